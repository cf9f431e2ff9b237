package placement

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func route(t *testing.T, r *Router, key string, now time.Time) Decision {
	t.Helper()
	d, err := r.Route(Request{Key: key, Now: now})
	if err != nil {
		t.Fatalf("routing %q: %v", key, err)
	}
	d.Release()
	return d
}

func replicaRow(t *testing.T, r *Router, id string) ReplicaSnapshot {
	t.Helper()
	for _, rs := range r.Snapshot().Replicas {
		if rs.ID == id {
			return rs
		}
	}
	t.Fatalf("no replica %s", id)
	return ReplicaSnapshot{}
}

// A replica out for a failure (poll, health check) takes no new
// conversation and no sticky turn; its conversations are re-placed on their
// next turn, and once it is back they do not return to it on their own.
func TestDownReplicaReplacedAndNotReturned(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		down  func(r *Router, id string, down bool) bool
		cause Cause
	}{
		{"poll", (*Router).SetPollDown, CausePoll},
		{"health", (*Router).SetHealthDown, CauseHealth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(3, Config{})
			for i := range 6 {
				bindTo(t, r, fmt.Sprintf("k%d", i), fmt.Sprintf("r%d", i%3), t0)
			}
			if !tc.down(r, "r1", true) || tc.down(r, "r1", true) {
				t.Fatal("state change not reported once")
			}
			row := replicaRow(t, r, "r1")
			if row.Available || row.Out != tc.cause {
				t.Fatalf("r1 row %+v, want out for %v", row, tc.cause)
			}
			now := t0.Add(time.Second)
			for i := range 30 {
				if d := route(t, r, fmt.Sprintf("new%d", i), now); d.Replica == "r1" {
					t.Fatalf("new conversation placed on the down replica")
				}
			}
			d := route(t, r, "k1", now) // bound to r1
			if d.Replica == "r1" || d.Reason != ReasonReplaced || d.Previous != "r1" {
				t.Fatalf("turn of a conversation on the down replica: %+v", d)
			}
			// survivors stay
			for _, k := range []string{"k0", "k2", "k3", "k5"} {
				if d := route(t, r, k, now); d.Reason != ReasonSticky {
					t.Fatalf("%s: %v, want sticky", k, d.Reason)
				}
			}
			tc.down(r, "r1", false)
			if row := replicaRow(t, r, "r1"); !row.Available || row.Out != 0 {
				t.Fatalf("r1 back: %+v", row)
			}
			// k4 was bound to r1 and had no turn during the outage: it is
			// placed by load, as a new conversation would be (r1 is the
			// least loaded now, so by load it may well land there)
			d = route(t, r, "k4", now)
			if d.Reason != ReasonReplaced {
				t.Fatalf("k4 after the outage: %v, want re-placed", d.Reason)
			}
			if d2 := route(t, r, "k4", now); d2.Reason != ReasonSticky || d2.Replica != d.Replica {
				t.Fatalf("k4 next turn: %+v, want sticky on %s", d2, d.Replica)
			}
			if d := route(t, r, "k1", now); d.Replica == "r1" || d.Reason != ReasonSticky {
				t.Fatalf("k1 went back to r1 on its own: %+v", d)
			}
		})
	}
}

