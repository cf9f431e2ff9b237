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

// TestMatrixBestLeavesOutModesThatFailedMore: a mode that failed a larger
// share of its turns than the default, beyond the seeds' spread, is not
// the best other mode on any metric (its output came from sessions
// thrown away); within the spread it is.
func TestMatrixBestLeavesOutModesThatFailedMore(t *testing.T) {
	sp := func(lo, hi float64) Spread { return Spread{Mean: (lo + hi) / 2, Lo: lo, Hi: hi} }
	cases := []struct {
		name       string
		refused    Spread // the refusing mode's failed share
		def        Spread // the default's
		wantOutput string // the best other mode on output
	}{
		{"refused far more", sp(0.55, 0.56), sp(0, 0), "on"},
		{"both refused alike", sp(0.20, 0.25), sp(0.22, 0.30), "off"},
		{"none failed", sp(0, 0), sp(0, 0), "off"},
	}
	for _, c := range cases {
		row := MatrixRow{Regime: "r", Sessions: 24, Modes: []Figures{
			{Mode: "off", Output: sp(180000, 190000), Hits: sp(77, 78), Failed: c.refused},
			{Mode: "on", Output: sp(150000, 151000), Hits: sp(80, 81)},
			{Mode: ModeDefault, Output: sp(170000, 175000), Hits: sp(86, 86), Failed: c.def, Requests: 1800},
		}}
		if got := row.BestOutput().Mode; got != c.wantOutput {
			t.Errorf("%s: best output %q, want %q", c.name, got, c.wantOutput)
		}
		losses := row.Losses()
		if c.wantOutput == "on" && len(losses) != 0 {
			t.Errorf("%s: losses %+v against a mode that failed more", c.name, losses)
		}
		if c.wantOutput == "off" && len(losses) == 0 {
			t.Errorf("%s: no output loss against off's 185k", c.name)
		}
	}
}

// TestMatrixAlsoModesRunOnce: a regime's own modes run before the
// matrix's, and a mode in both runs once.
func TestMatrixAlsoModesRunOnce(t *testing.T) {
	cfg := LLMDSimConfig()
	cfg.Replicas, cfg.Stages = 1, []int{1}
	cfg.StageLength, cfg.Warmup = 10*time.Second, 0
	rows, err := Matrix([]Regime{{Name: "r", Config: cfg, Also: []string{ModeOff, ModeOn}, KeepLength: true}},
		MatrixOptions{Seeds: []uint64{1}, Modes: []string{ModeOn, "vllm-router"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range rows[0].Modes {
		got = append(got, f.Mode)
	}
	if want := []string{ModeOff, ModeOn, "vllm-router", ModeDefault}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("modes %v, want %v", got, want)
	}
}
