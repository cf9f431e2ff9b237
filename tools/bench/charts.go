package bench

import (
	"fmt"
	"io"
	"math"
	"strconv"

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
// output tokens per minute per stage, one line per mode.
func (r *Report) Charts() []Chart {
	return []Chart{
		{File: "ttfb.png", Render: r.ttfbChart},
		{File: "prefix_hits.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Prefix cache hits per stage", "prefix hits (%)", func(s Stage) float64 { return s.PrefixHitPct }, &chart.ContinuousRange{Min: 0, Max: 100})
		}},
		{File: "replicas_busy.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Replicas busy per stage", "replicas running ≥1 request (avg)", func(s Stage) float64 { return s.ReplicasBusy }, nil)
		}},
		{File: "output_tokens.png", Render: func(w io.Writer) error {
			return r.lineChart(w, "Output tokens per minute per stage", "output tokens/min", func(s Stage) float64 { return s.OutputTokensPerMin }, nil)
		}},
	}
}

var modeColors = map[string]drawing.Color{
	ModeVLLMDP:     {R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	ModeOff:        {R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	ModeOn:         {R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
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
		return "affinity on"
	}
	return m
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

func (r *Report) baseChart(title, yName string, series []chart.Series) chart.Chart {
	g := chart.Chart{
		Title:  title,
		Width:  900,
		Height: 500,
		Background: chart.Style{
			Padding: chart.Box{Top: 50, Left: 20, Right: 20, Bottom: 20},
		},
		XAxis:  chart.XAxis{Name: "concurrent sessions", Ticks: r.xTicks()},
		YAxis:  chart.YAxis{Name: yName},
		Series: series,
	}
	if len(g.XAxis.Ticks) == 1 {
		// A single stage: blank ticks either side give the axis a width.
		v := g.XAxis.Ticks[0]
		g.XAxis.Ticks = []chart.Tick{{Value: v.Value - 1}, v, {Value: v.Value + 1}}
	}
	g.Elements = []chart.Renderable{chart.LegendLeft(&g)}
	return g
}

// pointStyle draws a line with dots, so a single stage still shows.
func pointStyle(c drawing.Color, dashed bool) chart.Style {
	s := chart.Style{StrokeColor: c, StrokeWidth: 2, DotColor: c, DotWidth: 4}
	if dashed {
		s.StrokeDashArray = []float64{6, 4}
	}
	return s
}

func (r *Report) lineChart(w io.Writer, title, yName string, value func(Stage) float64, yr chart.Range) error {
	var series []chart.Series
	for i, m := range r.Modes() {
		xs, ys := r.series(m, value)
		series = append(series, chart.ContinuousSeries{Name: modeLabel(m), XValues: xs, YValues: ys, Style: pointStyle(modeColor(m, i), false)})
	}
	if len(series) == 0 {
		return fmt.Errorf("no stages to chart")
	}
	g := r.baseChart(title, yName, series)
	if yr == nil {
		hi := 0.0
		for _, s := range r.Stages {
			hi = math.Max(hi, value(s))
		}
		yr = &chart.ContinuousRange{Min: 0, Max: niceCeil(hi)}
	}
	g.YAxis.Range = yr
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
			chart.ContinuousSeries{Name: modeLabel(m) + " p50", XValues: xs, YValues: p50, Style: pointStyle(c, false)},
			chart.ContinuousSeries{Name: modeLabel(m) + " p95", XValues: xs, YValues: p95, Style: pointStyle(c, true)},
		)
	}
	if len(series) == 0 {
		return fmt.Errorf("no stages to chart")
	}
	g := r.baseChart("Time to first token per stage (log scale)", "TTFB (s)", series)
	minD := math.Pow(10, math.Floor(math.Log10(lo)))
	maxD := math.Pow(10, math.Ceil(math.Log10(hi)))
	if maxD <= minD {
		maxD = minD * 10
	}
	var ticks []chart.Tick
	for d := minD; d <= maxD*1.0001; d *= 10 {
		ticks = append(ticks, chart.Tick{Value: d, Label: strconv.FormatFloat(d, 'g', -1, 64)})
	}
	g.YAxis.Range = &logRange{min: minD, max: maxD}
	g.YAxis.Ticks = ticks
	return g.Render(chart.PNG, w)
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
