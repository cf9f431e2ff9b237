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

func TestParseMetricsFixtures(t *testing.T) {
	const qwen = "Qwen/Qwen3-4B-Instruct-2507"
	tests := []struct {
		fixture string
		want    map[string]EngineMetrics
	}{
		{"four_engines.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: qwen, Running: 12, KVUsage: 0.4137, PrefixQueries: 1845120, PrefixHits: 1310720, PromptTokens: 2100000, GenerationTokens: 301234, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"1": {Engine: "1", ModelName: qwen, Running: 9, Waiting: 3, KVUsage: 0.9021, PrefixQueries: 1520000, PrefixHits: 1307200, PromptTokens: 1700000, GenerationTokens: 250001, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"2": {Engine: "2", ModelName: qwen, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
			"3": {Engine: "3", ModelName: qwen, Running: 31, Waiting: 7, KVUsage: 0.995, PrefixQueries: 2500000, PrefixHits: 800000, PromptTokens: 2900000, GenerationTokens: 410000, BlockSize: 16, NumGPUBlocks: 2300, KVCapacityTokens: 36800},
		}},
		// One server per replica without an engine label: keyed "0"; NaN KV usage
		// ignored; interleaved _created lines; capacity from block_size*num_gpu_blocks.
		{"single_no_engine.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: "meta-llama/Llama-3.1-8B-Instruct", Running: 3, Waiting: 1, PrefixQueries: 5000, PrefixHits: 4000, BlockSize: 32, NumGPUBlocks: 1000, KVCapacityTokens: 32000},
		}},
		// A server started per rank; both KV names present: the new one wins;
		// no cache_config_info: capacity 0.
		{"single_engine_rank.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: qwen, Running: 2, KVUsage: 0.25, PrefixQueries: 100, PrefixHits: 50},
		}},
		// Legacy names only, escaped label values.
		{"legacy.txt", map[string]EngineMetrics{
			"0": {Engine: "0", ModelName: "my \"quoted\" model\\v1\nx", Running: 4, Waiting: 2, KVUsage: 0.61, PrefixQueries: 800, PrefixHits: 600, PromptTokens: 900, GenerationTokens: 70},
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
				if *g != w {
					t.Errorf("engine %q:\n got %+v\nwant %+v", id, *g, w)
				}
			}
		})
	}
}

func TestParseMetricsReferenceSample(t *testing.T) {
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
