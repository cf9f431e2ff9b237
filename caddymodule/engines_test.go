package caddymodule

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// llamaCppExposition prints the fake's figures under llama.cpp's names, as
// llama-server --metrics does (tools/server/server-task.cpp,
// server_task_result_metrics::to_metrics): no labels, the prompt counter
// excluding the cached tokens.
func llamaCppExposition(f *fakeVLLM) string {
	return fmt.Sprintf(`# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total %d
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total %d
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total %d
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing %d
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred %d
`, f.sum.prompt-f.sum.cached, f.sum.cached, f.sum.generated, f.running[0], f.waiting[0])
}

// otherProgram is a /metrics of something the module does not know.
func otherProgram(*fakeVLLM) string {
	return "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 12\n"
}

// A replica whose /metrics answers 200 with no series the module knows stays
// available, keeps its conversations and shows its figures unknown; a
// llama.cpp replica is read in its own names. Neither is ever out for its
// metric names.
func TestReachableWithoutKnownSeriesStaysAvailableAndSticky(t *testing.T) {
	fs := startFakes(t, 3)
	fs[0].exposition = llamaCppExposition
	fs[1].exposition = otherProgram
	// fs[2] speaks vLLM's names
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("engines", "max_num_seqs 64")))

	// more polls than fail_after (10 at 100 ms) before the first turn: a
	// replica whose answered polls counted as failures would be out by
	// then. (fail_after 1 would make that quicker, but a single poll
	// slower than its 80 ms timeout on a loaded machine would take the
	// replica out too.)
	time.Sleep(1100 * time.Millisecond)
	const convs, turns = 6, 4
	where := map[string]string{}
	for turn := 1; turn <= turns; turn++ {
		for c := range convs {
			name := fmt.Sprintf("eng-%d", c)
			res := sendTurn(t, "/v1/messages", chatTurn(name, turn, c%2 == 0), map[string]string{"X-Claude-Code-Session-Id": name})
			if res.status != http.StatusOK {
				t.Fatalf("%s turn %d: %d %s", name, turn, res.status, res.body)
			}
			want := "placed"
			if turn > 1 {
				want = "sticky"
			}
			if res.reason != want {
				t.Errorf("%s turn %d: reason %q, want %q (on %s)", name, turn, res.reason, want, res.replica)
			}
			if turn == 1 {
				where[name] = res.replica
			} else if res.replica != where[name] {
				t.Errorf("%s turn %d on %s, was on %s", name, turn, res.replica, where[name])
			}
		}
		time.Sleep(150 * time.Millisecond) // a poll between turns
	}
	held := map[string]int{}
	for _, r := range where {
		held[r]++
	}
	for _, f := range fs {
		if held[f.addr] == 0 {
			t.Errorf("replica %s got no conversation (spread %v)", f.addr, held)
		}
	}

	// every replica available, reachable and its last poll good: a poll
	// that timed out on a loaded machine is followed by a good one, while
	// a replica whose answers counted as failures never gets there
	var c Card
	ok := func() bool {
		c = getCard(t, "engines")
		for _, f := range fs {
			if r := cardRow(c, f.addr); !r.Available || !r.Reachable || len(r.Out) != 0 || r.LastError != "" {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); !ok() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	for i, f := range fs {
		if r := cardRow(c, f.addr); !r.Available || !r.Reachable || len(r.Out) != 0 || r.LastError != "" {
			t.Errorf("replica %d: available %v reachable %v out %v error %q", i, r.Available, r.Reachable, r.Out, r.LastError)
		}
	}
	llama, other, vllm := cardRow(c, fs[0].addr), cardRow(c, fs[1].addr), cardRow(c, fs[2].addr)
	if llama.Engine != "llamacpp" || vllm.Engine != "vllm" || other.Engine != "" {
		t.Errorf("engines: %q %q %q, want llamacpp, vllm and unknown", llama.Engine, vllm.Engine, other.Engine)
	}
	if other.MetricsUnread == "" || other.Running != nil || other.Waiting != nil || other.PrefixHitRate != nil || other.PrefixIdle {
		t.Errorf("other program's replica: figures not unknown: %+v", other)
	}
	if llama.Running == nil || llama.Waiting == nil || llama.KVUsage != nil {
		t.Errorf("llama.cpp replica: running %v waiting %v kv %v; want running and waiting known, KV unknown", llama.Running, llama.Waiting, llama.KVUsage)
	}
	// llama.cpp's hit rate is cached / (computed + cached), as vLLM's
	prompt, cached, _ := fs[0].totals()
	if llama.PrefixHitRateTotal == nil || cached == 0 {
		t.Fatalf("llama.cpp replica: hit rate since start %v, cached %d", llama.PrefixHitRateTotal, cached)
	}
	if got, tokens := *llama.PrefixHitRateTotal, float64(llama.Tokens.Cached)/float64(llama.Tokens.Cached+llama.Tokens.Computed); got <= 0 || got > 1 || llama.Tokens.Cached != uint64(cached) || llama.Tokens.Cached+llama.Tokens.Computed != uint64(prompt) {
		t.Errorf("llama.cpp replica: engine hit rate %v, usage share %v; card tokens %+v, engine prompt %d cached %d", got, tokens, llama.Tokens, prompt, cached)
	}
}
