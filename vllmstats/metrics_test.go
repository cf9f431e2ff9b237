package vllmstats

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func readFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// simQwen is what every llm-d-inference-sim fixture says.
var simQwen = EngineMetrics{Engine: "0", ModelName: "qwen3-4b", Present: AllFigures, Running: 1, KVUsage: 0.1079,
	PrefixQueries: 553416, PrefixHits: 355216, PromptTokens: 553416, GenerationTokens: 7365,
	BlockSize: 16, NumGPUBlocks: 2048, KVCapacityTokens: 32768}

func TestParseMetricsFixtures(t *testing.T) {
	t.Parallel()
	const qwen = "Qwen/Qwen3-4B-Instruct-2507"
	tests := []struct {
		fixture string
		want    map[string]EngineMetrics
	}{
		{"four_engines.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: qwen, Present: AllFigures, Running: 12, KVUsage: 0.4137, PrefixQueries: 1845120, PrefixHits: 1310720, PromptTokens: 2100000, GenerationTokens: 301234, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"1": {Engine: "1", ModelName: qwen, Present: AllFigures, Running: 9, Waiting: 3, KVUsage: 0.9021, PrefixQueries: 1520000, PrefixHits: 1307200, PromptTokens: 1700000, GenerationTokens: 250001, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"2": {Engine: "2", ModelName: qwen, Present: AllFigures, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"3": {Engine: "3", ModelName: qwen, Present: AllFigures, Running: 31, Waiting: 7, KVUsage: 0.995, PrefixQueries: 2500000, PrefixHits: 800000, PromptTokens: 2900000, GenerationTokens: 410000, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
		}},
		// One server per replica without an engine label: keyed "0"; NaN KV usage
		// is unknown; interleaved _created lines; capacity from
		// block_size*num_gpu_blocks; no token counters.
		{"single_no_engine.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: "meta-llama/Llama-3.1-8B-Instruct", Present: FigRunning | FigWaiting | FigPrefix | FigCacheConfig, Running: 3, Waiting: 1, PrefixQueries: 5000, PrefixHits: 4000, BlockSize: 32, NumGPUBlocks: 1000, KVCapacityTokens: 32000},
		}},
		// A server started per rank; both KV names present: the new one wins;
		// no cache_config_info: capacity 0.
		{"single_engine_rank.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: qwen, Present: FigRunning | FigWaiting | FigKVUsage | FigPrefix, Running: 2, KVUsage: 0.25, PrefixQueries: 100, PrefixHits: 50},
		}},
		// Legacy names only, escaped label values.
		{"legacy.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: "my \"quoted\" model\\v1\nx", Present: AllFigures &^ FigCacheConfig, Running: 4, Waiting: 2, KVUsage: 0.61, PrefixQueries: 800, PrefixHits: 600, PromptTokens: 900, GenerationTokens: 70},
		}},
		// llm-d-inference-sim v0.10.2 (pkg/llm-d-inference-sim/metrics.go), as
		// shown next to the routing card: counters without _total, untyped (no
		// TYPE lines), no engine label, cache_config_info with two labels.
		{"sim_v0.10.2_excerpt.txt", map[string]EngineMetrics{"0": simQwen}},
		// The same as client_golang prints it: TYPE counter on the names
		// without _total, families sorted, histograms and other programs' series.
		{"sim_v0.10.2.txt", map[string]EngineMetrics{"0": simQwen}},
		// The simulator after it renamed the prefix counters to vLLM's spelling.
		{"sim_main.txt", map[string]EngineMetrics{"0": simQwen}},
		// The scrape with the prefix series gone: everything else still read,
		// the pair reported absent (not 0 % hits).
		{"sim_v0.10.2_no_prefix.txt", map[string]EngineMetrics{"0": func() EngineMetrics {
			m := simQwen
			m.Present &^= FigPrefix
			m.PrefixHits, m.PrefixQueries = 0, 0
			return m
		}()}},
		// Current vLLM (vllm/v1/metrics/loggers.py, PrometheusStatLogger) through
		// prometheus_client: _total counters with _created gauge families, the
		// engine label, cache_config_info with every CacheConfig label, and a
		// histogram whose name ends in _total.
		{"vllm_v1.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: qwen, Present: AllFigures, Running: 5, Waiting: 2, KVUsage: 0.37, PrefixQueries: 40000, PrefixHits: 30000, PromptTokens: 41000, GenerationTokens: 5200, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(readFixture(t, tt.fixture)))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d engines, want %d: %v", len(got), len(tt.want), got)
			}
			for id, w := range tt.want {
				g, ok := got[id]
				if !ok {
					t.Fatalf("engine %q missing", id)
				}
				if w.Dialect == DialectAuto {
					w.Dialect = DialectVLLM
				}
				if *g != w {
					t.Errorf("engine %q:\n got %+v\nwant %+v", id, *g, w)
				}
			}
		})
	}
}

