package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
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
	// Also are modes run here besides the matrix's (those a recorded run
	// compared), before them.
	Also []string
	// KeepLength keeps the preset's stage length and warm-up when the
	// matrix is given others: its stages reproduce a recorded run.
	KeepLength bool
}

// MatrixModes are the modes the matrix compares: vLLM's own balancer,
// every peer router's policy (PeerModes) and the shipped default
// (affinity with admission and the lifecycle checks), last.
var MatrixModes = append(append([]string{ModeVLLMDP}, PeerModes...), ModeDefault)

// MatrixKnownLosses are the regime stages ("regime/sessions") where a
// peer router beats the shipped default beyond noise, with the cause. The
// matrix test logs them instead of failing; the scorecard prints the
// cause. Each is ThunderAgent's: it pauses whole conversations at their
// tool boundaries once a worker's resident conversations pass 0.95 of its
// KV pool, and admits new ones at once, where the default holds only new
// conversations and counts a pausing one at its share of the time in
// flight.
var MatrixKnownLosses = map[string]string{
	"think 20s/12": "ThunderAgent pauses idle conversations and keeps the resident ones' caches (hits 88 % against 80 % " +
		"over the matrix test's 4-minute stages, 84 % against 77 % over the scorecard's), at 0.98× the default's output: " +
		"the default counts a conversation pausing 20 s at its share of the time in flight and admits more than the KV keeps",
	"think 20s/16": "ThunderAgent pauses idle conversations and keeps the resident ones' caches (hits 76 % against 55 % " +
		"over the scorecard's 3-minute stages), at 0.56× the default's output: the default counts a conversation pausing 20 s " +
		"at its share of the time in flight, admits all 16, and their 224k tokens thrash 147k of KV",
	"h100 closed loop/24": "ThunderAgent admits new conversations at once and pauses running ones at their tool " +
		"boundaries; every conversation is in flight all the time, so the default's average demand overflows the KV and " +
		"new ones wait at the router (first-turn TTFB p95 above 100 s)",
}

// KnownLoss returns the cause of a known loss at that regime stage, or "".
func KnownLoss(regime string, sessions int) string {
	return MatrixKnownLosses[fmt.Sprintf("%s/%d", regime, sessions)]
}

// MatrixSeeds are the workload seeds the scorecard averages over.
var MatrixSeeds = []uint64{1, 2, 3}

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
		// admission's start costs output at 16 sessions (0.86×
		// vllm-router's), where over 40 minutes it gains (1.15× the best
		// peer's)
		{Name: "fleet", Hold: false, Config: FleetSimConfig()},
		// a fast engine whose tokenizer counts words and which refuses a
		// turn its KV cache cannot hold: no cache needs protecting at 16
		// sessions, and the default holds nothing since it sizes new
		// conversations by the engine's own counts (0.56× off's output
		// before, as on llm-d-inference-sim itself,
		// docs/other-engines.md); with the peers, and with what that run
		// compared
		{Name: "llmd-sim", Hold: true, Config: LLMDSimConfig(), Also: []string{ModeOff, ModeOn}, KeepLength: true},
		{Name: "h100", Hold: true, Config: H100SimConfig()},
		{Name: "h100 closed loop", Hold: true, Config: h100Closed},
	}
}

// Spread is one figure over the seeds: its mean, lowest and highest.
type Spread struct{ Mean, Lo, Hi float64 }

func spreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := Spread{Lo: xs[0], Hi: xs[0]}
	for _, x := range xs {
		s.Mean += x / float64(len(xs))
		s.Lo, s.Hi = min(s.Lo, x), max(s.Hi, x)
	}
	return s
}

// Figures are one mode's scorecard figures at one regime's stage, over
// the seeds.
type Figures struct {
	Mode string
	// Output is tok/min; Hits the prefix hit %; LaterP50 and LaterP95 the
	// TTFB of sessions' later turns; FirstP95 the TTFB of their first
	// turns (router wait included); CompletionP50 the sessions'
	// completion time (s), over the seeds that measured it (a session
	// completed in the window); Completed the sessions that did.
	Output, Hits, LaterP50, LaterP95, FirstP95, CompletionP50, Completed Spread
	// Failed is the share of the stage's requests that failed (an engine
	// that refuses turns, as llm-d-inference-sim does when its KV cache
	// is full).
	Failed Spread
	// Requests is the fewest requests a seed's stage served.
	Requests int
}

