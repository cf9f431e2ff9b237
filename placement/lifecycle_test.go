package placement

import (
	"testing"
	"time"
)

// turn routes one turn and feeds the engine's answer back at once.
func turn(t *testing.T, r *Router, key string, start uint64, now time.Time, prompt, cached int) Decision {
	t.Helper()
	d, err := r.Route(Request{Key: key, Start: start, Now: now})
	if err != nil {
		t.Fatalf("routing %q: %v", key, err)
	}
	d.Release()
	r.Feedback(Turn{Key: key, Replica: d.Replica, Reason: d.Reason, Prompt: prompt, Cached: cached})
	return d
}

func TestLifecycleRules(t *testing.T) {
	t.Parallel()
	const a, b uint64 = 0xa, 0xb
	tests := []struct {
		name string
		// setup binds "k" on r0 (start a, prompt 1000 delivered) and may do
		// more; then the request is routed with r0 loaded so that a
		// placement by load picks another replica.
		setup    func(t *testing.T, r *Router)
		start    uint64
		reason   Reason
		previous string
	}{
		{name: "same start stays", start: a, reason: ReasonSticky},
		{name: "unknown start stays", start: 0, reason: ReasonSticky},
		{name: "new start is a side request", start: b, reason: ReasonSide},
		{
			name: "binding without a start learns it, no restart",
			setup: func(t *testing.T, r *Router) {
				r.Unbind("k")
				bindTo(t, r, "k", "r0", t0.Add(time.Second))
			},
			start: b, reason: ReasonSticky,
		},
		{
			// the turn that found its cache gone computed its prompt on
			// r0, which holds it again: no reason to move
			name: "delivered far below predicted stays",
			setup: func(t *testing.T, r *Router) {
				turn(t, r, "k", a, t0.Add(time.Second), 1200, 64) // predicted 984
			},
			start: a, reason: ReasonSticky,
		},
		{
			name: "delivered at half the prediction stays warm",
			setup: func(t *testing.T, r *Router) {
				turn(t, r, "k", a, t0.Add(time.Second), 1200, 492) // predicted 984
			},
			start: a, reason: ReasonSticky,
		},
		{
			name: "replica restart makes every binding cold",
			setup: func(t *testing.T, r *Router) {
				if n := r.ColdReplica("r0"); n != 1 {
					t.Fatalf("ColdReplica marked %d bindings, want 1", n)
				}
			},
			start: a, reason: ReasonColdReplaced, previous: "r0",
		},
		{
			// the conversation's cache is gone, but a new start is a side
			// request before it is anything else
			name: "side request on a cold binding",
			setup: func(t *testing.T, r *Router) {
				r.ColdReplica("r0")
			},
			start: b, reason: ReasonSide,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(2, Config{MaxNumSeqs: 16})
			d, err := r.Route(Request{Key: "k", Pin: "r0", Start: a, Now: t0})
			if err != nil {
				t.Fatal(err)
			}
			d.Release()
			r.Feedback(Turn{Key: "k", Replica: "r0", Reason: d.Reason, Prompt: 1000})
			if tc.setup != nil {
				tc.setup(t, r)
			}
			hold(t, r, "r0", 2) // r1 is the less loaded
			got, err := r.Route(Request{Key: "k", Start: tc.start, Now: t0.Add(time.Minute)})
			if err != nil {
				t.Fatal(err)
			}
			if got.Reason != tc.reason || got.Previous != tc.previous {
				t.Fatalf("got %s (%s, previous %q), want %s, previous %q", got.Replica, got.Reason, got.Previous, tc.reason, tc.previous)
			}
			wantRep := "r0"
			if tc.previous != "" {
				wantRep = "r1"
			}
			if got.Replica != wantRep {
				t.Fatalf("routed to %s, want %s", got.Replica, wantRep)
			}
			s := replicaRow(t, r, wantRep)
			switch tc.reason {
			case ReasonRestarted:
				if s.Restarted != 1 {
					t.Fatalf("Restarted = %d, want 1", s.Restarted)
				}
			case ReasonColdReplaced:
				if s.ColdReplaced != 1 {
					t.Fatalf("ColdReplaced = %d, want 1", s.ColdReplaced)
				}
			}
			// the turn after a re-placement sticks to the new replica; a
			// side request's start that comes again is the conversation
			// going on with it, where the side request went (the
			// binding's own start came once: no restart)
			got.Release()
			next, _ := r.Route(Request{Key: "k", Start: tc.start, Now: t0.Add(2 * time.Minute)})
			next.Release()
			if next.Reason != ReasonSticky || next.Replica != wantRep {
				t.Fatalf("next turn: %s (%s), want %s (sticky)", next.Replica, next.Reason, wantRep)
			}
		})
	}
}

