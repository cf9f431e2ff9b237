package caddymodule

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// TestRouteValue: the route header carries the costs in seconds of the two
// candidates a decision compared, and nothing more where none were.
func TestRouteValue(t *testing.T) {
	t.Parallel()
	const route = "10.0.0.5:8001; "
	for _, tc := range []struct {
		name, reason string
		dec          placement.Decision
		want         string
	}{
		{"sticky", "sticky", placement.Decision{Expect: time.Second}, route + "sticky"},
		{"spill declined", "spill-declined", placement.Decision{Stay: 400 * time.Millisecond, Move: 6200 * time.Millisecond},
			route + "spill-declined; stay 0.40s, move 6.20s"},
		{"spilled, evicting", "spilled", placement.Decision{Stay: 9100 * time.Millisecond, Move: 3020 * time.Millisecond, Evict: 1200 * time.Millisecond},
			route + "spilled; stay 9.10s, move 3.02s (evicts 1.20s)"},
		{"let in by the comparison", "placed", placement.Decision{Wait: 15 * time.Second, Evict: 3200 * time.Millisecond},
			route + "placed; wait 15.00s, evicts 3.20s"},
	} {
		if got := routeValue(route+tc.reason, tc.dec); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
