package bench

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// TestTraceReplayPeers replays the recorded Claude Code fixture under every
// peer router's policy: every turn sent in its conversation and order with
// its recorded sizes, answered, and the stage named after the peer's
// policy.
func TestTraceReplayPeers(t *testing.T) {
	turns, err := ReadTraceFiles(traceFixture)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range PeerModes {
		t.Run(mode, func(t *testing.T) {
			st, got := replayTrace(t, traceSimConfig(), turns, TraceOptions{SharedTokens: SharedAuto}, mode)
			checkReplay(t, mode, turns, st, got)
			if st.Mode != mode || st.Policy != "sim:"+mode {
				t.Errorf("stage %s policy %s, want %s and sim:%s", st.Mode, st.Policy, mode, mode)
			}
		})
	}
}

// replicasOf returns, per conversation, the replicas its turns ran on in
// turn order.
func replicasOf(got []replayedTurn) map[string][]string {
	out := map[string][]string{}
	idx := map[string][]int{}
	for _, g := range got {
		out[g.conv] = append(out[g.conv], g.replica)
		idx[g.conv] = append(idx[g.conv], g.idx)
	}
	for c, ix := range idx { // in turn order, not the order they ended
		r := make([]string, len(ix))
		for k, i := range ix {
			r[i] = out[c][k]
		}
		out[c] = r
	}
	return out
}

// TestTraceReplayPeerBehaviour shows that a peer mode's replay is its own
// policy's, not LM Warden's under its name: production-stack puts every
// turn of a conversation on the replica its hash ring gives the
// conversation's session (its parent's for a sub-agent; computed here from
// the ring alone), vllm-router's
// sticky_least_loaded keeps every conversation where it started (100 %
// stayed), and both place the fixture's conversations differently from
// LM Warden's on.
func TestTraceReplayPeerBehaviour(t *testing.T) {
	turns, err := ReadTraceFiles(traceFixture)
	if err != nil {
		t.Fatal(err)
	}
	cfg := traceSimConfig()
	opt := TraceOptions{SharedTokens: SharedAuto}
	_, on := replayTrace(t, cfg, turns, opt, ModeOn)
	onAt := replicasOf(on)

	names := make([]string, cfg.Replicas)
	for i := range names {
		names[i] = fmt.Sprintf("replica-%d", i)
	}
	ring := peers.NewSessionRing(peers.Config{Replicas: names})
	// the session header: a sub-agent sends its parent's
	session := map[string]string{}
	for _, tr := range turns {
		if tr.Parent != "" {
			session[tr.Conv] = tr.Parent
		} else if session[tr.Conv] == "" {
			session[tr.Conv] = tr.Conv
		}
	}
	st, got := replayTrace(t, cfg, turns, opt, peers.ModeProdStack)
	ps := replicasOf(got)
	for conv, reps := range ps {
		want := names[ring.Owner("trace-"+session[conv])]
		for i, r := range reps {
			if r != want {
				t.Errorf("production-stack: conversation %s turn %d on %s, want its ring owner %s", conv, i, r, want)
			}
		}
	}
	if st.StayedPct != 100 {
		t.Errorf("production-stack: %.1f %% stayed, want 100", st.StayedPct)
	}
	if fmt.Sprint(ps) == fmt.Sprint(onAt) {
		t.Errorf("production-stack placed every turn as on did: %v", ps)
	}

	st, got = replayTrace(t, cfg, turns, opt, peers.ModeSticky)
	if st.StayedPct != 100 {
		t.Errorf("vllm-router: %.1f %% stayed, want 100 (sticky by session)", st.StayedPct)
	}
	for conv, reps := range replicasOf(got) {
		for i, r := range reps {
			if r != reps[0] {
				t.Errorf("vllm-router: conversation %s turn %d on %s, its first on %s", conv, i, r, reps[0])
			}
		}
	}
}

// TestTraceReplayThunderHolds: ThunderAgent pauses programs when a
// worker's KV pool is nearly full of them; their next turns wait at the
// router until a tick resumes them, and are then sent and answered. Four
// conversations of 5000-token prompts on one replica of 16,000 tokens of
// KV: over the 0.95 pause threshold, so the scheduler pauses the smallest.
func TestTraceReplayThunderHolds(t *testing.T) {
	var turns []turntrace.Turn
	for i := range 4 {
		conv := fmt.Sprintf("c%d", i)
		turns = append(turns, tturn(conv, time.Duration(i)*100*time.Millisecond, 0, 5000+int64(i)*100, 20, first))
	}
	for k := 1; k < 4; k++ {
		for i := range 4 {
			conv := fmt.Sprintf("c%d", i)
			turns = append(turns, tturn(conv, time.Duration(k)*20*time.Second+time.Duration(i)*100*time.Millisecond, 8000, 5000+int64(i)*100+int64(k)*100, 20, nil))
		}
	}
	cfg := DefaultSimConfig()
	cfg.Replicas = 1
	cfg.Engine.NumGPUBlocks = 1000 // 16,000 tokens
	st, got := replayTrace(t, cfg, turns, TraceOptions{}, peers.ModeThunder)
	checkReplay(t, peers.ModeThunder, turns, st, got)
	held := 0
	for _, g := range got {
		if g.routed > g.sent {
			held++
		}
	}
	if held == 0 {
		t.Fatalf("no turn held at the router; sent and routed: %+v", got)
	}
	// LM Warden's on, on the same trace, holds none (admission is off)
	_, on := replayTrace(t, cfg, turns, TraceOptions{}, ModeOn)
	for _, g := range on {
		if g.routed > g.sent {
			t.Errorf("on held %s turn %d", g.conv, g.idx)
		}
	}
}

// TestTraceModes: a replay runs every mode, the peers' included, unless
// told which; and a mode it cannot run is refused, never replaced.
func TestTraceModes(t *testing.T) {
	all := AllModes()
	for _, m := range append(append([]string{}, CompareModes...), PeerModes...) {
		found := false
		for _, a := range all {
			found = found || a == m
		}
		if !found {
			t.Errorf("AllModes lacks %s", m)
		}
	}
	turns := []turntrace.Turn{tturn("a", 0, 0, 100, 1, first)}
	cfg := DefaultSimConfig()
	cfg.Modes = nil
	rep, err := SimTrace(cfg, turns, TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Stages) != len(all) {
		t.Fatalf("%d stages, want one per mode (%d)", len(rep.Stages), len(all))
	}
	for i, st := range rep.Stages {
		if st.Mode != all[i] || st.Requests != 1 {
			t.Errorf("stage %d: %s with %d requests, want %s with 1", i, st.Mode, st.Requests, all[i])
		}
	}
	for _, bad := range []string{"sglang", "vllm_router", ""} {
		_, _, err := replayMode(cfg, turns, TraceOptions{Limit: time.Hour}, bad)
		if err == nil || !strings.Contains(err.Error(), "unknown mode") {
			t.Errorf("mode %q: error %v, want it refused", bad, err)
		}
	}
}
