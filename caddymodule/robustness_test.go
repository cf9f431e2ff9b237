package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func (rs *robustSite) getJSON(path string, into any) {
	rs.t.Helper()
	resp, err := testClient.Get(rs.admin + path)
	if err != nil {
		rs.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		rs.t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		rs.t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

func (rs *robustSite) card(model string) Card {
	var c Card
	rs.getJSON("/lm-warden/models/"+model, &c)
	return c
}

func (rs *robustSite) send(path, body string, hdr map[string]string) turnResult {
	rs.t.Helper()
	req, err := http.NewRequest(http.MethodPost, rs.url+path, strings.NewReader(body))
	if err != nil {
		rs.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		rs.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := turnResult{status: resp.StatusCode, body: string(b), header: resp.Header}
	res.replica, res.reason, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
	return res
}

// TestReplicaDiesMidStream stops an emulated replica while it streams an
// answer: the client gets a truncated stream, the proxy keeps serving, the
// request's in-flight slot is freed, the response is still counted (as
// unmeasured: the usage chunk never came) and the conversation's next turn
// is re-placed on the live replica, then sticks there.
func TestReplicaDiesMidStream(t *testing.T) {
	emu, dials := startEmulator(t, 2, 1)
	rs := loadRobustSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		lb_retries 2
		flush_interval -1
	}`, strings.Join(dials, " "), policyBlock("middie", "max_num_seqs 32")))

	long := `{"model":"qwen3-4b","max_tokens":4000,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"write a long story about a replica"}]}`
	req, _ := http.NewRequest(http.MethodPost, rs.url+"/v1/chat/completions", strings.NewReader(long))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", "mid")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	replica, _, _ := strings.Cut(resp.Header.Get(RouteHeader), "; ")
	dead := -1
	for i, d := range dials {
		if d == replica {
			dead = i
		}
	}
	if dead < 0 {
		t.Fatalf("route header %q names no upstream", replica)
	}
	br := bufio.NewReader(resp.Body)
	for events := 0; events < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream's first events: %v", err)
		}
		if strings.HasPrefix(line, "data: ") {
			events++
		}
	}
	if c := rs.card("middie"); c.InFlight != 1 {
		t.Errorf("in flight %d while streaming, want 1", c.InFlight)
	}
	if err := emu.Stop(dead); err != nil {
		t.Fatal(err)
	}
	rest, rerr := io.ReadAll(br)
	if rerr == nil && strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream completed although its replica stopped: %q", rest)
	}
	t.Logf("client saw the stream end with %v after %d more bytes", rerr, len(rest))

	waitFor(t, "the slot of the broken stream to be freed", func() bool { return rs.card("middie").InFlight == 0 })
	// the cut stream is the replica's failure: it is out at once
	if r := cardRow(rs.card("middie"), replica); r.ProxyFailures != 1 || r.Available || !slices.Contains(r.Out, "proxy errors") {
		t.Errorf("replica after cutting a stream: proxy failures %d, available %v, out %v", r.ProxyFailures, r.Available, r.Out)
	}
	var st Stats
	rs.getJSON("/lm-warden/models/middie/stats", &st)
	if tot := st.ReplicaTotals[replica]; tot.Requests != 1 || tot.Unmeasured != 1 {
		t.Errorf("broken stream on %s counted as %+v, want 1 request, unmeasured", replica, tot)
	}

	// the proxy still serves, and the conversation moves to the live replica
	next := rs.send("/v1/chat/completions", `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"write a long story about a replica"}]}`,
		map[string]string{"X-Claude-Code-Session-Id": "mid"})
	if next.status != http.StatusOK || next.replica == replica || next.reason != "re-placed" {
		t.Fatalf("turn after the replica died: %d %s; %s (dead %s): %s", next.status, next.replica, next.reason, replica, next.body)
	}
	// the next turn resends the conversation, as agents do
	again := rs.send("/v1/chat/completions", `{"model":"qwen3-4b","max_tokens":4,"messages":[{"role":"user","content":"write a long story about a replica"},{"role":"assistant","content":"Once"},{"role":"user","content":"and another"}]}`,
		map[string]string{"X-Claude-Code-Session-Id": "mid"})
	if again.replica != next.replica || again.reason != "sticky" {
		t.Errorf("turn after the move: %s; %s, want %s; sticky", again.replica, again.reason, next.replica)
	}
	waitFor(t, "in flight back to 0", func() bool { return rs.card("middie").InFlight == 0 })
}

// TestReloadUnderLoad reloads the configuration several times, changing the
// spill threshold, while conversations keep sending turns: no request fails
// with a 5xx, every conversation stays on its replica (bindings survive each
// reload), the counters add up and nothing is left in flight.
func TestReloadUnderLoad(t *testing.T) {
	fs := startFakes(t, 3)
	site := func(threshold int) string {
		return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		lb_retries 1
	}`, dialList(fs), policyBlock("reloading", fmt.Sprintf("spill_threshold %d", threshold)))
	}
	rs := loadRobustSite(t, site(8))

	const workers, maxTurns = 6, 2000
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var (
		stop      atomic.Bool
		ok        atomic.Int64
		transport atomic.Int64
		handover  atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		bad       []string
		lost      []string
		where     = make([]map[string]int, workers)
		last      = make([]string, workers)
		moves     = make([][]string, workers)
	)
	for w := 0; w < workers; w++ {
		where[w] = map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("load-%d", w)
			for turn := 1; turn <= maxTurns && !stop.Load(); turn++ {
				req, _ := http.NewRequest(http.MethodPost, rs.url+"/v1/messages", strings.NewReader(chatTurn(name, 1+turn%4, turn%2 == 0)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Claude-Code-Session-Id", name)
				// a replayable POST: the client may resend it on a
				// connection the old server closed before reading it
				req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", name, turn))
				var reused, answered atomic.Bool
				req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
					GotConn:              func(i httptrace.GotConnInfo) { reused.Store(i.Reused) },
					GotFirstResponseByte: func() { answered.Store(true) },
				}))
				resp, err := client.Do(req)
				if err != nil {
					if !reused.Load() && !answered.Load() {
						// a connection the client had just opened, closed
						// or reset before any answer (the dial itself, when
						// GotConn never came): it landed in the queue of the
						// old server's listening socket, which the kernel
						// resets when Caddy closes it (see the README,
						// "Reloads"); a failure on a reused connection the
						// client replays itself (Idempotency-Key)
						handover.Add(1)
					}
					transport.Add(1)
					mu.Lock()
					lost = append(lost, err.Error())
					mu.Unlock()
					continue
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil {
					transport.Add(1)
					mu.Lock()
					lost = append(lost, "reading the answer: "+err.Error())
					mu.Unlock()
					continue
				}
				route := resp.Header.Get(RouteHeader)
				replica, _, _ := strings.Cut(route, "; ")
				mu.Lock()
				if resp.StatusCode != http.StatusOK {
					bad = append(bad, fmt.Sprintf("%s turn %d: %d", name, turn, resp.StatusCode))
				} else {
					ok.Add(1)
					if last[w] != "" && replica != last[w] {
						moves[w] = append(moves[w], fmt.Sprintf("turn %d at %s: %s", turn, time.Now().Format("15:04:05.000"), route))
					}
					last[w] = replica
					where[w][replica]++
				}
				mu.Unlock()
			}
		}()
	}
	var reloads []string
	for _, threshold := range []int{5, 9, 6, 10} {
		time.Sleep(150 * time.Millisecond)
		reloads = append(reloads, time.Now().Format("15:04:05.000"))
		reloadRobustSite(t, rs.port, site(threshold))
	}
	time.Sleep(150 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	if len(bad) > 0 {
		t.Errorf("%d turns failed across reloads: %v", len(bad), bad)
	}
	// Every configuration listens on its own socket (SO_REUSEPORT), and
	// the kernel resets the connections queued on the old one when the old
	// server closes it: a connection the client opened just then is closed
	// before any answer. That is the kernel's listener handover, which
	// neither Caddy nor the handler sees (net.ipv4.tcp_migrate_req=1 moves
	// those connections to the new socket instead: then none is lost). Any
	// other loss is a failure: on a reused connection, or after the answer
	// began.
	n, h := transport.Load(), handover.Load()
	if n > h {
		t.Errorf("%d turns lost at the transport across reloads, %d of them not in the listener handover: %v", n, n-h, lost)
	} else if h > 0 && migrateReq() {
		t.Errorf("%d turns lost in the listener handover with net.ipv4.tcp_migrate_req on: %v", h, lost)
	} else if h > 0 {
		t.Logf("%d turns lost in the kernel's listener handover (net.ipv4.tcp_migrate_req off): %v", h, lost)
	}
	if ok.Load() == 0 {
		t.Fatal("no turn succeeded")
	}
	t.Logf("%d turns answered across 4 reloads", ok.Load())
	for w, reps := range where {
		if len(reps) != 1 {
			t.Errorf("conversation load-%d served by %d replicas across reloads at %v: %v; moves %v", w, len(reps), reloads, reps, moves[w])
		}
	}
	waitFor(t, "in flight back to 0", func() bool { return rs.card("reloading").InFlight == 0 })
	c := rs.card("reloading")
	if c.SpillThreshold != 10 {
		t.Errorf("spill threshold %d after the last reload, want 10", c.SpillThreshold)
	}
	if c.Bindings != workers {
		t.Errorf("%d bindings, want one per conversation (%d)", c.Bindings, workers)
	}
	if c.Requests < uint64(ok.Load()) {
		t.Errorf("card counts %d requests, clients got %d answers", c.Requests, ok.Load())
	}
	var served int
	for _, f := range fs {
		served += len(f.requests())
	}
	if int64(served) != ok.Load() {
		t.Errorf("upstreams served %d turns, clients got %d answers", served, ok.Load())
	}
}

