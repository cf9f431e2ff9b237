package placement

import (
	"testing"
	"time"
)

// runTurn admits one turn of key (failing when it waits), and ends it a
// second later with the engine's count: prompt tokens, all but the last
// 500 cached after the first turn, and 100 generated. It returns when the
// turn ended.
func runTurn(t *testing.T, r *Router, key string, prompt int, now time.Time) time.Time {
	t.Helper()
	r.mu.Lock()
	_, bound := r.b.idx[r.hash(key)]
	r.mu.Unlock()
	d, tk := admitTurn(t, r, key, prompt, now)
	if tk != nil {
		t.Fatalf("%s's turn at %v waits; want it admitted at once", key, now.Sub(t0))
	}
	end := now.Add(time.Second)
	cached := 0 // a first turn finds nothing of its own
	if bound {
		cached = max(prompt-500, 0)
	}
	finishTurn(r, key, d, end, prompt, cached, 100)
	return end
}

// alternate runs n turns of a and then b, turn i of each at size(i)
// prompt tokens, from now, and returns when the last ended.
func alternate(t *testing.T, r *Router, n int, size func(i int) int, now time.Time) time.Time {
	t.Helper()
	for i := range n {
		for _, k := range []string{"a", "b"} {
			now = runTurn(t, r, k, size(i), now)
		}
	}
	return now
}

func isPaused(r *Router, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.b.idx[r.hash(key)]
	return ok && r.b.ents[e].flags&flagPaused != 0
}

