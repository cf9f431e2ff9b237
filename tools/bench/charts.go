package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/dustin/go-humanize"
	"github.com/wcharczuk/go-chart/v2"
	"github.com/wcharczuk/go-chart/v2/drawing"
)

// Chart is one PNG figure of a report.
type Chart struct {
	File   string
	Render func(io.Writer) error
}

// Charts returns the reference measurement's figures for the report: TTFB p50 and p95 per
// stage on a log scale, prefix hit % per stage, replicas busy per stage and
// output tokens per minute per stage, one line per mode. Every title names
// the time base (engine seconds of the emulator at its speed, the sim's
// virtual clock, or wall-clock seconds of a real engine).
func (r *Report) Charts() []Chart {
	return []Chart{
		{File: "ttfb.png", Render: r.ttfbChart},
		{File: "prefix_hits.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Prefix cache hits per stage", "prefix hits (%)", func(s Stage) float64 { return s.PrefixHitPct }, 100)
		}},
		{File: "replicas_busy.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Replicas busy per stage", "replicas running ≥1 request (avg)", func(s Stage) float64 { return s.ReplicasBusy }, 0)
		}},
		{File: "output_tokens.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Output tokens per minute per stage", "output tokens/min", func(s Stage) float64 { return s.OutputTokensPerMin }, 0)
		}},
	}
}