// TestNoLeaksUnderTraffic sends more distinct conversations than
// max_sessions, some streams cancelled by the client mid-way: bindings stay
// within max_sessions, nothing stays in flight, goroutines return to their
// level before the traffic and a second round of the same traffic does not
// grow the heap.
func TestNoLeaksUnderTraffic(t *testing.T) {
	fs := startFakes(t, 3)
	rs := loadRobustSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, dialList(fs), policyBlock("leak", "max_sessions 50")))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	// warm up: connections, pools, the poller
	if res := rs.send("/v1/messages", chatTurn("warm", 1, true), nil); res.status != http.StatusOK {
		t.Fatalf("warm-up: %d", res.status)
	}
	settle := func() int { return settledGoroutines(client) }
	baseline := settle()

	round := func(prefix string) {
		const sessions, workers = 300, 8
		next := atomic.Int64{}
		var failed atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= sessions {
						return
					}
					name := fmt.Sprintf("%s-%d", prefix, i)
					req, _ := http.NewRequest(http.MethodPost, rs.url+"/v1/messages", strings.NewReader(chatTurn(name, 1, i%2 == 0)))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Claude-Code-Session-Id", name)
					resp, err := client.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Errorf("round %s: %d of %d turns failed", prefix, n, sessions)
		}
		// streams the client gives up on after their first event
		step := make(chan struct{})
		for _, f := range fs {
			f.mu.Lock()
			f.step = step
			f.mu.Unlock()
		}
		for i := 0; i < 12; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, rs.url+"/v1/messages", strings.NewReader(chatTurn(fmt.Sprintf("%s-gone-%d", prefix, i), 1, true)))
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				cancel()
				t.Fatalf("cancelled stream %d: %v", i, err)
			}
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "event: message_start") {
				t.Errorf("cancelled stream %d: first line %q, %v", i, line, err)
			}
			cancel()
			resp.Body.Close()
		}
		waitFor(t, "cancelled streams to free their slots", func() bool { return rs.card("leak").InFlight == 0 })
		for _, f := range fs {
			f.mu.Lock()
			f.step = nil
			f.mu.Unlock()
		}
		close(step)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}

	round("a")
	h1 := heap()
	if c := rs.card("leak"); c.Bindings > 50 {
		t.Errorf("%d bindings with max_sessions 50", c.Bindings)
	}
	round("b")
	h2 := heap()
	if c := rs.card("leak"); c.Bindings > 50 || c.InFlight != 0 {
		t.Errorf("after two rounds: %d bindings (max_sessions 50), %d in flight", c.Bindings, c.InFlight)
	}
	t.Logf("heap after round 1: %d KiB, after round 2: %d KiB", h1>>10, h2>>10)
	if h2 > h1+8<<20 {
		t.Errorf("heap grew from %d KiB to %d KiB between two equal rounds", h1>>10, h2>>10)
	}

	deadline := time.Now().Add(10 * time.Second)
	var now int
	for {
		now = settle()
		if now <= baseline+5 || time.Now().After(deadline) {
			break
		}
	}
	if now > baseline+5 {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("%d goroutines after the traffic, %d before; stacks:\n%s", now, baseline, buf[:n])
	}
}