func TestTimeSlicing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		run  func(t *testing.T, r *Router)
	}{
		{
			name: "everything fits: nobody is paused, however long they run",
			run: func(t *testing.T, r *Router) {
				alternate(t, r, 3*DefaultRotateTurns, func(turn int) int { return 2000 + 50*turn }, t0)
				if isPaused(r, "a") || isPaused(r, "b") {
					t.Fatal("a conversation was paused on a replica that holds both")
				}
			},
		},
		{
			name: "grown past the KV: the one whose turn ends is paused, waits, and resumes when room appears",
			run: func(t *testing.T, r *Router) {
				now := alternate(t, r, minRunsOver, func(turn int) int { return 3000 + 1000*turn }, t0)
				// a grows to 7k; at the end of b's next turn the engine's
				// counts say 7.1k + 4.1k on a 10k replica (b's own growth
				// is counted when its answer's usage arrives, after)
				now = runTurn(t, r, "a", 7000, now)
				now = runTurn(t, r, "b", 4500, now)
				if !isPaused(r, "b") {
					t.Fatal("b not paused with a and b needing 11.2k of a 10k replica")
				}
				if isPaused(r, "a") {
					t.Fatal("a paused too: pausing b made room")
				}
				_, tk := admitTurn(t, r, "b", 4600, now)
				if tk == nil {
					t.Fatal("b's turn after its pause did not wait")
				}
				now = runTurn(t, r, "a", 7100, now) // a runs on meanwhile
				if isReady(tk) {
					t.Fatal("b resumed while a holds the room")
				}
				r.End("a", now) // a's conversation ends: room
				if !isReady(tk) {
					t.Fatal("b still waits after a ended")
				}
				d, err := tk.Decision()
				if err != nil || d.Replica != "r0" || d.Reason != ReasonSticky {
					t.Fatalf("b resumed: %+v %v; want sticky on r0", d, err)
				}
				d.Release()
				// b's turn waited from its arrival to a's end: a's turn
				// after it, one second
				if a := r.Admission(); a.Resumed != 1 || a.PausedWaitP50 != time.Second || a.PausedWaitP95 != time.Second {
					t.Fatalf("resumed %d, paused waits p50 %v p95 %v; want 1, 1s, 1s", a.Resumed, a.PausedWaitP50, a.PausedWaitP95)
				}
				if rs := r.Snapshot().Replicas[0]; rs.Resumed != 1 {
					t.Fatalf("r0 resumed %d; want 1", rs.Resumed)
				}
			},
		},
		{
			name: "rotation: a paused conversation first in the queue takes the room of one that ran its quantum",
			run: func(t *testing.T, r *Router) {
				now := alternate(t, r, minRunsOver, func(turn int) int { return 3000 + 1000*turn }, t0)
				now = runTurn(t, r, "a", 7000, now)
				now = runTurn(t, r, "b", 4500, now) // b paused (see above)
				_, tk := admitTurn(t, r, "b", 4600, now)
				if tk == nil {
					t.Fatal("b's turn after its pause did not wait")
				}
				// a has run minRunsOver+1 turns; it runs until its quantum
				for range DefaultRotateTurns - minRunsOver - 2 {
					now = runTurn(t, r, "a", 7100, now)
					if isReady(tk) || isPaused(r, "a") {
						t.Fatalf("a paused within its quantum (b ready %v)", isReady(tk))
					}
				}
				now = runTurn(t, r, "a", 7100, now) // its quantum's last turn
				if !isPaused(r, "a") || !isReady(tk) {
					t.Fatalf("after a's quantum: a paused %v, b resumed %v; want both", isPaused(r, "a"), isReady(tk))
				}
				d, _ := tk.Decision()
				d.Release()
				if _, ta := admitTurn(t, r, "a", 7200, now); ta == nil {
					t.Fatal("a's next turn did not wait for its turn")
				}
			},
		},
		{
			name: "the engine reports requests waiting: one of the conversations there is paused, though their sizes fit",
			run: func(t *testing.T, r *Router) {
				now := alternate(t, r, minRunsOver, func(turn int) int { return 2000 + 100*turn }, t0)
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 10000, Waiting: 2, Running: 1, KVUsage: 0.9})
				now = runTurn(t, r, "a", 2200, now)
				if !isPaused(r, "a") {
					t.Fatal("a not paused with the engine's queue holding requests")
				}
				r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 10000, Waiting: 2, Running: 1, KVUsage: 0.9})
				runTurn(t, r, "b", 2200, now)
				if isPaused(r, "b") {
					t.Fatal("b paused though it is the only conversation left there")
				}
			},
		},
		{
			name: "an engine queueing at max_num_seqs pauses nobody: it waits for a place in the batch, not for KV",
			cfg:  Config{MaxNumSeqs: 4},
			run: func(t *testing.T, r *Router) {
				now := t0
				for turn := range minRunsOver + 2 {
					for _, k := range []string{"a", "b"} {
						r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 10000, Waiting: 2, Running: 4, KVUsage: 0.9})
						now = runTurn(t, r, k, 2000+100*turn, now)
					}
				}
				if isPaused(r, "a") || isPaused(r, "b") {
					t.Fatal("a conversation was paused for a queue of an engine that runs max_num_seqs")
				}
			},
		},
		{
			name: "within its first turns after admission a conversation is not paused",
			run: func(t *testing.T, r *Router) {
				now := runTurn(t, r, "a", 4000, t0)
				d, _ := admitTurn(t, r, "b", 5000, now)
				now = now.Add(time.Second)
				finishTurn(r, "b", d, now, 6500, 0, 100) // larger than its request said
				// 4.1k + 6.6k on a 10k replica, and a has run one turn
				r.mu.Lock()
				e := r.b.idx[r.hash("a")]
				_, load := r.adm.demand(r.reps[0], 0, 0, unixNanos(now), r.footprint)
				r.adm.maybePause(e, unixNanos(now))
				r.mu.Unlock()
				if load <= 10000 {
					t.Fatalf("demand %.0f: the case needs the replica over its KV", load)
				}
				if isPaused(r, "a") {
					t.Fatal("a paused after one turn")
				}
			},
		},
		{
			name: "rotate_turns off: never paused",
			cfg:  Config{RotateTurns: -1},
			run: func(t *testing.T, r *Router) {
				alternate(t, r, DefaultRotateTurns, func(turn int) int { return 3000 + 1000*min(turn, 3) }, t0)
				if isPaused(r, "a") || isPaused(r, "b") {
					t.Fatal("a conversation was paused with time-slicing off")
				}
			},
		},
		{
			name: "admission off: never paused",
			cfg:  Config{AdmissionOff: true},
			run: func(t *testing.T, r *Router) {
				alternate(t, r, DefaultRotateTurns, func(turn int) int { return 3000 + 1000*min(turn, 3) }, t0)
				if isPaused(r, "a") || isPaused(r, "b") {
					t.Fatal("a conversation was paused with admission off")
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(1, 10000, tc.cfg)
			tc.run(t, r)
			checkInvariants(t, r)
		})
	}
}
