package bench

import (
	"strings"
	"testing"
	"time"
)

// TestMatrixDefaultHolds runs the regime matrix on short stages and fails
// where the shipped default (ModeDefault) is worse than the best of vLLM's
// balancer and affinity alone beyond noise (MatrixRow.Holds) in a regime
// where it is expected to hold.
func TestMatrixDefaultHolds(t *testing.T) {
	sweep(t)
	rows, err := Matrix(MatrixRegimes(), 4*time.Minute, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteScorecard(&b, rows); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	regimes := map[string]bool{}
	for _, r := range rows {
		regimes[r.Regime] = true
		if r.Hold && !r.Holds() {
			t.Errorf("%s, %d sessions: the default's output %.0f tok/min and hits %.1f %% against the best other's %.0f and %.1f %%",
				r.Regime, r.Sessions, r.Default.OutputTokensPerMin, r.Default.PrefixHitPct, r.BestOutput, r.BestHitPct)
		}
	}
	if len(regimes) != len(MatrixRegimes()) {
		t.Errorf("scorecard covers %d regimes, want %d", len(regimes), len(MatrixRegimes()))
	}
}
