package placement

import (
	"testing"
	"time"
)

// TestAdmissionAgreesWithEngine covers the rules by which the engine's own
// figures overrule the working-set estimate: an idle replica takes a new
// conversation, an oversize one comes in at once where it pushes out the
// least (the emptiest, at equal prefill rates), the
// working set is learnt with admission off, and the estimate is corrected
// when the engine contradicts it.
func TestAdmissionAgreesWithEngine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		n    int
		cap  int
		cfg  Config
		run  func(t *testing.T, r *Router)
	}{
		{
			name: "an idle replica takes a new conversation the estimate would hold",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				// a conversation that just finished counts in the working
				// set for the window; the engine is idle
				d, _ := admitTurn(t, r, "a", 18000, t0)
				finishTurn(r, "a", d, t0.Add(time.Second), 18000, 0, 100)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, KVUsage: 0.02})
				if ws := r.Snapshot().Replicas[0].WorkingSet; ws < 18000 {
					t.Fatalf("working set %d, want a's 18k still counted", ws)
				}
				d2, tk := admitTurn(t, r, "b", 9000, t0.Add(2*time.Second))
				if tk != nil || d2.Replica != "r0" {
					t.Fatalf("b on an idle replica: %q, ticket %v; want admitted at once", d2.Replica, tk)
				}
				// b is in flight now: the replica is not idle, and c waits
				if _, tk := admitTurn(t, r, "c", 9000, t0.Add(3*time.Second)); tk == nil {
					t.Fatal("c admitted beside b in flight and a resident: want a ticket")
				}
			},
		},
		{
			// the demo's case: a stage of a few polls, each finding a turn in
			// flight; the moment between two turns is not idleness
			name: "a replica polled busy is not idle between two turns",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 18000, t0)
				for range 10 {
					r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, Running: 1, KVUsage: 0.9})
				}
				finishTurn(r, "a", d, t0.Add(time.Second), 18000, 0, 100)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, KVUsage: 0.02})
				if b := r.Snapshot().Replicas[0].Busy; b < idleBusy {
					t.Fatalf("busy share %.2f after 10 of 12 polls with a turn in flight, want ≥ %.1f", b, idleBusy)
				}
				if _, tk := admitTurn(t, r, "b", 9000, t0.Add(2*time.Second)); tk == nil {
					t.Fatal("b admitted between two turns of a replica busy at 10 of its 12 polls")
				}
			},
		},
		{
			name: "a replica whose engine has requests waiting is not idle",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 18000, t0)
				finishTurn(r, "a", d, t0.Add(time.Second), 18000, 0, 100)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, Waiting: 2, Running: 3, KVUsage: 0.9})
				if _, tk := admitTurn(t, r, "b", 9000, t0.Add(2*time.Second)); tk == nil {
					t.Fatal("b admitted on a replica with requests waiting in its engine")
				}
			},
		},
		{
			name: "a replica whose KV gauge is over the mark is not idle",
			n:    1, cap: 20000, cfg: Config{HighWater: 0.8},
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 18000, t0)
				finishTurn(r, "a", d, t0.Add(time.Second), 18000, 0, 100)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, KVUsage: 0.85})
				if _, tk := admitTurn(t, r, "b", 9000, t0.Add(2*time.Second)); tk == nil {
					t.Fatal("b admitted on a replica whose engine reports its KV over the mark")
				}
			},
		},
		{
			name: "waiting conversations go to a replica that turned idle",
			n:    2, cap: 20000,
			run: func(t *testing.T, r *Router) {
				da, _ := admitTurn(t, r, "a", 18000, t0)
				db, _ := admitTurn(t, r, "b", 18000, t0)
				_, tc := admitTurn(t, r, "c", 9000, t0)
				if tc == nil {
					t.Fatal("c admitted while both replicas are full and busy")
				}
				finishTurn(r, "b", db, t0.Add(5*time.Second), 18000, 0, 100)
				if !isReady(tc) {
					t.Fatal("c still waits while b's replica is idle")
				}
				dc, _ := tc.Decision()
				if dc.Replica != db.Replica || tc.Waited() != 5*time.Second || tc.Forced() {
					t.Fatalf("c on %q after %v (forced %v); want %q after 5s", dc.Replica, tc.Waited(), tc.Forced(), db.Replica)
				}
				da.Release()
				dc.Release()
			},
		},
		{
			name: "a conversation larger than every replica comes in at once where it pushes out least: the emptiest, or the fuller where it prefills ten times as fast",
			n:    2, cap: 10000,
			run: func(t *testing.T, r *Router) {
				d0, _ := admitTurn(t, r, "a", 6000, t0)
				d1, _ := admitTurn(t, r, "b", 3000, t0)
				r.UpdateLoad(d0.Replica, Load{Reachable: true, KVTokens: 10000, Running: 1, KVUsage: 0.6})
				r.UpdateLoad(d1.Replica, Load{Reachable: true, KVTokens: 10000, Running: 1, KVUsage: 0.3})
				d, tk := admitTurn(t, r, "huge", 12211, t0.Add(time.Second))
				if tk != nil {
					t.Fatal("a conversation that fits no replica even empty waits")
				}
				if d.Replica != d1.Replica {
					t.Fatalf("oversize conversation on %q, want the emptiest %q", d.Replica, d1.Replica)
				}
				if a := r.Snapshot().Admission; a.Oversized != 1 || a.Queued != 0 {
					t.Fatalf("oversized %d queued %d, want 1 and 0", a.Oversized, a.Queued)
				}
				// where pushing out what is in use costs least: 6,000
				// tokens at 20,000 tokens/s against 3,000 at 1,000
				r.mu.Lock()
				r.reps[r.byID[d0.Replica]].cost.rate = 20000
				r.reps[r.byID[d1.Replica]].cost.rate = 1000
				r.mu.Unlock()
				d, tk = admitTurn(t, r, "huge2", 12211, t0.Add(2*time.Second))
				if tk != nil || d.Replica != d0.Replica {
					t.Fatalf("oversize conversation on %q (waits %v), want the fuller %q, ten times as fast to prefill", d.Replica, tk != nil, d0.Replica)
				}
			},
		},
		{
			name: "the working set is learnt with admission off, and admission on starts from it",
			n:    1, cap: 20000, cfg: Config{AdmissionOff: true},
			run: func(t *testing.T, r *Router) {
				// a turn, a 10 s pause, a turn: the pause is learnt
				d, _ := admitTurn(t, r, "a", 8000, t0)
				finishTurn(r, "a", d, t0.Add(2*time.Second), 8000, 0, 100)
				d, _ = admitTurn(t, r, "a", 8500, t0.Add(12*time.Second))
				if got := r.Snapshot().Replicas[0].WorkingSet; got < 8000 {
					t.Fatalf("working set with admission off %d, want a's turn in flight counted", got)
				}
				finishTurn(r, "a", d, t0.Add(14*time.Second), 8500, 8000, 100)
				// twice a's 10 s pause: still resident at 30 s, gone at 40 s
				r.Sweep(t0.Add(30 * time.Second))
				if got := r.Snapshot().Replicas[0].WorkingSet; got == 0 {
					t.Fatal("a not resident 16 s after its turn, within twice its 10 s pause")
				}
				r.Sweep(t0.Add(40 * time.Second))
				if got := r.Snapshot().Replicas[0].WorkingSet; got != 0 {
					t.Fatalf("working set %d 26 s after a's turn, want 0 (more than twice its pause)", got)
				}
				r.SetAdmission(true)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, Running: 1, KVUsage: 0.5})
				if a := r.Snapshot().Admission; !a.Active {
					t.Fatalf("admission switched on not in force: %s", a.Why)
				}
			},
		},
		{
			name: "a replica whose turns keep it busy is not idle between them",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				now := keepBusy(t, r, 17000)
				// between two turns nothing is in flight, but the replica
				// is busy: the newcomer waits for room by the estimate
				if _, tk := admitTurn(t, r, "b", 9000, now); tk == nil {
					t.Fatal("b admitted in a pause of a busy replica's conversation")
				}
			},
		},
		{
			// agents pausing 20 s, 16 sessions on 4 replicas: the caches
			// are lost with admission holding newcomers, so holding one
			// from a replica with nothing in flight buys no hit
			name: "a busy replica whose turns find their caches gone is idle between them",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				now := keepBusy(t, r, 4000)
				if h := r.Snapshot().Replicas[0].Hits; h >= HitsLow {
					t.Fatalf("hits %.2f after turns finding 4k of 18k cached, want under %.2f", h, HitsLow)
				}
				if d, tk := admitTurn(t, r, "b", 9000, now); tk != nil || d.Replica != "r0" {
					t.Fatalf("b: %q, ticket %v; want admitted at once to the replica with nothing in flight", d.Replica, tk)
				}
				// b is in flight: the replica is not idle now
				if _, tk := admitTurn(t, r, "c", 9000, now); tk == nil {
					t.Fatal("c admitted beside b in flight")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, admitRouter(tt.n, tt.cap, tt.cfg))
		})
	}
}

