package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// admitRouter returns a router of n replicas of capTokens KV each, with
// admission on (cfg's admission settings kept) and their load polled.
func admitRouter(n, capTokens int, cfg Config) *Router {
	r := newTestRouter(n, cfg)
	for _, id := range ids(n) {
		r.UpdateLoad(id, Load{Reachable: true, KVTokens: capTokens})
	}
	return r
}

// admitTurn routes one turn of key with an estimate of tokens at now and
// reports its decision, or the ticket it waits on.
func admitTurn(t *testing.T, r *Router, key string, tokens int, now time.Time) (Decision, *Ticket) {
	t.Helper()
	d, tk, err := r.Admit(Request{Key: key, Tokens: tokens, Now: now})
	if err != nil {
		t.Fatalf("admitting %s: %v", key, err)
	}
	return d, tk
}

// finishTurn releases d at now and reports the engine's count for it.
func finishTurn(r *Router, key string, d Decision, now time.Time, prompt, cached, completion int) {
	d.ReleaseAt(now)
	r.Feedback(Turn{Key: key, Replica: d.Replica, Reason: d.Reason, Prompt: prompt, Cached: cached, Completion: completion})
}

func isReady(tk *Ticket) bool {
	select {
	case <-tk.Ready():
		return true
	default:
		return false
	}
}

func TestAdmissionRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		n    int
		cap  int
		cfg  Config
		// run drives the router; it returns what the test checks
		run func(t *testing.T, r *Router)
	}{
		{
			name: "fits: new conversations go where they fit, then wait",
			n:    2, cap: 10000,
			run: func(t *testing.T, r *Router) {
				// 6k each: one per replica fits (6k+6k > 10k)
				d1, tk1 := admitTurn(t, r, "a", 6000, t0)
				d2, tk2 := admitTurn(t, r, "b", 6000, t0)
				if tk1 != nil || tk2 != nil || d1.Replica == d2.Replica {
					t.Fatalf("first two: %q %q, tickets %v %v; want one per replica at once", d1.Replica, d2.Replica, tk1, tk2)
				}
				_, tk3 := admitTurn(t, r, "c", 6000, t0)
				if tk3 == nil {
					t.Fatal("third 6k conversation on 2 × 10k replicas holding 6k each: admitted, want a ticket")
				}
				if got := r.Waiting(); got != 1 {
					t.Fatalf("waiting %d, want 1", got)
				}
			},
		},
		{
			name: "an empty replica takes any conversation, however large",
			n:    1, cap: 1000,
			run: func(t *testing.T, r *Router) {
				d, tk := admitTurn(t, r, "huge", 50000, t0)
				if tk != nil || d.Replica != "r0" {
					t.Fatalf("got %q, ticket %v; want r0 at once", d.Replica, tk)
				}
			},
		},
		{
			name: "turns of admitted conversations never wait",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 9000, t0)
				_, tk := admitTurn(t, r, "b", 9000, t0)
				if tk == nil {
					t.Fatal("b admitted over the capacity")
				}
				finishTurn(r, "a", d, t0.Add(time.Second), 9000, 0, 200)
				d2, tk2 := admitTurn(t, r, "a", 9500, t0.Add(time.Second))
				if tk2 != nil || d2.Reason != ReasonSticky {
					t.Fatalf("a's second turn: %v, ticket %v; want sticky at once", d2.Reason, tk2)
				}
			},
		},
		{
			name: "queue order: the first to wait is the first admitted",
			n:    1, cap: 20000,
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 12000, t0)
				_, tb := admitTurn(t, r, "b", 12000, t0)
				_, tc := admitTurn(t, r, "c", 3000, t0) // would fit, but b came first
				if tb == nil || tc == nil {
					t.Fatalf("tickets b %v c %v; c must queue behind b", tb, tc)
				}
				// a's turn ends (the engine counted 2k): the replica sits
				// idle, so b is admitted at once; once a went quiet, c fits
				// beside it
				finishTurn(r, "a", d, t0.Add(time.Second), 2000, 0, 100)
				r.AdmitWaiting(t0.Add(2 * time.Minute))
				if !isReady(tb) || !isReady(tc) {
					t.Fatalf("after a went quiet: b ready %v, c ready %v", isReady(tb), isReady(tc))
				}
				db, _ := tb.Decision()
				dc, _ := tc.Decision()
				if db.Reason != ReasonPlaced || dc.Reason != ReasonPlaced {
					t.Fatalf("reasons %v %v, want placed", db.Reason, dc.Reason)
				}
				if w := tb.Waited(); w != time.Second {
					t.Fatalf("b waited %v, want 1s (until the replica was idle)", w)
				}
			},
		},
		{
			name: "admit_wait: a conversation that waited long enough is admitted anyway",
			n:    1, cap: 10000, cfg: Config{AdmitWait: 30 * time.Second},
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 9000, t0) // stays in flight
				_, tb := admitTurn(t, r, "b", 9000, t0)
				r.AdmitWaiting(t0.Add(29 * time.Second))
				if isReady(tb) {
					t.Fatal("b admitted before admit_wait")
				}
				r.AdmitWaiting(t0.Add(30 * time.Second))
				if !isReady(tb) || !tb.Forced() {
					t.Fatalf("b at admit_wait: ready %v forced %v", isReady(tb), tb.Forced())
				}
				a := r.Snapshot().Admission
				if a.AdmittedAtLimit != 1 || a.AdmittedAfterWait != 0 || a.Waiting != 0 {
					t.Fatalf("counters %+v", a)
				}
			},
		},
		{
			name: "refusal: beyond admit_queue new conversations get ErrQueueFull",
			n:    1, cap: 10000, cfg: Config{AdmitQueue: 2},
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 9000, t0)
				admitTurn(t, r, "b", 9000, t0)
				admitTurn(t, r, "c", 9000, t0)
				_, tk, err := r.Admit(Request{Key: "d", Tokens: 9000, Now: t0})
				if !errors.Is(err, ErrQueueFull) || tk != nil {
					t.Fatalf("d: ticket %v, err %v; want ErrQueueFull", tk, err)
				}
				if a := r.Snapshot().Admission; a.Refused != 1 || a.Waiting != 2 {
					t.Fatalf("counters %+v", a)
				}
				// a turn of an admitted conversation is never refused
				if _, tk, err := r.Admit(Request{Key: "a", Tokens: 9000, Now: t0}); err != nil || tk != nil {
					t.Fatalf("a's turn with the queue full: ticket %v, err %v", tk, err)
				}
			},
		},
		{
			name: "capacity unknown: admission stays out of the way",
			n:    2, cap: 0,
			run: func(t *testing.T, r *Router) {
				for i := range 10 {
					if _, tk := admitTurn(t, r, fmt.Sprint("k", i), 1<<20, t0); tk != nil {
						t.Fatalf("conversation %d waits with the capacity unknown", i)
					}
				}
				a := r.Snapshot().Admission
				if a.Active || !a.On || a.Why == "" {
					t.Fatalf("admission state %+v: want on but not active, with a reason", a)
				}
			},
		},
		{
			name: "kv_tokens override: the configured capacity counts",
			n:    1, cap: 0, cfg: Config{KVTokens: 10000},
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 9000, t0)
				if _, tk := admitTurn(t, r, "b", 9000, t0); tk == nil {
					t.Fatal("b admitted over the configured capacity")
				}
			},
		},
		{
			name: "admission off: nobody waits",
			n:    1, cap: 10000, cfg: Config{AdmissionOff: true},
			run: func(t *testing.T, r *Router) {
				for i := range 5 {
					if _, tk := admitTurn(t, r, fmt.Sprint("k", i), 9000, t0); tk != nil {
						t.Fatalf("conversation %d waits with admission off", i)
					}
				}
			},
		},
		{
			name: "a sub-agent never waits: its parent was admitted",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "parent", 9000, t0)
				d, tk, err := r.Admit(Request{Key: "parent/sub", Parent: "parent", Tokens: 5000, Now: t0})
				if err != nil || tk != nil || d.Replica != "r0" {
					t.Fatalf("sub-agent: %q, ticket %v, err %v", d.Replica, tk, err)
				}
			},
		},
		{
			name: "the card's full flag keeps the mark until below the low mark",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 10000, t0) // in flight, at the mark
				full := func(n uint32) bool {
					r.mu.Lock()
					r.b.ents[r.b.idx[r.hash("a")]].ctx = n
					r.reps[0].busyFP = int64(n) // its turn counted at that size
					r.mu.Unlock()
					return r.Snapshot().Replicas[0].Full
				}
				for _, c := range []struct {
					ctx  uint32
					want bool
				}{{10000, true}, {9500, true}, {8900, false}, {9500, false}, {10000, true}} {
					if got := full(c.ctx); got != c.want {
						t.Errorf("working set %d: full %v, want %v", c.ctx, got, c.want)
					}
				}
			},
		},
		{
			name: "pauses long against the turns leave room",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				// a: 6k, 2 s turns; then b arrives 1 s into a's pause
				turns := func(gap time.Duration) time.Time {
					now := t0
					d, _ := admitTurn(t, r, "a", 6000, now)
					now = now.Add(2 * time.Second)
					finishTurn(r, "a", d, now, 6000, 0, 100)
					now = now.Add(gap)
					d, _ = admitTurn(t, r, "a", 6100, now)
					now = now.Add(2 * time.Second)
					r.Feedback(Turn{Key: "a", Replica: d.Replica, Reason: d.Reason, Prompt: 6100, Cached: 6000, Completion: 100, Duration: 2 * time.Second})
					d.ReleaseAt(now)
					return now.Add(time.Second)
				}
				now := turns(30 * time.Second)
				// c in flight keeps the replica from looking idle
				c, _ := admitTurn(t, r, "c", 500, now)
				defer c.Release()
				// counted whole, 6.1k + 0.5k + 6k > 10k; counted at their
				// share of the time in flight (2 s of 32), they fit
				if d, tk := admitTurn(t, r, "b", 6000, now); tk != nil || d.Replica != "r0" {
					t.Fatalf("b beside a that pauses 30 s between 2 s turns: %q, ticket %v; want admitted", d.Replica, tk)
				}
			},
		},
		{
			name: "without pauses a second conversation that does not fit waits",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				d, _ := admitTurn(t, r, "a", 6000, t0)
				now := t0.Add(2 * time.Second)
				finishTurn(r, "a", d, now, 6000, 0, 100)
				d, _ = admitTurn(t, r, "a", 6100, now) // no pause
				if _, tk := admitTurn(t, r, "b", 6000, now.Add(time.Second)); tk == nil {
					t.Fatal("b admitted beside a 6.1k conversation in a closed loop on a 10k replica")
				}
				d.ReleaseAt(now.Add(2 * time.Second))
			},
		},
		{
			name: "a second request of a waiting conversation follows it when it is admitted",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				// c stays in flight throughout, so the replica never
				// looks idle and only the working set decides
				c, _ := admitTurn(t, r, "c", 500, t0)
				d, _ := admitTurn(t, r, "a", 9000, t0)
				_, tk := admitTurn(t, r, "b", 6000, t0.Add(time.Second))
				if tk == nil {
					t.Fatal("b admitted beside 9.5k on a 10k replica")
				}
				finishTurn(r, "a", d, t0.Add(2*time.Second), 9000, 0, 10)
				if isReady(tk) {
					t.Fatal("b admitted while a still counts resident")
				}
				// a goes quiet past its resident time (the whole window: it
				// never paused); b's client sends again (a retry) before
				// anything else looked at the queue: the retry admits the
				// queued b and follows its binding
				d2, tk2 := admitTurn(t, r, "b", 6000, t0.Add(2*time.Second+DefaultAdmitWindow+time.Second))
				if tk2 != nil || d2.Reason != ReasonSticky || !isReady(tk) {
					t.Fatalf("retry of b: %v (ticket %v), queued b ready %v; want the retry sticky behind the admitted one", d2.Reason, tk2, isReady(tk))
				}
				checkInvariants(t, r)
				d2.Release()
				c.Release()
			},
		},
		{
			name: "a cancelled ticket leaves the queue and lets the next one in",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 6000, t0)
				_, tb := admitTurn(t, r, "b", 8000, t0) // does not fit beside a
				_, tc := admitTurn(t, r, "c", 3000, t0) // would, but waits behind b
				if tb == nil || tc == nil {
					t.Fatal("b and c must wait")
				}
				if !tb.Cancel() {
					t.Fatal("Cancel of a waiting ticket reported admitted")
				}
				if !isReady(tc) {
					t.Fatal("c still waits after b left the queue")
				}
				if tc.Cancel() {
					t.Fatal("Cancel of an admitted ticket reported it waiting")
				}
				if a := r.Snapshot().Admission; a.Cancelled != 1 || a.Waiting != 0 || a.AdmittedAfterWait != 1 {
					t.Fatalf("counters %+v", a)
				}
			},
		},
		{
			name: "a replica joining lets waiting conversations in",
			n:    1, cap: 10000,
			run: func(t *testing.T, r *Router) {
				admitTurn(t, r, "a", 9000, t0)
				_, tb := admitTurn(t, r, "b", 9000, t0)
				r.SetReplicas(ids(2))
				if isReady(tb) {
					t.Fatal("b admitted to a replica whose capacity is not known yet")
				}
				r.UpdateLoad("r1", Load{Reachable: true, KVTokens: 10000})
				r.AdmitWaiting(t0)
				d, _ := tb.Decision()
				if !isReady(tb) || d.Replica != "r1" {
					t.Fatalf("b: ready %v on %q, want r1", isReady(tb), d.Replica)
				}
			},
		},
		{
			name: "spills go only where the conversation fits",
			n:    2, cap: 10000, cfg: Config{SpillThreshold: 1},
			run: func(t *testing.T, r *Router) {
				da, _ := admitTurn(t, r, "a", 8000, t0)
				db, _ := admitTurn(t, r, "b", 8000, t0)
				if da.Replica == db.Replica {
					t.Fatalf("a and b both on %s", da.Replica)
				}
				finishTurn(r, "a", da, t0.Add(time.Second), 8000, 0, 100)
				// a's replica is over the threshold: the other is not, but
				// b's 8k leaves no room for a's 8.1k there
				r.UpdateLoad(da.Replica, Load{Reachable: true, KVTokens: 10000, Running: 5})
				d, _ := admitTurn(t, r, "a", 8200, t0.Add(time.Second))
				if d.Reason != ReasonStayedOverloaded || d.Replica != da.Replica {
					t.Fatalf("a: %v to %s, want stayed-overloaded on %s", d.Reason, d.Replica, da.Replica)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(tc.n, tc.cap, tc.cfg)
			tc.run(t, r)
			checkInvariants(t, r)
		})
	}
}