// echoUpstream answers every request with what it received: the body's
// length and SHA-256, its content type and the session header.
type echoed struct {
	Len         int    `json:"len"`
	SHA         string `json:"sha"`
	ContentType string `json:"content_type"`
	Encoding    string `json:"encoding"`
}

func newEchoUpstream(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(b)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(echoed{Len: len(b), SHA: hex.EncodeToString(sum[:]),
			ContentType: r.Header.Get("Content-Type"), Encoding: r.Header.Get("Content-Encoding")})
	}))
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().String()
}

// chunkedReader hides the body's length so the client sends it chunked.
type chunkedReader struct{ io.Reader }

// TestOddRequestsReachTheUpstreamUnchanged sends bodies and headers a client
// may get wrong: each request is answered by the upstream (never a 5xx from
// the handler), its bytes arrive unchanged, and where the body still allows
// a key (a fingerprint of a valid body without a session header) the
// conversation is routed by it.
func TestOddRequestsReachTheUpstreamUnchanged(t *testing.T) {
	up := newEchoUpstream(t)
	rs := loadRobustSite(t, fmt.Sprintf(`
	lm_warden {
		max_body 64KiB
	}
	reverse_proxy %s {
		%s
	}`, up, policyBlock("odd", "")))
	valid := `{"model":"qwen3-4b","system":"be brief","messages":[{"role":"user","content":"hello odd"}]}`
	cases := []struct {
		name, method, ctype, encoding string
		body                          []byte
		chunked                       bool
		reasons                       []string // acceptable route reasons
	}{
		{"truncated JSON", "POST", "application/json", "", []byte(`{"model":"qwen3-4b","messages":[{"role":"user","content":"hel`), false, []string{"placed", "no-key"}},
		{"not JSON at all", "POST", "application/json", "", []byte("\x00\xff\xfe binary \x01\x02 garbage"), false, []string{"no-key"}},
		{"JSON array", "POST", "application/json", "", []byte(`[1,2,3]`), false, []string{"no-key"}},
		{"empty body", "POST", "application/json", "", nil, false, []string{"no-key"}},
		{"no content type", "POST", "", "", []byte(valid), false, []string{"placed", "sticky"}},
		{"text/plain", "POST", "text/plain", "", []byte(valid), false, []string{"no-key"}},
		{"malformed content type", "POST", "application/json;;;=", "", []byte(valid), false, []string{"no-key"}},
		{"charset parameter", "POST", "application/json; charset=utf-8", "", []byte(valid), false, []string{"sticky"}},
		{"chunked", "POST", "application/json", "", []byte(valid), true, []string{"sticky"}},
		{"chunked truncated JSON", "POST", "application/json", "", []byte(`{"model":`), true, []string{"no-key"}},
		{"gzip encoded", "POST", "application/json", "gzip", []byte("\x1f\x8b\x08\x00 not really gzip"), false, []string{"no-key"}},
		{"GET without body", "GET", "", "", nil, false, []string{"no-key"}},
		{"invalid UTF-8 in a string", "POST", "application/json", "", []byte("{\"model\":\"q\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}"), false, []string{"placed", "no-key"}},
		{"deeply nested", "POST", "application/json", "", []byte(`{"model":"m","metadata":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`), false, []string{"no-key"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				body = chunkedReader{bytes.NewReader(tc.body)}
			}
			if tc.body == nil {
				body = nil
			}
			req, _ := http.NewRequest(tc.method, rs.url+"/v1/messages", body)
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			if tc.encoding != "" {
				req.Header.Set("Content-Encoding", tc.encoding)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			var got echoed
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatalf("upstream answer %q: %v", b, err)
			}
			sum := sha256.Sum256(tc.body)
			if got.Len != len(tc.body) || got.SHA != hex.EncodeToString(sum[:]) {
				t.Errorf("upstream got %d bytes (sha %s), client sent %d", got.Len, got.SHA[:12], len(tc.body))
			}
			if got.ContentType != tc.ctype || got.Encoding != tc.encoding {
				t.Errorf("upstream got content type %q encoding %q, sent %q %q", got.ContentType, got.Encoding, tc.ctype, tc.encoding)
			}
			_, reason, _ := strings.Cut(resp.Header.Get(RouteHeader), "; ")
			okReason := false
			for _, r := range tc.reasons {
				okReason = okReason || r == reason
			}
			if !okReason {
				t.Errorf("routed as %q, want one of %v", reason, tc.reasons)
			}
		})
	}
	waitFor(t, "in flight back to 0", func() bool { return rs.card("odd").InFlight == 0 })
}

