package vllmstats

import (
	"errors"
	"fmt"
	"io"
	"math"
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

	// Running and Waiting are the requests in the running batch and in the queue.
	Running, Waiting float64
	// KVUsage is the fraction (0–1) of the KV cache in use; taken from
	// vllm:kv_cache_usage_perc, or from the legacy vllm:gpu_cache_usage_perc
	// when the former is absent.
	KVUsage float64

	// Counters (the _total series), cumulative since the engine started.
	// PrefixQueries and PrefixHits are in tokens.
	PrefixQueries, PrefixHits, PromptTokens, GenerationTokens float64

	// From vllm:cache_config_info; 0 when absent. KVCapacityTokens is
	// kv_cache_size_tokens when the label is present, else BlockSize*NumGPUBlocks.
	BlockSize, NumGPUBlocks, KVCapacityTokens int
}

// ErrNoVLLMMetrics is returned by ParseMetrics for a well-formed exposition
// that carries no vLLM series (for instance another program's /metrics).
var ErrNoVLLMMetrics = errors.New("no vllm: series in exposition")

// Series names read by ParseMetrics.
const (
	mRunning        = "vllm:num_requests_running"
	mWaiting        = "vllm:num_requests_waiting"
	mKVUsage        = "vllm:kv_cache_usage_perc"
	mKVUsageLegacy  = "vllm:gpu_cache_usage_perc"
	mQueries        = "vllm:prefix_cache_queries_total"
	mHits           = "vllm:prefix_cache_hits_total"
	mQueriesLegacy  = "vllm:gpu_prefix_cache_queries_total"
	mHitsLegacy     = "vllm:gpu_prefix_cache_hits_total"
	mPromptTokens   = "vllm:prompt_tokens_total"
	mGenTokens      = "vllm:generation_tokens_total"
	mCacheConfig    = "vllm:cache_config_info"
	labelEngine     = "engine"
	labelModelName  = "model_name"
	defaultEngineID = "0"
)

// engineSeen records which series an engine had, to pick legacy names only
// when the current ones are absent.
type engineSeen struct {
	m                               *EngineMetrics
	kv, kvLegacy                    float64
	hasKV, hasKVLegacy              bool
	queries, hits                   float64
	hasQueries, hasHits             bool
	queriesLegacy, hitsLegacy       float64
	hasQueriesLegacy, hasHitsLegacy bool
}

// ParseMetrics reads a Prometheus text exposition as vLLM prints it and returns
// the numbers of every engine found, keyed by the engine label ("0" for series
// without one). Metric names containing ':' , _created lines, NaN values and
// escaped label values are accepted; non-finite values are ignored. Malformed
// input yields an error naming the line; a well-formed exposition without any
// vLLM series yields ErrNoVLLMMetrics.
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
		if !strings.HasPrefix(name, "vllm:") {
			continue
		}
		for _, m := range mf.GetMetric() {
			v, ok := sampleValue(mf.GetType(), m)
			if !ok {
				continue
			}
			switch name {
			case mRunning:
				get(m.GetLabel()).m.Running += v
			case mWaiting:
				get(m.GetLabel()).m.Waiting += v
			case mKVUsage:
				e := get(m.GetLabel())
				e.kv, e.hasKV = math.Max(e.kv, v), true
			case mKVUsageLegacy:
				e := get(m.GetLabel())
				e.kvLegacy, e.hasKVLegacy = math.Max(e.kvLegacy, v), true
			case mQueries:
				e := get(m.GetLabel())
				e.queries, e.hasQueries = e.queries+v, true
			case mHits:
				e := get(m.GetLabel())
				e.hits, e.hasHits = e.hits+v, true
			case mQueriesLegacy:
				e := get(m.GetLabel())
				e.queriesLegacy, e.hasQueriesLegacy = e.queriesLegacy+v, true
			case mHitsLegacy:
				e := get(m.GetLabel())
				e.hitsLegacy, e.hasHitsLegacy = e.hitsLegacy+v, true
			case mPromptTokens:
				get(m.GetLabel()).m.PromptTokens += v
			case mGenTokens:
				get(m.GetLabel()).m.GenerationTokens += v
			case mCacheConfig:
				applyCacheConfig(get(m.GetLabel()).m, m.GetLabel())
			}
		}
	}
	if len(engines) == 0 {
		return nil, ErrNoVLLMMetrics
	}
	out := make(map[string]*EngineMetrics, len(engines))
	for id, e := range engines {
		switch {
		case e.hasKV:
			e.m.KVUsage = e.kv
		case e.hasKVLegacy:
			e.m.KVUsage = e.kvLegacy
		}
		if e.hasQueries || e.hasHits {
			e.m.PrefixQueries, e.m.PrefixHits = e.queries, e.hits
		} else {
			e.m.PrefixQueries, e.m.PrefixHits = e.queriesLegacy, e.hitsLegacy
		}
		out[id] = e.m
	}
	return out, nil
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
