package placement

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%d", i)
	}
	return out
}

func newTestRouter(n int, cfg Config) *Router {
	r := NewRouter(cfg)
	r.SetReplicas(ids(n))
	return r
}

// bindTo binds key to replica id with a pinned turn that is released at once.
func bindTo(t *testing.T, r *Router, key, id string, now time.Time) {
	t.Helper()
	d, err := r.Route(Request{Key: key, Pin: id, Now: now})
	if err != nil || d.Replica != id {
		t.Fatalf("binding %q to %s: got %q, %v", key, id, d.Replica, err)
	}
	d.Release()
}

func running(n int) Load { return Load{Running: n, Reachable: true} }

// queued is a polled load of n running and w waiting: the engine runs
// what its KV allows, so a turn sent there waits for a place in its batch.
func queued(n, w int) Load { return Load{Running: n, Waiting: w, Reachable: true} }

// hold routes n pinned, key-less requests to id and keeps them in flight.
func hold(t *testing.T, r *Router, id string, n int) {
	t.Helper()
	for range n {
		d, err := r.Route(Request{Pin: id, Now: t0})
		if err != nil || d.Replica != id {
			t.Fatalf("holding %s: %q, %v", id, d.Replica, err)
		}
	}
}

func TestRouteRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		n         int
		cfg       Config
		setup     func(t *testing.T, r *Router)
		req       Request
		want      string
		reason    Reason
		wantBound string // "" = key must not be bound afterwards; "-" = don't check
		previous  string
		wantErr   error
	}{
		{
			name: "affinity off picks least waiting*4+running",
			n:    3, cfg: Config{AffinityOff: true},
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", Load{Running: 3, Reachable: true})
				r.UpdateLoad("r1", Load{Waiting: 1, Reachable: true})
				r.UpdateLoad("r2", Load{Running: 2, Reachable: true})
			},
			req: Request{Key: "k"}, want: "r2", reason: ReasonAffinityOff, wantBound: "",
		},
		{
			name: "no key picks least waiting*4+running",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", Load{Running: 5, Reachable: true})
				r.UpdateLoad("r1", Load{Running: 1, Waiting: 1, Reachable: true})
				r.UpdateLoad("r2", Load{Running: 4, Reachable: true})
			},
			req: Request{}, want: "r2", reason: ReasonNoKey, wantBound: "-",
		},
		{
			name: "no key: router in-flight is fresher than polled running",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				hold(t, r, "r0", 3)
				r.UpdateLoad("r1", running(2))
			},
			req: Request{}, want: "r1", reason: ReasonNoKey, wantBound: "-",
		},
		{
			name: "no key: unreachable replica's polled numbers are ignored",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", Load{Running: 1, Reachable: true})
				r.UpdateLoad("r1", Load{Running: 50, Waiting: 50, Reachable: false})
			},
			req: Request{}, want: "r1", reason: ReasonNoKey, wantBound: "-",
		},
		{
			name: "sticky at exactly the threshold",
			n:    3, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.UpdateLoad("r1", running(2))
			},
			req: Request{Key: "k"}, want: "r1", reason: ReasonSticky, wantBound: "r1",
		},
		{
			name: "spill one above the threshold, re-bound at the target",
			n:    3, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.UpdateLoad("r1", queued(3, 6))
				r.UpdateLoad("r0", running(2))
				r.UpdateLoad("r2", running(1))
			},
			req: Request{Key: "k"}, want: "r2", reason: ReasonSpilled, wantBound: "r2", previous: "r1",
		},
		{
			name: "spill counts the router's in-flight against the threshold",
			n:    2, cfg: Config{MaxNumSeqs: 8}, // auto threshold 2
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				hold(t, r, "r0", 8) // a full batch: the turn waits for a place
			},
			req: Request{Key: "k"}, want: "r1", reason: ReasonSpilled, wantBound: "r1", previous: "r0",
		},
		{
			name: "spill skips replicas over the threshold even if less loaded than others",
			n:    4, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(9, 9))
				r.UpdateLoad("r1", running(3))
				r.UpdateLoad("r2", running(5))
				r.UpdateLoad("r3", running(2))
			},
			req: Request{Key: "k"}, want: "r3", reason: ReasonSpilled, wantBound: "r3", previous: "r0",
		},
		{
			name: "every replica over the threshold: stay",
			n:    3, cfg: Config{SpillThreshold: 1},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.UpdateLoad("r0", running(2))
				r.UpdateLoad("r1", running(5))
				r.UpdateLoad("r2", running(2))
			},
			req: Request{Key: "k"}, want: "r1", reason: ReasonStayedOverloaded, wantBound: "r1",
		},
		{
			name: "bound replica removed: re-placed",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.SetReplicas([]string{"r0", "r2"})
				r.UpdateLoad("r0", running(4))
			},
			req: Request{Key: "k"}, want: "r2", reason: ReasonReplaced, wantBound: "r2", previous: "r1",
		},
		{
			name: "bound replica unavailable: re-placed",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.SetAvailable("r1", false)
				r.UpdateLoad("r2", running(4))
			},
			req: Request{Key: "k"}, want: "r0", reason: ReasonReplaced, wantBound: "r0", previous: "r1",
		},
		{
			name: "bound replica excluded for this request: re-placed",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.UpdateLoad("r0", running(4))
			},
			req: Request{Key: "k", Exclude: []string{"r1"}}, want: "r2", reason: ReasonReplaced, wantBound: "r2", previous: "r1",
		},
		{
			name: "new key: fewer running wins",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", running(2))
				r.UpdateLoad("r1", running(1))
				r.UpdateLoad("r2", Load{Running: 3, KVUsage: 0, Reachable: true})
			},
			req: Request{Key: "k"}, want: "r1", reason: ReasonPlaced, wantBound: "r1",
		},
		{
			name: "new key: equal running, fewer active conversations wins",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "a", "r0", t0)
				bindTo(t, r, "b", "r1", t0)
				bindTo(t, r, "c", "r1", t0)
				bindTo(t, r, "d", "r2", t0)
				r.UpdateLoad("r0", Load{KVUsage: 0.9, Reachable: true})
				r.UpdateLoad("r2", Load{KVUsage: 0.1, Reachable: true})
				bindTo(t, r, "e", "r0", t0.Add(-DefaultActiveWindow)) // clamped to t0: active
			},
			req: Request{Key: "k", Now: t0}, want: "r2", reason: ReasonPlaced, wantBound: "r2",
		},
		{
			name: "new key: inactive conversations do not count",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "a", "r0", t0)
				bindTo(t, r, "b", "r0", t0)
				bindTo(t, r, "c", "r1", t0.Add(9*time.Minute))
				r.UpdateLoad("r0", Load{KVUsage: 0.1, Reachable: true})
				r.UpdateLoad("r1", Load{KVUsage: 0.2, Reachable: true})
			},
			req: Request{Key: "k", Now: t0.Add(11 * time.Minute)}, want: "r0", reason: ReasonPlaced, wantBound: "r0",
		},
		{
			name: "new key: equal running and active, lower KV usage wins",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", Load{KVUsage: 0.5, Reachable: true})
				r.UpdateLoad("r1", Load{KVUsage: 0.2, Reachable: true})
				r.UpdateLoad("r2", Load{KVUsage: 0.3, Reachable: true})
			},
			req: Request{Key: "k"}, want: "r1", reason: ReasonPlaced, wantBound: "r1",
		},
		{
			// KV usage the engine did not export reads 0 but must not win.
			name: "new key: unknown KV usage does not look empty",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", Load{Reachable: true, KVUnknown: true})
				r.UpdateLoad("r1", Load{KVUsage: 0.5, Reachable: true})
				r.UpdateLoad("r2", Load{KVUsage: 0.3, Reachable: true})
			},
			req: Request{Key: "k"}, want: "r2", reason: ReasonPlaced, wantBound: "r2",
		},
		{
			name: "new key with parent: parent's replica under the threshold",
			n:    3, cfg: Config{SpillThreshold: 4},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "parent", "r2", t0)
				r.UpdateLoad("r2", running(4))
			},
			req: Request{Key: "child", Parent: "parent"}, want: "r2", reason: ReasonPlaced, wantBound: "r2",
		},
		{
			name: "new key with parent over the threshold: placed by score",
			n:    3, cfg: Config{SpillThreshold: 4},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "parent", "r2", t0)
				r.UpdateLoad("r2", running(5))
				r.UpdateLoad("r0", running(1))
			},
			req: Request{Key: "child", Parent: "parent"}, want: "r1", reason: ReasonPlaced, wantBound: "r1",
		},
		{
			name: "new key with unknown parent: placed by score",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				r.UpdateLoad("r0", running(1))
			},
			req: Request{Key: "child", Parent: "nobody"}, want: "r1", reason: ReasonPlaced, wantBound: "r1",
		},
		{
			name: "pin honoured and re-binds the conversation",
			n:    3,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r2", running(100))
			},
			req: Request{Key: "k", Pin: "r2"}, want: "r2", reason: ReasonClientPinned, wantBound: "r2", previous: "r0",
		},
		{
			name: "pin honoured with affinity off, nothing bound",
			n:    3, cfg: Config{AffinityOff: true},
			req: Request{Key: "k", Pin: "r1"}, want: "r1", reason: ReasonClientPinned, wantBound: "",
		},
		{
			name: "pin to unknown replica ignored",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
			},
			req: Request{Key: "k", Pin: "elsewhere"}, want: "r1", reason: ReasonSticky, wantBound: "r1",
		},
		{
			name: "pin to unavailable replica ignored",
			n:    2,
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r1", t0)
				r.SetAvailable("r0", false)
			},
			req: Request{Key: "k", Pin: "r0"}, want: "r1", reason: ReasonSticky, wantBound: "r1",
		},
		{
			name: "pin to excluded replica ignored",
			n:    2,
			req:  Request{Pin: "r0", Exclude: []string{"r0"}}, want: "r1", reason: ReasonNoKey, wantBound: "-",
		},
		{
			name:    "no replicas",
			n:       0,
			req:     Request{Key: "k"},
			wantErr: ErrNoReplica, wantBound: "",
		},
		{
			name:    "every replica excluded or unavailable",
			n:       2,
			setup:   func(t *testing.T, r *Router) { r.SetAvailable("r1", false) },
			req:     Request{Key: "k", Exclude: []string{"r0"}},
			wantErr: ErrNoReplica, wantBound: "",
		},
		{
			name: "affinity off, every replica excluded",
			n:    1, cfg: Config{AffinityOff: true},
			req:     Request{Exclude: []string{"r0"}},
			wantErr: ErrNoReplica, wantBound: "-",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(tc.n, tc.cfg)
			if tc.setup != nil {
				tc.setup(t, r)
			}
			req := tc.req
			if req.Now.IsZero() {
				req.Now = t0
			}
			d, err := r.Route(req)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				d.Release() // zero decision: no effect
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if d.Replica != tc.want || d.Reason != tc.reason || d.Previous != tc.previous {
					t.Fatalf("got %s (%s, previous %q), want %s (%s, previous %q)", d.Replica, d.Reason, d.Previous, tc.want, tc.reason, tc.previous)
				}
			}
			if tc.wantBound != "-" && req.Key != "" {
				got, ok := r.Bound(req.Key)
				if tc.wantBound == "" && ok {
					t.Fatalf("key bound to %s, want unbound", got)
				}
				if tc.wantBound != "" && got != tc.wantBound {
					t.Fatalf("key bound to %q (%v), want %s", got, ok, tc.wantBound)
				}
			}
		})
	}
}

func TestThresholdDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  Config
		want int
		auto bool
	}{
		{Config{}, 64, true},
		{Config{MaxNumSeqs: 32}, 8, true},
		{Config{MaxNumSeqs: 3}, 1, true},
		{Config{MaxNumSeqs: 32, SpillThreshold: 4}, 4, false},
		{Config{SpillThreshold: -1}, 64, true},
	}
	for _, tc := range tests {
		r := NewRouter(tc.cfg)
		n, auto := r.SpillThreshold()
		if n != tc.want || auto != tc.auto {
			t.Errorf("%+v: threshold %d auto %v, want %d %v", tc.cfg, n, auto, tc.want, tc.auto)
		}
	}
	c := NewRouter(Config{}).Config()
	if c.MaxNumSeqs != 256 || c.IdleTTL != time.Hour || c.ActiveWindow != 10*time.Minute || c.MaxBindings != 100000 || c.AffinityOff {
		t.Errorf("defaults: %+v", c)
	}
}

func TestReleaseExactlyOnce(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	d, err := r.Route(Request{Key: "k", Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	cp := d
	if got := r.Snapshot().InFlight; got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	d.Release()
	d.Release()
	cp.Release()
	if got := r.Snapshot().InFlight; got != 0 {
		t.Fatalf("in flight %d after releases, want 0", got)
	}
	// The slot is reused by the next decision; the stale copy must not free it.
	d2, _ := r.Route(Request{Key: "k", Now: t0})
	cp.Release()
	if got := r.Snapshot().InFlight; got != 1 {
		t.Fatalf("stale copy released a new decision: in flight %d, want 1", got)
	}
	d2.Release()
	if got := r.Snapshot().InFlight; got != 0 {
		t.Fatalf("in flight %d, want 0", got)
	}
	Decision{}.Release()
}

func TestReplicaRemovedWhileInFlight(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	d, _ := r.Route(Request{Pin: "r1", Now: t0})
	r.SetReplicas([]string{"r0"})
	d.Release()
	if s := r.Snapshot(); s.InFlight != 0 || len(s.Replicas) != 1 {
		t.Fatalf("snapshot %+v", s)
	}
	r.SetReplicas([]string{"r0", "r1"})
	if s := r.Snapshot(); s.Replicas[1].InFlight != 0 || !s.Replicas[1].Available {
		t.Fatalf("re-added replica %+v", s.Replicas[1])
	}
}

func TestIdleTTL(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{IdleTTL: time.Minute})
	bindTo(t, r, "k", "r1", t0)
	r.UpdateLoad("r1", running(3)) // a new placement would choose r0
	d, _ := r.Route(Request{Key: "k", Now: t0.Add(time.Minute)})
	d.Release()
	if d.Replica != "r1" || d.Reason != ReasonSticky {
		t.Fatalf("at exactly TTL: %s %s, want sticky r1", d.Replica, d.Reason)
	}
	d, _ = r.Route(Request{Key: "k", Now: t0.Add(2*time.Minute + 1)})
	d.Release()
	if d.Replica != "r0" || d.Reason != ReasonPlaced {
		t.Fatalf("after TTL: %s %s, want placed r0", d.Replica, d.Reason)
	}

	// Sweep removes expired bindings without a lookup.
	for i := range 10 {
		bindTo(t, r, fmt.Sprint("s", i), "r1", t0.Add(3*time.Minute))
	}
	if n := r.Len(); n != 11 {
		t.Fatalf("len %d, want 11", n)
	}
	if got := r.Sweep(t0.Add(3*time.Minute + 30*time.Second)); got != 1 {
		t.Fatalf("sweep removed %d, want only k", got)
	}
	if got := r.Sweep(t0.Add(10 * time.Minute)); got != 10 {
		t.Fatalf("sweep removed %d, want 10", got)
	}
	if s := r.Snapshot(); s.Bindings != 0 || s.Replicas[1].Bindings != 0 || s.Replicas[1].Active != 0 {
		t.Fatalf("after sweep: %+v", s)
	}
	if _, ok := r.Bound("k"); ok {
		t.Fatal("k still bound")
	}
	if s := r.Snapshot(); s.Expired != 12 || s.Evicted != 0 {
		t.Fatalf("expired %d evicted %d, want 12 0", s.Expired, s.Evicted)
	}
}

func TestRouteDrainsExpiredBindings(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{IdleTTL: time.Minute})
	for i := range 10 {
		bindTo(t, r, fmt.Sprint("k", i), "r0", t0)
	}
	for i := range 5 {
		d, _ := r.Route(Request{Now: t0.Add(time.Hour + time.Duration(i))})
		d.Release()
	}
	if n := r.Len(); n != 0 {
		t.Fatalf("len %d after 5 routes, want 0 (two drained per route)", n)
	}
}