var modeColors = map[string]drawing.Color{
	ModeVLLMDP:     {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	ModeOff:        {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	ModeOn:         {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	ModeDefault:    {R: 0x17, G: 0x8a, B: 0x50, A: 0xff},
	ModeAdmit:      {R: 0x17, G: 0xbe, B: 0xcf, A: 0xff},
	ModeLifecycle:  {R: 0xbc, G: 0xbd, B: 0x22, A: 0xff},
	ModeLeastConn:  {R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	ModeRoundRobin: {R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	ModeHeader:     {R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

func modeColor(m string, i int) drawing.Color {
	if c, ok := modeColors[m]; ok {
		return c
	}
	return chart.GetDefaultColor(i)
}

func modeLabel(m string) string {
	switch m {
	case ModeVLLMDP:
		return "vLLM's balancer"
	case ModeOff:
		return "affinity off"
	case ModeOn:
		return "affinity only"
	case ModeDefault:
		return "LM Warden (default)"
	}
	return m
}

// timeBase says what the report's seconds are, for the charts' titles.
func (r *Report) timeBase() string {
	switch {
	case r.Kind == "sim":
		return "engine seconds, virtual clock"
	case r.Speed > 1:
		return "engine seconds, emulator " + strconv.FormatFloat(r.Speed, 'g', -1, 64) + "× speed"
	}
	return "wall-clock seconds"
}

func (r *Report) series(mode string, value func(Stage) float64) (xs, ys []float64) {
	for _, n := range r.SessionCounts() {
		if s, ok := r.Find(mode, n); ok {
			xs = append(xs, float64(n))
			ys = append(ys, value(s))
		}
	}
	return xs, ys
}

func (r *Report) xTicks() []chart.Tick {
	var ticks []chart.Tick
	for _, n := range r.SessionCounts() {
		ticks = append(ticks, chart.Tick{Value: float64(n), Label: strconv.Itoa(n)})
	}
	return ticks
}

// legendWidth is the room right of the plot that the legend takes.
const legendWidth = 250

// baseChart lays a chart out with its y axis on the left (go-chart's
// secondary axis; every series is drawn against it) and the legend in a
// column right of the plot, where it covers no line.
func (r *Report) baseChart(title, yName string, series []chart.Series) chart.Chart {
	g := chart.Chart{
		Title:  title + " (" + r.timeBase() + ")",
		Width:  1060,
		Height: 500,
		Background: chart.Style{
			Padding: chart.Box{Top: 60, Left: 20, Right: legendWidth + 20, Bottom: 20},
		},
		XAxis:          chart.XAxis{Name: "concurrent sessions", Ticks: r.xTicks()},
		YAxis:          chart.YAxis{Style: chart.Hidden()},
		YAxisSecondary: chart.YAxis{},
		Series:         series,
	}
	if len(g.XAxis.Ticks) == 1 {
		// A single stage: blank ticks either side give the axis a width.
		v := g.XAxis.Ticks[0]
		g.XAxis.Ticks = []chart.Tick{{Value: v.Value - 1}, v, {Value: v.Value + 1}}
	}
	legend := chart.Legend(&g, chart.Style{FontSize: 10})
	g.Elements = []chart.Renderable{func(rd chart.Renderer, cb chart.Box, d chart.Style) {
		legend(rd, chart.Box{Top: cb.Top, Left: cb.Right + 20, Right: cb.Right + 20 + legendWidth, Bottom: cb.Bottom}, d)
		// the axis's name above it, level (go-chart writes a left axis's
		// name across its tick labels)
		chart.Style{FontSize: 10, FontColor: chart.DefaultTextColor}.InheritFrom(d).WriteTextOptionsToRenderer(rd)
		rd.Text(yName, cb.Left-10, cb.Top-12)
	}}
	return g
}

// modeStyle draws mode i's line so that lines lying on top of each other
// stay apart: each mode has its own dash pattern and dot size (the first
// mode's dots the largest, so a later mode's dot on the same point sits
// inside it), and p95 lines are dashed wider than p50 ones.
func modeStyle(c drawing.Color, i int, p95 bool) chart.Style {
	dashes := [][]float64{nil, {10, 5}, {2, 4}, {10, 4, 2, 4}}
	dots := []float64{7, 5, 3, 2}
	s := chart.Style{StrokeColor: c, StrokeWidth: 2, DotColor: c, DotWidth: dots[i%len(dots)],
		StrokeDashArray: dashes[i%len(dashes)]}
	if p95 {
		s.StrokeDashArray = []float64{14, 6}
		s.StrokeWidth = 1.5
	}
	return s
}

// intTicks are 0 to top in whole-number steps of 1, 2 or 5 × 10ⁿ, labelled
// with thousands separators.
func intTicks(top float64) []chart.Tick {
	step := math.Max(1, niceCeil(top/5))
	var ticks []chart.Tick
	for v := 0.0; v <= top+step/1000; v += step {
		ticks = append(ticks, chart.Tick{Value: v, Label: humanize.Comma(int64(math.Round(v)))})
	}
	return ticks
}

// lineChart draws value per stage, one line per mode, from 0 to top (0:
// the data's maximum rounded up).
func (r *Report) lineChart(w io.Writer, title, yName string, value func(Stage) float64, top float64) error {
	var series []chart.Series
	for i, m := range r.Modes() {
		xs, ys := r.series(m, value)
		series = append(series, chart.ContinuousSeries{Name: modeLabel(m), XValues: xs, YValues: ys,
			Style: modeStyle(modeColor(m, i), i, false), YAxis: chart.YAxisSecondary})
	}
	if len(series) == 0 {
		return fmt.Errorf("no stages to chart")
	}
	g := r.baseChart(title, yName, series)
	if top <= 0 {
		hi := 0.0
		for _, s := range r.Stages {
			hi = math.Max(hi, value(s))
		}
		top = niceCeil(hi)
	}
	ticks := intTicks(top)
	setY(&g, &chart.ContinuousRange{Min: 0, Max: ticks[len(ticks)-1].Value}, ticks)
	return g.Render(chart.PNG, w)
}

// ttfbChart draws p50 (solid) and p95 (dashed) per mode on a log scale, with
// decade ticks.
func (r *Report) ttfbChart(w io.Writer) error {
	const floor = 0.01 // seconds; the log scale cannot show 0
	var series []chart.Series
	lo, hi := math.Inf(1), 0.0
	clamp := func(v float64) float64 { return math.Max(v, floor) }
	for i, m := range r.Modes() {
		c := modeColor(m, i)
		xs, p50 := r.series(m, func(s Stage) float64 { return clamp(s.TTFBP50S) })
		_, p95 := r.series(m, func(s Stage) float64 { return clamp(s.TTFBP95S) })
		for _, v := range append(append([]float64(nil), p50...), p95...) {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		series = append(series,
			chart.ContinuousSeries{Name: modeLabel(m) + " p50", XValues: xs, YValues: p50, Style: modeStyle(c, i, false), YAxis: chart.YAxisSecondary},
			chart.ContinuousSeries{Name: modeLabel(m) + " p95", XValues: xs, YValues: p95, Style: modeStyle(c, i, true), YAxis: chart.YAxisSecondary},
		)
	}
	if len(series) == 0 {
		return fmt.Errorf("no stages to chart")
	}
	g := r.baseChart("Time to first token per stage, log scale", "TTFB (s)", series)
	minD := math.Pow(10, math.Floor(math.Log10(lo)))
	maxD := math.Pow(10, math.Ceil(math.Log10(hi)))
	if maxD <= minD {
		maxD = minD * 10
	}
	var ticks []chart.Tick
	for d := minD; d <= maxD*1.0001; d *= 10 {
		ticks = append(ticks, chart.Tick{Value: d, Label: strconv.FormatFloat(d, 'g', -1, 64)})
	}
	setY(&g, &logRange{min: minD, max: maxD}, ticks)
	return g.Render(chart.PNG, w)
}

// setY gives the left axis its range and ticks. go-chart v2.1.2 takes the
// span of the secondary axis's ticks from the primary axis's tick list, so
// the hidden right-hand axis gets the same ticks.
func setY(g *chart.Chart, rng chart.Range, ticks []chart.Tick) {
	g.YAxisSecondary.Range = rng
	g.YAxisSecondary.Ticks = ticks
	g.YAxis.Ticks = ticks
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// logRange is a base-10 logarithmic axis for positive values (go-chart's
// LogarithmicRange maps every value below 1 to the axis origin).
type logRange struct {
	min, max float64
	domain   int
}

func (r *logRange) String() string     { return fmt.Sprintf("log[%g,%g]", r.min, r.max) }
func (r *logRange) IsZero() bool       { return r.min <= 0 || r.max <= 0 }
func (r *logRange) GetMin() float64    { return r.min }
func (r *logRange) SetMin(v float64)   { r.min = v }
func (r *logRange) GetMax() float64    { return r.max }
func (r *logRange) SetMax(v float64)   { r.max = v }
func (r *logRange) GetDelta() float64  { return r.max - r.min }
func (r *logRange) GetDomain() int     { return r.domain }
func (r *logRange) SetDomain(d int)    { r.domain = d }
func (r *logRange) IsDescending() bool { return false }
func (r *logRange) Translate(v float64) int {
	if v <= r.min || r.max <= r.min {
		return 0
	}
	ratio := (math.Log10(v) - math.Log10(r.min)) / (math.Log10(r.max) - math.Log10(r.min))
	return int(math.Round(ratio * float64(r.domain)))
}
