package bench

import (
	"bytes"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

func shortSim() SimConfig {
	cfg := DefaultSimConfig()
	cfg.Stages = []int{4, 8}
	cfg.StageLength = 90 * time.Second
	cfg.Warmup = 20 * time.Second
	return cfg
}

func TestSimDirection(t *testing.T) {
	cfg := shortSim()
	// every mode but admit, which TestSimAdmission covers
	cfg.Modes = []string{ModeVLLMDP, ModeOff, ModeOn, ModeLifecycle, ModeLeastConn, ModeRoundRobin, ModeHeader}
	rep := simLogged(t, cfg)
	for _, n := range cfg.Stages {
		off, _ := rep.Find(ModeVLLMDP, n)
		on, _ := rep.Find(ModeOn, n)
		if off.Requests == 0 || on.Requests == 0 {
			t.Fatalf("%d sessions: no requests (off %d, on %d)", n, off.Requests, on.Requests)
		}
		if on.Errors != 0 || off.Errors != 0 {
			t.Errorf("%d sessions: errors off %d on %d", n, off.Errors, on.Errors)
		}
		if on.PrefixHitPct < off.PrefixHitPct {
			t.Errorf("%d sessions: prefix hits on %.1f%% < off %.1f%%", n, on.PrefixHitPct, off.PrefixHitPct)
		}
		if on.StayedPct != 100 {
			t.Errorf("%d sessions: stayed %.1f%% with affinity on at low load, want 100", n, on.StayedPct)
		}
		if on.TTFBP50S > off.TTFBP50S {
			t.Errorf("%d sessions: TTFB p50 on %.2fs > off %.2fs", n, on.TTFBP50S, off.TTFBP50S)
		}
		if off.StayedPct >= 60 {
			t.Errorf("%d sessions: vLLM's balancer kept %.1f%% of turns on their replica; its stale, tied picks should scatter them", n, off.StayedPct)
		}
		if h, _ := rep.Find(ModeHeader, n); h.StayedPct != 100 {
			t.Errorf("%d sessions: header hash stayed %.1f%%, want 100", n, h.StayedPct)
		}
		// In a closed loop without think time, the least-loaded replica
		// is usually the one the turn just left (its request finished),
		// so least_conn and LM Warden's affinity off return there by
		// accident; round robin cannot, except when as many sessions as
		// replicas run in lockstep (same sizes, same start): then a fresh
		// counter deals each session the same replica every round.
		b, _ := rep.Find(ModeRoundRobin, n)
		if b.PrefixHitPct > on.PrefixHitPct || (n > cfg.Replicas && b.PrefixHitPct >= on.PrefixHitPct) {
			t.Errorf("%d sessions: round_robin prefix hits %.1f%%, affinity on %.1f%%", n, b.PrefixHitPct, on.PrefixHitPct)
		}
	}
}

// TestSimSevenGPUStory checks the direction of the 7-GPU story on
// shortened stages: hashing the session ID is sticky but blind to load, so
// at 26 sessions it leaves replicas idle, and placing by load keeps more of
// the prompt cached.
func TestSimSevenGPUStory(t *testing.T) {
	sweep(t)
	cfg := SevenGPUSimConfig()
	// 8-minute stages: in 4 the hash's luck with 26 session IDs decides
	cfg.StageLength, cfg.Warmup = 8*time.Minute, time.Minute
	rep := simLogged(t, cfg)
	h26, _ := rep.Find(ModeHeader, 26)
	on26, _ := rep.Find(ModeOn, 26)
	if h26.ReplicasBusy >= on26.ReplicasBusy || h26.ReplicasBusy > 6 {
		t.Errorf("26 sessions: header hash keeps %.2f replicas busy, affinity on %.2f; want idle replicas under the hash", h26.ReplicasBusy, on26.ReplicasBusy)
	}
	for _, n := range cfg.Stages {
		h, _ := rep.Find(ModeHeader, n)
		on, _ := rep.Find(ModeOn, n)
		if on.PrefixHitPct <= h.PrefixHitPct || on.OutputTokensPerMin <= h.OutputTokensPerMin {
			t.Errorf("%d sessions: on %.1f%% / %.0f tok/min vs header %.1f%% / %.0f tok/min", n, on.PrefixHitPct, on.OutputTokensPerMin, h.PrefixHitPct, h.OutputTokensPerMin)
		}
	}
	on16, _ := rep.Find(ModeOn, 16)
	if on16.PrefixHitPct <= on26.PrefixHitPct {
		t.Errorf("cutting to 16 sessions did not raise the cached share: %.1f%% vs %.1f%% at 26", on16.PrefixHitPct, on26.PrefixHitPct)
	}
}

func TestSimDeterministic(t *testing.T) {
	cfg := shortSim()
	cfg.Stages = []int{4}
	cfg.StageLength = 40 * time.Second
	cfg.Modes = CompareModes
	a, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Stages {
		if a.Stages[i] != b.Stages[i] {
			t.Errorf("stage %d differs between runs:\n%+v\n%+v", i, a.Stages[i], b.Stages[i])
		}
	}
}

// TestSimModesIndependent: a mode's figures do not depend on the other
// modes run beside it.
func TestSimModesIndependent(t *testing.T) {
	cfg := shortSim()
	cfg.StageLength = 40 * time.Second
	cfg.Modes = []string{ModeOn}
	alone, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Modes = []string{ModeVLLMDP, ModeAdmit, ModeOn}
	beside, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(beside.Stages) != 3*len(cfg.Stages) {
		t.Fatalf("%d stages, want %d", len(beside.Stages), 3*len(cfg.Stages))
	}
	for i, n := range cfg.Stages {
		for j, m := range cfg.Modes {
			if st := beside.Stages[3*i+j]; st.Mode != m || st.Sessions != n {
				t.Errorf("stage %d is %s at %d sessions, want %s at %d", 3*i+j, st.Mode, st.Sessions, m, n)
			}
		}
		a, _ := alone.Find(ModeOn, n)
		b, _ := beside.Find(ModeOn, n)
		if a.Requests == 0 || a != b {
			t.Errorf("%d sessions: on alone\n%+v\nbeside vllm-dp and admit\n%+v", n, a, b)
		}
	}
}

// TestSimOverloadIsKVBound pins down why TTFB is high past the KV cache
// (the reference measurement's open question at 24 and 32 sessions): vLLM runs only what
// fits in KV, far below the spill threshold, the rest queue, preemptions
// are common, and only the shared system prompt survives until a
// conversation's next turn — for affinity off and on alike. It also checks
// that SpillWaiting leaves low load alone.
func TestSimOverloadIsKVBound(t *testing.T) {
	cfg := DefaultSimConfig()
	cfg.Stages = []int{24}
	cfg.Modes = []string{ModeVLLMDP, ModeOn} // the policies without admission
	cfg.StageLength, cfg.Warmup = 90*time.Second, 30*time.Second
	var details []SimDetail
	cfg.Detail = func(d SimDetail) { details = append(details, d) }
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, d := range details {
		WriteSimDetail(&b, d)
	}
	t.Logf("\n%s", b.String())
	if len(details) != len(cfg.Modes) {
		t.Fatalf("%d details for %d modes", len(details), len(cfg.Modes))
	}
	threshold := max(1, cfg.Placement.MaxNumSeqs/4)
	sys := float64(emulatorTokens(t, cfg))
	for _, d := range details {
		for _, r := range d.Replicas {
			if r.Running >= float64(threshold) || r.Waiting < 1 || r.KV < 0.7 {
				t.Errorf("%s %s: running %.2f waiting %.2f KV %.2f; want KV-bound (running < %d, a queue, KV ≥ 70%%)", d.Mode, r.ID, r.Running, r.Waiting, r.KV, threshold)
			}
		}
		if d.QueueS < 5 || d.Preempted < 0.3 {
			t.Errorf("%s: queue %.2fs, preempted %.0f%%; want turns mostly waiting for KV", d.Mode, d.QueueS, 100*d.Preempted)
		}
		if d.CachedTokens > sys*1.2 {
			t.Errorf("%s: %.0f cached tokens per turn, more than the %.0f-token system prompt; the working set should not fit", d.Mode, d.CachedTokens, sys)
		}
	}
	off, _ := rep.Find(ModeVLLMDP, 24)
	on, _ := rep.Find(ModeOn, 24)
	if d := on.PrefixHitPct - off.PrefixHitPct; d > 5 || d < -5 {
		t.Errorf("prefix hits off %.1f%% on %.1f%%: expected a tie past the KV cache", off.PrefixHitPct, on.PrefixHitPct)
	}

	// SpillWaiting does not move conversations at low load.
	low := shortSim()
	low.Stages = []int{4}
	low.Modes = []string{ModeOn}
	low.Placement.SpillWaiting = 2
	lr, err := Sim(low)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := lr.Find(ModeOn, 4); st.StayedPct != 100 {
		t.Errorf("4 sessions with SpillWaiting 2: stayed %.1f%%, want 100", st.StayedPct)
	}
}

// emulatorTokens is the length of the rendered system prompt in tokens.
func emulatorTokens(t *testing.T, cfg SimConfig) int {
	t.Helper()
	gen, err := NewGenerator(cfg.Workload, emulator.CountTokens)
	if err != nil {
		t.Fatal(err)
	}
	return len(emulator.Tokenize(emulator.RenderMessage("system", gen.System())))
}

// calibrationCell is one cell of the reference measurement's table (4 ×
// RTX A4000, Qwen3-4B, vLLM data-parallel 4) beside the simulator's value
// for it, with the default configuration.
type calibrationCell struct {
	sessions int
	column   string
	ref      float64 // the reference measurement
	sim      float64 // pinned: the simulator's value when the test was written
	// within35 says the simulator is within ±35 % of the reference. Cells
	// outside it are explained in TestSimCalibration's comment.
	within35 bool
}

// TestSimCalibration pins the calibration of the default sweep (closed loop
// without think time, 3-minute stages after 30 s of warm-up) against the
// reference measurement, for vLLM's own balancer ("off" there) and for
// LM Warden with affinity on. Each mode runs on replicas of its own, so
// vLLM's balancer's cells do not move when LM Warden's placement changes. Every cell must stay within ±15 % of its
// pinned value, and cells marked within35 within ±35 % of the reference.
//
// The cells outside ±35 % and why, with the emulator following vLLM's
// scheduler (vllm/v1/core/sched/scheduler.py, Scheduler.schedule) and KV
// cache manager (vllm/v1/core/kv_cache_manager.py, allocate_slots):
//
//   - TTFB p50 at 24 and 32 sessions is 3–4× the reference's, and p95 is
//     half of it; at 16 sessions, the same in a smaller measure (p50 1.7×
//     with vLLM's balancer, p95 two thirds in both modes). With 36,800 tokens of KV per engine and prompts of
//     12–14k, at most two prompts are resident; the rest wait at the head
//     of a first-come-first-served waiting queue (schedule() breaks out of
//     the waiting loop when allocate_slots returns None, and admits nothing
//     in a step that preempted: "if not preempted_reqs"), and a preempted
//     request goes back to the front (prepend_request). That makes the wait
//     uniform: by Little's law the mean TTFB is sessions per engine ÷
//     throughput minus generation time, about 22 s at 24 sessions. The
//     reference's 5 s median with a 59 s tail needs most turns admitted
//     and prefilled on arrival, i.e. more resident sequences than the KV
//     cache holds under these rules; its 89 % / 67 % stayed with LM Warden
//     (spills, so more than 8 running requests on a replica) says the same.
//   - Output tok/min at 32 sessions: the reference rises 63 % from 24 to 32
//     sessions at the same hit rate; past the KV limit vLLM's throughput is
//     set by the resident sequences and the step time, so more sessions add
//     only queue. The simulator stays flat.
//   - TTFB p95 at 8 sessions with vLLM's balancer (3.35 s vs 6.32 s): a
//     cold 11k prefill takes ≈2.5 s on the engine; the reference's tail
//     has two cold prefills meeting on one engine more often than the
//     simulated balancer sends them there.
//   - TTFB with affinity on at 16 sessions (3.7 s vs 0.85 s p50): four
//     13k sessions per replica (52k tokens) do not fit 36,800 tokens, so
//     a third of the turns queue for KV as at 24; the reference's replicas
//     held them.
//   - TTFB at low load with affinity on (0.16 s vs 0.38 s p50): a warm turn
//     is 400–650 new tokens, 0.14 s on the engine; the rest of the
//     reference's time is outside the engine (HTTP, chat template,
//     tokenisation of a 12k-token prompt), which the simulator does not
//     model. p95 at 8 sessions is short for the same reason plus fewer
//     cold prefills queued behind each other.
func TestSimCalibration(t *testing.T) {
	sweep(t)
	cfg := DefaultSimConfig()
	cfg.Modes = []string{ModeVLLMDP, ModeOn} // the reference measurement's two
	rep := simLogged(t, cfg)
	get := func(mode string, n int, col string) float64 {
		st, ok := rep.Find(mode, n)
		if !ok {
			t.Fatalf("no %s stage at %d sessions", mode, n)
		}
		switch col {
		case "hits":
			return st.PrefixHitPct
		case "p50":
			return st.TTFBP50S
		case "p95":
			return st.TTFBP95S
		case "tok/min":
			return st.OutputTokensPerMin
		}
		t.Fatalf("unknown column %q", col)
		return 0
	}
	tables := map[string][]calibrationCell{
		ModeVLLMDP: {
			{4, "hits", 56.2, 55.7, true}, {4, "p50", 2.05, 2.06, true}, {4, "p95", 3.5, 3.36, true}, {4, "tok/min", 5886, 5035, true},
			{8, "hits", 44.3, 58.0, true}, {8, "p50", 2.33, 2.12, true}, {8, "p95", 6.32, 3.75, false}, {8, "tok/min", 8364, 8448, true},
			{16, "hits", 33.2, 44.6, true}, {16, "p50", 3.25, 5.48, false}, {16, "p95", 26.24, 16.8, false}, {16, "tok/min", 9558, 9813, true},
			{24, "hits", 32.8, 28.0, true}, {24, "p50", 5.06, 22.5, false}, {24, "p95", 58.82, 24.6, false}, {24, "tok/min", 9048, 8875, true},
			{32, "hits", 31.6, 27.7, true}, {32, "p50", 12.32, 37.6, false}, {32, "p95", 82.84, 46.9, false}, {32, "tok/min", 14760, 8533, false},
		},
		ModeOn: {
			{4, "hits", 86.4, 87.4, true}, {4, "p50", 0.38, 0.16, false}, {4, "p95", 2.84, 2.06, true}, {4, "tok/min", 6744, 6229, true},
			{8, "hits", 86.1, 87.3, true}, {8, "p50", 0.48, 0.17, false}, {8, "p95", 5.03, 2.10, false}, {8, "tok/min", 10752, 10325, true},
			{16, "hits", 48.6, 64.0, true}, {16, "p50", 0.85, 3.74, false}, {16, "p95", 24.88, 16.0, false}, {16, "tok/min", 12204, 10923, true},
			{24, "hits", 37.9, 28.0, true}, {24, "p50", 13.14, 22.3, false}, {24, "p95", 38.34, 23.3, false}, {24, "tok/min", 11178, 8875, true},
			{32, "hits", 31.6, 27.8, true}, {32, "p50", 27.66, 38.8, false}, {32, "p95", 38.92, 42.0, true}, {32, "tok/min", 16638, 8277, false},
		},
	}
	for mode, cells := range tables {
		for _, c := range cells {
			got := get(mode, c.sessions, c.column)
			if d := got/c.sim - 1; d > 0.15 || d < -0.15 {
				t.Errorf("%s %d sessions %s: %.3g, pinned %.3g (%+.0f%%); recalibrate and update the table", mode, c.sessions, c.column, got, c.sim, 100*d)
			}
			d := got/c.ref - 1
			if c.within35 && (d > 0.35 || d < -0.35) {
				t.Errorf("%s %d sessions %s: %.3g vs the reference's %.3g (%+.0f%%), outside ±35%%", mode, c.sessions, c.column, got, c.ref, 100*d)
			}
			if !c.within35 && d <= 0.35 && d >= -0.35 {
				t.Logf("%s %d sessions %s: %.3g now within ±35%% of %.3g; mark it", mode, c.sessions, c.column, got, c.ref)
			}
		}
	}
}

// lifecycleSim is shortSim with affinity on, with and without the lifecycle
// checks, collecting each stage's detail.
func lifecycleSim(t *testing.T, events bool, think time.Duration) (*Report, map[string][]SimDetail) {
	t.Helper()
	cfg := shortSim()
	cfg.Modes = []string{ModeOn, ModeLifecycle}
	cfg.Workload.Think = think
	if events {
		cfg.Workload.CompactShare, cfg.Workload.CompactAfter, cfg.Workload.CompactTokens = 0.2, 3, 800
		cfg.RestartAt, cfg.RestartReplica = 50*time.Second, 1
	}
	details := map[string][]SimDetail{}
	cfg.Detail = func(d SimDetail) { details[d.Mode] = append(details[d.Mode], d) }
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Logf("events %v\n%s", events, b.String())
	return rep, details
}

// TestSimLifecycle pins how the sim drives the router in the lifecycle
// mode: without compaction or restarts nothing is placed anew (no false
// restarts, no false cold bindings) and hits match affinity on; with them,
// compacted conversations are placed anew (restarted), while affinity on
// without the checks keeps every binding. A restart's bindings are found
// cold only when idle since the poll before it: in the closed loop every
// conversation on the replica resends its turn at once and refills its
// cache there, so none is; with agents pausing between turns some are.
func TestSimLifecycle(t *testing.T) {
	rep, det := lifecycleSim(t, false, 0)
	for i, n := range []int{4, 8} {
		on, _ := rep.Find(ModeOn, n)
		lc, _ := rep.Find(ModeLifecycle, n)
		if d := det[ModeLifecycle][i]; d.Restarted != 0 || d.ColdReplaced != 0 {
			t.Errorf("%d sessions, no events: %d restarted, %d cold-replaced turns, want none", n, d.Restarted, d.ColdReplaced)
		}
		if lc.StayedPct != 100 || lc.Errors != 0 {
			t.Errorf("%d sessions, no events: lifecycle stayed %.1f%% with %d errors, want 100%% and none", n, lc.StayedPct, lc.Errors)
		}
		if diff := lc.PrefixHitPct - on.PrefixHitPct; diff < -1.5 || diff > 1.5 {
			t.Errorf("%d sessions, no events: prefix hits lifecycle %.1f%% vs on %.1f%%, want within 1.5 points", n, lc.PrefixHitPct, on.PrefixHitPct)
		}
	}

	rep, det = lifecycleSim(t, true, 0)
	restarted, cold := 0, 0
	for i, n := range []int{4, 8} {
		if d := det[ModeOn][i]; d.Restarted != 0 || d.ColdReplaced != 0 {
			t.Errorf("%d sessions, affinity on: %d restarted, %d cold-replaced turns, want none without the checks", n, d.Restarted, d.ColdReplaced)
		}
		d := det[ModeLifecycle][i]
		restarted += d.Restarted
		cold += d.ColdReplaced
		for _, m := range []string{ModeOn, ModeLifecycle} {
			if st, _ := rep.Find(m, n); st.Requests == 0 {
				t.Errorf("%d sessions, %s: no requests", n, m)
			}
		}
	}
	if restarted == 0 || cold != 0 {
		t.Errorf("lifecycle with compaction and a restart, closed loop: %d restarted, %d cold-replaced turns, want restarted and no cold", restarted, cold)
	}

	_, det = lifecycleSim(t, true, 20*time.Second)
	cold = 0
	for _, d := range det[ModeLifecycle] {
		cold += d.ColdReplaced
	}
	if cold == 0 {
		t.Error("lifecycle with a restart and agents pausing 20 s between turns: no binding found cold")
	}
}

func TestSimRestartLosesTurns(t *testing.T) {
	cfg := shortSim()
	cfg.Stages = []int{8}
	cfg.Modes = []string{ModeVLLMDP, ModeOn}
	cfg.RestartAt = 50 * time.Second
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range cfg.Modes {
		// With 8 sessions on 4 replicas, the restarted replica is serving
		// turns: they fail, are counted, and are sent again.
		if st, _ := rep.Find(m, 8); st.Errors == 0 || st.Requests <= st.Errors {
			t.Errorf("%s: %d requests, %d errors; want the restarted replica's turns as errors and the run going on", m, st.Requests, st.Errors)
		}
	}
	cfg.RestartReplica = 4
	if _, err := Sim(cfg); err == nil {
		t.Error("restart of replica 4 of 4: no error")
	}
}

// TestSimAdmission pins what working-set admission is for: at 24 sessions
// the conversations hold about twice the replicas' KV cache, and every
// policy that places them all at once loses the cache (≈28 % hits);
// holding new conversations at the router keeps the admitted ones cached.
// At 8 sessions everything fits: nobody may wait.
func TestSimAdmission(t *testing.T) {
	cfg := DefaultSimConfig()
	cfg.Stages = []int{8, 24}
	cfg.Modes = []string{ModeOn, ModeAdmit, ModeDefault}
	rep := simLogged(t, cfg)
	on8, _ := rep.Find(ModeOn, 8)
	on, _ := rep.Find(ModeOn, 24)
	if on.IdleWhileHeldS != 0 {
		t.Errorf("on, 24 sessions: %.0f replica·s idle while held without admission", on.IdleWhileHeldS)
	}
	// the default mode (admission and the lifecycle checks on) is held to
	// the same as admission alone
	for _, m := range []string{ModeAdmit, ModeDefault} {
		ad8, _ := rep.Find(m, 8)
		// two conversations per replica fit; a session that finished
		// and starts its next conversation at once finds the finished
		// one still counted (the router cannot tell a finished agent
		// from one running a tool) for twice its pauses, milliseconds
		// here, and the queue is looked at again on the next poll: no
		// first turn waits longer than a poll
		if limit := cfg.PollInterval.Seconds(); ad8.WaitFirstP95S > limit {
			t.Errorf("%s, 8 sessions: first turns waited %.2fs (p95) at the router; everything fits, want ≤ %.0fs", m, ad8.WaitFirstP95S, limit)
		}
		if ad8.OutputTokensPerMin < 0.97*on8.OutputTokensPerMin {
			t.Errorf("%s, 8 sessions: output %.0f tok/min with admission, %.0f without", m, ad8.OutputTokensPerMin, on8.OutputTokensPerMin)
		}
		if ad8.PrefixHitPct < on8.PrefixHitPct-2 {
			t.Errorf("%s, 8 sessions: prefix hits with admission %.1f%% < without %.1f%%", m, ad8.PrefixHitPct, on8.PrefixHitPct)
		}
		ad, _ := rep.Find(m, 24)
		if ad.Errors != 0 || on.Errors != 0 {
			t.Errorf("%s, 24 sessions: errors on %d admit %d", m, on.Errors, ad.Errors)
		}
		if ad.PrefixHitPct < 75 {
			t.Errorf("%s, 24 sessions: prefix hits with admission %.1f%%, want ≥ 75%% (without: %.1f%%)", m, ad.PrefixHitPct, on.PrefixHitPct)
		}
		if ad.OutputTokensPerMin < 1.2*on.OutputTokensPerMin {
			t.Errorf("%s, 24 sessions: output %.0f tok/min with admission, %.0f without; want ≥ 1.2×", m, ad.OutputTokensPerMin, on.OutputTokensPerMin)
		}
		if ad.TTFBLaterP50S > 1 {
			t.Errorf("%s, 24 sessions: later turns' TTFB p50 %.2fs with admission, want ≤ 1s", m, ad.TTFBLaterP50S)
		}
		if ad.WaitFirstP50S <= 0 {
			t.Errorf("%s, 24 sessions: no first turn waited at the router; admission did not hold anything", m)
		}
		// while conversations wait, an engine idles only where the
		// conversations it held finished and their successors wait out
		// the finished ones' resident time (milliseconds) and the next
		// poll: at most a poll for each session that completed
		poll := cfg.PollInterval.Seconds()
		if idle, most := ad.IdleWhileHeldS, poll*float64(ad.CompletedCounts); idle > most {
			t.Errorf("%s, 24 sessions: engines idle %.0f replica·s while turns waited; want ≤ %.0f (%.0f s for each of %d completed sessions)", m, idle, most, poll, ad.CompletedCounts)
		}
	}
	// the counter counts: with 20 s pauses a conversation counts on its
	// replica for twice its pause, and newcomers are held while a replica
	// whose conversations all pause has nothing in flight
	cfg.Workload.Think = 20 * time.Second
	cfg.Stages, cfg.Modes = []int{16}, []string{ModeDefault}
	slow := simLogged(t, cfg)
	if st, _ := slow.Find(ModeDefault, 16); st.IdleWhileHeldS <= 0 || st.WaitFirstP50S+st.WaitFirstP95S <= 0 {
		t.Errorf("default, 20 s pauses, 16 sessions: engines idle %.0f replica·s while turns waited (first-turn waits p50 %.2f s, p95 %.2f s); want above 0", st.IdleWhileHeldS, st.WaitFirstP50S, st.WaitFirstP95S)
	}
}

// simLogged runs the sim and logs its tables.
func simLogged(t *testing.T, cfg SimConfig) *Report {
	t.Helper()
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Logf("\n%s", b.String())
	return rep
}

// TestSimSmallSeqsSpillPays runs the seqs8 preset at 8 sessions, where the
// auto threshold (2) is crossed on most turns while every engine still has
// places in its batch: a move would only recompute a history, so the turns
// stay and affinity keeps at least the hits of per-request picks.
func TestSimSmallSeqsSpillPays(t *testing.T) {
	cfg := SmallSeqsSimConfig()
	cfg.Stages = []int{8}
	cfg.Modes = []string{ModeOff, ModeOn}
	rep := simLogged(t, cfg)
	off, _ := rep.Find(ModeOff, 8)
	on, _ := rep.Find(ModeOn, 8)
	if on.StayedPct != 100 {
		t.Errorf("stayed %.1f%% with free places in every batch, want 100", on.StayedPct)
	}
	if on.PrefixHitPct < off.PrefixHitPct {
		t.Errorf("prefix hits on %.1f%% < off %.1f%%", on.PrefixHitPct, off.PrefixHitPct)
	}
}

func TestWorkloadWaves(t *testing.T) {
	w := DefaultWorkload()
	if got := w.FirstTurn(3, 4); got != StartTurn(3, 4, w.Turns) {
		t.Fatalf("without waves slot 3 of 4 starts at turn %d, want %d", got, StartTurn(3, 4, w.Turns))
	}
	if got := w.NextStart(42 * time.Second); got != 42*time.Second {
		t.Fatalf("without waves the next session starts at %v, want at once", got)
	}
	w.Waves = time.Minute
	if got := w.FirstTurn(3, 4); got != 0 {
		t.Fatalf("in waves slot 3 starts at turn %d, want 0", got)
	}
	for since, want := range map[time.Duration]time.Duration{0: time.Minute, 59 * time.Second: time.Minute, time.Minute: 2 * time.Minute, 61 * time.Second: 2 * time.Minute} {
		if got := w.NextStart(since); got != want {
			t.Errorf("a session ending at %v: next at %v, want %v", since, got, want)
		}
	}
	w.Waves = -time.Second
	if w.Validate() == nil {
		t.Error("a negative wave period passed validation")
	}

	// In the sim, sessions that end wait for the next wave: over 110 s
	// with waves a minute apart, each of 4 slots starts at most two.
	cfg := WavesSimConfig()
	cfg.Stages = []int{4}
	cfg.Modes = []string{ModeOn}
	cfg.StageLength, cfg.Warmup = 90*time.Second, 20*time.Second
	rep := simLogged(t, cfg)
	st, _ := rep.Find(ModeOn, 4)
	if st.Requests == 0 || st.CompletedCounts > 8 {
		t.Errorf("waves: %d requests, %d sessions completed (at most 8 can start)", st.Requests, st.CompletedCounts)
	}
}

// TestSimFleetTimeSlicing runs the fleet preset: agents that keep going
// for 60 turns, growing toward the model's context until they compact. At
// 16 sessions they fit the seven caches and admission holds nobody back;
// at 26 and 40 they do not, and turn-boundary time-slicing pauses the
// conversations a replica can no longer hold, where affinity alone
// recomputes most prompts.
// A paused conversation's turn waits at most AdmitWait (then it runs
// anyway): no session starves.
func TestSimFleetTimeSlicing(t *testing.T) {
	sweep(t)
	cfg := FleetSimConfig()
	cfg.Modes = []string{ModeOn, ModeAdmit}
	cfg.Stages = []int{16, 26, 40}
	rep := simLogged(t, cfg)
	on16, _ := rep.Find(ModeOn, 16)
	ad16, _ := rep.Find(ModeAdmit, 16)
	on26, _ := rep.Find(ModeOn, 26)
	ad26, _ := rep.Find(ModeAdmit, 26)
	if ad16.PrefixHitPct < on16.PrefixHitPct || ad16.OutputTokensPerMin < on16.OutputTokensPerMin {
		t.Errorf("16 sessions: admit %.1f %% hits, %.0f tok/min; on %.1f %%, %.0f", ad16.PrefixHitPct, ad16.OutputTokensPerMin, on16.PrefixHitPct, on16.OutputTokensPerMin)
	}
	if ad16.WaitFirstP95S > 60 {
		t.Errorf("16 sessions: first turns waited %.0f s (p95) at the router; they fit", ad16.WaitFirstP95S)
	}
	if ad26.PrefixHitPct < 70 || ad26.OutputTokensPerMin < 2*on26.OutputTokensPerMin {
		t.Errorf("26 sessions: admit %.1f %% hits, %.0f tok/min; want ≥ 70 %% and ≥ 2× on's %.0f", ad26.PrefixHitPct, ad26.OutputTokensPerMin, on26.OutputTokensPerMin)
	}
	if most := (placement.DefaultAdmitWait + cfg.PollInterval).Seconds(); ad26.WaitLaterMaxS > most || ad16.WaitLaterMaxS > most {
		t.Errorf("later turns waited up to %.0f s (16) and %.0f s (26) at the router; want ≤ %.0f", ad16.WaitLaterMaxS, ad26.WaitLaterMaxS, most)
	}
	on40, _ := rep.Find(ModeOn, 40)
	ad40, _ := rep.Find(ModeAdmit, 40)
	if ad40.PrefixHitPct < 60 || ad40.OutputTokensPerMin < 2*on40.OutputTokensPerMin {
		t.Errorf("40 sessions: admit %.1f %% hits, %.0f tok/min; want ≥ 60 %% and ≥ 2× on's %.0f", ad40.PrefixHitPct, ad40.OutputTokensPerMin, on40.OutputTokensPerMin)
	}
	if most := (placement.DefaultAdmitWait + cfg.PollInterval).Seconds(); ad40.WaitLaterMaxS > most || ad40.WaitFirstP95S > most {
		t.Errorf("40 sessions: turns waited up to %.0f s (later) and %.0f s (first, p95) at the router; want ≤ %.0f", ad40.WaitLaterMaxS, ad40.WaitFirstP95S, most)
	}
	if ad26.WaitLaterMaxS <= 0 {
		t.Errorf("26 sessions: no later turn waited: nothing was paused")
	}
	if on26.WaitLaterMaxS != 0 {
		t.Errorf("on, 26 sessions: a later turn waited %.0f s without admission", on26.WaitLaterMaxS)
	}
}

// TestSimClosedLoopSteady runs the reference preset's closed loop at 24
// and 32 sessions long enough for the conversations that wait at the door
// to come in and finish (20 minutes measured after 5 of warm-up): the
// default's output is ≥ 1.3× affinity alone's, and a new conversation's
// first token comes, at the 95th percentile, sooner than a conversation
// takes to finish (the median, from its first request to its last answer,
// wait included). In the matrix's 3-minute stages the second holds at 24
// but not at 32: there every session starts at once, and the few
// conversations that end within the stage are the first let in.
func TestSimClosedLoopSteady(t *testing.T) {
	sweep(t)
	cfg := DefaultSimConfig()
	cfg.Modes = []string{ModeOn, ModeDefault}
	cfg.Stages = []int{24, 32}
	cfg.StageLength, cfg.Warmup = 20*time.Minute, 5*time.Minute
	rep := simLogged(t, cfg)
	for _, n := range cfg.Stages {
		on, _ := rep.Find(ModeOn, n)
		def, _ := rep.Find(ModeDefault, n)
		if def.OutputTokensPerMin < 1.3*on.OutputTokensPerMin {
			t.Errorf("%d sessions: default %.0f tok/min; want ≥ 1.3× on's %.0f", n, def.OutputTokensPerMin, on.OutputTokensPerMin)
		}
		if def.CompletedCounts < n || def.TTFBFirstP95S > def.CompletionP50S {
			t.Errorf("%d sessions: first-turn TTFB p95 %.1f s, completion p50 %.1f s over %d conversations; want the wait the shorter, over at least %d",
				n, def.TTFBFirstP95S, def.CompletionP50S, def.CompletedCounts, n)
		}
	}
}