// TestResidentTime: a conversation counts in its replica's working set
// while in flight, and after its turn for twice its longest pause, or
// AdmitWindow before a pause was seen.
func TestResidentTime(t *testing.T) {
	t.Parallel()
	r := admitRouter(1, 100000, Config{AdmitWindow: time.Minute})
	ws := func(at time.Time) int64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.adm.workingSet(r.reps[0], unixNanos(at))
	}
	d, _ := admitTurn(t, r, "a", 5000, t0)
	if got := ws(t0.Add(10 * time.Minute)); got != 5000 {
		t.Fatalf("in flight for 10 min: working set %d, want 5000", got)
	}
	end := t0.Add(10 * time.Minute)
	finishTurn(r, "a", d, end, 5000, 0, 100)
	if got := ws(end.Add(59 * time.Second)); got != 5100 {
		t.Fatalf("59 s after its first turn (no pause seen): %d, want 5100", got)
	}
	if got := ws(end.Add(61 * time.Second)); got != 0 {
		t.Fatalf("61 s after its first turn: %d, want 0", got)
	}
	// a pause of 10 s: it now counts for 20 s after a turn
	d, _ = admitTurn(t, r, "a", 5300, end.Add(10*time.Second))
	end2 := end.Add(15 * time.Second)
	finishTurn(r, "a", d, end2, 5300, 5000, 100)
	if got := ws(end2.Add(19 * time.Second)); got == 0 {
		t.Fatal("19 s after a turn, with 10 s pauses: not counted")
	}
	if got := ws(end2.Add(21 * time.Second)); got != 0 {
		t.Fatalf("21 s after a turn, with 10 s pauses: %d, want 0", got)
	}
	// pauses of a few milliseconds (a closed loop): it counts for twice
	// them, not for a floor
	t1 := end2.Add(5 * time.Minute)
	d, _ = admitTurn(t, r, "b", 4000, t1)
	finishTurn(r, "b", d, t1.Add(time.Second), 4000, 0, 100)
	d, _ = admitTurn(t, r, "b", 4200, t1.Add(time.Second+5*time.Millisecond))
	end3 := t1.Add(2 * time.Second)
	finishTurn(r, "b", d, end3, 4200, 4000, 100)
	if got := ws(end3.Add(9 * time.Millisecond)); got == 0 {
		t.Fatal("9 ms after a turn, with 5 ms pauses: not counted")
	}
	if got := ws(end3.Add(11 * time.Millisecond)); got != 0 {
		t.Fatalf("11 ms after a turn, with 5 ms pauses: %d, want 0", got)
	}
}