// A metric of the scorecard: how to read it from Figures and whether
// higher is better.
type metric struct {
	name   string
	get    func(Figures) Spread
	higher bool
	prec   int // decimals printed
}

var scorecardMetrics = []metric{
	{"output tok/min", func(f Figures) Spread { return f.Output }, true, 0},
	{"prefix hits %", func(f Figures) Spread { return f.Hits }, true, 1},
	{"TTFB later p50 (s)", func(f Figures) Spread { return f.LaterP50 }, false, 2},
	{"TTFB later p95 (s)", func(f Figures) Spread { return f.LaterP95 }, false, 2},
	{"first-turn TTFB p95 (s)", func(f Figures) Spread { return f.FirstP95 }, false, 1},
	{"completion p50 (s)", func(f Figures) Spread { return f.CompletionP50 }, false, 1},
}

// MatrixRow is one regime's stage: every mode's figures, in MatrixModes
// order, the default last.
type MatrixRow struct {
	Regime   string
	Hold     bool
	Sessions int
	Modes    []Figures
}

// Default returns the shipped default's figures.
func (m MatrixRow) Default() Figures { return m.Modes[len(m.Modes)-1] }

// Best returns the other mode with the best mean of the metric (highest
// output or hits; lowest times, among modes that have the figure). A mode
// that failed a larger share of its requests than the default, beyond
// the seeds' spread, is left out: a refused turn produces nothing and
// costs almost no time, its session is replaced by a new one, and the
// stage's figures then describe work that was thrown away, not served.
func (m MatrixRow) best(x metric) (Figures, bool) {
	var best Figures
	found := false
	def := m.Default()
	for _, f := range m.Modes[:len(m.Modes)-1] {
		if f.Failed.Lo > def.Failed.Hi {
			continue
		}
		v := x.get(f).Mean
		if !x.higher && v <= 0 {
			continue
		}
		b := x.get(best).Mean
		if !found || (x.higher && v > b) || (!x.higher && v < b) {
			best, found = f, true
		}
	}
	return best, found
}

// BestOutput and BestHits return the other mode with the most output and
// the most prefix hits.
func (m MatrixRow) BestOutput() Figures { f, _ := m.best(scorecardMetrics[0]); return f }
func (m MatrixRow) BestHits() Figures   { f, _ := m.best(scorecardMetrics[1]); return f }

// Loss is one scorecard cell where the default is worse than the best
// other mode by more than the seeds' spread: the two ranges of seeds do
// not overlap.
type Loss struct {
	Metric        string
	Default, Best Spread
	BestMode      string
	prec          int
}

// Losses returns the cells the default loses beyond the seeds' spread.
// A stage of fewer than MatrixMinRequests requests is too short to judge.
func (m MatrixRow) Losses() []Loss {
	def := m.Default()
	if def.Requests < MatrixMinRequests {
		return nil
	}
	var out []Loss
	for _, x := range scorecardMetrics {
		b, ok := m.best(x)
		if !ok {
			continue
		}
		d, o := x.get(def), x.get(b)
		if !x.higher && (d.Mean <= 0 || o.Mean <= 0) {
			continue // a time no seed measured (no session completed in the window)
		}
		lost := (x.higher && d.Hi < o.Lo) || (!x.higher && d.Lo > o.Hi)
		if lost {
			out = append(out, Loss{Metric: x.name, Default: d, Best: o, BestMode: b.Mode, prec: x.prec})
		}
	}
	return out
}

// Matrix noise: the default holds when its output is within
// MatrixOutputNoise of the best other mode's and its prefix hits within
// MatrixHitNoise points, or within the seeds' spread of them. A stage of
// fewer than MatrixMinRequests requests is too short to judge: it holds.
const (
	MatrixOutputNoise = 0.10
	MatrixHitNoise    = 5.0
	MatrixMinRequests = 100
)

