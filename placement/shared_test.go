package placement

import (
	"testing"
	"time"
)

// TestAdopt pins what a binding adopted from a shared store does to the turn
// that follows: it is sticky where the adopted replica can take it, and
// placed anew by load (counted as any binding's turn would be) where not.
func TestAdopt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		setup   func(t *testing.T, r *Router)
		key     string
		adopt   string
		start   uint64 // the adopted binding's start
		req     Request
		ok      bool
		want    string
		reason  Reason
		prev    string
		binding int // bindings held afterwards
	}{
		{
			name: "new key becomes sticky on the adopted replica",
			key:  "k", adopt: "r2", ok: true,
			req:  Request{Key: "k"},
			want: "r2", reason: ReasonSticky, binding: 1,
		},
		{
			name:  "existing binding moves to the adopted replica",
			setup: func(t *testing.T, r *Router) { bindTo(t, r, "k", "r0", t0) },
			key:   "k", adopt: "r1", ok: true,
			req:  Request{Key: "k"},
			want: "r1", reason: ReasonSticky, binding: 1,
		},
		{
			name: "unknown replica is refused and the turn is placed",
			key:  "k", adopt: "elsewhere:8000", ok: false,
			req:  Request{Key: "k"},
			want: "r0", reason: ReasonPlaced, binding: 1,
		},
		{
			name: "empty key is refused",
			key:  "", adopt: "r1", ok: false,
			req:  Request{},
			want: "r0", reason: ReasonNoKey, binding: 0,
		},
		{
			name:  "adopted replica out of placement: re-placed by load",
			setup: func(t *testing.T, r *Router) { r.SetAvailable("r1", false) },
			key:   "k", adopt: "r1", ok: true,
			req:  Request{Key: "k"},
			want: "r0", reason: ReasonReplaced, prev: "r1", binding: 1,
		},
		{
			name: "adopted start differs from the turn's: a side request on its replica",
			key:  "k", adopt: "r2", start: 7, ok: true,
			req:  Request{Key: "k", Start: 8},
			want: "r2", reason: ReasonSide, binding: 1,
		},
		{
			name: "adopted start equals the turn's: sticky",
			key:  "k", adopt: "r2", start: 7, ok: true,
			req:  Request{Key: "k", Start: 7},
			want: "r2", reason: ReasonSticky, binding: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(3, Config{})
			// r0 is the least loaded, so placement by load picks it
			r.UpdateLoad("r1", running(2))
			r.UpdateLoad("r2", running(3))
			if tc.setup != nil {
				tc.setup(t, r)
			}
			if got := r.Adopt(tc.key, tc.adopt, tc.start, t0); got != tc.ok {
				t.Fatalf("Adopt = %v, want %v", got, tc.ok)
			}
			tc.req.Now = t0.Add(time.Second)
			d, err := r.Route(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			if d.Replica != tc.want || d.Reason != tc.reason || d.Previous != tc.prev {
				t.Fatalf("Route = %s %s (previous %q), want %s %s (previous %q)",
					d.Replica, d.Reason, d.Previous, tc.want, tc.reason, tc.prev)
			}
			if n := r.Len(); n != tc.binding {
				t.Fatalf("bindings = %d, want %d", n, tc.binding)
			}
		})
	}
}

// TestAdoptBounded checks that adopted bindings obey MaxBindings like any.
func TestAdoptBounded(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{MaxBindings: 3})
	for i := range 10 {
		if !r.Adopt(string(rune('a'+i)), "r1", 0, t0.Add(time.Duration(i)*time.Second)) {
			t.Fatal("Adopt refused a known replica")
		}
	}
	if n := r.Len(); n != 3 {
		t.Fatalf("bindings = %d, want 3", n)
	}
	if s := r.Snapshot(); s.Requests != 0 {
		t.Fatalf("adopting counted %d requests", s.Requests)
	}
}
