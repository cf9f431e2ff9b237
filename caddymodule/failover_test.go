package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
)

// coreSite is the core snippet of docs/failures.md with the emulator's replicas as the
// upstreams: no health checks, no retries. rht is the response header
// timeout; extra adds lines to the policy's block ("" = the defaults).
func coreSite(model string, dials []string, rht, extra string) string {
	return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			max_num_seqs 32
			%s
		}
		flush_interval -1
		transport http {
			dial_timeout 3s
			response_header_timeout %s
		}
	}`, strings.Join(dials, " "), model, extra, rht)
}

// turnLog is one turn a failover test sent.
type turnLog struct {
	conv, turn      int
	start, end      time.Time
	status          int
	replica, reason string
	errBody         string // the start of a response other than 200
	streamed        bool   // a 200 with its headers: the response had started
	complete        bool   // the stream ended with its final event
}

// failedEarly: the turn failed before any response had started.
func (l turnLog) failedEarly() bool { return !l.streamed }

type faultRun struct {
	t     *testing.T
	url   string
	model string
	mu    sync.Mutex
	log   []turnLog
	next  int // next conversation number
}

// sendTurn sends turn n of conversation c, streaming, and logs it.
func (fr *faultRun) sendTurn(ctx context.Context, c, n int) turnLog {
	l := streamTurn(ctx, fr.url, "qwen3-4b", fmt.Sprintf("%s-conv-%d", fr.model, c), n, nil)
	l.conv = c
	fr.mu.Lock()
	fr.log = append(fr.log, l)
	fr.mu.Unlock()
	return l
}

// streamTurn sends turn n of conversation conv (its session header) in
// Claude Code's shape, streaming, to base, and records where it went and
// how it ended.
func streamTurn(ctx context.Context, base, model, conv string, n int, hdr map[string]string) (l turnLog) {
	msgs := []map[string]any{{"role": "user", "content": "Task " + conv + ": " + strings.Repeat("read the code and fix the failing test. ", 40)}}
	for i := 1; i < n; i++ {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "done step " + fmt.Sprint(i)},
			map[string]any{"role": "user", "content": "continue with step " + fmt.Sprint(i+1)})
	}
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": 16, "stream": true,
		"system":   []map[string]any{{"type": "text", "text": strings.Repeat("You are a careful coding agent. ", 60)}},
		"messages": msgs,
	})
	l = turnLog{turn: n, start: time.Now()}
	defer func() { l.end = time.Now() }()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", conv)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return l
	}
	defer resp.Body.Close()
	l.status = resp.StatusCode
	l.replica, l.reason, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
	l.reason, _, _ = strings.Cut(l.reason, "; ") // the spill estimates follow
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		l.errBody = string(b)
		return l
	}
	l.streamed = true
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "message_stop") {
			l.complete = true
		}
	}
	return l
}

// run keeps workers conversations going (6 turns each, then a new one)
// until stop is closed; bounded by a hard limit of turns.
func (fr *faultRun) run(workers int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sent := 0; sent < 2000; {
				fr.mu.Lock()
				c := fr.next
				fr.next++
				fr.mu.Unlock()
				for n := 1; n <= 6; n++ {
					select {
					case <-stop:
						return
					default:
					}
					fr.sendTurn(ctx, c, n)
					sent++
					time.Sleep(20 * time.Millisecond) // the agent's own work
				}
			}
		}()
	}
	wg.Wait()
}

func (fr *faultRun) turns() []turnLog {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	return append([]turnLog(nil), fr.log...)
}

// busiest returns the index of the replica holding the most conversations,
// so the fault hits conversations that come back.
func busiest(t *testing.T, model string, dials []string) int {
	t.Helper()
	c := getCard(t, model)
	best, most := 0, -1
	for i, d := range dials {
		if n := cardRow(c, d).Bindings; n > most {
			best, most = i, n
		}
	}
	return best
}

// watchOut records when the card first shows replica out (not available)
// and when it first shows it back after that.
type outWatch struct {
	mu       sync.Mutex
	out, in  time.Time
	outCause []string
	seen     map[string]bool // every cause shown while out
}

func watchCard(t *testing.T, model, replica string, stop <-chan struct{}) *outWatch {
	w := &outWatch{seen: map[string]bool{}}
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var c Card
			st, body, err := serveAdminJSON(context.Background(), "/lm-warden/models/"+model)
			if err != nil || st != http.StatusOK || json.Unmarshal(body, &c) != nil {
				continue
			}
			row := cardRow(c, replica)
			now := time.Now()
			w.mu.Lock()
			if !row.Available && w.out.IsZero() {
				w.out, w.outCause = now, row.Out
			}
			for _, c := range row.Out {
				w.seen[c] = true
			}
			if row.Available && !w.out.IsZero() && w.in.IsZero() {
				w.in = now
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *outWatch) times() (out, in time.Time, cause []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out, w.in, w.outCause
}

// startEmulator starts n emulated one-engine replicas at speed (engine
// seconds per wall second) and returns them with their dial addresses.
func startEmulator(t *testing.T, n int, speed float64) (*emulator.Server, []string) {
	t.Helper()
	return startEmulatorConfig(t, emulator.ServerConfig{Replicas: n, Speed: speed, Model: "qwen3-4b"})
}

// stageFigures sums up a fault stage for the test log.
type stageFigures struct {
	outage, earlyFails, lateFails, placedOnDead, replaced, survivorTurns, survivorSticky int
}

// checkFaultStage checks the turns of a stage in which replica dead failed
// at tFault, was shown out at tOut and came back at tBack (zero if never),
// on the router's guarantees, not on elapsed time: the replica is out from
// the first failure a turn met there (its Failed is told before the client
// gets its error) or the card showing it out, whichever came first, so every
// turn that failed before streaming went there and started before then;
// each failed with
// failStatus (502: the dial was refused; 504: no response headers within
// response_header_timeout) and took at least minFail (the timeout it
// waited for); no turn that started after tOut went to the dead replica
// before tBack; the turns of its conversations after tOut were re-placed;
// every other conversation stayed where it was on every turn.
func checkFaultStage(t *testing.T, log []turnLog, dead string, tFault, tOut, tBack time.Time, failStatus int, minFail time.Duration) stageFigures {
	t.Helper()
	var f stageFigures
	byConv := map[int][]turnLog{}
	for _, l := range log {
		byConv[l.conv] = append(byConv[l.conv], l)
	}
	inOutage := func(at time.Time) bool { return !at.Before(tFault) && (tBack.IsZero() || at.Before(tBack)) }
	// the replica was out from its first failure's answer or the card
	// showing it out, whichever came first
	outBy := tOut
	for _, l := range log {
		if l.failedEarly() && l.replica == dead && l.end.Before(outBy) {
			outBy = l.end
		}
	}
	for _, l := range log {
		if inOutage(l.start) {
			f.outage++
		}
		if l.failedEarly() {
			if l.replica != dead {
				t.Errorf("conv %d turn %d failed on %s, not the failed replica (status %d, %s: %q)", l.conv, l.turn, l.replica, l.status, l.reason, l.errBody)
			}
			if l.end.Before(tFault) {
				t.Errorf("conv %d turn %d failed before the fault (status %d, %s; %s)", l.conv, l.turn, l.status, l.replica, l.reason)
			}
			if l.start.After(outBy) {
				f.lateFails++
				t.Errorf("conv %d turn %d started %v after the replica was out (its first failure answered, or shown out) and failed before streaming (status %d, %s; %s)",
					l.conv, l.turn, l.start.Sub(outBy), l.status, l.replica, l.reason)
			} else {
				f.earlyFails++
			}
			if l.status != failStatus {
				t.Errorf("conv %d turn %d failed with status %d (%s; %s: %q), want %d", l.conv, l.turn, l.status, l.replica, l.reason, l.errBody, failStatus)
			}
			if d := l.end.Sub(l.start); d < minFail {
				t.Errorf("conv %d turn %d failed after %v, before the %v it should have waited", l.conv, l.turn, d, minFail)
			}
		}
		if l.start.After(tOut) && inOutage(l.start) && l.replica == dead {
			f.placedOnDead++
			t.Errorf("conv %d turn %d started %v after the replica was shown out and went to it (%s)",
				l.conv, l.turn, l.start.Sub(tOut), l.reason)
		}
	}
	for c, turns := range byConv {
		onDead := false
		prev := ""
		for _, l := range turns {
			switch {
			case l.start.Before(tFault):
				if l.replica != "" {
					// a turn cut before its headers names no replica: the
					// conversation is still bound where its last answer was
					onDead = l.replica == dead
				}
			case onDead && inOutage(l.start) && l.streamed && l.replica != dead:
				// its first turn served after the fault
				if l.reason != "re-placed" {
					t.Errorf("conv %d turn %d, first served after its replica failed: %s; %s, want re-placed", c, l.turn, l.replica, l.reason)
				}
				f.replaced++
				onDead = false
			}
		}
		touched := false
		for _, l := range turns {
			if l.replica == dead || !l.streamed {
				touched = true
			}
		}
		if touched {
			continue
		}
		for _, l := range turns {
			if l.turn > 1 {
				f.survivorTurns++
				if l.reason == "sticky" && l.replica == prev {
					f.survivorSticky++
				} else {
					t.Errorf("survivor conv %d turn %d: %s; %s, was on %s", c, l.turn, l.replica, l.reason, prev)
				}
			}
			prev = l.replica
		}
	}
	return f
}

// startFaultStage loads the core snippet of docs/failures.md for model in front of
// dials (response_header_timeout rht, extra lines in the policy's block),
// runs eight agents through it for
// three seconds and starts watching the card of the busiest replica, the one
// a test then breaks. end stops the agents and the watch and waits for them;
// it may be called more than once.
func startFaultStage(t *testing.T, model string, dials []string, rht, extra string) (fr *faultRun, target int, w *outWatch, end func()) {
	t.Helper()
	loadSite(t, coreSite(model, dials, rht, extra))
	fr = &faultRun{t: t, url: siteURL, model: model}
	stop, stopWatch := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { fr.run(8, stop); close(done) }()
	var once sync.Once
	end = func() {
		once.Do(func() {
			close(stop)
			<-done
			close(stopWatch)
		})
	}
	t.Cleanup(end) // also when the test fails early: no client outlives it
	time.Sleep(3 * time.Second)
	target = busiest(t, model, dials)
	w = watchCard(t, model, dials[target], stopWatch)
	time.Sleep(50 * time.Millisecond)
	// The agents' conversations are short and tend to run in step: break
	// the replica while one of its conversations has turns left, so the
	// test sees one come back.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !midConversation(fr.turns(), dials[target]); {
		time.Sleep(2 * time.Millisecond)
	}
	return fr, target, w, end
}

// midConversation reports whether the latest turn answered by replica was
// complete and not among the last two of its conversation.
func midConversation(log []turnLog, replica string) bool {
	var last *turnLog
	for i := range log {
		if l := &log[i]; l.replica == replica && (last == nil || l.start.After(last.start)) {
			last = l
		}
	}
	return last != nil && last.complete && last.turn <= 4
}

// TestKilledReplicaMidStage kills one of four emulated replicas while eight
// agents keep their conversations going through Caddy with the README's core
// snippet (no health checks, no retries), then restarts it. fail_after is
// set far off, so that the replica can be out for its polls only by the rule
// that a refused poll takes it out at once (at its first failed poll, not
// after fail_after of them).
func TestKilledReplicaMidStage(t *testing.T) {
	emu, dials := startEmulator(t, 4, 20)
	fr, dead, w, end := startFaultStage(t, "killed", dials, "10m", "fail_after 1000")
	tKill := time.Now()
	if err := emu.Stop(dead); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("row of the killed replica at the end: %+v", cardRow(getCard(t, "killed"), dials[dead]))
		}
	}()
	waitFor(t, "the card to show the killed replica out", func() bool {
		out, _, _ := w.times()
		return !out.IsZero()
	})
	tOut, _, cause := w.times()
	t.Logf("shown out %v after the kill, for %v", tOut.Sub(tKill), cause)
	waitFor(t, "the killed replica out for its refused polls", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.seen["poll failure"]
	})
	// a conversation bound to the killed replica comes back (its agent
	// may have ended it: this turn is the test's own): answered elsewhere
	c, n := lastOn(fr.turns(), dials[dead], tKill)
	if c < 0 {
		t.Fatal("no turn answered by the replica before the kill")
	}
	if l := fr.sendTurn(context.Background(), c, n+1); !l.streamed || l.replica == dials[dead] {
		t.Errorf("conv %d turn %d, bound to the killed replica: %d %s; %s", c, n+1, l.status, l.replica, l.reason)
	}
	tRestart := time.Now()
	if err := emu.Restart(dead); err != nil {
		t.Fatal(err)
	}
	var tBack time.Time
	waitFor(t, "the restarted replica back in placement", func() bool {
		_, in, _ := w.times()
		tBack = in
		return !in.IsZero()
	})
	t.Logf("back %v after the restart", tBack.Sub(tRestart))
	// restarted, conversations are placed on it again: new ones, or those
	// re-placed from it (by load: the emptiest replica; which of them
	// comes first is the agents')
	waitFor(t, "a conversation placed on the restarted replica", func() bool {
		for _, l := range fr.turns() {
			if l.start.After(tBack) && l.replica == dials[dead] && (l.reason == "placed" || l.reason == "re-placed") && l.streamed {
				return true
			}
		}
		return false
	})
	end()
	// turns may go to it again from its restart on; a turn sent to it
	// before it was out met a refused dial: 502 at once
	f := checkFaultStage(t, fr.turns(), dials[dead], tKill, tOut, tRestart, http.StatusBadGateway, 0)
	t.Logf("outage turns %d, failed before streaming %d (late %d), re-placed %d, survivors sticky %d/%d",
		f.outage, f.earlyFails, f.lateFails, f.replaced, f.survivorSticky, f.survivorTurns)
	if f.replaced == 0 {
		t.Error("no conversation of the killed replica had a turn during the outage")
	}
}

// lastOn returns the conversation and turn of the latest turn replica
// answered that started before at; -1 when none.
func lastOn(log []turnLog, replica string, at time.Time) (conv, turn int) {
	conv = -1
	var last time.Time
	for _, l := range log {
		if l.replica == replica && l.streamed && l.start.Before(at) && l.start.After(last) {
			conv, turn, last = l.conv, l.turn, l.start
		}
	}
	return conv, turn
}

// TestHungReplicaMidStage makes one of four emulated replicas accept
// requests and never answer them (its /metrics still answers): the turns
// sent there time out after the configured response header timeout, and
// then no more are sent there. fail_cooldown outlasts the stage, so the
// replica stays out from its first failure to the stage's end. The
// response header timeout is 5 s: an emulated replica sends a stream's
// headers as it takes the turn, but on a loaded 2-core machine under the
// race detector a healthy one took over 1 s to get there (and was then
// taken out for it as the hung one is).
func TestHungReplicaMidStage(t *testing.T) {
	emu, dials := startEmulator(t, 4, 20)
	const rht = 5 * time.Second
	fr, hung, w, end := startFaultStage(t, "hung", dials, rht.String(), "fail_cooldown 10m")
	tHang := time.Now()
	if err := emu.SetRequestsHang(hung, true); err != nil {
		t.Fatal(err)
	}
	// its first turn times out after rht
	waitLong(t, "the card to show the hung replica out", rht+5*time.Second, func() bool {
		out, _, _ := w.times()
		return !out.IsZero()
	})
	tOut, _, cause := w.times()
	t.Logf("shown out %v after the hang, for %v", tOut.Sub(tHang), cause)
	// a stage's worth of turns routed while it is out (its conversations'
	// next turns may all have been their last: none need come back)
	waitFor(t, "40 turns started after the hung replica was out", func() bool {
		n := 0
		for _, l := range fr.turns() {
			if l.start.After(tOut) {
				n++
			}
		}
		return n >= 40
	})
	// the agents stop before the hang is cleared: a turn still held there
	// times out as the others did (the emulator answers the turns it
	// held with 503 when its hang is cleared)
	end()
	if err := emu.SetRequestsHang(hung, false); err != nil {
		t.Fatal(err)
	}
	stage := fr.turns()
	// a turn sent there before it was out waited response_header_timeout
	// for its headers and got 504
	f := checkFaultStage(t, stage, dials[hung], tHang, tOut, time.Time{}, http.StatusGatewayTimeout, rht)
	t.Logf("hang turns %d, failed before streaming %d (late %d), re-placed %d, survivors sticky %d/%d",
		f.outage, f.earlyFails, f.lateFails, f.replaced, f.survivorSticky, f.survivorTurns)
	if f.earlyFails == 0 {
		t.Error("no turn went to the hung replica: the stage tested nothing")
	}
}

// outMetric reads lm_warden_replica_out{model,replica,cause} and
// lm_warden_replica_available{model,replica} from the admin /metrics.
func outMetric(t *testing.T, model, replica string) (available float64, out map[string]float64) {
	t.Helper()
	fams := adminMetrics(t)
	labels := func(m *dto.Metric) map[string]string {
		out := map[string]string{}
		for _, l := range m.GetLabel() {
			out[l.GetName()] = l.GetValue()
		}
		return out
	}
	available = -1
	for _, m := range fams["lm_warden_replica_available"].GetMetric() {
		if l := labels(m); l["model"] == model && l["replica"] == replica {
			available = m.GetGauge().GetValue()
		}
	}
	out = map[string]float64{}
	for _, m := range fams["lm_warden_replica_out"].GetMetric() {
		if l := labels(m); l["model"] == model && l["replica"] == replica {
			out[l["cause"]] = m.GetGauge().GetValue()
		}
	}
	return available, out
}

// TestCardFollowsHealthCheck: when Caddy's active health check marks an
// upstream down (here its /metrics hangs past health_timeout while the
// poll's fail_after is far off), the card's available column, the reason
// and the metrics follow, no conversation is placed there, and all come
// back when the check passes again.
func TestCardFollowsHealthCheck(t *testing.T) {
	emu, dials := startEmulator(t, 3, 20)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model health
			max_num_seqs 32
			poll_interval 1s
			fail_after 1000
		}
		health_uri /metrics
		health_interval 100ms
		health_timeout 300ms
		health_fails 1
		health_passes 1
		flush_interval -1
	}`, strings.Join(dials, " ")))
	sick := dials[0]
	waitFor(t, "every replica available", func() bool {
		for _, r := range getCard(t, "health").Replicas {
			if !r.Available {
				return false
			}
		}
		return len(getCard(t, "health").Replicas) == 3
	})
	if err := emu.SetMetricsHang(0, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the card to show the replica out for its health check", func() bool {
		r := cardRow(getCard(t, "health"), sick)
		return !r.Available && strings.Join(r.Out, ",") == "health check"
	})
	if avail, out := outMetric(t, "health", sick); avail != 0 || out["health"] != 1 || out["poll"] != 0 || out["proxy"] != 0 {
		t.Errorf("metrics while out: available %v, out %v", avail, out)
	}
	fr := &faultRun{t: t, url: siteURL, model: "health"}
	for c := range 12 {
		if l := fr.sendTurn(context.Background(), c, 1); l.replica == sick || !l.streamed {
			t.Errorf("conversation %d while the replica is out: %d %s; %s", c, l.status, l.replica, l.reason)
		}
	}
	if err := emu.SetMetricsHang(0, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the card to show the replica back", func() bool {
		r := cardRow(getCard(t, "health"), sick)
		return r.Available && len(r.Out) == 0
	})
	if avail, out := outMetric(t, "health", sick); avail != 1 || out["health"] != 0 {
		t.Errorf("metrics when back: available %v, out %v", avail, out)
	}
	placed := false
	for c := 100; c < 112 && !placed; c++ {
		placed = fr.sendTurn(context.Background(), c, 1).replica == sick
	}
	if !placed {
		t.Error("no new conversation placed on the replica back in")
	}
}