func TestLRUEviction(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{MaxBindings: 3})
	for i, k := range []string{"a", "b", "c"} {
		bindTo(t, r, k, "r0", t0.Add(time.Duration(i)*time.Second))
	}
	// Touch "a" so "b" is the least recently used.
	d, _ := r.Route(Request{Key: "a", Now: t0.Add(5 * time.Second)})
	d.Release()
	bindTo(t, r, "d", "r1", t0.Add(6*time.Second))
	if _, ok := r.Bound("b"); ok {
		t.Fatal("b should have been evicted")
	}
	for _, k := range []string{"a", "c", "d"} {
		if _, ok := r.Bound(k); !ok {
			t.Fatalf("%s evicted", k)
		}
	}
	s := r.Snapshot()
	if s.Bindings != 3 || s.Replicas[0].Bindings != 2 || s.Replicas[1].Bindings != 1 {
		t.Fatalf("snapshot bindings %d %+v", s.Bindings, s.Replicas)
	}
	if s.Evicted != 1 || s.Expired != 0 {
		t.Fatalf("evicted %d expired %d", s.Evicted, s.Expired)
	}
	r.Reconfigure(Config{MaxBindings: 1})
	if _, ok := r.Bound("d"); !ok || r.Len() != 1 || r.Snapshot().Evicted != 3 {
		t.Fatalf("after shrinking: len %d, %+v", r.Len(), r.Snapshot())
	}
}

