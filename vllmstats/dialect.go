package vllmstats

import (
	"fmt"
	"math/bits"
	"strings"
	"sync"
)

// Dialect is the engine whose /metrics names ParseMetrics reads: each
// engine names its figures its own way, and a few count them differently.
// Every dialect is one table (dialects below), not code of its own.
type Dialect uint8

// The dialects. DialectAuto, the zero value, means "detect it from the
// exposition": the engine whose series the exposition carries most of.
const (
	DialectAuto Dialect = iota
	DialectVLLM
	DialectSGLang
	DialectLlamaCpp
	DialectTGI

	numDialects = iota
)

var dialectNames = [numDialects]string{"auto", "vllm", "sglang", "llamacpp", "tgi"}

// String returns the dialect's name as the engine setting spells it.
func (d Dialect) String() string {
	if int(d) < len(dialectNames) {
		return dialectNames[d]
	}
	return fmt.Sprintf("dialect(%d)", uint8(d))
}

// ParseDialect reads an engine setting: auto (or ""), vllm, sglang,
// llamacpp or tgi.
func ParseDialect(s string) (Dialect, error) {
	if s == "" {
		return DialectAuto, nil
	}
	for i, n := range dialectNames {
		if strings.EqualFold(s, n) {
			return Dialect(i), nil
		}
	}
	return DialectAuto, fmt.Errorf("unknown engine %q (want auto, vllm, sglang, llamacpp or tgi)", s)
}

// CapacitySource says where a dialect's KV capacity in tokens comes from.
type CapacitySource uint8

const (
	// CapacityNone: the engine does not say; the policy's kv_tokens gives it.
	CapacityNone CapacitySource = iota
	// CapacityCacheConfig: the labels of vllm:cache_config_info.
	CapacityCacheConfig
	// CapacityGauge: a gauge in tokens (SGLang's sglang:max_total_num_tokens).
	CapacityGauge
	// CapacityProps: llama.cpp's GET /props (n_ctx per slot × total_slots),
	// fetched once per replica by the Poller.
	CapacityProps
)

// seriesDef is one row of a dialect's table: a metric family and the figure
// it gives.
type seriesDef struct {
	name    string
	fig     Figures
	counter bool // a counter (else a gauge); untyped families are read as either
	// rank orders the spellings of one figure: an engine's figure comes from
	// its highest-ranked family present, so a figure exported under two
	// names is not counted twice.
	rank int8
	// sum adds the engine's samples of the family (several label sets);
	// otherwise the largest is kept.
	sum bool
}

// dialectTable is everything ParseMetrics knows of one engine.
type dialectTable struct {
	// engineLabel names the label that tells a server's data-parallel
	// engines apart; "" when the engine's series carry none.
	engineLabel string
	// modelLabel names the label with the served model's name.
	modelLabel string
	series     []seriesDef
	capacity   CapacitySource
	// queries says where the prefix-cache queries come from, so that the hit
	// rate is cached / all prompt tokens for every engine, as vLLM counts it.
	queries queriesFrom
	// hitsAppearLate: the cached-tokens counter has no sample until the first
	// request with a hit (SGLang increments it only when cached_tokens > 0),
	// so while the prompt counter is present an absent one is 0, not unknown.
	hitsAppearLate bool
	// cachedOmittedWhenZero: the usage of a response leaves the cached
	// count out when it is 0, and always when cache reports are off (SGLang
	// with --enable-cache-report: entrypoints/openai/usage_processor.py,
	// UsageProcessor._details_if_cached returns None for 0). See
	// CacheReports.
	cachedOmittedWhenZero bool
}

// queriesFrom is how a dialect counts the prompt tokens looked up in the
// prefix cache.
type queriesFrom uint8

const (
	// queriesSeries: a series of its own (vLLM's prefix_cache_queries).
	queriesSeries queriesFrom = iota
	// queriesPrompt: the prompt counter, which counts cached tokens too
	// (SGLang).
	queriesPrompt
	// queriesPromptPlusCached: the prompt counter counts only the tokens
	// computed, not those reused (llama.cpp): queries and prompt tokens are
	// prompt + cached.
	queriesPromptPlusCached
)

