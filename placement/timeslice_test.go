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

// pausedB runs a and b until b is paused for a's growth (as in the case
// "grown past the KV") and sends b's next turn, which waits: it returns
// the time and b's ticket.
func pausedB(t *testing.T, r *Router) (time.Time, *Ticket) {
	t.Helper()
	now := alternate(t, r, minRunsOver, func(turn int) int { return 3000 + 1000*turn }, t0)
	now = runTurn(t, r, "a", 7000, now)
	now = runTurn(t, r, "b", 4500, now) // b paused
	_, tk := admitTurn(t, r, "b", 4600, now)
	if tk == nil {
		t.Fatal("b's turn after its pause did not wait")
	}
	return now, tk
}

func isPaused(r *Router, key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.b.idx[r.hash(key)]
	return ok && r.b.ents[e].flags&flagPaused != 0
}

func TestTimeSlicing(t *testing.T) {
	t.Parallel()
	const quantum = 8 // turns, for the cases that set one (rotate_turns)
	tests := []struct {
		name string
		cfg  Config
		run  func(t *testing.T, r *Router)
	}{
		{
			name: "everything fits: nobody is paused, however long they run",
			run: func(t *testing.T, r *Router) {
				alternate(t, r, 3*quantum, func(turn int) int { return 2000 + 50*turn }, t0)
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
			name: "with a quantum: a paused conversation first in the queue takes the room of one that ran it",
			cfg:  Config{RotateTurns: quantum},
			run: func(t *testing.T, r *Router) {
				now, tk := pausedB(t, r)
				// a has run minRunsOver+1 turns; it runs until its quantum
				for range quantum - minRunsOver - 2 {
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
			name: "no quantum by default: the conversation that runs on is not paused for a paused one while its replica holds it",
			run: func(t *testing.T, r *Router) {
				now, tk := pausedB(t, r)
				for turn := range 3 * quantum {
					now = runTurn(t, r, "a", 7100, now)
					if isPaused(r, "a") || isReady(tk) {
						t.Fatalf("after a's turn %d: a paused %v, b resumed %v; want a running on, b waiting for room", turn+1, isPaused(r, "a"), isReady(tk))
					}
				}
				if a := r.Admission(); a.RotateTurns != 0 || a.PausedTotal != 1 {
					t.Fatalf("quantum %d, pauses %d; want none and b's one", a.RotateTurns, a.PausedTotal)
				}
				r.End("a", now) // room: b resumes
				if !isReady(tk) {
					t.Fatal("b still waits after a ended")
				}
				d, _ := tk.Decision()
				d.Release()
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
				_, load, _ := r.adm.demand(r.reps[0], 0, 0, unixNanos(now), r.footprint)
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
				alternate(t, r, quantum, func(turn int) int { return 3000 + 1000*min(turn, 3) }, t0)
				if isPaused(r, "a") || isPaused(r, "b") {
					t.Fatal("a conversation was paused with time-slicing off")
				}
			},
		},
		{
			name: "admission off: never paused",
			cfg:  Config{AdmissionOff: true},
			run: func(t *testing.T, r *Router) {
				alternate(t, r, quantum, func(turn int) int { return 3000 + 1000*min(turn, 3) }, t0)
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

// pauseNow pauses key's conversation at a turn boundary as maybePause
// does when its replica runs out of room.
func pauseNow(t *testing.T, r *Router, key string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.b.idx[r.hash(key)]
	if !ok {
		t.Fatalf("%s is not bound", key)
	}
	en := &r.b.ents[e]
	r.setPaused(en, true)
	en.runs = 0
}

func boundTo(r *Router, key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.b.idx[r.hash(key)]
	if !ok {
		return ""
	}
	return r.reps[r.b.ents[e].rep].id
}

// TestQueueOrder: new conversations start in arrival order, and nothing
// passes one that fits nowhere; a new conversation that fits somewhere
// starts past a paused turn that fits nowhere, whose room it cannot take.
func TestQueueOrder(t *testing.T) {
	t.Parallel()
	// a on one replica, c in the room b left on the other when it was
	// paused; 15k of KV each, the engines' KV full, so that no replica
	// idles and conversations go only where they fit
	setup := func(t *testing.T, bSize int) (*Router, time.Time) {
		r := admitRouter(2, 15000, Config{})
		for _, id := range ids(2) {
			r.UpdateLoad(id, Load{Reachable: true, KVTokens: 15000, KVUsage: 1})
		}
		// a's 20 turns make 6.1k what conversations grow to (the 90th
		// percentile of recent turns), whatever b's one turn adds; its
		// 2 s pauses keep it resident for 4 s after a turn
		now := t0
		for range 20 {
			now = runTurn(t, r, "a", 6000, now).Add(2 * time.Second)
		}
		now = runTurn(t, r, "b", bSize, now)
		if boundTo(r, "a") == boundTo(r, "b") {
			t.Fatalf("a and b both on %s; the case needs them apart", boundTo(r, "a"))
		}
		pauseNow(t, r, "b")
		// c's request says 9k, which fits only where b was; the engine
		// counts 6k
		d, tc := admitTurn(t, r, "c", 9000, now)
		if tc != nil || d.Replica != boundTo(r, "b") {
			t.Fatalf("c waits %v, on %s; the case needs it in b's room on %s", tc != nil, d.Replica, boundTo(r, "b"))
		}
		now = now.Add(time.Second)
		finishTurn(r, "c", d, now, 6000, 0, 100)
		return r, now
	}
	t.Run("a new conversation starts past a paused turn that fits nowhere", func(t *testing.T) {
		r, now := setup(t, 8000)
		// b resumes by its actual size under the low mark (13.5k):
		// 8.1k beside 6.1k fits neither replica
		_, tb := admitTurn(t, r, "b", 8200, now)
		if tb == nil {
			t.Fatal("b's turn after its pause did not wait")
		}
		r.AdmitWaiting(now)
		if isReady(tb) {
			t.Fatal("b resumed beside 6.1k on a 15k replica; the case needs it to fit nowhere")
		}
		// d, counted at what conversations grow to (6.1k), fits beside 6.1k
		d, td := admitTurn(t, r, "d", 1000, now)
		if td != nil {
			t.Fatal("d waited behind b's paused turn, which cannot use the room d fits in")
		}
		d.Release()
		if isReady(tb) {
			t.Fatal("b resumed when d was placed")
		}
		checkInvariants(t, r)
	})
	t.Run("a paused turn that fits waits behind a new conversation that does not", func(t *testing.T) {
		r, now := setup(t, 6000)
		_, td := admitTurn(t, r, "d", 10000, now) // 6.1k + 10k > 15k
		if td == nil {
			t.Fatal("d was placed; the case needs it to fit nowhere")
		}
		_, tb := admitTurn(t, r, "b", 6200, now) // 6.1k + 6.1k would fit
		if tb == nil {
			t.Fatal("b's turn after its pause did not wait")
		}
		r.AdmitWaiting(now)
		if isReady(tb) || isReady(td) {
			t.Fatalf("b resumed %v, d admitted %v; want both waiting: b behind d", isReady(tb), isReady(td))
		}
		// c's conversation ends: d gets its room first, then b resumes
		r.End("c", now)
		if !isReady(td) || !isReady(tb) {
			t.Fatalf("after c ended: d admitted %v, b resumed %v; want both", isReady(td), isReady(tb))
		}
		for _, tk := range []*Ticket{td, tb} {
			dec, err := tk.Decision()
			if err != nil {
				t.Fatal(err)
			}
			dec.Release()
		}
		if boundTo(r, "d") == boundTo(r, "b") {
			t.Fatalf("d and b both on %s", boundTo(r, "d"))
		}
		checkInvariants(t, r)
	})
}

// TestPausePays: where only the deviation of a replica's demand
// overflows, a conversation at the end of its turn is paused only when its
// staying costs the residents more recompute, for as long as conversations
// run, than pausing costs it: its context again. A measured wait to
// resume does not count.
func TestPausePays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration // how long conversations are taken to run, before their ages are known
		waited time.Duration // a paused turn's wait to resume, measured (0: none yet)
		paused bool
	}{
		{"conversations run a minute: the overflow's recompute outweighs the context's", time.Minute, 0, true},
		{"conversations run 10 s: the context's recompute outweighs the overflow's", 10 * time.Second, 0, false},
		{"paused turns wait 10 s to resume: the same", time.Minute, 10 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(1, 10000, Config{AdmitWindow: tc.window})
			if tc.waited > 0 {
				r.mu.Lock()
				r.adm.pausedWaits.add(tc.waited.Milliseconds())
				r.mu.Unlock()
			}
			// a, b and c: 4.5k each, 2 s turns 2 s apart, out of step,
			// prefilled at 20k tokens/s: on average half of them in
			// flight (6.75k), one standard deviation more overflows 10k;
			// from their second turn on (minRunsOver) one may be paused
			keys := []string{"a", "b", "c"}
			var ds [3]Decision
			now := t0
			for i := range 3 {
				for k, key := range keys {
					at := now.Add(time.Duration(k) * 1300 * time.Millisecond)
					req := Request{Key: key, Tokens: 4500 + 10*i, Now: at}
					if i == 0 {
						req.Pin = "r0"
					}
					d, tk, err := r.Admit(req)
					if err != nil {
						t.Fatal(err)
					}
					if tk != nil {
						if !tc.paused || !isPaused(r, key) {
							t.Fatalf("%s's turn %d waits (paused %v); want no pause", key, i, isPaused(r, key))
						}
						return
					}
					ds[k] = d
				}
				if i == 1 {
					r.mu.Lock()
					_, load, mean := r.adm.demand(r.reps[0], 0, 0, r.clock, r.adm.footprint)
					r.mu.Unlock()
					if mean > 10000 || load <= 10000 {
						t.Fatalf("mean %.0f, mean + deviation %.0f: want only the deviation over 10k", mean, load)
					}
				}
				for k, key := range keys {
					end := now.Add(time.Duration(k)*1300*time.Millisecond + 2*time.Second)
					prompt, cached := 4500+10*i, 0
					if i > 0 {
						cached = prompt - 10
					}
					r.Feedback(Turn{Key: key, Replica: "r0", Reason: ds[k].Reason, Prompt: prompt, Cached: cached, Completion: 10,
						Duration: 2 * time.Second, FirstToken: time.Duration(prompt-cached) * time.Second / 20000})
					ds[k].ReleaseAt(end)
				}
				now = now.Add(4 * time.Second)
			}
			if tc.paused {
				t.Fatal("nobody was paused; want one paused for the others")
			}
		})
	}
}

// TestPauseForQueue: conversations whose sizes fit, on an engine that
// holds a request for KV; the queue's wait, recurring while conversations
// run, is weighed against the paused conversation's context computed again
// (20k tokens at the default 2,000 tokens/s: 10 s).
func TestPauseForQueue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration // how long conversations are taken to run
		paused bool
	}{
		// one request waits a turn time (10 s by default) at each of
		// about 5 cycles of a turn and a 1 s pause
		{"conversations run a minute: the queue's wait, about 55 s, outweighs the context's 10 s", time.Minute, true},
		// about 0.9 cycles: 9 s
		{"conversations run 10 s: the queue's wait, about 9 s, does not", 10 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(1, 100000, Config{AdmitWindow: tc.window})
			now := alternate(t, r, minRunsOver, func(turn int) int { return 20000 + 100*turn }, t0)
			r.UpdateLoad("r0", Load{Reachable: true, KVTokens: 100000, Waiting: 1, Running: 1, KVUsage: 0.9})
			runTurn(t, r, "a", 20200, now)
			if got := isPaused(r, "a"); got != tc.paused {
				t.Fatalf("a paused %v; want %v", got, tc.paused)
			}
		})
	}
}