// TestResidentTypicalPause: before a conversation paused, it counts for
// twice what conversations pause (the 90th percentile of recent pauses),
// not the whole window, once pauses have been seen at all.
func TestResidentTypicalPause(t *testing.T) {
	t.Parallel()
	r := admitRouter(1, 100000, Config{AdmitWindow: time.Minute})
	ws := func(at time.Time) int64 {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.adm.workingSet(r.reps[0], unixNanos(at))
	}
	// a conversation pausing 5 s: pauses seen
	d, _ := admitTurn(t, r, "a", 1000, t0)
	finishTurn(r, "a", d, t0.Add(time.Second), 1000, 0, 10)
	d, _ = admitTurn(t, r, "a", 1100, t0.Add(6*time.Second))
	finishTurn(r, "a", d, t0.Add(7*time.Second), 1100, 1000, 10)
	// a one-turn conversation, never paused
	d, _ = admitTurn(t, r, "b", 3000, t0.Add(7*time.Second))
	end := t0.Add(8 * time.Second)
	finishTurn(r, "b", d, end, 3000, 1000, 10)
	r.Unbind("a")
	if got := ws(end.Add(9 * time.Second)); got == 0 {
		t.Fatal("b not counted 9 s after its turn (pauses of 5 s: it counts for 10 s)")
	}
	if got := ws(end.Add(11 * time.Second)); got != 0 {
		t.Fatalf("b counted 11 s after its turn: %d, want 0 (not the whole minute)", got)
	}
}

