package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Regime is one traffic shape of the regime matrix: a simulation preset
// with its workload's pauses, run for every mode of MatrixModes.
type Regime struct {
	Name string
	// Hold says whether the shipped default (ModeDefault) is expected to be
	// no worse than the best baseline here (MatrixRow.Holds).
	Hold   bool
	Config SimConfig
	// Baselines, when set, are the modes the default is compared with
	// instead of MatrixModes' others.
	Baselines []string
	// KeepLength keeps the preset's stage length and warm-up when the
	// matrix is given others: its stages reproduce a recorded run.
	KeepLength bool
}

// MatrixModes are the modes the matrix compares: vLLM's own balancer,
// affinity alone, and the shipped default (affinity with admission and the
// lifecycle checks, last).
var MatrixModes = []string{ModeVLLMDP, ModeOn, ModeDefault}

// MatrixRegimes returns every traffic shape the bench knows, with the
// stages where they differ: the reference preset's closed loop, its agents
// pausing 3 s and 20 s, the interactive-like workload, max_num_seqs 8, the
// 7-GPU preset, sessions in waves, the fleet of agents that never stop,
// the run on llm-d-inference-sim (fast engines) and four H100s.
func MatrixRegimes() []Regime {
	closed := DefaultSimConfig()
	closed.Stages = []int{8, 16, 24, 32}
	think3 := closed
	think3.Workload.Think = 3 * time.Second
	think20 := DefaultSimConfig()
	think20.Stages = []int{8, 12, 16}
	think20.Workload.Think = 20 * time.Second
	inter := DefaultSimConfig()
	inter.Stages = []int{8, 16, 24}
	inter.Workload.Interactive = true
	seqs := SmallSeqsSimConfig()
	seqs.Stages = []int{8, 16, 24}
	waves := WavesSimConfig()
	waves.Stages = []int{8, 16, 24}
	h100Closed := H100SimConfig()
	h100Closed.Workload.Think = 0
	return []Regime{
		{Name: "closed loop", Hold: true, Config: closed},
		{Name: "think 3s", Hold: true, Config: think3},
		// conversations pausing 20 s between their turns leave room: counted
		// at their share of the time in flight, admission no longer holds
		// there what "on" would run
		{Name: "think 20s", Hold: true, Config: think20},
		{Name: "interactive", Hold: true, Config: inter},
		{Name: "seqs8", Hold: true, Config: seqs},
		{Name: "7gpu", Hold: true, Config: SevenGPUSimConfig()},
		{Name: "waves", Hold: true, Config: waves},
		// agents that never stop need long stages: in the short ones the
		// matrix test runs (4 minutes) the fleet has not grown yet, and
		// admission's and time-slicing's start cost output at 16 sessions
		// (0.87× on's), where over 40 minutes they gain (1.25×)
		{Name: "fleet", Hold: false, Config: FleetSimConfig()},
		// a fast engine: no cache needs protecting, and the default's
		// holds cost it 0.56× off's output at 16 sessions, as on
		// llm-d-inference-sim itself (docs/other-engines.md); compared
		// with what that run compared
		{Name: "llmd-sim", Hold: false, Config: LLMDSimConfig(), Baselines: []string{ModeOff, ModeOn}, KeepLength: true},
		{Name: "h100", Hold: true, Config: H100SimConfig()},
		{Name: "h100 closed loop", Hold: true, Config: h100Closed},
	}
}

// MatrixRow is one regime's stage: the default's figures relative to the
// best of the other modes (highest hits and output, lowest completion p50
// and first-turn wait p95; 0 where no other mode has the figure).
type MatrixRow struct {
	Regime          string
	Hold            bool
	Sessions        int
	Default         Stage
	BestHitPct      float64 // the best other mode's prefix hits
	BestOutput      float64 // tok/min
	BestCompletionS float64
	BestFirstP95S   float64
}