func TestActiveWindow(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{ActiveWindow: time.Minute})
	bindTo(t, r, "a", "r0", t0)
	bindTo(t, r, "b", "r0", t0.Add(30*time.Second))
	bindTo(t, r, "c", "r0", t0.Add(50*time.Second))
	check := func(now time.Time, want int) {
		t.Helper()
		r.Sweep(now)
		if got := r.Snapshot().Replicas[0].Active; got != want {
			t.Fatalf("active at %v = %d, want %d", now.Sub(t0), got, want)
		}
	}
	check(t0.Add(55*time.Second), 3)
	check(t0.Add(61*time.Second), 2)
	// A turn on "a" makes it active again.
	d, _ := r.Route(Request{Key: "a", Now: t0.Add(62 * time.Second)})
	d.Release()
	check(t0.Add(62*time.Second), 3)
	check(t0.Add(100*time.Second), 2)
	check(t0.Add(200*time.Second), 0)
	if got := r.Snapshot().Replicas[0].Bindings; got != 3 {
		t.Fatalf("bindings %d, want 3", got)
	}
}

func TestCountersAndSnapshot(t *testing.T) {
	t.Parallel()
	r := NewRouter(Config{SpillThreshold: 1})
	r.SetReplicas([]string{"b", "a"})
	route := func(req Request) Decision {
		t.Helper()
		req.Now = t0
		d, err := r.Route(req)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	route(Request{Key: "k", Pin: "a"}).Release() // pinned
	route(Request{Key: "k"}).Release()           // sticky on a
	route(Request{Key: "k"}).Release()           // sticky on a
	route(Request{}).Release()                   // no key
	r.UpdateLoad("a", queued(2, 4))              // a over threshold, with a queue
	if d := route(Request{Key: "k"}); d.Reason != ReasonSpilled || d.Previous != "a" {
		t.Fatalf("spill: %+v", d)
	} else {
		d.Release()
	}
	r.UpdateLoad("b", running(2)) // both over
	if d := route(Request{Key: "k"}); d.Reason != ReasonStayedOverloaded || d.Previous != "" {
		t.Fatalf("stay: %+v", d)
	} else {
		d.Release()
	}
	if d := route(Request{Key: "k", Exclude: []string{"b"}}); d.Reason != ReasonReplaced || d.Previous != "b" {
		t.Fatalf("re-place: %+v", d)
	} else {
		d.Release()
	}
	r.SetAffinity(false)
	held := route(Request{Key: "k"}) // affinity off
	if r.Affinity() {
		t.Fatal("affinity still on")
	}
	s := r.Snapshot()
	if s.Requests != 8 || s.KeyedRequests != 5 || s.StickyRequests != 3 || s.InFlight != 1 {
		t.Fatalf("snapshot %+v", s)
	}
	if s.StickyShare != 0.6 || s.Affinity || s.SpillThreshold != 1 || s.SpillAuto || s.Since.IsZero() {
		t.Fatalf("snapshot %+v", s)
	}
	a, b := s.Replicas[0], s.Replicas[1]
	if a.ID != "a" || b.ID != "b" {
		t.Fatalf("not sorted: %s %s", a.ID, b.ID)
	}
	if a.ClientPinned != 1 || a.Sticky != 2 || a.Replaced != 1 || b.SpillAccepted != 1 || b.Sticky != 1 || b.StayedOverloaded != 1 {
		t.Fatalf("counters a=%+v b=%+v", a, b)
	}
	if a.NoKey+b.NoKey != 1 || a.AffinityOff+b.AffinityOff != 1 || a.InFlight+b.InFlight != 1 {
		t.Fatalf("counters a=%+v b=%+v", a, b)
	}
	if a.Bindings != 1 || b.Bindings != 0 || a.Load.Running != 2 {
		t.Fatalf("bindings a=%+v b=%+v", a, b)
	}
	held.Release()
	r.SetAffinity(true)
	if got, _ := r.Bound("k"); got != "a" {
		t.Fatalf("binding lost across affinity toggle: %q", got)
	}
	r.Reconfigure(Config{MaxNumSeqs: 32})
	if n, auto := r.SpillThreshold(); n != 8 || !auto || r.Snapshot().Requests != 8 {
		t.Fatalf("reconfigure: %d %v", n, auto)
	}
}

func TestUnbind(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{})
	bindTo(t, r, "k", "r1", t0)
	if !r.Unbind("k") || r.Unbind("k") {
		t.Fatal("unbind")
	}
	if _, ok := r.Bound("k"); ok {
		t.Fatal("still bound")
	}
	if s := r.Snapshot(); s.Bindings != 0 || s.Replicas[1].Bindings != 0 {
		t.Fatalf("%+v", s)
	}
}