// TestAdmissionOffIsExact: with admission off, decisions are exactly those
// of a router whose capacity is unknown (the behaviour without admission).
func TestAdmissionOffIsExact(t *testing.T) {
	t.Parallel()
	a := admitRouter(4, 10000, Config{AdmissionOff: true})
	b := newTestRouter(4, Config{})
	rng := rand.New(rand.NewPCG(7, 7))
	now := t0
	var held [][2]Decision
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(500)) * time.Millisecond)
		switch rng.IntN(3) {
		case 0, 1:
			req := Request{Key: fmt.Sprint("k", rng.IntN(40)), Tokens: rng.IntN(20000), Now: now}
			da, ta, ea := a.Admit(req)
			db, eb := b.Route(req)
			if ta != nil || ea != nil || eb != nil || da.Replica != db.Replica || da.Reason != db.Reason {
				t.Fatalf("step %d: %s/%v (ticket %v, %v) vs %s/%v (%v)", step, da.Replica, da.Reason, ta, ea, db.Replica, db.Reason, eb)
			}
			held = append(held, [2]Decision{da, db})
		default:
			if len(held) > 0 {
				i := rng.IntN(len(held))
				held[i][0].ReleaseAt(now)
				held[i][1].ReleaseAt(now)
				held = append(held[:i], held[i+1:]...)
			}
		}
	}
}

