package vllmstats

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// EngineMetrics holds the numbers of one engine (one data-parallel rank)
// read from one /metrics exposition.
type EngineMetrics struct {
	// Engine is the value of the engine label ("0" when the series carry none).
	Engine string
	// Dialect is the engine whose names were read.
	Dialect Dialect
	// ModelName is the model_name label of the engine's series.
	ModelName string

	// Present says which figures the exposition carried for this engine. A
	// figure not in it is unknown: its field below is 0 but means nothing.
	Present Figures

	// Running and Waiting are the requests in the running batch and in the queue.
	Running, Waiting float64
	// KVUsage is the fraction (0–1) of the KV cache in use; taken from
	// vllm:kv_cache_usage_perc, or from the legacy vllm:gpu_cache_usage_perc
	// when the former is absent.
	KVUsage float64

	// Counters, cumulative since the engine started. PrefixQueries and
	// PrefixHits are in tokens.
	PrefixQueries, PrefixHits, PromptTokens, GenerationTokens float64

	// From vllm:cache_config_info; 0 when absent. KVCapacityTokens is
	// kv_cache_size_tokens when the label is present, else
	// BlockSize*NumGPUBlocks; for SGLang sglang:max_total_num_tokens; for
	// llama.cpp the Poller sets it from /props (FigCacheConfig says it is
	// known).
	BlockSize, NumGPUBlocks, KVCapacityTokens int
}

// Figures is a set of the figures ParseMetrics reads.
type Figures uint16

// The figures of EngineMetrics, one bit each.
const (
	FigRunning Figures = 1 << iota
	FigWaiting
	FigKVUsage
	FigPrefixQueries
	FigPrefixHits
	FigPromptTokens
	FigGenerationTokens
	FigCacheConfig

	numFigures = iota
	// AllFigures is every figure ParseMetrics reads.
	AllFigures Figures = 1<<numFigures - 1
	// FigPrefix is the pair a prefix hit rate needs.
	FigPrefix = FigPrefixQueries | FigPrefixHits
)

// figureNames names each figure, in bit order, for messages.
var figureNames = [numFigures]string{
	"running", "waiting", "kv_usage", "prefix_queries", "prefix_hits",
	"prompt_tokens", "generation_tokens", "kv_capacity",
}

// Has reports whether every figure of f is in s.
func (s Figures) Has(f Figures) bool { return s&f == f }

// Missing returns the figures of AllFigures that are not in s.
func (s Figures) Missing() Figures { return AllFigures &^ s }

// String lists the vLLM series of the figures in s, comma-separated ("" when
// none); Dialect.Series names another engine's.
func (s Figures) String() string { return DialectVLLM.Series(s) }

// Names lists the figures in s by name, comma-separated ("" when none).
func (s Figures) Names() string {
	var b strings.Builder
	for i, name := range figureNames {
		if s&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(name)
		}
	}
	return b.String()
}

// ErrNoKnownSeries is returned by ParseMetrics for a well-formed exposition
// that carries no series of any engine it reads (for instance another
// program's /metrics, or an engine of another version): the server answered,
// only its figures are unknown.
var ErrNoKnownSeries = errors.New("no series of a known engine (vllm, sglang, llamacpp, tgi) in exposition")

// ErrNoVLLMMetrics is the former name of ErrNoKnownSeries.
var ErrNoVLLMMetrics = ErrNoKnownSeries

const defaultEngineID = "0"

// engineSeen gathers one engine's figures while the families are read.
type engineSeen struct {
	m    *EngineMetrics
	val  [numFigures]float64
	rank [numFigures]int8 // of the family val came from; valid when the figure is present
}

// ParseMetrics reads a Prometheus text exposition of any engine it knows and
// returns the numbers of every engine found; it detects the engine (see
// ParseMetricsAs).
func ParseMetrics(r io.Reader) (map[string]*EngineMetrics, error) {
	return ParseMetricsAs(r, DialectAuto)
}