// keepBusy runs 100 turns of conversation "a" (18k tokens) on r0, each
// finding cached tokens of its prompt, with a poll in every one, so the
// replica's busy share grows past idleBusy; it returns the time after the
// last turn.
func keepBusy(t *testing.T, r *Router, cached int) time.Time {
	t.Helper()
	now := t0
	for i := 0; i < 100; i++ {
		d, _ := admitTurn(t, r, "a", 18000, now)
		r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, Running: 1, KVUsage: 0.5})
		now = now.Add(time.Second)
		finishTurn(r, "a", d, now, 18000, cached, 100)
	}
	if b := r.Snapshot().Replicas[0].Busy; b < idleBusy {
		t.Fatalf("busy share %.2f after 100 busy polls, want at least %.2f", b, idleBusy)
	}
	return now
}

func TestOvercommittedNeedsTheEngine(t *testing.T) {
	t.Parallel()
	over := AdmissionSnapshot{WorkingSetTokens: 741000, CapacityTokens: 262000}
	if over.Overcommitted() {
		t.Error("overcommitted by the estimate alone, with no engine confirming it")
	}
	over.Strained = true
	if !over.Overcommitted() {
		t.Error("not overcommitted with the estimate over the capacity and an engine strained")
	}
	r := admitRouter(1, 20000, Config{})
	d, _ := admitTurn(t, r, "a", 8000, t0)
	finishTurn(r, "a", d, t0.Add(time.Second), 8000, 0, 100)
	for i := 0; i < 4; i++ { // returning turns that find 79 % of their cache
		d, _ = admitTurn(t, r, "a", 8000, t0.Add(time.Duration(2+i)*time.Second))
		finishTurn(r, "a", d, t0.Add(time.Duration(2+i)*time.Second), 8000, 6320, 100)
	}
	if a := r.Snapshot().Admission; a.Strained {
		t.Errorf("strained at 79 %% hits (hits %.2f) with nothing waiting", r.Snapshot().Replicas[0].Hits)
	}
	// a queue in an engine that runs max_num_seqs waits for a place in
	// the batch, not for KV (llm-d-inference-sim at max-num-seqs 8: the
	// warning at 80 % hits); below max_num_seqs it waits for KV
	r = admitRouter(1, 20000, Config{MaxNumSeqs: 8})
	for _, tc := range []struct {
		running int
		want    bool
	}{{8, false}, {5, true}} {
		r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 20000, Running: tc.running, Waiting: 2})
		if got := r.Snapshot().Admission.Strained; got != tc.want {
			t.Errorf("2 waiting, %d running of max_num_seqs 8: strained %v, want %v", tc.running, got, tc.want)
		}
	}
}

