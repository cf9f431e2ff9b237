package caddymodule

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Turns sent on kept-alive connections that the replica closes: the tests
// put a TCP proxy that closes or resets idle connections, as engines do,
// between Caddy and each emulated replica, and count the turns that fail.

// idleMode is what an idleProxy does to an idle connection.
type idleMode int

const (
	// closeIdle closes a connection (FIN) that has carried no byte
	// either way for the idle time, as uvicorn and cpp-httplib do.
	closeIdle idleMode = iota
	// resetStale resets a connection on which a request arrives after
	// the idle time without a byte, as a middlebox that forgot it does.
	resetStale
)

// idleProxy relays TCP connections to target, closing or resetting those
// left idle (see idleMode).
type idleProxy struct {
	ln     net.Listener
	target string
	idle   time.Duration
	mode   idleMode
	mu     sync.Mutex
	conns  map[*relayConn]struct{}
	closed bool
	// connections closed for idleness (closeIdle) or reset under a
	// request (resetStale)
	cut atomic.Int64
	wg  sync.WaitGroup
}

type relayConn struct {
	c, u net.Conn
	// mu orders a byte relayed against a close for idleness: the sweep
	// decides under it, so a request that arrives is either relayed
	// before the close is decided (and the connection is no longer idle)
	// or never relayed at all, as a server closing an idle connection
	// never starts a request it has not read
	mu         sync.Mutex
	closedIdle bool
	last       atomic.Int64 // unix nanoseconds of the last byte either way
	// the replica behind restarted: the connection is gone on its side
	// without a word to the client, whose next byte on it gets a reset
	dead atomic.Bool
	once sync.Once
}

func (rc *relayConn) close(reset bool) {
	rc.once.Do(func() {
		if reset {
			if tc, ok := rc.c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
		}
		rc.c.Close()
		rc.u.Close()
	})
}

func startIdleProxy(t *testing.T, target string, idle time.Duration, mode idleMode) *idleProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &idleProxy{ln: ln, target: target, idle: idle, mode: mode, conns: map[*relayConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	if mode == closeIdle {
		p.wg.Add(1)
		go p.sweep()
	}
	t.Cleanup(p.close)
	return p
}

func (p *idleProxy) addr() string { return p.ln.Addr().String() }

func (p *idleProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			// the replica is down: refuse as it would
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
			continue
		}
		rc := &relayConn{c: c, u: u}
		rc.last.Store(time.Now().UnixNano())
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			rc.close(false)
			return
		}
		p.conns[rc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(rc, rc.c, rc.u, true)
		go p.pump(rc, rc.u, rc.c, false)
	}
}

// pump copies from src to dst; up is the client-to-replica direction.
func (p *idleProxy) pump(rc *relayConn, src, dst net.Conn, up bool) {
	defer p.wg.Done()
	defer func() {
		if !up && rc.dead.Load() {
			// the replica's side went with its restart: the client
			// learns of it when it next sends
			return
		}
		rc.close(false)
		p.mu.Lock()
		delete(p.conns, rc)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			now := time.Now().UnixNano()
			if up && rc.dead.Load() || up && p.mode == resetStale && time.Duration(now-rc.last.Load()) > p.idle {
				p.cut.Add(1)
				rc.close(true)
				return
			}
			rc.mu.Lock()
			if rc.closedIdle {
				rc.mu.Unlock()
				return
			}
			rc.last.Store(now)
			rc.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// sweep closes the connections idle for longer than the idle time.
func (p *idleProxy) sweep() {
	defer p.wg.Done()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		now := time.Now().UnixNano()
		var idle []*relayConn
		for rc := range p.conns {
			if time.Duration(now-rc.last.Load()) >= p.idle {
				idle = append(idle, rc)
			}
		}
		p.mu.Unlock()
		for _, rc := range idle {
			rc.mu.Lock()
			// idle still: nothing was relayed since it was picked
			if time.Duration(time.Now().UnixNano()-rc.last.Load()) >= p.idle {
				rc.closedIdle = true
				p.cut.Add(1)
				rc.close(false)
			}
			rc.mu.Unlock()
		}
	}
}

// restarted drops the replica's side of every connection without telling
// the client, as a replica restarted with its host or container does: the
// client's next request on such a connection is reset.
func (p *idleProxy) restarted() {
	for _, rc := range p.open() {
		rc.dead.Store(true)
		rc.u.Close()
	}
}

// open returns the connections relayed now.
func (p *idleProxy) open() []*relayConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	all := make([]*relayConn, 0, len(p.conns))
	for rc := range p.conns {
		all = append(all, rc)
	}
	return all
}