// A failed request puts its replica in a cool-down at once: the next
// placements avoid it; after it one request probes the replica, and only
// an answer to a probe (or any answer) ends the run.
func TestProxyFailureCooldown(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{FailCooldown: time.Second})
	d, err := r.Route(Request{Key: "a", Pin: "r0", Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	d.Failed(t0)
	d.Release()
	d.Failed(t0) // after Release: nothing
	row := replicaRow(t, r, "r0")
	if row.Available || row.Out != CauseProxy || row.ProxyFailures != 1 || !row.CooldownUntil.Equal(t0.Add(time.Second)) {
		t.Fatalf("r0 after one failure: %+v", row)
	}
	for i := range 10 {
		if d := route(t, r, fmt.Sprintf("n%d", i), t0); d.Replica != "r1" {
			t.Fatalf("placed on the cooling replica: %+v", d)
		}
	}
	// one failure does not move r0's conversations once it is back
	if d := route(t, r, "a", t0.Add(500*time.Millisecond)); d.Reason != ReasonReplaced || d.Replica != "r1" {
		t.Fatalf("turn during cool-down: %+v", d)
	}
	bindTo(t, r, "b", "r0", t0.Add(2*time.Second))
	if d := route(t, r, "b", t0.Add(2*time.Second)); d.Reason != ReasonSticky {
		t.Fatalf("after the cool-down: %+v", d)
	}

	// after the cool-down, the first request is a probe: while it is
	// unanswered r0 is out for every other; its failure starts another
	// cool-down of the same length (no back-off: one request per
	// cool-down is what a broken replica gets)
	now := t0.Add(10 * time.Second)
	d, _ = r.Route(Request{Pin: "r0", Now: now})
	d.Failed(now)
	d.Release()
	now = now.Add(2 * time.Second)
	probe, err := r.Route(Request{Key: "b", Now: now})
	if err != nil || probe.Replica != "r0" || probe.Reason != ReasonSticky {
		t.Fatalf("first turn after the cool-down: %+v, %v", probe, err)
	}
	if row := replicaRow(t, r, "r0"); row.Available || row.Out != CauseProxy {
		t.Fatalf("r0 while its probe is out: %+v", row)
	}
	if d := route(t, r, "n-probe", now); d.Replica != "r1" {
		t.Fatalf("placed beside an unanswered probe: %+v", d)
	}
	probe.Failed(now)
	probe.Release()
	if got := replicaRow(t, r, "r0").CooldownUntil.Sub(now); got != time.Second {
		t.Fatalf("cool-down after a failed probe: %v, want the same 1s", got)
	}
	// a probe whose client gave up before any answer says nothing: the
	// next request is the next probe
	now = now.Add(2 * time.Second)
	p1 := pinned(t, r, "p1", "r0", now)
	p1.Abandoned("p1", now)
	p1.Release()
	p2 := pinned(t, r, "p2", "r0", now)
	if row := replicaRow(t, r, "r0"); row.Available {
		t.Fatalf("r0 while its second probe is out: %+v", row)
	}
	// its answer ends the run: r0 is back, and the next request is no probe
	p2.Succeeded()
	p2.Release()
	d = pinned(t, r, "p3", "r0", now)
	if row := replicaRow(t, r, "r0"); !row.Available || row.Out != 0 {
		t.Fatalf("r0 after an answered probe, a request in flight: %+v", row)
	}
	d.Release()
	// a probe released with nothing reported (the proxy without the
	// handler reports only failures) ends the run too
	d, _ = r.Route(Request{Pin: "r0", Now: now})
	d.Failed(now)
	d.Release()
	now = now.Add(2 * time.Second)
	pinned(t, r, "p4", "r0", now).Release()
	d = pinned(t, r, "p5", "r0", now)
	if row := replicaRow(t, r, "r0"); !row.Available || row.Out != 0 {
		t.Fatalf("r0 after a probe released with nothing reported, a request in flight: %+v", row)
	}
	d.Release()
	// the poll seeing a restarted server clears the cool-down
	r.SetPollDown("r0", true)
	r.SetPollDown("r0", false)
	if row := replicaRow(t, r, "r0"); !row.Available {
		t.Fatalf("r0 after coming back: %+v", row)
	}
}

// When every replica is out for what the router inferred (poll failures,
// proxy errors), requests are still served; health checks and exclusions
// stay binding.
func TestAllOutFallback(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	r.SetPollDown("r0", true)
	r.SetPollDown("r1", true)
	if _, err := r.Route(Request{Key: "x", Now: t0}); err != nil {
		t.Fatalf("all polls failing: %v", err)
	}
	if _, err := r.Route(Request{Now: t0}); err != nil {
		t.Fatalf("all polls failing, no key: %v", err)
	}
	r.SetHealthDown("r0", true)
	for range 5 {
		if d := route(t, r, "y", t0); d.Replica != "r1" {
			t.Fatalf("health-down replica chosen: %+v", d)
		}
	}
	r.SetHealthDown("r1", true)
	if _, err := r.Route(Request{Key: "z", Now: t0}); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("every replica health-down: %v", err)
	}
}

func TestCauseNames(t *testing.T) {
	t.Parallel()
	if got := (CausePoll | CauseHealth).String(); got != "poll failure, health check" {
		t.Fatalf("%q", got)
	}
	if Cause(0).String() != "" {
		t.Fatal("no cause must be empty")
	}
}

// pinned routes a turn of key to id (kept in flight: the caller reports
// its outcome and releases it).
func pinned(t *testing.T, r *Router, key, id string, now time.Time) Decision {
	t.Helper()
	d, err := r.Route(Request{Key: key, Pin: id, Now: now})
	if err != nil || d.Replica != id {
		t.Fatalf("pinning %q to %s: got %q, %v", key, id, d.Replica, err)
	}
	return d
}