// TestLostCacheThresholds: a replica is judged to evict its
// conversations' caches (strained) once the mean share of their predicted
// cache over meanSpan returning turns is under HitsLow: turns finding 80 %
// do not make it strained, 60 % and 40 % do.
func TestLostCacheThresholds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		cached       int // of a predicted 7,984 (8,000 less a block)
		wantStrained bool
	}{
		{"80 % found", 6387, false},
		{"60 % found", 4790, true},
		{"40 % found", 3194, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(1, 20000, Config{})
			d, _ := admitTurn(t, r, "a", 8000, t0)
			finishTurn(r, "a", d, t0.Add(time.Second), 8000, 0, 100)
			for i := 0; i < meanSpan; i++ {
				now := t0.Add(time.Duration(2+i) * time.Second)
				d, _ = admitTurn(t, r, "a", 8000, now)
				d.ReleaseAt(now)
				if predicted := r.Feedback(Turn{Key: "a", Replica: d.Replica, Reason: d.Reason, Prompt: 8000, Cached: tc.cached, Completion: 100}); predicted != 8000-DefaultBlockTokens {
					t.Fatalf("turn %d: predicted %d, want %d", i, predicted, 8000-DefaultBlockTokens)
				}
			}
			if got := r.Snapshot().Admission.Strained; got != tc.wantStrained {
				t.Errorf("strained %v after %d turns finding %d of 7,984 cached (hits %.2f); want %v", got, meanSpan, tc.cached, r.Snapshot().Replicas[0].Hits, tc.wantStrained)
			}
		})
	}
}