// dropAll closes every connection.
func (p *idleProxy) dropAll() {
	for _, rc := range p.open() {
		rc.close(false)
	}
}

func (p *idleProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.dropAll()
	p.wg.Wait()
}

// spacedRun is the shape of a run: conversations conversations, each
// sending rounds turns, one every period, the conversations' turns
// spread over the first spread of each period; between two rounds (every
// turn of the round answered), between is called.
type spacedRun struct {
	conversations, rounds int
	period, spread        time.Duration
	between               func(round int, logs []turnLog)
}

// runSpaced runs the turns through the in-process Caddy and returns the
// turns that failed, with what they got.
func runSpaced(t *testing.T, prefix string, sr spacedRun) (sent int, failed []string, logs []turnLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	offsets := make([]time.Duration, sr.conversations)
	for c := range offsets {
		offsets[c] = time.Duration(rand.Int64N(int64(sr.spread) + 1))
	}
	var mu sync.Mutex
	start := time.Now()
	for round := 1; round <= sr.rounds; round++ {
		roundStart := start.Add(time.Duration(round-1) * sr.period)
		var wg sync.WaitGroup
		for c := 0; c < sr.conversations; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if d := time.Until(roundStart.Add(offsets[c])); d > 0 {
					time.Sleep(d)
				}
				l := streamTurn(ctx, siteURL, "qwen3-4b", fmt.Sprintf("%s-%d", prefix, c), round, nil)
				l.conv = c
				mu.Lock()
				defer mu.Unlock()
				sent++
				logs = append(logs, l)
				if !l.complete {
					failed = append(failed, fmt.Sprintf("conversation %d turn %d: status %d (route %s; %s)", c, round, l.status, l.replica, l.reason))
				}
			}()
		}
		wg.Wait()
		if sr.between != nil && round < sr.rounds {
			sr.between(round, logs)
		}
	}
	return sent, failed, logs
}