// TestAdmissionRandomized drives admission with random arrivals, turns,
// cancellations, forced admissions and config changes, and checks the
// bindings' invariants and that everything held is given back.
func TestAdmissionRandomized(t *testing.T) {
	t.Parallel()
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			cfg := Config{MaxNumSeqs: 16, AdmitQueue: 20, AdmitWait: time.Minute, MaxBindings: 60}
			r := admitRouter(3, 30000, cfg)
			now := t0
			type held struct {
				key string
				d   Decision
			}
			var hs []held
			var tickets []*Ticket
			var tkKeys []string
			for step := range 8000 {
				now = now.Add(time.Duration(rng.IntN(800)) * time.Millisecond)
				switch op := rng.IntN(100); {
				case op < 45:
					key := fmt.Sprint("k", rng.IntN(80))
					d, tk, err := r.Admit(Request{Key: key, Tokens: 1000 + rng.IntN(15000), Now: now})
					switch {
					case errors.Is(err, ErrQueueFull):
					case err != nil:
						t.Fatalf("step %d: %v", step, err)
					case tk != nil:
						tickets, tkKeys = append(tickets, tk), append(tkKeys, key)
					default:
						hs = append(hs, held{key, d})
					}
				case op < 80:
					if len(hs) > 0 {
						i := rng.IntN(len(hs))
						p := 1000 + rng.IntN(20000)
						finishTurn(r, hs[i].key, hs[i].d, now, p, rng.IntN(p), rng.IntN(500))
						hs = append(hs[:i], hs[i+1:]...)
					}
				case op < 90:
					// tickets admitted since: take their decisions; cancel some
					for i := 0; i < len(tickets); i++ {
						tk := tickets[i]
						if isReady(tk) || rng.IntN(5) == 0 {
							if !isReady(tk) && tk.Cancel() {
							} else if d, err := tk.Decision(); err == nil {
								hs = append(hs, held{tkKeys[i], d})
							}
							tickets = append(tickets[:i], tickets[i+1:]...)
							tkKeys = append(tkKeys[:i], tkKeys[i+1:]...)
							i--
						}
					}
				case op < 94:
					r.AdmitWaiting(now)
				case op < 96:
					if len(tickets) > 0 {
						tickets[rng.IntN(len(tickets))].Force(now)
					}
				case op < 98:
					c := cfg
					c.AdmissionOff = rng.IntN(3) == 0
					c.HighWater = 0.5 + rng.Float64()
					r.Reconfigure(c)
				default:
					r.UpdateLoad(fmt.Sprint("r", rng.IntN(3)), Load{Reachable: true, KVTokens: 10000 + rng.IntN(40000)})
				}
				if step%101 == 0 {
					checkInvariants(t, r)
					if q := r.Waiting(); q > cfg.AdmitQueue {
						t.Fatalf("step %d: %d waiting over the limit %d", step, q, cfg.AdmitQueue)
					}
				}
			}
			for _, tk := range tickets {
				if !tk.Cancel() {
					if d, err := tk.Decision(); err == nil {
						hs = append(hs, held{"", d})
					}
				}
			}
			for _, h := range hs {
				h.d.ReleaseAt(now)
			}
			checkInvariants(t, r)
			s := r.Snapshot()
			if s.InFlight != 0 || s.Admission.Waiting != 0 {
				t.Fatalf("after releasing everything: in flight %d, waiting %d", s.InFlight, s.Admission.Waiting)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, p := range r.reps {
				if p != nil && p.busyFP != 0 {
					t.Fatalf("%s: %d tokens still counted in flight", p.id, p.busyFP)
				}
			}
			for e := r.b.ghead; e != nilIdx; e = r.b.ents[e].gnext {
				if r.b.ents[e].busy != 0 {
					t.Fatalf("binding %d: busy %d after releasing everything", e, r.b.ents[e].busy)
				}
			}
		})
	}
}

// TestFullFollowsWorkingSet: a replica marked full at a placement is
// reported not full once its working set fell below the low-water mark,
// without another placement (the queue drained, conversations went quiet).
func TestFullFollowsWorkingSet(t *testing.T) {
	t.Parallel()
	r := admitRouter(1, 10000, Config{})
	d, _ := admitTurn(t, r, "a", 11000, t0)
	finishTurn(r, "a", d, t0.Add(time.Second), 11000, 0, 100)
	d, _ = r.Route(Request{Key: "b", Tokens: 1000, Now: t0.Add(2 * time.Second)}) // placed anyway; marks r0 full
	finishTurn(r, "b", d, t0.Add(3*time.Second), 1000, 0, 10)
	if row := replicaRow(t, r, "r0"); !row.Full {
		t.Fatalf("working set %d of %d: not full, want full", row.WorkingSet, row.Capacity)
	}
	// both have gone quiet: nothing is placed, the card is read
	r.Sweep(t0.Add(DefaultAdmitWindow + time.Minute))
	if row := replicaRow(t, r, "r0"); row.Full || row.WorkingSet >= 9000 {
		t.Fatalf("working set %d of %d, full %v; want below the low-water mark and not full", row.WorkingSet, row.Capacity, row.Full)
	}
}