// TestRetryAfterAnAnswerResendsTheWholeBody makes the first replica read the
// request and answer 503, with the proxy set to retry such answers: the
// retry goes to the other replica with the body complete and unchanged.
func TestRetryAfterAnAnswerResendsTheWholeBody(t *testing.T) {
	echo := newEchoUpstream(t)
	var busyGot atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busySrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			return
		}
		b, _ := io.ReadAll(r.Body)
		busyGot.Add(int64(len(b)))
		// Go's transport reads a request body once more after its last byte
		// (to check for extra bytes), and Caddy v2.11.9 shares one body
		// wrapper between the attempts of a request: an answer that beats
		// that read races the retry inside Caddy's reverse proxy. Answer a
		// moment later, as a replica doing any work would.
		time.Sleep(50 * time.Millisecond)
		http.Error(w, `{"error":"busy"}`, http.StatusServiceUnavailable)
	}))
	busySrv.Listener = l
	busySrv.Start()
	t.Cleanup(busySrv.Close)
	busy := l.Addr().String()

	rs := loadRobustSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s %s {
		%s
		lb_retries 2
		lb_retry_match {
			expression `+"`{rp.status_code} == 503`"+`
		}
	}`, busy, echo, policyBlock("retry", "client_pin_header X-Pin\n fail_cooldown 1ms")))
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		size int // the body's least size
	}{
		{"session header", map[string]string{"X-Pin": busy, "X-Claude-Code-Session-Id": "retry-1"}, 0},
		{"session header, 256 KB", map[string]string{"X-Pin": busy, "X-Claude-Code-Session-Id": "retry-2"}, 256 << 10},
		{"body read for the key", map[string]string{"X-Pin": busy}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// the previous attempt's failure cools the busy replica down
			// for fail_cooldown: a pin to it is honoured only after that
			waitFor(t, "the busy replica back in placement", func() bool { return cardRow(rs.card("retry"), busy).Available })
			before := busyGot.Load()
			body := chatTurn("retry", 3, false, "user_1_account_2_session_retry-body")
			if tc.size > 0 {
				// a conversation under streamOver is read in full, so the
				// retry needs no request_buffers
				body = `{"model":"qwen3-4b","messages":[{"role":"user","content":"` + strings.Repeat("long turn ", tc.size/10) + `"}]}`
			}
			res := rs.send("/v1/messages", body, tc.hdr)
			if busyGot.Load() == before {
				t.Fatal("the first attempt did not reach the busy replica")
			}
			if res.status != http.StatusOK || res.replica != echo {
				t.Fatalf("retry: %d from %s (%s): %s", res.status, res.replica, res.reason, res.body)
			}
			var got echoed
			if err := json.Unmarshal([]byte(res.body), &got); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256([]byte(body))
			if got.Len != len(body) || got.SHA != hex.EncodeToString(sum[:]) {
				t.Errorf("the retry carried %d bytes, the client sent %d", got.Len, len(body))
			}
		})
	}
	waitFor(t, "in flight back to 0", func() bool { return rs.card("retry").InFlight == 0 })

	// A body over streamOver keyed by a header is streamed after its first
	// bytes (only the model is read); Caddy's request_buffers keeps it for
	// such retries, as for any unbuffered body.
	rs = loadRobustSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s %s {
		%s
		request_buffers 2MiB
		lb_retries 2
		lb_retry_match {
			expression `+"`{rp.status_code} == 503`"+`
		}
	}`, busy, echo, policyBlock("retry-big", "client_pin_header X-Pin")))
	body := `{"model":"qwen3-4b","messages":[{"role":"user","content":"` + strings.Repeat("large turn ", streamOver/10) + `"}]}`
	res := rs.send("/v1/messages", body, map[string]string{"X-Pin": busy, "X-Claude-Code-Session-Id": "retry-big"})
	var got echoed
	if err := json.Unmarshal([]byte(res.body), &got); res.status != http.StatusOK || err != nil {
		t.Fatalf("large body retried with request_buffers: %d %s", res.status, res.body)
	}
	if sum := sha256.Sum256([]byte(body)); got.Len != len(body) || got.SHA != hex.EncodeToString(sum[:]) {
		t.Errorf("the retry carried %d bytes, the client sent %d", got.Len, len(body))
	}
}