// Only the conversation's start is fingerprinted: later messages change on
// every turn, the start does not, so a long conversation never counts as
// restarted.
func TestNoFalseRestartOverManyTurns(t *testing.T) {
	t.Parallel()
	r := newTestRouter(3, Config{})
	first := turn(t, r, "k", 42, t0, 500, 0)
	prompt := 500
	for i := 1; i <= 50; i++ {
		d := turn(t, r, "k", 42, t0.Add(time.Duration(i)*time.Second), prompt+300, prompt)
		if d.Reason != ReasonSticky || d.Replica != first.Replica {
			t.Fatalf("turn %d: %s (%s), want %s sticky", i, d.Replica, d.Reason, first.Replica)
		}
		prompt += 300
	}
	s := replicaRow(t, r, first.Replica)
	if s.Restarted != 0 || s.ColdMarked != 0 || s.MeasuredTurns != 50 {
		t.Fatalf("restarted %d, cold %d, measured %d; want 0, 0, 50", s.Restarted, s.ColdMarked, s.MeasuredTurns)
	}
	if s.DeliveredShare() != 1 {
		t.Fatalf("delivered share %v, want 1 (every turn found its prefix)", s.DeliveredShare())
	}
}

func TestFeedbackAccounting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                    string
		prev                    int // prompt of the binding's previous turn; 0 = first turn
		prompt                  int // the turn's prompt; 0 = prev+100
		reason                  Reason
		replica                 string
		cached                  int
		wantPredicted           int
		wantMeasured, wantDeliv uint64
	}{
		{name: "first turn predicts nothing", reason: ReasonPlaced, replica: "r0", cached: 0},
		{name: "sticky, all delivered", prev: 1000, reason: ReasonSticky, replica: "r0", cached: 1000, wantPredicted: 984, wantMeasured: 1, wantDeliv: 984},
		{name: "sticky, partly delivered", prev: 1000, reason: ReasonSticky, replica: "r0", cached: 600, wantPredicted: 984, wantMeasured: 1, wantDeliv: 600},
		{name: "sticky, only the system prompt", prev: 1000, reason: ReasonSticky, replica: "r0", cached: 128, wantPredicted: 984, wantMeasured: 1, wantDeliv: 128},
		{name: "stayed overloaded counts", prev: 1000, reason: ReasonStayedOverloaded, replica: "r0", cached: 0, wantPredicted: 984, wantMeasured: 1},
		{name: "spilled turn predicts nothing", prev: 1000, reason: ReasonSpilled, replica: "r0", cached: 0},
		{name: "other replica is ignored", prev: 1000, reason: ReasonSticky, replica: "r1", cached: 0},
		{name: "prompt under a block predicts nothing", prev: 10, reason: ReasonSticky, replica: "r0", cached: 0, prompt: 15},
		{name: "shorter history predicts its own prompt", prev: 1000, prompt: 400, reason: ReasonSticky, replica: "r0", cached: 399, wantPredicted: 384, wantMeasured: 1, wantDeliv: 384},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(2, Config{})
			bindTo(t, r, "k", "r0", t0)
			if tc.prev > 0 {
				r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonPlaced, Prompt: tc.prev})
			}
			prompt := tc.prompt
			if prompt == 0 {
				prompt = tc.prev + 100
			}
			if pred := r.Feedback(Turn{Key: "k", Replica: tc.replica, Reason: tc.reason, Prompt: prompt, Cached: tc.cached}); pred != tc.wantPredicted {
				t.Fatalf("Feedback = %d, want %d", pred, tc.wantPredicted)
			}
			s := replicaRow(t, r, "r0")
			if s.MeasuredTurns != tc.wantMeasured || s.PredictedTokens != uint64(tc.wantPredicted) || s.DeliveredTokens != tc.wantDeliv {
				t.Fatalf("measured %d predicted %d delivered %d; want %d %d %d",
					s.MeasuredTurns, s.PredictedTokens, s.DeliveredTokens, tc.wantMeasured, tc.wantPredicted, tc.wantDeliv)
			}
			if s.ColdMarked != 0 {
				t.Fatalf("ColdMarked = %d: a shortfall must not mark the binding cold (the turn refilled its cache)", s.ColdMarked)
			}
		})
	}
}