// Abandoned turns are evidence against a replica only in a run that spans
// two clients while other replicas answer (and holds AbandonAfter turns
// when that is set): an answer from the replica ends the run, one
// impatient client never takes it out, nor do clients that give up
// everywhere.
func TestAbandonedTurnsTakeAHungReplicaOut(t *testing.T) {
	t.Parallel()
	type turn struct {
		rep, client string
		answered    bool
	}
	abandon := func(client string) turn { return turn{"r1", client, false} }
	answer := func(rep string) turn { return turn{rep, "other", true} }
	for _, tc := range []struct {
		name    string
		turns   []turn
		outAt   int // index of the turn after which r1 is out; -1 never
		cfgN    int
		outWhat Cause
	}{
		{"two clients while r0 answers", []turn{answer("r0"), abandon("a"), answer("r0"), abandon("b")}, 3, 0, CauseAbandoned},
		{"a second client after the first's turns", []turn{abandon("a"), abandon("a"), answer("r0"), abandon("b")}, 3, 0, CauseAbandoned},
		{"one impatient client", []turn{abandon("a"), answer("r0"), abandon("a"), abandon("a"), abandon("a"), abandon("a")}, -1, 0, 0},
		{"nobody else answers", []turn{abandon("a"), abandon("b"), abandon("c"), abandon("d")}, -1, 0, 0},
		{"an answer from r1 ends the run", []turn{abandon("a"), answer("r0"), answer("r1"), abandon("b"), abandon("b")}, -1, 0, 0},
		{"abandon_after 5", []turn{abandon("a"), abandon("b"), abandon("a"), answer("r0"), abandon("b"), abandon("a")}, 5, 5, CauseAbandoned},
		{"off", []turn{answer("r0"), abandon("a"), abandon("b"), abandon("a"), abandon("b")}, -1, -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(2, Config{AbandonAfter: tc.cfgN})
			now := t0
			for i, tu := range tc.turns {
				now = now.Add(100 * time.Millisecond)
				d := pinned(t, r, tu.client, tu.rep, now)
				if tu.answered {
					d.Succeeded()
				} else {
					d.Abandoned(tu.client, now)
				}
				d.ReleaseAt(now)
				row := replicaRow(t, r, "r1")
				want := tc.outAt >= 0 && i >= tc.outAt
				if !row.Available != want {
					t.Fatalf("after turn %d r1 out %v (%v), want %v", i, !row.Available, row.Out, want)
				}
				if want && row.Out != tc.outWhat {
					t.Fatalf("r1 out for %v, want %v", row.Out, tc.outWhat)
				}
				if want && row.ProxyFailures != 0 {
					t.Fatalf("abandoned turns counted as %d proxy failures", row.ProxyFailures)
				}
			}
		})
	}
}

// TestEveryReplicaOutKeepsConversations: when every replica is out for
// proxy errors at once (an engine that refuses what its KV cannot hold
// fails everywhere within a second), a turn is still sent, and a
// conversation's own replica is as good a try as any: it stays there,
// keeping its cache, instead of being placed anew by load. With one
// replica back, the conversations of the others move to it as before.
func TestEveryReplicaOutKeepsConversations(t *testing.T) {
	t.Parallel()
	r := newTestRouter(3, Config{FailCooldown: 5 * time.Second})
	keys := map[string]string{"a": "r0", "b": "r1", "c": "r2", "d": "r0"}
	for k, id := range keys {
		bindTo(t, r, k, id, t0)
	}
	for _, id := range []string{"r0", "r1", "r2"} {
		r.fail(r.reps[r.byID[id]], t0.UnixNano())
		r.fail(r.reps[r.byID[id]], t0.UnixNano()) // the second in a row orphans
	}
	now := t0.Add(time.Second)
	for k, id := range keys {
		if d := route(t, r, k, now); d.Replica != id || d.Previous != "" {
			t.Errorf("%s with every replica out: %+v, want kept on %s", k, d, id)
		}
	}
	// r1 back (its cool-down of 10 s over for it alone): the others'
	// conversations are re-placed as a replica is in again
	r1 := r.reps[r.byID["r1"]]
	r1.coolUntil, r1.failStreak = 0, 0
	r1.streak.Store(0)
	if d := route(t, r, "a", now); d.Replica != "r1" || d.Reason != ReasonReplaced || d.Previous != "r0" {
		t.Errorf("a with r1 back: %+v, want re-placed on r1", d)
	}
}
