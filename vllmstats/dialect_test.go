package vllmstats

import (
	"errors"
	"strings"
	"testing"
)

// Each engine's exposition, read in its own names: every figure present or
// unknown as the engine exports it, the prefix hit rate cached / all prompt
// tokens for every one.
func TestParseMetricsDialectFixtures(t *testing.T) {
	t.Parallel()
	const qwen = "Qwen/Qwen3-4B-Instruct-2507"
	tests := []struct {
		fixture string
		want    EngineMetrics
	}{
		// The largest of the per-rank gauges, not their sum; the cached
		// counter summed over cache_source; queries are the prompt tokens;
		// capacity from max_total_num_tokens; the per-batch hit-rate gauge
		// is not read.
		{"sglang.txt", EngineMetrics{Engine: "0", Dialect: DialectSGLang, ModelName: qwen,
			Present: AllFigures, Running: 3, Waiting: 2, KVUsage: 0.21,
			PrefixQueries: 31200, PrefixHits: 21000, PromptTokens: 31200, GenerationTokens: 900,
			KVCapacityTokens: 480000}},
		// Before the first hit the cached counter has no sample: 0, not
		// unknown, while the prompt counter is there.
		{"sglang_fresh.txt", EngineMetrics{Engine: "0", Dialect: DialectSGLang, ModelName: qwen,
			Present: AllFigures, PrefixQueries: 2400, PromptTokens: 2400, GenerationTokens: 64,
			KVCapacityTokens: 480000}},
		// llm-d-inference-sim eec055a, captured after three chat requests
		// with a shared 208-token prefix (POD_IP=127.0.0.1 llm-d-inference-sim
		// --model qwen3-4b --enable-kvcache --kv-cache-size 4096
		// --block-size 16): vLLM's names with _total, no engine label.
		{"sim_eec055a.txt", EngineMetrics{Engine: "0", Dialect: DialectVLLM, ModelName: "qwen3-4b",
			Present: AllFigures, PrefixQueries: 666, PrefixHits: 416, PromptTokens: 666, GenerationTokens: 10,
			BlockSize: 16, NumGPUBlocks: 4096, KVCapacityTokens: 65536}},
		// The same server before its first request: its counters have no
		// sample yet, so they are unknown (the window starts at the first).
		{"sim_eec055a_fresh.txt", EngineMetrics{Engine: "0", Dialect: DialectVLLM, ModelName: "qwen3-4b",
			Present:   FigRunning | FigWaiting | FigKVUsage | FigCacheConfig,
			BlockSize: 16, NumGPUBlocks: 4096, KVCapacityTokens: 65536}},
		// llama.cpp's llama-server --metrics, captured (node-llama-cpp
		// 3.22.1's source, commit de3ff815) after four requests: 1941 prompt
		// tokens, 1401 of them cached (its usage said 0+453+496+452), 540
		// computed, which is what its prompt counter counts. No KV figures:
		// capacity comes from /props.
		{"llamacpp.txt", EngineMetrics{Engine: "0", Dialect: DialectLlamaCpp,
			Present:       AllFigures &^ (FigKVUsage | FigCacheConfig),
			PrefixQueries: 1941, PrefixHits: 1401, PromptTokens: 1941, GenerationTokens: 16}},
		// Batch and queue only; no prefix, KV, token counters or capacity.
		{"tgi.txt", EngineMetrics{Engine: "0", Dialect: DialectTGI, Present: FigRunning | FigWaiting, Running: 6, Waiting: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(readFixture(t, tt.fixture)))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got["0"] == nil {
				t.Fatalf("engines %v, want one, \"0\"", got)
			}
			if *got["0"] != tt.want {
				t.Errorf("\n got %+v\nwant %+v", *got["0"], tt.want)
			}
			// the same when the engine is configured rather than detected
			as, err := ParseMetricsAs(strings.NewReader(readFixture(t, tt.fixture)), tt.want.Dialect)
			if err != nil || *as["0"] != tt.want {
				t.Errorf("as %v: %+v, %v", tt.want.Dialect, as["0"], err)
			}
		})
	}
}

