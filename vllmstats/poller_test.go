package vllmstats

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// fakeVLLM serves a settable exposition and /v1/models on 127.0.0.1.
type fakeVLLM struct {
	srv           *httptest.Server
	mu            sync.Mutex
	body          string
	status        int
	metricsHits   atomic.Int64
	modelsHits    atomic.Int64
	maxModelLen   int
	hang          chan struct{} // when non-nil, /metrics blocks until closed or the request ends
	requestsAlive atomic.Int64
}

func newFakeVLLM(t *testing.T, body string) *fakeVLLM {
	f := &fakeVLLM{body: body, status: 200, maxModelLen: 32768}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.requestsAlive.Add(1)
		defer f.requestsAlive.Add(-1)
		f.mu.Lock()
		body, status, hang, mml := f.body, f.status, f.hang, f.maxModelLen
		f.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			f.metricsHits.Add(1)
			if hang != nil {
				select {
				case <-hang:
				case <-r.Context().Done():
				}
				return
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			w.WriteHeader(status)
			fmt.Fprint(w, body)
		case "/v1/models":
			f.modelsHits.Add(1)
			fmt.Fprintf(w, `{"object":"list","data":[{"id":"qwen3-4b","object":"model","max_model_len":%d,"parent":null},{"id":"lora-a","parent":"qwen3-4b","max_model_len":%d}]}`, mml, mml)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) set(status int, body string) {
	f.mu.Lock()
	f.status, f.body = status, body
	f.mu.Unlock()
}

func counters(q, h float64, running int) string {
	return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} %g
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} %g
`, running, q, h)
}

func mustReplica(t *testing.T, p *Poller, id string) *ReplicaStats {
	t.Helper()
	r, ok := p.Snapshot().Replica(id)
	if !ok {
		t.Fatalf("replica %s missing", id)
	}
	return r
}

func TestPollerFourEnginesOneRequest(t *testing.T) {
	t.Parallel()
	f := newFakeVLLM(t, readFixture(t, "four_engines.txt"))
	var targets []Target
	for i := range 4 {
		targets = append(targets, Target{ID: fmt.Sprintf("dp%d", i), BaseURL: f.srv.URL + "/", Engine: fmt.Sprint(i)})
	}
	p := NewPoller(PollerConfig{Targets: targets, Interval: time.Second})
	defer p.Stop()
	if s := p.Snapshot(); len(s.Replicas) != 4 || !s.Replicas[0].Reachable || !s.Taken.IsZero() {
		t.Fatalf("initial snapshot %+v", s)
	}
	p.round()
	p.round()
	if got := f.metricsHits.Load(); got != 2 {
		t.Fatalf("metrics requests %d, want one per round", got)
	}
	if got := f.modelsHits.Load(); got != 0 {
		t.Fatalf("models requests %d, want none: nothing reads them", got)
	}
	s := p.Snapshot()
	for i, r := range s.Replicas {
		if r.ID != targets[i].ID || r.Metrics.Engine != fmt.Sprint(i) || !r.Reachable || r.LastSeen.IsZero() {
			t.Fatalf("replica %d: %+v", i, r)
		}
	}
	if r := mustReplica(t, p, "dp3"); r.Metrics.Running != 31 || r.Metrics.KVCapacityTokens != 36800 {
		t.Fatalf("dp3 %+v", r)
	}
}

func TestPollerHitRatesAndReset(t *testing.T) {
	t.Parallel()
	f := newFakeVLLM(t, counters(100, 50, 1))
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "r", BaseURL: f.srv.URL}}, Interval: time.Second, Window: time.Hour})
	defer p.Stop()
	steps := []struct {
		q, h                 float64
		window, total, since float64
		resets               uint64
	}{
		{100, 50, 0, 0, 0, 0},        // baseline: counts before the poller started are not ours
		{200, 130, 0.8, 0.8, 100, 0}, // Δq 100 Δh 80
		{10, 5, 0.8, 0.8, 100, 1},    // restart: new baseline, no negative traffic
		{110, 105, 0.9, 0.9, 200, 1}, // Δq 100 Δh 100
	}
	for i, st := range steps {
		f.set(200, counters(st.q, st.h, 0))
		p.round()
		r := mustReplica(t, p, "r")
		if r.HitRateWindow != st.window || r.HitRateTotal != st.total || r.QueriesSinceStart != st.since || r.Resets != st.resets {
			t.Fatalf("step %d: window %v total %v since %v resets %d; want %+v", i, r.HitRateWindow, r.HitRateTotal, r.QueriesSinceStart, r.Resets, st)
		}
	}
}

func TestPollerWindowSlides(t *testing.T) {
	t.Parallel()
	f := newFakeVLLM(t, counters(0, 0, 0))
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "r", BaseURL: f.srv.URL}}, Interval: time.Second, Window: 30 * time.Millisecond})
	defer p.Stop()
	p.round()
	f.set(200, counters(100, 0, 0)) // 100 misses
	p.round()
	time.Sleep(60 * time.Millisecond)
	f.set(200, counters(200, 100, 0)) // then 100 hits
	p.round()
	r := mustReplica(t, p, "r")
	if r.HitRateWindow != 1 || r.HitRateTotal != 0.5 {
		t.Fatalf("window %v total %v", r.HitRateWindow, r.HitRateTotal)
	}
}

func TestPollerFailuresAndRecovery(t *testing.T) {
	t.Parallel()
	good := newFakeVLLM(t, counters(100, 50, 2))
	dead := newFakeVLLM(t, counters(100, 50, 2))
	p := NewPoller(PollerConfig{
		Targets:  []Target{{ID: "good", BaseURL: good.srv.URL, Engine: "0"}, {ID: "dead", BaseURL: dead.srv.URL}},
		Interval: time.Second, FailAfter: 2,
	})
	defer p.Stop()
	p.round()
	seen := mustReplica(t, p, "dead").LastSeen
	if seen.IsZero() {
		t.Fatal("not seen")
	}
	failures := []struct {
		name  string
		apply func()
		want  string
	}{
		{"5xx", func() { good.set(503, "engine dead") }, "503"},
		{"wrong engine", func() { good.set(200, strings.ReplaceAll(counters(1, 1, 1), `engine="0"`, `engine="5"`)) }, `engine "0" not in exposition`},
	}
	for _, fc := range failures {
		fc.apply()
		p.round()
		r := mustReplica(t, p, "good")
		if !r.Reachable || r.Failures != 1 || !strings.Contains(r.LastError, fc.want) || r.Metrics.Running != 2 || r.Refused {
			t.Fatalf("%s after 1 failure: %+v", fc.name, r)
		}
		p.round()
		r = mustReplica(t, p, "good")
		if r.Reachable || r.Failures != 2 || !strings.Contains(r.LastError, fc.want) || r.Metrics.Running != 2 {
			t.Fatalf("%s after 2 failures: %+v", fc.name, r)
		}
		good.set(200, counters(100, 50, 2))
		before := good.modelsHits.Load()
		p.round()
		r = mustReplica(t, p, "good")
		if !r.Reachable || r.Failures != 0 || r.LastError != "" || r.LastSeen.Equal(seen) {
			t.Fatalf("%s not recovered: %+v", fc.name, r)
		}
		if good.modelsHits.Load() != before {
			t.Fatalf("%s: models read after recovery; nothing reads them", fc.name)
		}
	}

	// A server that dies: connection refused.
	seen = mustReplica(t, p, "dead").LastSeen
	dead.srv.Close()
	p.round()
	p.round()
	r := mustReplica(t, p, "dead")
	if r.Reachable || r.Failures != 2 || r.LastError == "" || !r.LastSeen.Equal(seen) || r.Metrics.Running != 2 || !r.Refused {
		t.Fatalf("dead server: %+v", r)
	}
	if g := mustReplica(t, p, "good"); !g.Reachable {
		t.Fatalf("good replica hurt by the dead one: %+v", g)
	}
}

// A server that answers 200 is reachable, whatever its body: an exposition
// without any known engine's series, or no exposition at all, leaves every
// figure unknown, is logged once and never counts as a failed poll.
func TestPollerReachableWithoutKnownSeries(t *testing.T) {
	t.Parallel()
	f := newFakeVLLM(t, counters(100, 50, 2))
	core, logs := observer.New(zap.WarnLevel)
	p := NewPoller(PollerConfig{
		Targets:  []Target{{ID: "r", BaseURL: f.srv.URL}},
		Interval: time.Second, FailAfter: 1, Logger: zap.New(core),
	})
	defer p.Stop()
	p.round()
	if r := mustReplica(t, p, "r"); r.Dialect != DialectVLLM || !r.HitRateKnown {
		t.Fatalf("vLLM exposition: %+v", r)
	}
	bodies := []struct{ name, body, unread string }{
		{"another program", "# TYPE go_goroutines gauge\ngo_goroutines 12\n", "no series of a known engine"},
		{"not an exposition", "<html>oops</html>", "text format parsing error"},
	}
	for _, b := range bodies {
		f.set(200, b.body)
		for range 3 { // FailAfter is 1: one failure would take it out
			p.round()
		}
		r := mustReplica(t, p, "r")
		if !r.Reachable || r.Failures != 0 || r.LastError != "" || r.Refused || r.LastSeen.IsZero() {
			t.Fatalf("%s: not reachable: %+v", b.name, r)
		}
		if r.Metrics.Present != 0 || r.HitRateKnown || r.HitRateWindowKnown || !strings.Contains(r.Unread, b.unread) {
			t.Fatalf("%s: figures not unknown: %+v", b.name, r)
		}
	}
	if n := logs.FilterMessageSnippet("gives no figure").Len(); n != 2 {
		t.Fatalf("logged %d times for 2 reasons over 6 polls, want 2: %v", n, logs.All())
	}
	f.set(200, counters(100, 50, 2))
	p.round()
	if r := mustReplica(t, p, "r"); r.Unread != "" || r.Metrics.Running != 2 || !r.HitRateKnown {
		t.Fatalf("back to vLLM: %+v", r)
	}
}

func TestPollerHangingServer(t *testing.T) {
	t.Parallel()
	hang := newFakeVLLM(t, counters(1, 1, 1))
	hang.hang = make(chan struct{})
	defer close(hang.hang)
	good := newFakeVLLM(t, counters(1, 1, 1))
	p := NewPoller(PollerConfig{
		Targets:  []Target{{ID: "hang", BaseURL: hang.srv.URL}, {ID: "good", BaseURL: good.srv.URL}},
		Interval: 200 * time.Millisecond, FailAfter: 1,
	})
	defer p.Stop()
	start := time.Now()
	p.round()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("round held %v by a hanging server", d)
	}
	r := mustReplica(t, p, "hang")
	if r.Reachable || !strings.Contains(r.LastError, "deadline") || r.Refused {
		t.Fatalf("hanging server: %+v", r)
	}
	if g := mustReplica(t, p, "good"); !g.Reachable || g.LastSeen.IsZero() {
		t.Fatalf("good replica: %+v", g)
	}
}

func TestPollerStartStopNoLeak(t *testing.T) {
	hang := newFakeVLLM(t, counters(1, 1, 1))
	hang.hang = make(chan struct{})
	good := newFakeVLLM(t, counters(1, 1, 1))
	base := runtime.NumGoroutine()
	rounds := make(chan *Snapshot, 100)
	tr := &http.Transport{}
	p := NewPoller(PollerConfig{
		Targets:    []Target{{ID: "hang", BaseURL: hang.srv.URL}, {ID: "good", BaseURL: good.srv.URL}},
		Interval:   50 * time.Millisecond,
		Timeout:    time.Hour, // clamped below the interval
		Client:     &http.Client{Transport: tr},
		OnSnapshot: func(s *Snapshot) { rounds <- s },
	})
	p.Start()
	p.Start()
	var s *Snapshot
	for range 3 {
		select {
		case s = <-rounds:
		case <-time.After(10 * time.Second):
			t.Fatal("no poll rounds")
		}
	}
	if r, _ := s.Replica("good"); r.LastSeen.IsZero() {
		t.Fatalf("good replica never seen: %+v", r)
	}
	p.Stop()
	p.Stop()
	close(hang.hang)
	tr.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Stop, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
	// Stop without Start returns at once.
	q := NewPoller(PollerConfig{})
	done := make(chan struct{})
	go func() { q.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop without Start blocked")
	}
}

func TestPollerSetTargets(t *testing.T) {
	t.Parallel()
	f := newFakeVLLM(t, readFixture(t, "four_engines.txt"))
	var got atomic.Pointer[Snapshot]
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "a", BaseURL: f.srv.URL, Engine: "1"}}, OnSnapshot: func(s *Snapshot) { got.Store(s) }})
	defer p.Stop()
	p.round()
	p.SetTargets([]Target{{ID: "b", BaseURL: f.srv.URL, Engine: "3"}, {ID: "a", BaseURL: f.srv.URL, Engine: "1"}, {ID: "a", BaseURL: "http://dup"}})
	s := p.Snapshot()
	if got.Load() != s || len(s.Replicas) != 2 || s.Replicas[0].ID != "b" || s.Replicas[1].LastSeen.IsZero() || !s.Replicas[0].LastSeen.IsZero() {
		t.Fatalf("after SetTargets: %+v", s.Replicas)
	}
	p.round()
	if r := mustReplica(t, p, "b"); r.Metrics.Running != 31 || r.LastSeen.IsZero() {
		t.Fatalf("new target: %+v", r)
	}
	p.SetTargets(nil)
	if len(p.Snapshot().Replicas) != 0 {
		t.Fatal("targets not removed")
	}
	p.round()
}

func TestPollerEngineDefault(t *testing.T) {
	t.Parallel()
	multi := newFakeVLLM(t, readFixture(t, "four_engines.txt"))
	single := newFakeVLLM(t, strings.ReplaceAll(counters(1, 1, 4), `engine="0"`, `engine="2"`))
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "m", BaseURL: multi.srv.URL}, {ID: "s", BaseURL: single.srv.URL}}})
	defer p.Stop()
	p.round()
	if r := mustReplica(t, p, "m"); r.Metrics.Engine != "0" || r.Metrics.Running != 12 {
		t.Fatalf("multi-engine default: %+v", r.Metrics)
	}
	if r := mustReplica(t, p, "s"); r.Metrics.Engine != "2" || r.Metrics.Running != 4 {
		t.Fatalf("only engine: %+v", r.Metrics)
	}
}

func TestSnapshotReadsDoNotAllocate(t *testing.T) {
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "a", BaseURL: "http://127.0.0.1:1"}, {ID: "b", BaseURL: "http://127.0.0.1:1"}}})
	allocs := testing.AllocsPerRun(100, func() {
		s := p.Snapshot()
		if r, ok := s.Replica("b"); !ok || r.ID != "b" {
			panic("missing")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per read", allocs)
	}
}

// TestPollerPrefixSeriesAbsent: the simulator's spelling (no _total) gives
// hit rates; when the prefix series go the rate is unknown (not 0), the token
// counters keep counting, the absence is logged once, and when they come back
// the rate resumes from the counters' new values.
func TestPollerPrefixSeriesAbsent(t *testing.T) {
	t.Parallel()
	sim := func(q, h, prompt float64, prefix bool) string {
		s := fmt.Sprintf("vllm:num_requests_running{model_name=\"qwen3-4b\"} 1\nvllm:prompt_tokens_total{model_name=\"qwen3-4b\"} %g\n", prompt)
		if prefix {
			s += fmt.Sprintf("vllm:prefix_cache_hits{model_name=\"qwen3-4b\"} %g\nvllm:prefix_cache_queries{model_name=\"qwen3-4b\"} %g\n", h, q)
		}
		return s
	}
	core, logs := observer.New(zap.InfoLevel)
	f := newFakeVLLM(t, sim(1000, 500, 1000, true))
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "r", BaseURL: f.srv.URL}}, Interval: time.Second, Window: time.Hour, Logger: zap.New(core)})
	defer p.Stop()
	steps := []struct {
		q, h, prompt float64
		prefix       bool
		known        bool
		total        float64
	}{
		{1000, 500, 1000, true, true, 0},
		{2000, 1300, 2000, true, true, 0.8},
		{0, 0, 3000, false, false, 0},
		{0, 0, 4000, false, false, 0},
		{3000, 2300, 5000, true, true, 0.9}, // Δ from the last values read: 1000 q, 1000 h
	}
	for i, st := range steps {
		f.set(200, sim(st.q, st.h, st.prompt, st.prefix))
		p.round()
		r := mustReplica(t, p, "r")
		if r.HitRateKnown != st.known || r.Metrics.PromptTokens != st.prompt || (st.known && r.HitRateTotal != st.total) || r.Resets != 0 {
			t.Fatalf("step %d: known %v total %v prompt %v resets %d; want %+v", i, r.HitRateKnown, r.HitRateTotal, r.Metrics.PromptTokens, r.Resets, st)
		}
		if !st.known && r.Metrics.Present.Has(FigPrefixHits) {
			t.Fatalf("step %d: present %v", i, r.Metrics.Present)
		}
	}
	warns := logs.FilterMessageSnippet("does not export").All()
	// first poll: waiting, KV, cache config and generation tokens absent;
	// then the prefix pair as well; then back to the first set.
	if len(warns) != 3 {
		t.Fatalf("%d warnings, want one per change: %v", len(warns), warns)
	}
	if got := warns[1].ContextMap()["missing"]; !strings.Contains(got.(string), "vllm:prefix_cache_hits_total") {
		t.Fatalf("warning names %v", got)
	}
}

// A counter without a sample until the first request (llm-d-inference-sim,
// client_golang) counts from 0 when it appears after a good poll without it:
// the first traffic is not lost as a baseline.
func TestPollerCountersAppearingLater(t *testing.T) {
	t.Parallel()
	fresh := readFixture(t, "sim_eec055a_fresh.txt")
	f := newFakeVLLM(t, fresh)
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "r", BaseURL: f.srv.URL}}, Interval: time.Second, Window: time.Hour})
	defer p.Stop()
	p.round()
	if r := mustReplica(t, p, "r"); r.HitRateKnown || r.QueriesSinceStart != 0 {
		t.Fatalf("fresh: %+v", r)
	}
	f.set(200, readFixture(t, "sim_eec055a.txt"))
	p.round()
	r := mustReplica(t, p, "r")
	if !r.HitRateKnown || r.QueriesSinceStart != 666 || r.HitsSinceStart != 416 || !r.HitRateWindowKnown || r.HitRateWindow != 416.0/666 {
		t.Fatalf("after the first requests: %+v", r)
	}
	// a counter present from the first poll is a baseline, as before
	g := newFakeVLLM(t, readFixture(t, "sim_eec055a.txt"))
	q := NewPoller(PollerConfig{Targets: []Target{{ID: "g", BaseURL: g.srv.URL}}, Interval: time.Second})
	defer q.Stop()
	q.round()
	if r := mustReplica(t, q, "g"); r.QueriesSinceStart != 0 || r.HitRateWindowKnown {
		t.Fatalf("baseline: %+v", r)
	}
}

// llama.cpp: the KV capacity from /props (captured: 2 slots of 4096), read
// once, not every round.
func TestPollerLlamaCppCapacityFromProps(t *testing.T) {
	t.Parallel()
	props := readFixture(t, "llamacpp_props.json")
	metrics := readFixture(t, "llamacpp.txt")
	var propsHits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			fmt.Fprint(w, metrics)
		case "/props":
			propsHits.Add(1)
			fmt.Fprint(w, props)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "l", BaseURL: srv.URL}}, Interval: time.Second})
	defer p.Stop()
	for range 3 {
		p.round()
	}
	r := mustReplica(t, p, "l")
	if r.Dialect != DialectLlamaCpp || !r.Metrics.Present.Has(FigCacheConfig) || r.Metrics.KVCapacityTokens != 8192 {
		t.Fatalf("llama.cpp replica: %+v", r)
	}
	if n := propsHits.Load(); n != 1 {
		t.Fatalf("/props read %d times in 3 rounds, want once", n)
	}
}

// A server detected as one engine and restarted as another is read in the
// new engine's names: detection runs again once the old names are gone.
func TestPollerDetectsAnotherEngineAfterRestart(t *testing.T) {
	t.Parallel()
	sglang, err := os.ReadFile(filepath.Join("testdata", "sglang.txt"))
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeVLLM(t, counters(100, 50, 2))
	p := NewPoller(PollerConfig{Targets: []Target{{ID: "r", BaseURL: f.srv.URL}}, Interval: time.Second})
	defer p.Stop()
	p.round()
	if r := mustReplica(t, p, "r"); r.Dialect != DialectVLLM || r.Metrics.Running != 2 {
		t.Fatalf("vLLM exposition: %+v", r)
	}
	f.set(200, string(sglang))
	p.round()
	r := mustReplica(t, p, "r")
	if r.Dialect != DialectSGLang || !r.Reachable || r.LastError != "" {
		t.Fatalf("after the restart as SGLang: dialect %v, reachable %v, error %q", r.Dialect, r.Reachable, r.LastError)
	}
	want, err := ParseMetricsAs(strings.NewReader(string(sglang)), DialectSGLang)
	if err != nil {
		t.Fatal(err)
	}
	if r.Metrics.Running != want["0"].Running || r.Metrics.KVUsage != want["0"].KVUsage {
		t.Fatalf("SGLang figures read as %+v; the exposition says %+v", r.Metrics, want["0"])
	}
}