func TestParseMetricsReferenceSample(t *testing.T) {
	t.Parallel()
	// The sample printed in the vLLM reference notes (data_parallel_size 2).
	const sample = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507"} 12.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-4B-Instruct-2507"} 9.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507"} 1.84512e+06
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-4B-Instruct-2507"} 1.7544e+09
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",kv_cache_size_tokens="36800",num_cpu_blocks="None",num_gpu_blocks="2300",prefix_caching_hash_algo="sha256"} 1.0
`
	got, err := ParseMetrics(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if got["0"].Running != 12 || got["1"].Running != 9 || got["0"].PrefixQueries != 1845120 || got["0"].KVCapacityTokens != 36800 {
		t.Fatalf("unexpected %+v %+v", *got["0"], *got["1"])
	}
}

func TestParseMetricsErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
		noVLLM   bool
	}{
		{"html", "<html><body>502 Bad Gateway</body></html>\n", false},
		{"bad value", "vllm:num_requests_running{engine=\"0\"} twelve\n", false},
		{"unterminated label", "vllm:num_requests_running{engine=\"0} 1\n", false},
		{"duplicate type", "# TYPE vllm:x gauge\n# TYPE vllm:x counter\nvllm:x 1\n", false},
		{"truncated", "vllm:num_requests_running{engine=\"0\",model_na", false},
		{"json", "{\"object\":\"error\"}", false},
		{"empty", "", true},
		{"other program", "# TYPE go_goroutines gauge\ngo_goroutines 12\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tt.in))
			if err == nil {
				t.Fatalf("no error, got %v", got)
			}
			if errors.Is(err, ErrNoVLLMMetrics) != tt.noVLLM {
				t.Fatalf("error %v: ErrNoVLLMMetrics=%v, want %v", err, !tt.noVLLM, tt.noVLLM)
			}
			if !tt.noVLLM && !strings.Contains(err.Error(), "line") {
				t.Errorf("error %q does not name the line", err)
			}
		})
	}
}

// TestParseMetricsSpellings pins how the spellings of one figure combine: a
// family is read only with a fitting type; a figure exported under two names
// counts once, from the preferred name whatever the order of the families.
func TestParseMetricsSpellings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		in          string
		hits        float64
		present     Figures
		kv, running float64
	}{
		{"without _total", "vllm:prefix_cache_hits 7\n", 7, FigPrefixHits, 0, 0},
		{"with _total", "vllm:prefix_cache_hits_total 7\n", 7, FigPrefixHits, 0, 0},
		{"typed counter without _total", "# TYPE vllm:prefix_cache_hits counter\nvllm:prefix_cache_hits 7\n", 7, FigPrefixHits, 0, 0},
		{"both spellings once", "vllm:prefix_cache_hits 7\nvllm:prefix_cache_hits_total 9\n", 9, FigPrefixHits, 0, 0},
		{"both spellings reversed", "vllm:prefix_cache_hits_total 9\nvllm:prefix_cache_hits 7\n", 9, FigPrefixHits, 0, 0},
		{"legacy only without _total", "vllm:gpu_prefix_cache_hits 5\n", 5, FigPrefixHits, 0, 0},
		{"legacy loses to current", "vllm:gpu_prefix_cache_hits_total 5\nvllm:prefix_cache_hits 7\n", 7, FigPrefixHits, 0, 0},
		{"_created alone is not the counter", "vllm:prefix_cache_hits_created 1.7e9\nvllm:num_requests_running 1\n", 0, FigRunning, 0, 1},
		{"counter typed as gauge ignored", "# TYPE vllm:prefix_cache_hits gauge\nvllm:prefix_cache_hits 7\nvllm:num_requests_running 1\n", 0, FigRunning, 0, 1},
		{"gauge typed as counter ignored", "# TYPE vllm:kv_cache_usage_perc counter\nvllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 1\n", 0, FigRunning, 0, 1},
		{"running summed over label sets", "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 2\n", 0, FigRunning, 0, 3},
		{"kv max over label sets", "vllm:kv_cache_usage_perc{x=\"a\"} 0.2\nvllm:kv_cache_usage_perc{x=\"b\"} 0.6\n", 0, FigKVUsage, 0.6, 0},
		{"kv NaN unknown", "vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running 0\n", 0, FigRunning, 0, 0},
		{"legacy kv when current absent", "vllm:gpu_cache_usage_perc 0.4\n", 0, FigKVUsage, 0.4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			e := got["0"]
			if e == nil || len(got) != 1 {
				t.Fatalf("engines %v", got)
			}
			if e.Present != tt.present || e.PrefixHits != tt.hits || e.KVUsage != tt.kv || e.Running != tt.running {
				t.Fatalf("got present %v hits %v kv %v running %v, want %v %v %v %v",
					e.Present, e.PrefixHits, e.KVUsage, e.Running, tt.present, tt.hits, tt.kv, tt.running)
			}
		})
	}
}

func TestFiguresString(t *testing.T) {
	t.Parallel()
	if got, want := (FigPrefix | FigKVUsage).String(), "vllm:kv_cache_usage_perc,vllm:prefix_cache_queries_total,vllm:prefix_cache_hits_total"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got := (AllFigures &^ FigPrefixHits).Missing(); got != FigPrefixHits {
		t.Fatalf("Missing() = %v", got)
	}
	if Figures(0).String() != "" || !AllFigures.Has(FigPrefix) || FigPrefixHits.Has(FigPrefix) {
		t.Fatal("Has/String of edge sets")
	}
}