// vllmCounter lists a counter under both spellings vLLM's exporters use: with
// the _total suffix, as Python's prometheus_client prints it (vLLM,
// vllm/v1/metrics/loggers.py, PrometheusStatLogger: Counter
// "vllm:prefix_cache_queries" is exposed as vllm:prefix_cache_queries_total),
// and without it, as client_golang may name it (llm-d-inference-sim v0.10.2
// exports vllm:prefix_cache_hits and vllm:prefix_cache_queries). Best
// spelling first; later names (legacy) are read only when earlier are absent.
func vllmCounter(f Figures, names ...string) []seriesDef {
	var out []seriesDef
	for i, base := range names {
		r := int8(2 * (len(names) - i))
		out = append(out,
			seriesDef{name: base + "_total", fig: f, counter: true, rank: r, sum: true},
			seriesDef{name: base, fig: f, counter: true, rank: r - 1, sum: true})
	}
	return out
}

// dialects holds one table per engine. The figures each engine lacks are
// absent from its table and so reported unknown, never 0.
var dialects = [numDialects]dialectTable{
	// vLLM v1 (vllm/v1/metrics/loggers.py) and the llm-d-inference-sim,
	// which copies its names. The vllm:gpu_ names are the prefix-cache and
	// KV-usage series before vLLM 0.9.
	DialectVLLM: {
		engineLabel: "engine", modelLabel: "model_name", capacity: CapacityCacheConfig,
		series: concat(
			[]seriesDef{
				{name: "vllm:num_requests_running", fig: FigRunning, sum: true},
				{name: "vllm:num_requests_waiting", fig: FigWaiting, sum: true},
				{name: "vllm:kv_cache_usage_perc", fig: FigKVUsage, rank: 1},
				{name: "vllm:gpu_cache_usage_perc", fig: FigKVUsage},
				{name: "vllm:cache_config_info", fig: FigCacheConfig},
			},
			vllmCounter(FigPrefixQueries, "vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
			vllmCounter(FigPrefixHits, "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
			vllmCounter(FigPromptTokens, "vllm:prompt_tokens"),
			vllmCounter(FigGenerationTokens, "vllm:generation_tokens"),
		),
	},
	// SGLang (python/sglang/srt/metrics/collector.py): the scheduler's gauges
	// (SchedulerMetricsCollector) carry model_name, engine_type, tp_rank and
	// pp_rank, one sample per rank: the largest is kept, not the sum. The
	// tokenizer's counters (TokenizerMetricsCollector.observe_one_finished_request)
	// count every prompt token in sglang:prompt_tokens_total and the cached
	// ones in sglang:cached_tokens_total (only when > 0, split by
	// cache_source in newer versions: summed). sglang:cache_hit_rate is a
	// gauge of the last prefill batches, not a count: it is not read, the
	// counters give the same cached/prompt ratio vLLM's give.
	DialectSGLang: {
		modelLabel: "model_name", capacity: CapacityGauge, hitsAppearLate: true, queries: queriesPrompt,
		cachedOmittedWhenZero: true,
		series: []seriesDef{
			{name: "sglang:num_running_reqs", fig: FigRunning},
			{name: "sglang:num_queue_reqs", fig: FigWaiting},
			{name: "sglang:token_usage", fig: FigKVUsage},
			{name: "sglang:max_total_num_tokens", fig: FigCacheConfig},
			{name: "sglang:prompt_tokens_total", fig: FigPromptTokens, counter: true, sum: true},
			{name: "sglang:cached_tokens_total", fig: FigPrefixHits, counter: true, sum: true},
			{name: "sglang:generation_tokens_total", fig: FigGenerationTokens, counter: true, sum: true},
		},
	},
	// llama.cpp's llama-server --metrics (tools/server/server-task.cpp,
	// server_task_result_metrics::to_metrics): no labels; its prompt counter
	// excludes the tokens reused from the cache, which the cached counter
	// counts. No KV capacity in /metrics: /props gives it. The
	// kv_cache_usage_ratio gauge is older servers' (removed since).
	DialectLlamaCpp: {
		capacity: CapacityProps, queries: queriesPromptPlusCached,
		series: []seriesDef{
			{name: "llamacpp:requests_processing", fig: FigRunning},
			{name: "llamacpp:requests_deferred", fig: FigWaiting},
			{name: "llamacpp:kv_cache_usage_ratio", fig: FigKVUsage},
			{name: "llamacpp:prompt_tokens_total", fig: FigPromptTokens, counter: true},
			{name: "llamacpp:prompt_tokens_cached_total", fig: FigPrefixHits, counter: true},
			{name: "llamacpp:tokens_predicted_total", fig: FigGenerationTokens, counter: true},
		},
	},
	// Text Generation Inference's router, exported by the Rust metrics
	// crate (backends/v3/src/backend.rs: gauge tgi_batch_current_size;
	// backends/v3/src/queue.rs: gauge tgi_queue_size): no prefix-cache
	// counters, no KV capacity, no token counters (its token counts are
	// histograms), no cached tokens in its usage.
	DialectTGI: {
		series: []seriesDef{
			{name: "tgi_batch_current_size", fig: FigRunning},
			{name: "tgi_queue_size", fig: FigWaiting},
		},
	},
}

func concat(parts ...[]seriesDef) []seriesDef {
	var out []seriesDef
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// seriesSpec is how ParseMetrics reads one metric family: its table row and
// its dialect.
type seriesSpec struct {
	seriesDef
	dialect Dialect
}

// seriesByName maps every family name of every dialect to its spec.
var seriesByName = func() map[string]seriesSpec {
	m := make(map[string]seriesSpec, 40)
	for d, t := range dialects {
		for _, s := range t.series {
			if _, dup := m[s.name]; dup {
				panic("vllmstats: series " + s.name + " in two dialects")
			}
			m[s.name] = seriesSpec{seriesDef: s, dialect: Dialect(d)}
		}
	}
	return m
}()

// Series lists the families of d that give the figures in f,
// comma-separated ("" when none): what a log says is missing.
func (d Dialect) Series(f Figures) string {
	if d == DialectAuto || int(d) >= len(dialects) {
		d = DialectVLLM
	}
	var b strings.Builder
	seen := Figures(0)
	for _, s := range dialects[d].series {
		if s.fig&f == 0 || seen&s.fig == s.fig {
			continue
		}
		seen |= s.fig
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.name)
	}
	for f &^= seen; f != 0; f &= f - 1 { // figures the engine has no series for
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(no series for " + figureNames[bits.TrailingZeros16(uint16(f))] + ")")
	}
	return b.String()
}

// Exports returns the figures d's table can give (the rest are always
// unknown for that engine).
func (d Dialect) Exports() Figures {
	if int(d) >= len(dialects) {
		return 0
	}
	var f Figures
	for _, s := range dialects[d].series {
		f |= s.fig
	}
	if dialects[d].queries != queriesSeries && f.Has(FigPromptTokens) {
		f |= FigPrefixQueries
	}
	if dialects[d].capacity == CapacityProps {
		f |= FigCacheConfig
	}
	return f
}

// Capacity says where d's KV capacity comes from.
func (d Dialect) Capacity() CapacitySource {
	if int(d) >= len(dialects) {
		return CapacityNone
	}
	return dialects[d].capacity
}

// CacheReports tells an omitted cached count from an unknown one, per
// replica, for engines that leave it out of a response's usage when it is 0
// (SGLang): once a replica's response carried the count, its cache reports
// are on, and a later response without it read 0 tokens from the cache (an
// evicted prefix shows as such); before, the count is unknown. For other
// engines it changes nothing. Safe for concurrent use.
type CacheReports struct {
	on sync.Map // replica ID → struct{}: it reported a cached count
}

// Complete fills u's cached count for a response of replica, read in
// dialect d, when the engine omitted a 0.
func (c *CacheReports) Complete(replica string, d Dialect, u *Usage) {
	if int(d) >= len(dialects) || !dialects[d].cachedOmittedWhenZero || !u.Measured {
		return
	}
	if u.CachedMeasured {
		if _, ok := c.on.Load(replica); !ok {
			c.on.Store(replica, struct{}{})
		}
		return
	}
	if _, ok := c.on.Load(replica); ok {
		u.CachedTokens, u.CachedMeasured = 0, true
	}
}

// Forget drops the replicas for which keep returns false.
func (c *CacheReports) Forget(keep func(replica string) bool) {
	c.on.Range(func(k, _ any) bool {
		if id, _ := k.(string); !keep(id) {
			c.on.Delete(k)
		}
		return true
	})
}