// Output, Completion and FirstWait are the default's figure over the best
// other mode's (1 = as good; above 1 is more output, and longer
// completions or waits); 0 when the best has none.
func (m MatrixRow) Output() float64     { return ratio(m.Default.OutputTokensPerMin, m.BestOutput) }
func (m MatrixRow) Completion() float64 { return ratio(m.Default.CompletionP50S, m.BestCompletionS) }
func (m MatrixRow) FirstWait() float64  { return ratio(m.Default.TTFBFirstP95S, m.BestFirstP95S) }

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// Matrix noise: the default holds when its output is within MatrixOutputNoise
// of the best other mode's and its prefix hits within MatrixHitNoise points.
// A stage of fewer than MatrixMinRequests requests is too short to judge:
// it holds.
const (
	MatrixOutputNoise = 0.10
	MatrixHitNoise    = 5.0
	MatrixMinRequests = 100
)

// Holds reports whether the default is no worse than the best baseline
// beyond noise in output and prefix hits.
func (m MatrixRow) Holds() bool {
	if m.Default.Requests < MatrixMinRequests {
		return true
	}
	return m.Default.OutputTokensPerMin >= (1-MatrixOutputNoise)*m.BestOutput &&
		m.Default.PrefixHitPct >= m.BestHitPct-MatrixHitNoise
}

// Matrix runs every regime for MatrixModes, each stage stageLength after
// warmup (0 keeps the preset's), and returns a row per regime and stage.
func Matrix(regimes []Regime, stageLength, warmup time.Duration) ([]MatrixRow, error) {
	var rows []MatrixRow
	for _, rg := range regimes {
		cfg := rg.Config
		base := MatrixModes[:len(MatrixModes)-1]
		if rg.Baselines != nil {
			base = rg.Baselines
		}
		cfg.Modes = append(slices.Clone(base), ModeDefault)
		if stageLength > 0 && !rg.KeepLength {
			cfg.StageLength = stageLength
		}
		if warmup > 0 && !rg.KeepLength {
			cfg.Warmup = warmup
		}
		cfg.Placement.MaxNumSeqs = cfg.Engine.MaxNumSeqs
		rep, err := Sim(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rg.Name, err)
		}
		for _, n := range cfg.Stages {
			def, ok := rep.Find(ModeDefault, n)
			if !ok {
				continue
			}
			row := MatrixRow{Regime: rg.Name, Hold: rg.Hold, Sessions: n, Default: def}
			for _, m := range base {
				st, ok := rep.Find(m, n)
				if !ok {
					continue
				}
				row.BestHitPct = max(row.BestHitPct, st.PrefixHitPct)
				row.BestOutput = max(row.BestOutput, st.OutputTokensPerMin)
				row.BestCompletionS = minPositive(row.BestCompletionS, st.CompletionP50S)
				row.BestFirstP95S = minPositive(row.BestFirstP95S, st.TTFBFirstP95S)
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

func minPositive(a, b float64) float64 {
	switch {
	case b <= 0:
		return a
	case a <= 0:
		return b
	}
	return min(a, b)
}

// WriteScorecard prints the matrix as one Markdown table.
func WriteScorecard(w io.Writer, rows []MatrixRow) error {
	var b strings.Builder
	b.WriteString("| Regime | Sessions | Prefix hits default (best other) % | Output default / best | Completion p50 default / best | First-turn TTFB p95 default / best | Idle while held, default (replica·s) | Holds |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		holds := "yes"
		switch {
		case r.Default.Requests < MatrixMinRequests:
			holds = "too few turns"
		case !r.Holds() && r.Hold:
			holds = "**no**"
		case !r.Holds():
			holds = "no (not expected)"
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f (%.1f) | %s | %s | %s | %.0f | %s |\n", r.Regime, r.Sessions,
			r.Default.PrefixHitPct, r.BestHitPct, fratio(r.Output()), fratio(r.Completion()), fratio(r.FirstWait()), r.Default.IdleWhileHeldS, holds)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func fratio(v float64) string {
	if v <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}