// ParseMetricsAs reads a Prometheus text exposition in dialect d
// (DialectAuto: the engine whose series the exposition carries most of,
// vLLM on a tie) and returns the numbers of every engine found, keyed by
// the dialect's engine label ("0" for series without one); each carries the
// dialect read. Families are matched by name and type: counters typed
// counter or untyped (vLLM's with or without the _total suffix, and its
// legacy vllm:gpu_ names); gauges typed gauge or untyped. Metric names
// containing ':', _created lines, NaN values and escaped label values are
// accepted; non-finite values are ignored. EngineMetrics.Present tells which
// figures were found. Malformed input yields an error naming the line; a
// well-formed exposition without any series of the dialect yields
// ErrNoKnownSeries.
func ParseMetricsAs(r io.Reader, d Dialect) (map[string]*EngineMetrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	if d == DialectAuto {
		d = detect(families)
		if d == DialectAuto {
			return nil, ErrNoKnownSeries
		}
	}
	if int(d) >= len(dialects) {
		return nil, fmt.Errorf("parsing metrics: unknown %v", d)
	}
	tab := &dialects[d]
	engines := make(map[string]*engineSeen)
	get := func(labels []*dto.LabelPair) *engineSeen {
		id := ""
		if tab.engineLabel != "" {
			id = labelValue(labels, tab.engineLabel)
		}
		if id == "" {
			id = defaultEngineID
		}
		e := engines[id]
		if e == nil {
			e = &engineSeen{m: &EngineMetrics{Engine: id, Dialect: d}}
			engines[id] = e
		}
		if tab.modelLabel != "" && e.m.ModelName == "" {
			e.m.ModelName = labelValue(labels, tab.modelLabel)
		}
		return e
	}
	for name, mf := range families {
		spec, ok := seriesByName[name]
		if !ok || spec.dialect != d {
			continue
		}
		t := mf.GetType()
		if !typeFits(t, spec.counter) {
			continue // e.g. a histogram that happens to share a name
		}
		bit := spec.fig
		fig := bits.TrailingZeros16(uint16(bit))
		for _, m := range mf.GetMetric() {
			v, ok := sampleValue(t, m)
			if !ok {
				continue
			}
			e := get(m.GetLabel())
			if bit == FigCacheConfig {
				if tab.capacity == CapacityCacheConfig {
					applyCacheConfig(e.m, m.GetLabel())
				} else if v >= 1 && v <= math.MaxInt32*1024 { // a gauge in tokens
					e.m.KVCapacityTokens = max(e.m.KVCapacityTokens, int(v))
				}
				e.m.Present |= bit
				continue
			}
			switch {
			case e.m.Present&bit == 0 || spec.rank > e.rank[fig]:
				e.val[fig], e.rank[fig] = v, spec.rank
				e.m.Present |= bit
			case spec.rank < e.rank[fig]:
				// a lower-ranked spelling of a figure already read
			case spec.sum:
				e.val[fig] += v
			default:
				e.val[fig] = math.Max(e.val[fig], v)
			}
		}
	}
	if len(engines) == 0 {
		return nil, ErrNoKnownSeries
	}
	out := make(map[string]*EngineMetrics, len(engines))
	for id, e := range engines {
		m := e.m
		m.Running, m.Waiting, m.KVUsage = e.val[0], e.val[1], e.val[2]
		m.PrefixQueries, m.PrefixHits = e.val[3], e.val[4]
		m.PromptTokens, m.GenerationTokens = e.val[5], e.val[6]
		tab.derive(m)
		out[id] = m
	}
	return out, nil
}

// derive fills the figures a dialect counts differently from vLLM, so that
// they mean the same for every engine.
func (t *dialectTable) derive(m *EngineMetrics) {
	if t.hitsAppearLate && m.Present.Has(FigPromptTokens) && !m.Present.Has(FigPrefixHits) {
		m.PrefixHits = 0 // no sample before the first hit
		m.Present |= FigPrefixHits
	}
	switch t.queries {
	case queriesPrompt:
		if m.Present.Has(FigPromptTokens) {
			m.PrefixQueries = m.PromptTokens
			m.Present |= FigPrefixQueries
		}
	case queriesPromptPlusCached:
		if m.Present.Has(FigPromptTokens | FigPrefixHits) {
			m.PromptTokens += m.PrefixHits
			m.PrefixQueries = m.PromptTokens
			m.Present |= FigPrefixQueries
		} else {
			// the computed tokens alone are not the prompt tokens
			m.Present &^= FigPromptTokens
		}
	}
}

// detect returns the dialect whose families the exposition carries most of
// (vLLM first on a tie), or DialectAuto when it carries none.
func detect(families map[string]*dto.MetricFamily) Dialect {
	var votes [numDialects]int
	for name, mf := range families {
		if spec, ok := seriesByName[name]; ok && len(mf.GetMetric()) > 0 {
			votes[spec.dialect]++
		}
	}
	best := DialectAuto
	for d := DialectVLLM; d < numDialects; d++ {
		if votes[d] > votes[best] {
			best = d
		}
	}
	return best
}

// typeFits reports whether a family of type t can be read as a counter
// (counter true) or a gauge: its own type, or untyped.
func typeFits(t dto.MetricType, counter bool) bool {
	switch t {
	case dto.MetricType_UNTYPED:
		return true
	case dto.MetricType_COUNTER:
		return counter
	case dto.MetricType_GAUGE:
		return !counter
	}
	return false
}

// sampleValue returns the value of a gauge, counter or untyped sample, and
// false for other types and non-finite values.
func sampleValue(t dto.MetricType, m *dto.Metric) (float64, bool) {
	var v float64
	switch t {
	case dto.MetricType_GAUGE:
		v = m.GetGauge().GetValue()
	case dto.MetricType_COUNTER:
		v = m.GetCounter().GetValue()
	case dto.MetricType_UNTYPED:
		v = m.GetUntyped().GetValue()
	default:
		return 0, false
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

func labelValue(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// applyCacheConfig reads the CacheConfig labels leniently: unknown labels are
// ignored, values that are not integers ("None") count as absent.
func applyCacheConfig(m *EngineMetrics, labels []*dto.LabelPair) {
	sizeTokens := 0
	for _, l := range labels {
		n, err := strconv.ParseFloat(l.GetValue(), 64)
		if err != nil || n < 0 || n > math.MaxInt32*1024 || math.IsNaN(n) {
			continue
		}
		switch l.GetName() {
		case "block_size":
			m.BlockSize = int(n)
		case "num_gpu_blocks":
			m.NumGPUBlocks = int(n)
		case "kv_cache_size_tokens":
			sizeTokens = int(n)
		}
	}
	if sizeTokens > 0 {
		m.KVCapacityTokens = sizeTokens
	} else {
		m.KVCapacityTokens = m.BlockSize * m.NumGPUBlocks
	}
}