func TestFeedbackBadInput(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{})
	for _, tr := range []Turn{
		{Key: "", Replica: "r0", Reason: ReasonSticky, Prompt: 10},
		{Key: "unbound", Replica: "r0", Reason: ReasonSticky, Prompt: 10},
		{Key: "k", Replica: "r0", Reason: ReasonSticky, Prompt: -1},
		{Key: "k", Replica: "r0", Reason: ReasonSticky, Prompt: 10, Cached: -5},
	} {
		if p := r.Feedback(tr); p != 0 {
			t.Fatalf("Feedback(%+v) = %d, want 0", tr, p)
		}
	}
	if n := r.ColdReplica("nope"); n != 0 {
		t.Fatalf("ColdReplica of an unknown replica marked %d", n)
	}
}

func TestColdReplicaMarksAllItsBindings(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	for _, k := range []string{"a", "b", "c"} {
		bindTo(t, r, k, "r0", t0)
	}
	bindTo(t, r, "d", "r1", t0)
	if n := r.ColdReplica("r0"); n != 3 {
		t.Fatalf("marked %d, want 3", n)
	}
	if n := r.ColdReplica("r0"); n != 0 {
		t.Fatalf("marking again marked %d, want 0", n)
	}
	d, _ := r.Route(Request{Key: "d", Now: t0.Add(time.Second)})
	d.Release()
	if d.Reason != ReasonSticky {
		t.Fatalf("r1's binding: %s, want sticky", d.Reason)
	}
	for _, k := range []string{"a", "b", "c"} {
		d, _ := r.Route(Request{Key: k, Now: t0.Add(time.Second)})
		d.Release()
		if d.Reason != ReasonColdReplaced {
			t.Fatalf("%s: %s, want cold-replaced", k, d.Reason)
		}
	}
}

// TestColdReplicaSince: a restart seen at a poll marks cold only the
// bindings whose last turn was routed before the previous poll; a turn
// routed since may have run on the restarted engine and refilled it.
func TestColdReplicaSince(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		since time.Duration // after t0
		want  []string      // keys marked cold
	}{
		{"before every turn", 0, nil},
		{"between the turns", 2 * time.Second, []string{"a", "b"}},
		{"after every turn", time.Minute, []string{"a", "b", "c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(2, Config{})
			bindTo(t, r, "a", "r0", t0.Add(time.Second))
			bindTo(t, r, "b", "r0", t0.Add(time.Second))
			bindTo(t, r, "c", "r0", t0.Add(3*time.Second))
			if n := r.ColdReplicaSince("r0", t0.Add(tc.since)); n != len(tc.want) {
				t.Fatalf("marked %d, want %d", n, len(tc.want))
			}
			for _, k := range []string{"a", "b", "c"} {
				d, err := r.Route(Request{Key: k, Now: t0.Add(2 * time.Minute)})
				if err != nil {
					t.Fatal(err)
				}
				d.Release()
				want := ReasonSticky
				for _, c := range tc.want {
					if c == k {
						want = ReasonColdReplaced
					}
				}
				if d.Reason != want {
					t.Errorf("%s: %s, want %s", k, d.Reason, want)
				}
			}
			if n := r.ColdReplicaSince("nope", t0.Add(time.Hour)); n != 0 {
				t.Fatalf("an unknown replica marked %d", n)
			}
		})
	}
}

func TestEnd(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	bindTo(t, r, "k", "r1", t0)
	if !r.End("k", t0.Add(time.Second)) {
		t.Fatal("End of a bound conversation reported no binding")
	}
	if _, ok := r.Bound("k"); ok {
		t.Fatal("binding still there after End")
	}
	if r.End("k", t0.Add(time.Second)) {
		t.Fatal("second End reported a binding")
	}
	if s := replicaRow(t, r, "r1"); s.Ended != 1 || s.Bindings != 0 {
		t.Fatalf("Ended %d, Bindings %d; want 1, 0", s.Ended, s.Bindings)
	}
	// an expired binding is not ended
	bindTo(t, r, "old", "r0", t0)
	if r.End("old", t0.Add(2*DefaultIdleTTL)) {
		t.Fatal("End of an expired binding reported one")
	}
	if s := replicaRow(t, r, "r0"); s.Ended != 0 {
		t.Fatalf("expired binding counted as ended: %d", s.Ended)
	}
}