func TestTiesRoundRobin(t *testing.T) {
	t.Parallel()
	r := newTestRouter(4, Config{})
	seen := map[string]int{}
	for i := range 8 {
		d, _ := r.Route(Request{Key: fmt.Sprint("k", i), Now: t0})
		seen[d.Replica]++
		d.Release()
		// released turns keep their bindings, so active counts spread the next ones
	}
	for _, id := range ids(4) {
		if seen[id] != 2 {
			t.Fatalf("placements %v, want 2 each", seen)
		}
	}
	seen = map[string]int{}
	for range 8 {
		d, _ := r.Route(Request{Now: t0})
		seen[d.Replica]++
		d.Release()
	}
	for _, id := range ids(4) {
		if seen[id] != 2 {
			t.Fatalf("no-key picks %v, want 2 each", seen)
		}
	}
}

func TestReasonString(t *testing.T) {
	t.Parallel()
	want := []string{"unknown", "affinity-off", "no-key", "sticky", "placed", "spilled", "stayed-overloaded", "re-placed", "client-pinned", "restarted", "cold-replaced", "side", "spill-declined", "unknown"}
	for i, w := range want {
		if got := Reason(i).String(); got != w {
			t.Errorf("Reason(%d) = %q, want %q", i, got, w)
		}
	}
}

