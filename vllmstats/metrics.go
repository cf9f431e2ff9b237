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

// EngineMetrics holds the numbers of one vLLM engine (one data-parallel rank)
// read from one /metrics exposition.
type EngineMetrics struct {
	// Engine is the value of the engine label ("0" when the series carry none).
	Engine string
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
	// kv_cache_size_tokens when the label is present, else BlockSize*NumGPUBlocks.
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

// figureSeries names the series of each figure, in bit order, as messages
// show them (current vLLM spelling).
var figureSeries = [numFigures]string{
	"vllm:num_requests_running",
	"vllm:num_requests_waiting",
	"vllm:kv_cache_usage_perc",
	"vllm:prefix_cache_queries_total",
	"vllm:prefix_cache_hits_total",
	"vllm:prompt_tokens_total",
	"vllm:generation_tokens_total",
	"vllm:cache_config_info",
}

// Has reports whether every figure of f is in s.
func (s Figures) Has(f Figures) bool { return s&f == f }

// Missing returns the figures of AllFigures that are not in s.
func (s Figures) Missing() Figures { return AllFigures &^ s }

// String lists the series of the figures in s, comma-separated ("" when none).
func (s Figures) String() string {
	var b strings.Builder
	for i, name := range figureSeries {
		if s&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(name)
		}
	}
	return b.String()
}

// ErrNoVLLMMetrics is returned by ParseMetrics for a well-formed exposition
// that carries no vLLM series (for instance another program's /metrics).
var ErrNoVLLMMetrics = errors.New("no vllm: series in exposition")

const (
	labelEngine     = "engine"
	labelModelName  = "model_name"
	defaultEngineID = "0"
)

// seriesSpec is how ParseMetrics reads one metric family.
type seriesSpec struct {
	fig     int  // bit index of the figure
	counter bool // a counter (else a gauge); untyped families are accepted as either
	// rank orders the spellings of one figure: an engine's figure comes from
	// its highest-ranked family present, so a figure exported under two
	// names is not counted twice.
	rank int8
	// sum adds the engine's samples of the family (several label sets);
	// otherwise the largest is kept.
	sum bool
}

// seriesByName maps every family name ParseMetrics reads to its spec.
//
// Counters are read under both spellings: with the _total suffix, as Python's
// prometheus_client (vLLM) prints them (vllm/v1/metrics/loggers.py,
// PrometheusStatLogger: Counter "vllm:prefix_cache_queries" is exposed as
// vllm:prefix_cache_queries_total), and without it, as an exposition written
// with Go's client_golang may name them (llm-d-inference-sim v0.10.2 exports
// vllm:prefix_cache_hits and vllm:prefix_cache_queries). The _created
// companions prometheus_client adds are other families and are not read. The
// vllm:gpu_ names are the prefix-cache and KV-usage series before vLLM 0.9;
// they are read only when the current names are absent.
var seriesByName = func() map[string]seriesSpec {
	m := make(map[string]seriesSpec, 20)
	fig := func(f Figures) int { return bits.TrailingZeros16(uint16(f)) }
	m["vllm:num_requests_running"] = seriesSpec{fig: fig(FigRunning), sum: true}
	m["vllm:num_requests_waiting"] = seriesSpec{fig: fig(FigWaiting), sum: true}
	m["vllm:kv_cache_usage_perc"] = seriesSpec{fig: fig(FigKVUsage), rank: 1}
	m["vllm:gpu_cache_usage_perc"] = seriesSpec{fig: fig(FigKVUsage)}
	m["vllm:cache_config_info"] = seriesSpec{fig: fig(FigCacheConfig)}
	counter := func(f Figures, names ...string) { // best spelling first
		for i, base := range names {
			r := int8(2 * (len(names) - i))
			m[base+"_total"] = seriesSpec{fig: fig(f), counter: true, rank: r, sum: true}
			m[base] = seriesSpec{fig: fig(f), counter: true, rank: r - 1, sum: true}
		}
	}
	counter(FigPrefixQueries, "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
	counter(FigPrefixHits, "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
	counter(FigPromptTokens, "vllm:prompt_tokens")
	counter(FigGenerationTokens, "vllm:generation_tokens")
	return m
}()

// engineSeen gathers one engine's figures while the families are read.
type engineSeen struct {
	m    *EngineMetrics
	val  [numFigures]float64
	rank [numFigures]int8 // of the family val came from; valid when the figure is present
}

// ParseMetrics reads a Prometheus text exposition as vLLM prints it and returns
// the numbers of every engine found, keyed by the engine label ("0" for series
// without one). Families are matched by name and type: counters with or
// without the _total suffix (and the legacy vllm:gpu_ names), typed counter or
// untyped; gauges typed gauge or untyped. Metric names containing ':',
// _created lines, NaN values and escaped label values are accepted;
// non-finite values are ignored. EngineMetrics.Present tells which figures
// were found. Malformed input yields an error naming the line; a well-formed
// exposition without any vLLM series yields ErrNoVLLMMetrics.
func ParseMetrics(r io.Reader) (map[string]*EngineMetrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing vllm metrics: %w", err)
	}
	engines := make(map[string]*engineSeen)
	get := func(labels []*dto.LabelPair) *engineSeen {
		id := labelValue(labels, labelEngine)
		if id == "" {
			id = defaultEngineID
		}
		e := engines[id]
		if e == nil {
			e = &engineSeen{m: &EngineMetrics{Engine: id}}
			engines[id] = e
		}
		if mn := labelValue(labels, labelModelName); mn != "" && e.m.ModelName == "" {
			e.m.ModelName = mn
		}
		return e
	}
	for name, mf := range families {
		spec, ok := seriesByName[name]
		if !ok {
			continue
		}
		t := mf.GetType()
		if !typeFits(t, spec.counter) {
			continue // e.g. a histogram that happens to share a name
		}
		bit := Figures(1) << spec.fig
		for _, m := range mf.GetMetric() {
			v, ok := sampleValue(t, m)
			if !ok {
				continue
			}
			e := get(m.GetLabel())
			if bit == FigCacheConfig {
				applyCacheConfig(e.m, m.GetLabel())
				e.m.Present |= bit
				continue
			}
			switch {
			case e.m.Present&bit == 0 || spec.rank > e.rank[spec.fig]:
				e.val[spec.fig], e.rank[spec.fig] = v, spec.rank
				e.m.Present |= bit
			case spec.rank < e.rank[spec.fig]:
				// a lower-ranked spelling of a figure already read
			case spec.sum:
				e.val[spec.fig] += v
			default:
				e.val[spec.fig] = math.Max(e.val[spec.fig], v)
			}
		}
	}
	if len(engines) == 0 {
		return nil, ErrNoVLLMMetrics
	}
	out := make(map[string]*EngineMetrics, len(engines))
	for id, e := range engines {
		m := e.m
		m.Running, m.Waiting, m.KVUsage = e.val[0], e.val[1], e.val[2]
		m.PrefixQueries, m.PrefixHits = e.val[3], e.val[4]
		m.PromptTokens, m.GenerationTokens = e.val[5], e.val[6]
		out[id] = m
	}
	return out, nil
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
