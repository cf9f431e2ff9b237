package placement

import (
	"testing"
	"time"
)

// TestSideRequests routes sequences of starts under one key, as a coding
// agent sends them: its conversation (start a), side requests with starts
// of their own (a session title, a probe) and, after a compaction, a new
// start that every later turn carries.
func TestSideRequests(t *testing.T) {
	t.Parallel()
	const a, c, t1, t2, t3 uint64 = 0xa, 0xc, 0x71, 0x72, 0x73
	type step struct {
		start  uint64
		reason Reason
		rep    string // where it goes
		prev   string // Decision.Previous
		bound  string // the binding afterwards
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, r *Router) // after the binding on r0
		steps []step
		side  map[string]uint64 // Side per replica at the end
		rest  map[string]uint64 // Restarted per replica at the end
	}{
		{
			name: "title requests between turns move nothing",
			steps: []step{
				{t1, ReasonSide, "r0", "", "r0"},
				{a, ReasonSticky, "r0", "", "r0"},
				{a, ReasonSticky, "r0", "", "r0"},
				{t2, ReasonSide, "r0", "", "r0"},
				{a, ReasonSticky, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 2},
		},
		{
			name: "a side start seen again after a turn of the conversation is still a side request",
			steps: []step{
				{t1, ReasonSide, "r0", "", "r0"},
				{a, ReasonSticky, "r0", "", "r0"},
				{t1, ReasonSide, "r0", "", "r0"},
				{a, ReasonSticky, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 2},
		},
		{
			name: "compaction: the new start recurs and is the conversation, restarted once where it went",
			steps: []step{
				{a, ReasonSticky, "r0", "", "r0"}, // the summary request keeps the start
				{c, ReasonSide, "r0", "", "r0"},
				{c, ReasonRestarted, "r0", "", "r0"},
				{c, ReasonSticky, "r0", "", "r0"},
				// the old start again, with history: the conversation
				// itself (the new start was another client's), its start
				// back, a turn as any other
				{a, ReasonSticky, "r0", "", "r0"},
				{c, ReasonSide, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 2},
			rest: map[string]uint64{"r0": 1},
		},
		{
			name: "a title request between the new start's two turns",
			steps: []step{
				{c, ReasonSide, "r0", "", "r0"},
				{t1, ReasonSide, "r0", "", "r0"},
				{c, ReasonRestarted, "r0", "", "r0"},
				{t2, ReasonSide, "r0", "", "r0"},
				{c, ReasonSticky, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 3},
			rest: map[string]uint64{"r0": 1},
		},
		{
			name: "two side requests push a new start out",
			steps: []step{
				{c, ReasonSide, "r0", "", "r0"},
				{t1, ReasonSide, "r0", "", "r0"},
				{t2, ReasonSide, "r0", "", "r0"},
				{c, ReasonSide, "r0", "", "r0"},
				{c, ReasonRestarted, "r0", "", "r0"},
				{t3, ReasonSide, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 5},
			rest: map[string]uint64{"r0": 1},
		},
		{
			name: "replica over the threshold: side requests go by load, the conversation stays",
			setup: func(t *testing.T, r *Router) {
				hold(t, r, "r0", 5) // threshold 4
				hold(t, r, "r2", 1) // r1 is the least loaded
			},
			steps: []step{
				{t1, ReasonSide, "r1", "", "r0"},
				{c, ReasonSide, "r1", "", "r0"},
				// it recurs: restarted where the conversation is, which
				// can take it (a start under the key may be another
				// client's: it moves nothing)
				{c, ReasonRestarted, "r0", "", "r0"},
			},
			side: map[string]uint64{"r1": 2},
			rest: map[string]uint64{"r0": 1},
		},
		{
			name: "replica out: a side request goes by load, the conversation's turn is re-placed",
			setup: func(t *testing.T, r *Router) {
				r.SetAvailable("r0", false)
				hold(t, r, "r2", 1)
			},
			steps: []step{
				{t1, ReasonSide, "r1", "", "r0"},
				{a, ReasonReplaced, "r1", "r0", "r1"},
			},
			side: map[string]uint64{"r1": 1},
		},
		{
			name: "new start recurring after its replica went out: placed by load",
			setup: func(t *testing.T, r *Router) {
				hold(t, r, "r1", 1) // r2 is the least loaded once r0 is out
			},
			steps: []step{
				{c, ReasonSide, "r0", "", "r0"},
				{0, 0, "", "", ""}, // r0 goes out
				{c, ReasonRestarted, "r2", "r0", "r2"},
			},
			side: map[string]uint64{"r0": 1},
			rest: map[string]uint64{"r2": 1},
		},
		{
			name: "cold binding: a recurring new start stays where it was computed",
			setup: func(t *testing.T, r *Router) {
				r.ColdReplica("r0")
			},
			steps: []step{
				{c, ReasonSide, "r0", "", "r0"},
				{c, ReasonRestarted, "r0", "", "r0"},
				{c, ReasonSticky, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 1},
			rest: map[string]uint64{"r0": 1},
		},
		{
			name: "unknown start: sticky, remembered side starts kept",
			steps: []step{
				{c, ReasonSide, "r0", "", "r0"},
				{0, ReasonSticky, "r0", "", "r0"},
				{c, ReasonRestarted, "r0", "", "r0"},
			},
			side: map[string]uint64{"r0": 1},
			rest: map[string]uint64{"r0": 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(3, Config{MaxNumSeqs: 16})
			d, err := r.Route(Request{Key: "k", Pin: "r0", Start: a, Now: t0})
			if err != nil {
				t.Fatal(err)
			}
			d.Release()
			// the conversation's start comes again: it is the
			// conversation's
			if d, err = r.Route(Request{Key: "k", Start: a, Now: t0}); err != nil || d.Reason != ReasonSticky {
				t.Fatalf("second turn: %s, %v", d.Reason, err)
			}
			d.Release()
			if tc.setup != nil {
				tc.setup(t, r)
			}
			keyed := r.Snapshot().KeyedRequests
			now := t0
			wantKeyed := keyed
			for i, s := range tc.steps {
				if s.reason == 0 {
					r.SetAvailable("r0", false)
					continue
				}
				now = now.Add(time.Second)
				d, err := r.Route(Request{Key: "k", Start: s.start, Now: now})
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				d.Release()
				if d.Reason != s.reason || d.Replica != s.rep || d.Previous != s.prev {
					t.Fatalf("step %d (start %x): %s %s (previous %q), want %s %s (previous %q)",
						i, s.start, d.Replica, d.Reason, d.Previous, s.rep, s.reason, s.prev)
				}
				if b, _ := r.Bound("k"); b != s.bound {
					t.Fatalf("step %d: bound to %s, want %s", i, b, s.bound)
				}
				if s.reason == ReasonSticky || s.reason == ReasonReplaced {
					wantKeyed++
				}
			}
			snap := r.Snapshot()
			if snap.KeyedRequests != wantKeyed {
				t.Errorf("KeyedRequests = %d, want %d (side requests and restarts are not keyed)", snap.KeyedRequests, wantKeyed)
			}
			for _, row := range snap.Replicas {
				if row.Side != tc.side[row.ID] {
					t.Errorf("%s: Side = %d, want %d", row.ID, row.Side, tc.side[row.ID])
				}
				if row.Restarted != tc.rest[row.ID] {
					t.Errorf("%s: Restarted = %d, want %d", row.ID, row.Restarted, tc.rest[row.ID])
				}
			}
		})
	}
}

// TestSideStartsForgotten: the side starts a binding remembers go with the
// binding, so a conversation that is unbound, ends or expires leaves
// nothing behind, and a later binding under the key starts afresh.
func TestSideStartsForgotten(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{IdleTTL: time.Minute})
	route := func(key string, start uint64, now time.Time) Decision {
		t.Helper()
		d, err := r.Route(Request{Key: key, Start: start, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		d.Release()
		return d
	}
	for i, key := range []string{"unbound", "ended", "expired"} {
		route(key, 1, t0)
		if d := route(key, uint64(10+i), t0.Add(time.Second)); d.Reason != ReasonSide {
			t.Fatalf("%s: %s, want side", key, d.Reason)
		}
	}
	if n := len(r.side); n != 3 {
		t.Fatalf("%d bindings with side starts, want 3", n)
	}
	r.Unbind("unbound")
	r.End("ended", t0.Add(2*time.Second))
	r.Sweep(t0.Add(2 * time.Minute))
	if n := len(r.side); n != 0 {
		t.Fatalf("%d bindings' side starts left after unbind, end and expiry, want 0", n)
	}
	// a new binding under the key: its first start is its own
	route("unbound", 10, t0.Add(3*time.Minute))
	if d := route("unbound", 10, t0.Add(3*time.Minute)); d.Reason != ReasonSticky {
		t.Fatalf("new binding's second turn: %s, want sticky", d.Reason)
	}
}

// TestSideRouteFast: the side path does not allocate once the binding's
// side starts are stored.
func TestSideRouteAllocs(t *testing.T) {
	r := newTestRouter(2, Config{})
	d, _ := r.Route(Request{Key: "k", Start: 1, Now: t0})
	d.Release()
	n := uint64(100)
	allocs := testing.AllocsPerRun(100, func() {
		n++
		d, err := r.Route(Request{Key: "k", Start: n, Now: t0})
		if err != nil || d.Reason != ReasonSide {
			t.Fatalf("%s %v", d.Reason, err)
		}
		d.Release()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per side request, want 0", allocs)
	}
}

// TestSideRequestFirst: a session whose first request is a side request
// (Claude Code sends the title request before the first turn) is bound
// with that request's start; the conversation's start, once it recurs,
// replaces it on the same replica with no restart, and later title
// requests are side requests.
func TestSideRequestFirst(t *testing.T) {
	t.Parallel()
	const title1, conv, title2 uint64 = 0x71, 0xa, 0x72
	r := newTestRouter(3, Config{})
	want := []struct {
		start  uint64
		reason Reason
	}{
		{title1, ReasonPlaced},
		{conv, ReasonSide},
		{conv, ReasonSticky},
		{conv, ReasonSticky},
		{title2, ReasonSide},
		{conv, ReasonSticky},
	}
	var rep string
	for i, w := range want {
		d, err := r.Route(Request{Key: "k", Start: w.start, Now: t0.Add(time.Duration(i) * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		d.Release()
		if rep == "" {
			rep = d.Replica
		}
		if d.Reason != w.reason || d.Replica != rep || d.Previous != "" {
			t.Fatalf("request %d (start %x): %s %s (previous %q), want %s %s", i, w.start, d.Replica, d.Reason, d.Previous, rep, w.reason)
		}
	}
	for _, row := range r.Snapshot().Replicas {
		if row.Restarted != 0 {
			t.Errorf("%s: Restarted = %d, want 0", row.ID, row.Restarted)
		}
	}
}

// TestSideRequestFeedback: what the engine reports for a side request (a
// short title prompt) does not become the conversation's context, so the
// next turn's prediction still comes from the conversation's last turn.
func TestSideRequestFeedback(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	turn(t, r, "k", 1, t0, 20000, 0)
	turn(t, r, "k", 1, t0.Add(time.Second), 21000, 19984)
	if d := turn(t, r, "k", 99, t0.Add(2*time.Second), 300, 0); d.Reason != ReasonSide {
		t.Fatalf("title request: %s, want side", d.Reason)
	}
	d, err := r.Route(Request{Key: "k", Start: 1, Now: t0.Add(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	d.Release()
	got := r.Feedback(Turn{Key: "k", Replica: d.Replica, Reason: d.Reason, Prompt: 22000, Cached: 20984})
	if want := 21000 - DefaultBlockTokens; got != want {
		t.Fatalf("prediction after a side request: %d, want %d (from the conversation's last turn)", got, want)
	}
}

// TestLoneSideRequests: a lone request (one message) with another start is
// a side request however often it comes: a permission classifier's call
// retried five times does not become the conversation.
func TestLoneSideRequests(t *testing.T) {
	t.Parallel()
	const title, conv, check uint64 = 0x71, 0xa, 0xcc
	r := newTestRouter(3, Config{})
	want := []struct {
		start  uint64
		lone   bool
		reason Reason
	}{
		{title, true, ReasonPlaced},
		{conv, false, ReasonSide},
		{check, true, ReasonSide},
		{check, true, ReasonSide},
		{check, true, ReasonSide},
		{check, true, ReasonSide},
		{check, true, ReasonSide},
		{conv, false, ReasonSticky},
		{check, true, ReasonSide},
		{check, true, ReasonSide},
		{conv, false, ReasonSticky},
	}
	var rep string
	for i, w := range want {
		d, err := r.Route(Request{Key: "k", Start: w.start, Lone: w.lone, Now: t0.Add(time.Duration(i) * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		d.Release()
		if rep == "" {
			rep = d.Replica
		}
		if d.Reason != w.reason || d.Replica != rep {
			t.Fatalf("request %d (start %x, lone %v): %s %s, want %s %s", i, w.start, w.lone, d.Replica, d.Reason, rep, w.reason)
		}
	}
	for _, row := range r.Snapshot().Replicas {
		if row.Restarted != 0 {
			t.Errorf("%s: Restarted = %d, want 0", row.ID, row.Restarted)
		}
	}
	if n := len(r.side); n != 0 {
		t.Errorf("%d bindings with side starts remembered, want 0 (lone ones are not)", n)
	}
}

// TestSideRequestFirstOverThreshold: the conversation's start, once it
// recurs on a binding a side request placed, is a sticky turn; over the
// spill threshold it goes through the threshold's comparison as any
// sticky turn does, not past it.
func TestSideRequestFirstOverThreshold(t *testing.T) {
	t.Parallel()
	const title, conv uint64 = 0x71, 0xa
	r := newTestRouter(2, Config{SpillThreshold: 1})
	d, err := r.Route(Request{Key: "k", Start: title, Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	d.Release()
	side, err := r.Route(Request{Key: "k", Start: conv, Now: t0.Add(time.Second)})
	if err != nil || side.Reason != ReasonSide {
		t.Fatalf("second request: %+v, %v; want a side request", side, err)
	}
	side.Release()
	// two turns of others in flight there: over the threshold of 1
	for _, k := range []string{"x", "y"} {
		pinned(t, r, k, d.Replica, t0.Add(2*time.Second))
	}
	got, err := r.Route(Request{Key: "k", Start: conv, Tokens: 100, Now: t0.Add(3 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	switch got.Reason {
	case ReasonSpilled, ReasonStayedOverloaded, ReasonSpillDeclined:
	default:
		t.Fatalf("the conversation's start recurring over the threshold: %s on %s; want the threshold's comparison", got.Reason, got.Replica)
	}
}