// TestModelFromTheBodysStart checks the handler's model variable when the
// key comes from a header: bodies up to streamOver are read in full, larger
// ones whose "model" comes first only as far as needed, the others in full,
// and in every case the proxy gets the body unchanged.
func TestModelFromTheBodysStart(t *testing.T) {
	pad := strings.Repeat("x", streamOver)
	cases := []struct {
		name, body, model string
		full              bool // the handler must have read the whole body
	}{
		{"small", `{"model":"m1","messages":[]}`, "m1", true},
		{"model first, 256 KB", `{"model":"m0","messages":[{"role":"user","content":"` + pad[:256<<10] + `"}]}`, "m0", true},
		{"model first, large", `{"model":"m2","messages":[{"role":"user","content":"` + pad + `"}]}`, "m2", false},
		{"model last, large", `{"messages":[{"role":"user","content":"` + pad + `"}],"model":"m3"}`, "m3", true},
		{"model cut at the peek", `{"pad":"` + strings.Repeat("y", peekSize-16) + `","model":"model-name-longer-than-the-rest"}` + pad, "model-name-longer-than-the-rest", true},
		{"nested model first", `{"metadata":{"model":"nested"},"messages":[{"content":"` + pad + `"}]}`, "", true},
		{"number model", `{"model":7,"messages":[{"content":"` + pad + `"}]}`, "", false},
		{"truncated JSON, large", `{"model":"m4","messages":[{"content":"` + pad, "m4", false},
	}
	h := &Handler{}
	if err := h.Provision(benchCtx()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vars := map[string]any{}
			ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars)
			r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw/v1/messages", strings.NewReader(tc.body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("X-Claude-Code-Session-Id", "s")
			var got []byte
			var replayable bool
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				_, replayable = r.Body.(*replayBody)
				var err error
				got, err = io.ReadAll(r.Body)
				return err
			})
			if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.body {
				t.Errorf("the proxy got %d bytes, the client sent %d", len(got), len(tc.body))
			}
			if m, _ := vars[VarModel].(string); m != tc.model {
				t.Errorf("model variable %q, want %q", m, tc.model)
			}
			if replayable != tc.full {
				t.Errorf("whole body read: %v, want %v", replayable, tc.full)
			}
		})
	}
}

// migrateReq reports whether the kernel moves the connections queued on a
// closing listening socket to another of its SO_REUSEPORT group
// (net.ipv4.tcp_migrate_req).
func migrateReq() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_migrate_req")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}