// Holds reports whether the default is no worse than the best other mode
// beyond noise and the seeds' spread in output and prefix hits.
func (m MatrixRow) Holds() bool {
	def := m.Default()
	if def.Requests < MatrixMinRequests {
		return true
	}
	out, hits := m.BestOutput(), m.BestHits()
	okOut := def.Output.Mean >= (1-MatrixOutputNoise)*out.Output.Mean || def.Output.Hi >= out.Output.Lo
	okHits := def.Hits.Mean >= hits.Hits.Mean-MatrixHitNoise || def.Hits.Hi >= hits.Hits.Lo
	return okOut && okHits
}

// MatrixOptions narrows a matrix run: stage length and warm-up (0 keeps
// each preset's), the seeds (nil: MatrixSeeds) and the modes (nil:
// MatrixModes; the default is always run, last).
type MatrixOptions struct {
	StageLength, Warmup time.Duration
	Seeds               []uint64
	Modes               []string
	// Progress, when set, is told of every regime and seed done.
	Progress func(regime string, seed uint64)
}

// Matrix runs every regime for every mode and seed and returns a row per
// regime and stage.
func Matrix(regimes []Regime, o MatrixOptions) ([]MatrixRow, error) {
	seeds := o.Seeds
	if len(seeds) == 0 {
		seeds = MatrixSeeds
	}
	modes := o.Modes
	if len(modes) == 0 {
		modes = MatrixModes
	}
	modes = append(slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return m == ModeDefault }), ModeDefault)
	var rows []MatrixRow
	for _, rg := range regimes {
		cfg := rg.Config
		rmodes := modes
		if rg.Also != nil {
			rmodes = append(slices.Clone(rg.Also), slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return slices.Contains(rg.Also, m) })...)
		}
		cfg.Modes = rmodes
		if o.StageLength > 0 && !rg.KeepLength {
			cfg.StageLength = o.StageLength
		}
		if o.Warmup > 0 && !rg.KeepLength {
			cfg.Warmup = o.Warmup
		}
		cfg.Placement.MaxNumSeqs = cfg.Engine.MaxNumSeqs
		var reps []*Report
		for _, seed := range seeds {
			c := cfg
			c.Workload.Seed = seed
			rep, err := Sim(c)
			if err != nil {
				return nil, fmt.Errorf("%s, seed %d: %w", rg.Name, seed, err)
			}
			reps = append(reps, rep)
			if o.Progress != nil {
				o.Progress(rg.Name, seed)
			}
		}
		for _, n := range cfg.Stages {
			row := MatrixRow{Regime: rg.Name, Hold: rg.Hold, Sessions: n}
			for _, m := range rmodes {
				f := Figures{Mode: m, Requests: -1}
				var out, hits, lp50, lp95, fp95, cp50, done, failed []float64
				pos := func(xs []float64, x float64) []float64 {
					if x > 0 {
						return append(xs, x)
					}
					return xs
				}
				for _, rep := range reps {
					st, ok := rep.Find(m, n)
					if !ok {
						continue
					}
					out = append(out, st.OutputTokensPerMin)
					hits = append(hits, st.PrefixHitPct)
					lp50 = pos(lp50, st.TTFBLaterP50S)
					lp95 = pos(lp95, st.TTFBLaterP95S)
					fp95 = pos(fp95, st.TTFBFirstP95S)
					cp50 = pos(cp50, st.CompletionP50S)
					done = append(done, float64(st.CompletedCounts))
					if st.Requests > 0 {
						failed = append(failed, float64(st.Errors)/float64(st.Requests))
					}
					if f.Requests < 0 || st.Requests < f.Requests {
						f.Requests = st.Requests
					}
				}
				f.Output, f.Hits, f.LaterP50, f.LaterP95 = spreadOf(out), spreadOf(hits), spreadOf(lp50), spreadOf(lp95)
				f.FirstP95, f.CompletionP50, f.Completed = spreadOf(fp95), spreadOf(cp50), spreadOf(done)
				f.Failed = spreadOf(failed)
				row.Modes = append(row.Modes, f)
			}
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// WriteScorecard prints the matrix as Markdown: the summary (per regime
// and stage, the default against vLLM's balancer and the best other mode
// on output and hits), the cells the default loses beyond the seeds'
// spread, and every mode's figures.
func WriteScorecard(w io.Writer, rows []MatrixRow) error {
	var b strings.Builder
	b.WriteString("| Shape | Sessions | Output tok/min: default | vllm-dp | best other | Prefix hits %: default | vllm-dp | best other | Holds |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		def := r.Default()
		dpOut, dpHits := "—", "—"
		if dp, ok := r.mode(ModeVLLMDP); ok {
			dpOut, dpHits = fmean(dp.Output), fpct(dp.Hits)
		}
		bo, bh := r.BestOutput(), r.BestHits()
		holds := "yes"
		switch {
		case def.Requests < MatrixMinRequests:
			holds = "too few turns"
		case !r.Holds() && r.Hold && KnownLoss(r.Regime, r.Sessions) != "":
			holds = "**no** (known, below)"
		case !r.Holds() && r.Hold:
			holds = "**no**"
		case !r.Holds():
			holds = "no (not expected)"
		}
		bestOut, bestHits := "— (every other mode failed more turns)", "—"
		if bo.Mode != "" {
			bestOut = fmt.Sprintf("%s (%s)", fmean(bo.Output), bo.Mode)
		}
		if bh.Mode != "" {
			bestHits = fmt.Sprintf("%s (%s)", fpct(bh.Hits), bh.Mode)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", r.Regime, r.Sessions,
			fmean(def.Output), dpOut, bestOut, fpct(def.Hits), dpHits, bestHits, holds)
	}
	var losses strings.Builder
	for _, r := range rows {
		for _, l := range r.Losses() {
			fmt.Fprintf(&losses, "- %s, %d sessions: %s, default %s against %s's %s\n", r.Regime, r.Sessions, l.Metric,
				fspreadP(l.Default, l.prec), l.BestMode, fspreadP(l.Best, l.prec))
		}
	}
	var known strings.Builder
	for _, r := range rows {
		if c := KnownLoss(r.Regime, r.Sessions); c != "" && !r.Holds() {
			fmt.Fprintf(&known, "- %s, %d sessions: %s\n", r.Regime, r.Sessions, c)
		}
	}
	if known.Len() > 0 {
		b.WriteString("\nKnown losses:\n\n")
		b.WriteString(known.String())
	}
	b.WriteString("\nCells where the default is worse than the best other mode beyond the seeds' spread (the seeds' ranges do not overlap):\n\n")
	if losses.Len() == 0 {
		b.WriteString("- none\n")
	} else {
		b.WriteString(losses.String())
	}
	b.WriteString("\nEvery mode, mean over the seeds (lowest–highest for output and hits):\n\n")
	b.WriteString("| Shape | Sessions | Mode | Output tok/min | Prefix hits % | TTFB later p50 / p95 (s) | First-turn TTFB p95 (s) | Completion p50 (s) | Sessions completed | Requests (fewest; mean share failed) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		for _, f := range r.Modes {
			req := strconv.Itoa(f.Requests)
			if f.Failed.Mean > 0 {
				req += fmt.Sprintf(" (%.1f %% failed)", 100*f.Failed.Mean)
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s / %s | %s | %s | %.1f | %s |\n", r.Regime, r.Sessions, f.Mode,
				fspreadInt(f.Output), fspread(f.Hits), fsecs(f.LaterP50), fsecs(f.LaterP95), fsecs(f.FirstP95), fsecs(f.CompletionP50), f.Completed.Mean, req)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (m MatrixRow) mode(name string) (Figures, bool) {
	for _, f := range m.Modes {
		if f.Mode == name {
			return f, true
		}
	}
	return Figures{Mode: name}, false
}

func fmean(s Spread) string { return fmt.Sprintf("%.0f", s.Mean) }
func fpct(s Spread) string  { return fmt.Sprintf("%.1f", s.Mean) }

func fspreadP(s Spread, prec int) string {
	if s.Lo == s.Hi {
		return fmt.Sprintf("%.*f", prec, s.Mean)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Mean, prec, s.Lo, prec, s.Hi)
}

func fspread(s Spread) string {
	if s.Lo == s.Hi {
		return fmt.Sprintf("%.1f", s.Mean)
	}
	return fmt.Sprintf("%.1f (%.1f–%.1f)", s.Mean, s.Lo, s.Hi)
}

func fspreadInt(s Spread) string {
	if s.Lo == s.Hi {
		return fmt.Sprintf("%.0f", s.Mean)
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", s.Mean, s.Lo, s.Hi)
}

func fsecs(s Spread) string {
	if s.Mean <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", s.Mean)
}