// replayCase runs one case: three emulated replicas, each behind an
// idleProxy, the core snippet of docs/failures.md in front. wantReplays: the case
// must make the handler send turns again (every kept-alive connection is
// reset or dropped under the next request).
func replayCase(t *testing.T, idle time.Duration, mode idleMode, sr spacedRun, restartEvery int, wantReplays bool) {
	emu, dials := startEmulator(t, 3, 50)
	proxies := make([]*idleProxy, len(dials))
	var front []string
	for i, d := range dials {
		proxies[i] = startIdleProxy(t, d, idle, mode)
		front = append(front, proxies[i].addr())
	}
	model := "replay-" + strings.ReplaceAll(t.Name(), "/", "-")
	loadSite(t, coreSite(model, front, "30s", ""))
	var restarts int
	if restartEvery > 0 {
		served := make([]int, len(dials))
		sr.between = func(round int, logs []turnLog) {
			// a replica that has answered restartEvery turns since it
			// last started is restarted (its engine stopped and
			// started, its connections closed); no turn is in flight
			for i, p := range proxies {
				n := 0
				for _, l := range logs {
					if l.replica == p.addr() {
						n++
					}
				}
				if n-served[i] >= restartEvery {
					served[i] = n
					p.restarted()
					if err := emu.Stop(i); err != nil {
						t.Fatal(err)
					}
					if err := emu.Restart(i); err != nil {
						t.Fatal(err)
					}
					restarts++
				}
			}
		}
	}
	sent, failed, logs := runSpaced(t, model, sr)
	var cut int64
	for _, p := range proxies {
		cut += p.cut.Load()
	}
	// a turn moved for its replica's failure is re-placed (moves for
	// load, spilled, and after a restart, cold-replaced, are the
	// policy's own)
	moved := 0
	reasons := map[string]int{}
	for _, l := range logs {
		reasons[l.reason]++
		if l.reason == "re-placed" {
			moved++
		}
	}
	t.Logf("%d turns, %d failed, %d re-placed; %d connections closed or reset by the replicas' proxies; %d restarts; reasons %v", sent, len(failed), moved, cut, restarts, reasons)
	for i, f := range failed {
		if i < 10 {
			t.Error(f)
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d turns failed", len(failed), sent)
	}
	if moved > 0 && restartEvery == 0 {
		// (with restarts, a poll can meet the moment the engine is
		// down: that is the poller's business, not a turn's; the
		// proxy failures below are the turns')
		t.Errorf("%d turns re-placed: their replica was out", moved)
	}
	// each turn counted once, however often it was sent: routed once in
	// the counters, its replays counted apart
	if n := modelCounterSum(t, "lm_warden_requests_total", model); n != float64(sent) {
		byReason := map[string]float64{}
		for _, m := range adminMetrics(t)["lm_warden_requests_total"].GetMetric() {
			if labelOf(m.GetLabel(), "model") == model {
				byReason[labelOf(m.GetLabel(), "reason")] += m.GetCounter().GetValue()
			}
		}
		t.Errorf("lm_warden_requests_total %v for %d turns: by reason %v, the turns' own %v", n, sent, byReason, reasons)
	}
	replays := modelCounterSum(t, "lm_warden_replays_total", model)
	var onCard uint64
	for _, r := range getCard(t, model).Replicas {
		onCard += r.Replays
	}
	t.Logf("%v replays (card %d)", replays, onCard)
	if float64(onCard) != replays {
		t.Errorf("the card counts %d replays, lm_warden_replays_total %v", onCard, replays)
	}
	if wantReplays && replays == 0 {
		t.Error("no turn was replayed: the case tested nothing")
	}
	for _, p := range proxies {
		avail, out := outMetric(t, model, p.addr())
		if avail != 1 || len(out) > 0 && sum(out) > 0 {
			t.Errorf("replica %s: available %v, out %v: a closed connection took it out", p.addr(), avail, out)
		}
		if f := replicaCounter(t, "lm_warden_proxy_failures_total", model, p.addr()); f != 0 {
			t.Errorf("replica %s: %v proxy failures counted", p.addr(), f)
		}
	}
}

func sum(m map[string]float64) (s float64) {
	for _, v := range m {
		s += v
	}
	return s
}

// modelCounterSum sums a counter's samples of one model from the admin
// /metrics, over every other label.
func modelCounterSum(t *testing.T, name, model string) (sum float64) {
	t.Helper()
	for _, m := range adminMetrics(t)[name].GetMetric() {
		if labelOf(m.GetLabel(), "model") == model {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// replicaCounter reads a counter of one replica from the admin /metrics.
func replicaCounter(t *testing.T, name, model, replica string) float64 {
	t.Helper()
	for _, m := range adminMetrics(t)[name].GetMetric() {
		if labelOf(m.GetLabel(), "model") == model && labelOf(m.GetLabel(), "replica") == replica {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestReplicaClosingIdleConnectionsCostsNoTurn: replicas that close every
// connection idle for 1 s, turns 1.5 s apart on kept-alive connections:
// every turn is answered, none moves, no replica is taken out.
func TestReplicaClosingIdleConnectionsCostsNoTurn(t *testing.T) {
	replayCase(t, time.Second, closeIdle, spacedRun{conversations: 40, rounds: 5, period: 1500 * time.Millisecond, spread: time.Second}, 0, false)
}

// TestRestartedReplicaCostsNoTurn: as above, and every replica restarted
// after every 10 turns it answered, between turns, as a container or host
// restarts: its engine starts empty and the connections the proxy kept are
// gone on its side, unannounced, so the next request on each is reset.
func TestRestartedReplicaCostsNoTurn(t *testing.T) {
	replayCase(t, time.Second, closeIdle, spacedRun{conversations: 40, rounds: 5, period: 1500 * time.Millisecond, spread: time.Second}, 10, true)
}

// TestReplicaResettingStaleConnectionsCostsNoTurn: replicas that reset a
// request arriving on a connection idle for more than 1.5 s, turns about
// 1.8 s apart, so that nearly every kept-alive connection is reset when
// used again.
func TestReplicaResettingStaleConnectionsCostsNoTurn(t *testing.T) {
	replayCase(t, 1500*time.Millisecond, resetStale, spacedRun{conversations: 40, rounds: 5, period: 1800 * time.Millisecond, spread: 100 * time.Millisecond}, 0, true)
}

// TestReplicaClosingAfterTwoSecondsCostsNoTurn: replicas that close a
// connection idle for 2 s, turns 2 s apart.
func TestReplicaClosingAfterTwoSecondsCostsNoTurn(t *testing.T) {
	replayCase(t, 2*time.Second, closeIdle, spacedRun{conversations: 40, rounds: 5, period: 2 * time.Second, spread: 300 * time.Millisecond}, 0, false)
}