// TestSpillWaiting covers Config.SpillWaiting: a conversation leaves a
// replica whose vLLM queue has reached the limit, for one with an empty
// queue that is not over the threshold; otherwise it stays.
func TestSpillWaiting(t *testing.T) {
	t.Parallel()
	queue := func(id string, run, wait int) func(*Router) {
		return func(r *Router) { r.UpdateLoad(id, Load{Running: run, Waiting: wait, Reachable: true}) }
	}
	tests := []struct {
		name     string
		k        int
		loads    []func(*Router)
		want     string
		reason   Reason
		previous string
	}{
		{name: "off by default", k: 0, loads: []func(*Router){queue("r0", 3, 5)}, want: "r0", reason: ReasonSticky},
		{name: "queue below the limit stays", k: 2, loads: []func(*Router){queue("r0", 3, 1)}, want: "r0", reason: ReasonSticky},
		{name: "queue at the limit moves to an empty queue", k: 2, loads: []func(*Router){queue("r0", 3, 2), queue("r1", 3, 1), queue("r2", 4, 0)}, want: "r2", reason: ReasonSpilled, previous: "r0"},
		{name: "best by score among empty queues", k: 1, loads: []func(*Router){queue("r0", 3, 1), queue("r1", 2, 0), queue("r2", 1, 0)}, want: "r2", reason: ReasonSpilled, previous: "r0"},
		{name: "every other queue busy: stays", k: 1, loads: []func(*Router){queue("r0", 3, 4), queue("r1", 3, 1), queue("r2", 3, 2)}, want: "r0", reason: ReasonSticky},
		{name: "empty queue but over the threshold: stays", k: 1, loads: []func(*Router){queue("r0", 3, 4), queue("r1", 9, 0), queue("r2", 9, 0)}, want: "r0", reason: ReasonSticky},
		{name: "unreachable replica's queue is not trusted", k: 1, loads: []func(*Router){func(r *Router) { r.UpdateLoad("r0", Load{Running: 3, Waiting: 4}) }}, want: "r0", reason: ReasonSticky},
		{name: "negative means off", k: -1, loads: []func(*Router){queue("r0", 3, 5)}, want: "r0", reason: ReasonSticky},
		// An engine that does not export its queue: no information, not an empty queue.
		{name: "unknown queue is not an empty one", k: 2, loads: []func(*Router){queue("r0", 3, 2), queue("r1", 3, 1),
			func(r *Router) { r.UpdateLoad("r2", Load{Running: 1, Reachable: true, WaitingUnknown: true}) }}, want: "r0", reason: ReasonSticky},
		{name: "unknown own queue does not spill", k: 1, loads: []func(*Router){queue("r1", 1, 0), queue("r2", 1, 0),
			func(r *Router) {
				r.UpdateLoad("r0", Load{Running: 3, Waiting: 4, Reachable: true, WaitingUnknown: true})
			}}, want: "r0", reason: ReasonSticky},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(3, Config{MaxNumSeqs: 32, SpillWaiting: tc.k})
			bindTo(t, r, "k", "r0", t0)
			for _, l := range tc.loads {
				l(r)
			}
			d, err := r.Route(Request{Key: "k", Now: t0.Add(time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			if d.Replica != tc.want || d.Reason != tc.reason || d.Previous != tc.previous {
				t.Fatalf("got %s (%s, previous %q), want %s (%s, previous %q)", d.Replica, d.Reason, d.Previous, tc.want, tc.reason, tc.previous)
			}
			if got, _ := r.Bound("k"); got != tc.want {
				t.Fatalf("bound to %s, want %s", got, tc.want)
			}
			if tc.reason == ReasonSpilled {
				s := r.Snapshot()
				for _, rs := range s.Replicas {
					if rs.ID == tc.want && rs.SpillAccepted != 1 {
						t.Fatalf("%s spill accepted = %d, want 1", rs.ID, rs.SpillAccepted)
					}
				}
			}
		})
	}
}

// TestReplicaChurnBounded rotates through 1,000 replica addresses, as DNS
// upstreams that change over time do: the replica table, its bindings and
// the ID index must stay bounded by what IdleTTL can hold, and a replica
// that comes back within IdleTTL still finds its conversations.
func TestReplicaChurnBounded(t *testing.T) {
	t.Parallel()
	const ttl = time.Minute
	r := NewRouter(Config{IdleTTL: ttl})
	now := t0
	set := make([]string, 4)
	for gen := range 1000 {
		for i := range set {
			set[i] = fmt.Sprintf("10.0.%d.%d:8000", (gen+i)/250, (gen+i)%250)
		}
		r.SetReplicas(set)
		for k := range 8 {
			d, err := r.Route(Request{Key: fmt.Sprint("conv-", gen, "-", k), Now: now})
			if err != nil {
				t.Fatalf("gen %d: %v", gen, err)
			}
			d.Release()
		}
		now = now.Add(10 * time.Second) // a replica leaves every 10 s
		r.Sweep(now)
		if gen%100 == 0 {
			checkInvariants(t, r)
		}
	}
	checkInvariants(t, r)
	r.mu.Lock()
	tableLen, ids, free, bound := len(r.reps), len(r.byID), len(r.free), r.b.n
	r.mu.Unlock()
	// 4 present plus those removed within the last IdleTTL (6 at one per 10 s),
	// one more while a Sweep has not yet run
	if ids > 4+int(ttl/(10*time.Second))+1 {
		t.Fatalf("%d replica IDs known after churn, want at most %d", ids, 4+int(ttl/(10*time.Second))+1)
	}
	if tableLen != ids+free || tableLen > 16 {
		t.Fatalf("table of %d (%d IDs, %d free slots) after churn", tableLen, ids, free)
	}
	if bound > 8*(int(ttl/(10*time.Second))+1) {
		t.Fatalf("%d bindings held after churn", bound)
	}
	if s := r.Snapshot(); len(s.Replicas) != 4 || s.Requests != 8000 {
		t.Fatalf("snapshot after churn: %d replicas, %d requests", len(s.Replicas), s.Requests)
	}

	// A replica removed and back within IdleTTL keeps its conversation.
	r.SetReplicas([]string{"a", "b"})
	d, _ := r.Route(Request{Key: "c", Pin: "b", Now: now})
	d.Release()
	r.SetReplicas([]string{"a"})
	r.Sweep(now.Add(ttl / 2))
	r.SetReplicas([]string{"a", "b"})
	if got, ok := r.Bound("c"); !ok || got != "b" {
		t.Fatalf("conversation on a replica back within IdleTTL: %q %v", got, ok)
	}
	// Gone for longer than IdleTTL: forgotten with its bindings.
	r.SetReplicas([]string{"a"})
	d, _ = r.Route(Request{Key: "held", Pin: "a", Now: now.Add(ttl / 2)})
	r.SetReplicas(nil) // "a" leaves with a request in flight
	r.Sweep(now.Add(3 * ttl))
	r.mu.Lock()
	_, bKnown := r.byID["b"]
	_, aKnown := r.byID["a"]
	r.mu.Unlock()
	if bKnown || !aKnown {
		t.Fatalf("after 3×IdleTTL: b known %v (want false), a known %v (in flight, want true)", bKnown, aKnown)
	}
	d.Release()
	r.Sweep(now.Add(3 * ttl))
	r.mu.Lock()
	_, aKnown = r.byID["a"]
	r.mu.Unlock()
	if aKnown || r.Len() != 0 {
		t.Fatalf("after release: a known %v, %d bindings", aKnown, r.Len())
	}
	checkInvariants(t, r)
}

// TestPolledRunningForgetsFinishedTurns: a poll counts the turns in flight
// when it was taken; a turn of this router that was among them and has
// finished since is gone from the replica, so the next new conversation sees
// it idle instead of waiting for the next poll (a closed loop of four
// sessions on four replicas otherwise doubles up on the replica whose
// session just ended).
func TestPolledRunningForgetsFinishedTurns(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{AdmissionOff: true})
	d0, _ := r.Route(Request{Key: "a", Pin: "r0", Now: t0})
	d1, _ := r.Route(Request{Key: "b", Pin: "r1", Now: t0})
	r.UpdateLoad("r0", running(1))
	r.UpdateLoad("r1", running(1))
	// a turn routed after the poll and finished before the next is not in
	// the poll's figure: releasing it must not lower the count
	late, _ := r.Route(Request{Pin: "r1", Now: t0})
	late.Release()
	if got := r.reps[1].running(); got != 1 {
		t.Fatalf("r1 running after a turn the poll never saw ended: %d, want 1", got)
	}
	d0.Release() // counted in r0's poll, gone now
	if got := r.reps[0].running(); got != 0 {
		t.Fatalf("r0 running after its polled turn ended: %d, want 0", got)
	}
	d, err := r.Route(Request{Key: "new", Now: t0.Add(time.Second)})
	if err != nil || d.Replica != "r0" || d.Reason != ReasonPlaced {
		t.Fatalf("new conversation: %q %v %v, want r0 placed", d.Replica, d.Reason, err)
	}
	d.Release()
	d1.Release()
	// the next poll's figure stands as polled
	r.UpdateLoad("r0", running(2))
	if got := r.reps[0].running(); got != 2 {
		t.Fatalf("r0 after the next poll: %d, want 2", got)
	}
}
