package placement

import (
	"testing"
	"time"
)

// A turn sent again after its replica closed the connection it went out on
// (Request.Replay) is counted once, with its first attempt's decision: it
// goes back to that replica with that reason, or, when the replica went
// out meanwhile, is re-placed without counting again; either way the
// replica that closed the connection counts a replay.
func TestReplayCountsOnce(t *testing.T) {
	t.Parallel()
	type counts struct {
		requests, keyed, sticky uint64
		placed, stuck, replaced uint64
		replays                 uint64
	}
	sum := func(r *Router) counts {
		s := r.Snapshot()
		c := counts{requests: s.Requests, keyed: s.KeyedRequests, sticky: s.StickyRequests}
		for _, rs := range s.Replicas {
			c.placed += rs.Placed
			c.stuck += rs.Sticky
			c.replaced += rs.Replaced
			c.replays += rs.Replays
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		turns int  // turns before the replayed one
		out   bool // the first attempt's replica goes out before the replay
		want  counts
		// the replay's reason and whether it went to the first attempt's
		// replica
		reason Reason
		same   bool
	}{
		{"first turn", 0, false, counts{requests: 1, placed: 1, replays: 1}, ReasonPlaced, true},
		{"sticky turn", 1, false, counts{requests: 2, keyed: 1, sticky: 1, placed: 1, stuck: 1, replays: 1}, ReasonSticky, true},
		{"first turn, replica out", 0, true, counts{requests: 1, placed: 1, replays: 1}, ReasonReplaced, false},
		{"sticky turn, replica out", 1, true, counts{requests: 2, keyed: 1, sticky: 1, placed: 1, stuck: 1, replays: 1}, ReasonReplaced, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(3, Config{})
			now := t0
			for range tc.turns {
				route(t, r, "conv", now)
				now = now.Add(time.Second)
			}
			first, err := r.Route(Request{Key: "conv", Now: now})
			if err != nil {
				t.Fatal(err)
			}
			// the connection was closed under it: its slot is freed and
			// it is sent again
			first.Release()
			if tc.out {
				r.SetPollDown(first.Replica, true)
			}
			again, err := r.Route(Request{Key: "conv", Now: now, Replay: &first})
			if err != nil {
				t.Fatal(err)
			}
			again.Release()
			if again.Reason != tc.reason || (again.Replica == first.Replica) != tc.same {
				t.Errorf("replayed: %s on %s; first attempt %s on %s", again.Reason, again.Replica, first.Reason, first.Replica)
			}
			if got := sum(r); got != tc.want {
				t.Errorf("counters %+v, want %+v", got, tc.want)
			}
			if n := replicaRow(t, r, first.Replica).Replays; n != 1 {
				t.Errorf("replays of %s: %d, want 1", first.Replica, n)
			}
			// the next turn follows the replay's replica, sticky
			if d := route(t, r, "conv", now.Add(time.Second)); d.Reason != ReasonSticky || d.Replica != again.Replica {
				t.Errorf("next turn: %s on %s, want sticky on %s", d.Reason, d.Replica, again.Replica)
			}
		})
	}
}

// A replay routed anew puts the counters back with a forgotten replica's
// slot empty (SetReplicas, then IdleTTL without it): nothing to restore
// there, and no panic.
func TestReplayWithForgottenReplica(t *testing.T) {
	t.Parallel()
	r := newTestRouter(4, Config{IdleTTL: time.Minute})
	r.SetReplicas(ids(3))
	now := t0.Add(2 * time.Minute)
	r.Sweep(now)
	first, err := r.Route(Request{Key: "conv", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	r.SetPollDown(first.Replica, true)
	again, err := r.Route(Request{Key: "conv", Now: now, Replay: &first})
	if err != nil {
		t.Fatal(err)
	}
	again.Release()
	if s := r.Snapshot(); s.Requests != 1 || again.Replica == first.Replica || again.Reason != ReasonReplaced {
		t.Errorf("replay: %s on %s after %s on %s; %d requests counted, want 1", again.Reason, again.Replica, first.Reason, first.Replica, s.Requests)
	}
}

// A replay routed anew is never queued by admission: its first attempt was
// admitted, and a ticket would be counted again when admitted. Here the
// conversation's binding is gone and both replicas hold a conversation
// that leaves no room for one of its size.
func TestReplayIsNotQueued(t *testing.T) {
	t.Parallel()
	r := admitRouter(2, 10000, Config{})
	first, tk := admitTurn(t, r, "a", 6000, t0)
	if tk != nil {
		t.Fatal("a queued on empty replicas")
	}
	first.Release()
	r.Unbind("a")
	for _, k := range []string{"b", "c"} {
		d, tk := admitTurn(t, r, k, 6000, t0)
		if tk != nil {
			t.Fatalf("%s queued with a replica empty", k)
		}
		defer d.Release()
	}
	if _, tk := admitTurn(t, r, "d", 6000, t0); tk == nil {
		t.Fatal("d admitted: the replicas have room, the test tests nothing")
	} else {
		tk.Cancel()
	}
	again, tk, err := r.Admit(Request{Key: "a", Tokens: 6000, Now: t0, Replay: &first})
	if err != nil || tk != nil {
		t.Fatalf("replay: ticket %v, %v; want routed at once", tk, err)
	}
	again.Release()
	if s := r.Snapshot(); s.Requests != 3 {
		t.Errorf("replay on %s (%s); %d requests counted for three turns", again.Replica, again.Reason, s.Requests)
	}
}
