package bench

import (
	"strings"
	"testing"
	"time"
)

// TestMatrixDefaultHolds runs the regime matrix on short stages, one seed,
// and fails where the shipped default (ModeDefault) is worse than the best
// of vLLM's balancer and the peer routers beyond noise (MatrixRow.Holds) in
// a regime where it is expected to hold, but for the known losses
// (MatrixKnownLosses), which it logs. The three-seed scorecard with the
// presets' own stage lengths is `warden-bench sim --matrix`
// (docs/scorecard.md).
func TestMatrixDefaultHolds(t *testing.T) {
	sweep(t)
	rows, err := Matrix(MatrixRegimes(), MatrixOptions{StageLength: 4 * time.Minute, Warmup: time.Minute, Seeds: []uint64{1}})
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
			d, o, h := r.Default(), r.BestOutput(), r.BestHits()
			if c := KnownLoss(r.Regime, r.Sessions); c != "" {
				t.Logf("known loss, %s, %d sessions: %s", r.Regime, r.Sessions, c)
				continue
			}
			t.Errorf("%s, %d sessions: the default's output %.0f tok/min and hits %.1f %% against %s's %.0f and %s's %.1f %%",
				r.Regime, r.Sessions, d.Output.Mean, d.Hits.Mean, o.Mode, o.Output.Mean, h.Mode, h.Hits.Mean)
		}
	}
	if len(regimes) != len(MatrixRegimes()) {
		t.Errorf("scorecard covers %d regimes, want %d", len(regimes), len(MatrixRegimes()))
	}
}