// TestAdmissionHoldsRatherThanTryAnOutReplica: a new conversation that
// fits none of the replicas in waits; it is not placed on a replica out
// for a failure (in its cool-down) because it would fit there. The lenient
// pick that ignores the router's own failure signals is for when every
// replica is out, not for when those in are full.
func TestAdmissionHoldsRatherThanTryAnOutReplica(t *testing.T) {
	r := admitRouter(2, 3000, Config{})
	now := time.Unix(1000, 0)
	da, tk := admitTurn(t, r, "A", 2000, now)
	if tk != nil {
		t.Fatal("A held on an empty fleet")
	}
	db, tk := admitTurn(t, r, "B", 2000, now)
	if tk != nil {
		t.Fatal("B held with a replica empty")
	}
	// B's replica fails its turn: out for the cool-down, idle
	db.Failed(now)
	db.ReleaseAt(now)
	dc, tk := admitTurn(t, r, "C", 2000, now.Add(time.Second))
	if tk == nil {
		t.Fatalf("C placed on %s (%v) while %s cools down and A's turn fills %s", dc.Replica, dc.Reason, db.Replica, da.Replica)
	}
	tk.Cancel()
}

// TestAdmissionActiveMatchesSnapshot: the cheap accessor says what the
// snapshot says, before and after the capacities are known and when
// admission is switched off.
func TestAdmissionActiveMatchesSnapshot(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	if r.AdmissionActive() != r.Admission().Active || r.AdmissionActive() {
		t.Fatal("in force before any replica was polled")
	}
	for _, id := range ids(2) {
		r.UpdateLoad(id, Load{Reachable: true, KVTokens: 10000})
	}
	if !r.AdmissionActive() || !r.Admission().Active {
		t.Fatal("not in force with every capacity known")
	}
	r.SetAdmission(false)
	if r.AdmissionActive() || r.Admission().Active {
		t.Fatal("in force after SetAdmission(false)")
	}
}

// TestUncachedStart: a new conversation's first request shares the
// replica's system prompt when it is longer than that; a shorter one
// cannot hold it and counts whole.
func TestUncachedStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ est, base, want int64 }{
		{9000, 4000, 5000}, // holds the shared part: only its own
		{5000, 4000, 1000}, // a short first message after a long system prompt
		{4000, 4000, 4000}, // no longer than the shared part: another client's
		{3000, 4000, 3000},
		{3000, 0, 3000}, // nothing shared yet
	} {
		if got := uncachedStart(tc.est, tc.base); got != tc.want {
			t.Errorf("uncachedStart(%d, %d) = %d, want %d", tc.est, tc.base, got, tc.want)
		}
	}
}

// TestPinnedTurnsLearnPauses: a conversation whose every turn names its
// replica (a client that pins) pauses between turns as any other, and its
// pauses count: it leaves its replica's working set twice its pause after
// a turn, not the whole admit window.
func TestPinnedTurnsLearnPauses(t *testing.T) {
	t.Parallel()
	r := admitRouter(2, 100000, Config{AdmitWindow: time.Minute})
	now := t0
	for i := range 3 {
		d, tk, err := r.Admit(Request{Key: "a", Pin: "r1", Tokens: 5000 + 100*i, Now: now})
		if err != nil || tk != nil || d.Replica != "r1" {
			t.Fatalf("turn %d: %s, %v, ticket %v", i, d.Replica, err, tk)
		}
		now = now.Add(time.Second)
		finishTurn(r, "a", d, now, 5000+100*i, 5000*min(i, 1), 100)
		now = now.Add(5 * time.Second) // a pause of 5 s
	}
	end := now.Add(-5 * time.Second) // the last turn's end
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := r.adm.workingSet(r.reps[1], unixNanos(end.Add(9*time.Second))); got == 0 {
		t.Fatal("9 s after its turn, with 5 s pauses: not counted")
	}
	if got := r.adm.workingSet(r.reps[1], unixNanos(end.Add(11*time.Second))); got != 0 {
		t.Fatalf("11 s after its turn, with 5 s pauses: %d, want 0 (not the whole minute)", got)
	}
}