// An engine configured by name reads only its own names: another engine's
// exposition carries none of them.
func TestParseMetricsAsOtherEngine(t *testing.T) {
	t.Parallel()
	for _, d := range []Dialect{DialectSGLang, DialectLlamaCpp, DialectTGI} {
		if _, err := ParseMetricsAs(strings.NewReader(readFixture(t, "vllm_v1.txt")), d); !errors.Is(err, ErrNoKnownSeries) {
			t.Errorf("vLLM exposition read as %v: %v, want ErrNoKnownSeries", d, err)
		}
	}
	if _, err := ParseMetricsAs(strings.NewReader(readFixture(t, "sglang.txt")), DialectVLLM); !errors.Is(err, ErrNoKnownSeries) {
		t.Errorf("SGLang exposition read as vllm: %v", err)
	}
}

func TestParseDialect(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want Dialect
		err  bool
	}{
		{"", DialectAuto, false}, {"auto", DialectAuto, false}, {"vllm", DialectVLLM, false},
		{"SGLang", DialectSGLang, false}, {"llamacpp", DialectLlamaCpp, false}, {"tgi", DialectTGI, false},
		{"ollama", DialectAuto, true}, {"llama.cpp", DialectAuto, true},
	} {
		d, err := ParseDialect(tt.in)
		if d != tt.want || (err != nil) != tt.err {
			t.Errorf("ParseDialect(%q) = %v, %v", tt.in, d, err)
		}
		if err == nil && tt.in != "" && !strings.EqualFold(d.String(), tt.in) {
			t.Errorf("%v.String() = %q", d, d.String())
		}
	}
}

// Every dialect's table names the figures it exports; what it lacks is
// unknown for that engine, and the log names its series.
func TestDialectExports(t *testing.T) {
	t.Parallel()
	if got := DialectTGI.Exports(); got != FigRunning|FigWaiting {
		t.Errorf("tgi exports %s", got.Names())
	}
	if got := DialectLlamaCpp.Exports(); got != AllFigures {
		t.Errorf("llamacpp exports %s, want all (KV usage from older servers, capacity from /props)", got.Names())
	}
	if got := DialectSGLang.Series(FigPrefixHits | FigWaiting); got != "sglang:num_queue_reqs,sglang:cached_tokens_total" {
		t.Errorf("sglang series %q", got)
	}
	if got := DialectTGI.Series(FigKVUsage); !strings.Contains(got, "no series for kv_usage") {
		t.Errorf("tgi series %q", got)
	}
}

// SGLang leaves cached_tokens out of the usage when it is 0 (and always
// when --enable-cache-report is off): after a replica reported a count, an
// omitted one is 0 cached; before, unknown. Other engines: unchanged.
func TestCacheReports(t *testing.T) {
	t.Parallel()
	var c CacheReports
	omitted := func() Usage { return Usage{PromptTokens: 900, Measured: true} }
	u := omitted()
	c.Complete("a", DialectSGLang, &u)
	if u.CachedMeasured {
		t.Fatalf("before any report: %+v, want unknown", u)
	}
	rep := Usage{PromptTokens: 900, CachedTokens: 800, Measured: true, CachedMeasured: true}
	c.Complete("a", DialectSGLang, &rep)
	if rep.CachedTokens != 800 || !rep.CachedMeasured {
		t.Fatalf("a report changed: %+v", rep)
	}
	u = omitted()
	c.Complete("a", DialectSGLang, &u)
	if !u.CachedMeasured || u.CachedTokens != 0 || u.Computed() != 900 {
		t.Fatalf("omitted after a report: %+v, want 0 cached", u)
	}
	for _, tc := range []struct {
		replica string
		d       Dialect
	}{{"b", DialectSGLang}, {"a", DialectVLLM}, {"a", DialectLlamaCpp}, {"a", DialectAuto}} {
		u = omitted()
		c.Complete(tc.replica, tc.d, &u)
		if u.CachedMeasured {
			t.Errorf("%s as %v: %+v, want unknown", tc.replica, tc.d, u)
		}
	}
	unmeasured := Usage{}
	c.Complete("a", DialectSGLang, &unmeasured)
	if unmeasured.CachedMeasured {
		t.Errorf("no usage at all became measured: %+v", unmeasured)
	}
	c.Forget(func(string) bool { return false })
	u = omitted()
	c.Complete("a", DialectSGLang, &u)
	if u.CachedMeasured {
		t.Errorf("forgotten replica still reports: %+v", u)
	}
}
