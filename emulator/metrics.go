package emulator

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"strings"
)

// vLLM's bucket bounds for time_to_first_token_seconds and
// e2e_request_latency_seconds.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// histogram is a fixed-bucket histogram (not safe for concurrent use).
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += v
	h.n++
}

// engineSample is what /metrics prints for one engine.
type engineSample struct {
	engine    string
	stats     EngineStats
	running   int
	waiting   int
	kvUsage   float64
	aborted   uint64
	ttft, e2e histogram
	created   float64 // unix seconds of the engine's start
	blockSize int
	numBlocks int
}

// writeMetrics prints the samples in the Prometheus text format the way
// vLLM's Python client does: counters as name_total with a separate
// name_created gauge family after them, labels engine then model_name
// (cache_config_info has no model_name), floats as Python prints them.
func writeMetrics(w io.Writer, model string, engines []engineSample) error {
	bw := bufio.NewWriter(w)
	lbl := func(e *engineSample) string {
		return `engine="` + e.engine + `",model_name="` + escapeLabel(model) + `"`
	}
	family := func(name, typ, help string) {
		bw.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
	}
	line := func(name, labels string, v float64) {
		bw.WriteString(name + "{" + labels + "} " + pyFloat(v) + "\n")
	}
	gauge := func(name, help string, v func(*engineSample) float64) {
		family(name, "gauge", help)
		for i := range engines {
			line(name, lbl(&engines[i]), v(&engines[i]))
		}
	}
	created := func(base, help string, extra func(*engineSample) []string) {
		family(base+"_created", "gauge", help)
		for i := range engines {
			e := &engines[i]
			if extra == nil {
				line(base+"_created", lbl(e), e.created)
				continue
			}
			for _, x := range extra(e) {
				line(base+"_created", lbl(e)+x, e.created)
			}
		}
	}
	counter := func(base, help string, v func(*engineSample) float64) {
		family(base+"_total", "counter", help)
		for i := range engines {
			line(base+"_total", lbl(&engines[i]), v(&engines[i]))
		}
		created(base, help, nil)
	}
	hist := func(base, help string, h func(*engineSample) *histogram) {
		family(base, "histogram", help)
		for i := range engines {
			e := &engines[i]
			hh := h(e)
			var cum uint64
			for j, b := range hh.bounds {
				cum += hh.counts[j]
				line(base+"_bucket", lbl(e)+`,le="`+pyFloat(b)+`"`, float64(cum))
			}
			line(base+"_bucket", lbl(e)+`,le="+Inf"`, float64(hh.n))
			line(base+"_count", lbl(e), float64(hh.n))
			line(base+"_sum", lbl(e), hh.sum)
		}
		created(base, help, nil)
	}

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(e *engineSample) float64 { return float64(e.running) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(e *engineSample) float64 { return float64(e.waiting) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(e *engineSample) float64 { return e.kvUsage })
	counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", func(e *engineSample) float64 { return float64(e.stats.Preemptions) })
	counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", func(e *engineSample) float64 { return float64(e.stats.PrefixQueries) })
	counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", func(e *engineSample) float64 { return float64(e.stats.PrefixHits) })
	counter("vllm:prompt_tokens", "Number of prefill tokens processed.", func(e *engineSample) float64 { return float64(e.stats.PromptTokens) })
	counter("vllm:generation_tokens", "Number of generation tokens processed.", func(e *engineSample) float64 { return float64(e.stats.GenerationTokens) })

	reasons := []string{"stop", "length", "abort"}
	family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for i := range engines {
		e := &engines[i]
		for _, reason := range reasons {
			v := 0.0
			switch reason {
			case "length":
				v = float64(e.stats.Finished)
			case "abort":
				v = float64(e.aborted)
			}
			line("vllm:request_success_total", `engine="`+e.engine+`",finished_reason="`+reason+`",model_name="`+escapeLabel(model)+`"`, v)
		}
	}
	family("vllm:request_success_created", "gauge", "Count of successfully processed requests.")
	for i := range engines {
		e := &engines[i]
		for _, reason := range reasons {
			line("vllm:request_success_created", `engine="`+e.engine+`",finished_reason="`+reason+`",model_name="`+escapeLabel(model)+`"`, e.created)
		}
	}

	hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", func(e *engineSample) *histogram { return &e.ttft })
	hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", func(e *engineSample) *histogram { return &e.e2e })

	family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
	for i := range engines {
		e := &engines[i]
		labels := `block_size="` + strconv.Itoa(e.blockSize) + `",cache_dtype="auto",enable_prefix_caching="True",engine="` + e.engine +
			`",gpu_memory_utilization="0.9",kv_cache_size_tokens="` + strconv.Itoa(e.blockSize*e.numBlocks) +
			`",num_cpu_blocks="None",num_gpu_blocks="` + strconv.Itoa(e.numBlocks) + `",prefix_caching_hash_algo="sha256"`
		line("vllm:cache_config_info", labels, 1)
	}
	return bw.Flush()
}

func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return r.Replace(s)
}

// pyFloat formats like prometheus_client's floatToGoString: Python's repr,
// with exponents for large values the way Go prints them.
func pyFloat(d float64) string {
	switch {
	case math.IsInf(d, 1):
		return "+Inf"
	case math.IsInf(d, -1):
		return "-Inf"
	case math.IsNaN(d):
		return "NaN"
	}
	a := math.Abs(d)
	if d != 0 && (a >= 1e16 || a < 1e-4) {
		return strconv.FormatFloat(d, 'e', -1, 64)
	}
	s := strconv.FormatFloat(d, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	dot := strings.IndexByte(s, '.')
	if d > 0 && dot > 6 {
		mantissa := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return mantissa + "e+0" + strconv.Itoa(dot-1)
	}
	return s
}
