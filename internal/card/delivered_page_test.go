package card_test

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/internal/pagetest"
)

// TestUIStatsDelivered checks the stats view's delivered share over the
// fixture's hour: per minute (the chart's 10 s steps summed by six,
// aligned to the chart's end), for the model and one replica, null in the
// minutes before the first checked turn, the last replica's dip to 0, and
// the hour's share.
func TestUIStatsDelivered(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	round := func(x float64) float64 { return math.Round(x*1000) / 1000 }
	// Step k of the chart holds series seconds 9+10k..18+10k; minute g
	// (six steps after the 5 oldest) holds seconds 59+60g..118+60g. The
	// fixture checks a turn every 10 s from second 1800 on, so minute 29
	// (1799..1858) is the first with six; the dip (3000..3059) is minute 49.
	dip := (pagetest.DeliveryDip - 59) / 60
	tests := []struct {
		name, query   string
		last, atDip   float64
		beforeDip     float64
		hour          float64
		hourTextStart string
	}{
		{"all replicas", "", round(6 * 3850.0 / 24000), round(6 * 2925.0 / 24000), round(6 * 3850.0 / 24000),
			(180*3850.0 - 6*925) / 720000, "95.5% ("},
		{"the replica with the dip", "?replica=127.0.0.1:8004", 0.925, 0, 0.925,
			(180*925.0 - 6*925) / 180000, "89.4% ("},
		{"a replica delivering all", "?replica=127.0.0.1:8001", 1, 1, 1, 1, "100.0% ("},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, resp := uiDecodeView[StatsView](t, h, "/lm-warden/ui/qwen3-4b/stats.json"+tc.query)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if len(v.Delivered) != 59 || v.DeliveredStepS != 60 {
				t.Fatalf("%d delivered points of %v s, want 59 of 60", len(v.Delivered), v.DeliveredStepS)
			}
			for g := range 29 {
				if v.Delivered[g] != nil {
					t.Fatalf("minute %d: %v before any checked turn", g, *v.Delivered[g])
				}
			}
			check := func(what string, got *float64, want float64) {
				t.Helper()
				if got == nil || *got != want {
					t.Errorf("%s: %v, want %v", what, got, want)
				}
			}
			check("first minute", v.Delivered[29], tc.beforeDip)
			check("minute before the dip", v.Delivered[dip-1], tc.beforeDip)
			check("the dip's minute", v.Delivered[dip], tc.atDip)
			check("last minute", v.Delivered[58], tc.last)
			if got, ok := v.DeliveredShare.V.(float64); !ok || math.Abs(got-tc.hour) > 1e-12 {
				t.Errorf("hour share %v, want %v", v.DeliveredShare.V, tc.hour)
			}
			if !strings.HasPrefix(v.DeliveredShare.T, tc.hourTextStart) || !strings.HasSuffix(v.DeliveredShare.T, " tokens)") {
				t.Errorf("hour share text %q", v.DeliveredShare.T)
			}
		})
	}
}