// TestRetriesGoElsewhere: with lb_retries, a retry never picks a replica the
// request already failed on, and a replica that failed a dial is avoided by
// the next placements at once (before any poll can notice).
func TestRetriesGoElsewhere(t *testing.T) {
	emu, dials := startEmulator(t, 3, 20)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model retries
			max_num_seqs 32
			poll_interval 1h
		}
		lb_retries 2
		flush_interval -1
	}`, strings.Join(dials, " ")))
	fr := &faultRun{t: t, url: siteURL, model: "retries"}
	// the poller's first round done (every replica seen), its next an hour
	// off: the polls say nothing more, and only the failed dials can take
	// the stopped replicas out
	waitFor(t, "the first poll round", func() bool {
		c := getCard(t, "retries")
		for _, r := range c.Replicas {
			if r.LastSeen == nil {
				return false
			}
		}
		return len(c.Replicas) == len(dials)
	})
	if err := emu.Stop(1); err != nil {
		t.Fatal(err)
	}
	if err := emu.Stop(2); err != nil {
		t.Fatal(err)
	}
	for c := range 20 {
		l := fr.sendTurn(context.Background(), c, 1)
		if !l.streamed || l.replica != dials[0] {
			t.Fatalf("conversation %d: %d %s; %s, want served by the only live replica", c, l.status, l.replica, l.reason)
		}
	}
	c := getCard(t, "retries")
	var fails uint64
	for _, d := range dials[1:] {
		r := cardRow(c, d)
		fails += r.ProxyFailures
		if r.ProxyFailures > 0 && (r.Available || !slices.Contains(r.Out, "proxy errors")) {
			t.Errorf("%s after a failed dial: %+v", d, r)
		}
	}
	// at most one failed dial per dead replica: after it, placements avoid it
	if fails == 0 {
		t.Error("no placement tried a stopped replica: the test tested nothing")
	}
	if fails > 2 {
		t.Errorf("%d failed dials to the two stopped replicas, want at most one each", fails)
	}
}

// TestAdminWritesAreStrict: admin writes refuse trailing data with 400 and
// take a valid body of any reasonable size.
func TestAdminWritesAreStrict(t *testing.T) {
	fs := startFakes(t, 1)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("strict", "")))
	sendTurn(t, "/v1/messages", chatTurn("bound", 1, false), map[string]string{"X-Claude-Code-Session-Id": "bound"})
	long300 := "s300-" + strings.Repeat("a", 295)
	long300b := "s300b-" + strings.Repeat("b", 294)
	long4k := "s4k-" + strings.Repeat("c", 4092)
	for _, k := range []string{long300, long300b, long4k} {
		if r := sendTurn(t, "/v1/messages", chatTurn(k[:4], 1, false), map[string]string{"X-Claude-Code-Session-Id": k}); r.status != 200 {
			t.Fatalf("turn with a %d-byte key: %d", len(k), r.status)
		}
	}
	admin := fmt.Sprintf("http://localhost:%d/lm-warden/models/strict", testAdminPort)
	tests := []struct {
		name, method, path, body string
		want                     int
	}{
		{"trailing garbage", http.MethodPut, "/affinity", `{"affinity":true}garbage`, 400},
		{"second value", http.MethodPut, "/affinity", `{"affinity":true} {"affinity":false}`, 400},
		{"trailing garbage, POST", http.MethodPost, "/affinity", `{"affinity":false}]`, 400},
		{"not an object", http.MethodPut, "/affinity", `true`, 400},
		{"missing field", http.MethodPut, "/affinity", `{}`, 400},
		{"empty", http.MethodPut, "/affinity", ``, 400},
		{"too large", http.MethodPut, "/affinity", `{"affinity":true}` + strings.Repeat(" ", maxAdminBody), 413},
		{"unknown field", http.MethodPut, "/affinity", `{"affinity":true,"afinity":false}`, 400},
		{"unknown field, admission", http.MethodPut, "/admission", `{"admission":true,"wait":"1m"}`, 400},
		{"valid, padded past 4 KB", http.MethodPut, "/affinity", `{"affinity":` + strings.Repeat(" ", 8000) + `true}` + "\n", 200},
		{"valid, trailing white space", http.MethodPut, "/affinity", "{\"affinity\":true}\n\t ", 200},
		{"unbind with a body", http.MethodDelete, "/sessions/bound", `garbage`, 400},
		{"unbind", http.MethodDelete, "/sessions/bound", ``, 200},
		{"unbind a 300-byte key in full", http.MethodDelete, "/sessions/" + url.PathEscape(long300), ``, 200},
		{"unbind a 4 KB key in full", http.MethodDelete, "/sessions/" + url.PathEscape(long4k), ``, 200},
		{"unbind a long key by its stored form", http.MethodDelete, "/sessions/" + url.PathEscape(convkey.Compact(long300b)), ``, 200},
		{"unbind a long key not bound", http.MethodDelete, "/sessions/" + url.PathEscape(long4k), ``, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, admin+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Fatalf("%s %s: %d %s, want %d", tt.method, tt.path, resp.StatusCode, b, tt.want)
			}
			if resp.StatusCode == 404 && strings.Contains(string(b), "cccccccc") {
				t.Fatalf("the 404 repeats the key: %s", b)
			}
		})
	}
}
