package emulator

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// perRequestConfig is llm-d-inference-sim's run: 20 ms + 100 µs per
// uncached token to the first token, 4 ms per later token, blocks of 16.
func perRequestConfig(blocks, seqs int) EngineConfig {
	return EngineConfig{
		BlockSize: 16, NumGPUBlocks: blocks, MaxNumSeqs: seqs, MaxNumBatchedTokens: 2048, MaxModelLen: 65536,
		PerRequest: PerRequestTiming{PrefillOverhead: 20 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
			InterTokenLatency: 4 * time.Millisecond},
	}
}

// TestPerRequestTimingIsTheSimulatorsFormula checks one request at a time
// against GetTimeToFirstToken and GetInterTokenLatency of
// llm-d-inference-sim (time-factor-under-load 1): first token at 20 ms +
// 100 µs × uncached prompt tokens, where the cached ones are the full
// 16-token blocks of an earlier prompt (the last full block included,
// output tokens never), then one token every 4 ms.
func TestPerRequestTimingIsTheSimulatorsFormula(t *testing.T) {
	first := tokens(1000, 1) // 62 full blocks, 8 tokens in a partial one
	cases := []struct {
		name      string
		prompt    []uint32
		maxTokens int
		cached    int
	}{
		{"cold 1,000 tokens", first, 10, 0},
		{"the same prompt again: its 62 full blocks", first, 1, 992},
		{"the prompt and 600 more tokens", append(slices.Clone(first), tokens(600, 2)...), 256, 992},
		{"a 16-token prompt, one block, all cached next time", tokens(16, 3), 5, 0},
		{"that prompt again", tokens(16, 3), 5, 16},
	}
	e := NewEngine(perRequestConfig(2048, 8))
	for _, c := range cases {
		start := e.Now()
		r := &EngineRequest{ID: c.name, Prompt: c.prompt, MaxTokens: c.maxTokens}
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
		var at []time.Duration
		for !r.Done {
			_, evs := e.Step()
			for _, ev := range evs {
				if ev.Kind == EventToken {
					at = append(at, ev.At-start)
				}
			}
		}
		ttft := 20*time.Millisecond + time.Duration(len(c.prompt)-c.cached)*100*time.Microsecond
		if r.CachedTokens != c.cached || len(at) != c.maxTokens || at[0] != ttft {
			t.Fatalf("%s: cached %d, %d tokens, first at %v; want %d, %d, %v", c.name, r.CachedTokens, len(at), at[0], c.cached, c.maxTokens, ttft)
		}
		for i := 1; i < len(at); i++ {
			if at[i]-at[i-1] != 4*time.Millisecond {
				t.Fatalf("%s: token %d came %v after the one before, want 4ms", c.name, i, at[i]-at[i-1])
			}
		}
		if r.Finished-start != ttft+time.Duration(c.maxTokens-1)*4*time.Millisecond {
			t.Errorf("%s: finished after %v", c.name, r.Finished-start)
		}
		t.Logf("%s: %d cached, first token %v, done %v", c.name, r.CachedTokens, at[0], r.Finished-start)
	}
	st := e.Stats()
	if st.PrefixQueries != 1000+1000+1600+16+16 || st.PrefixHits != 992+992+16 {
		t.Errorf("prefix counters %d / %d", st.PrefixHits, st.PrefixQueries)
	}
}

// TestPerRequestNoBatch runs max_num_seqs requests side by side: each keeps
// its own 4 ms cadence (no batch slows it), and one more waits for a
// worker, starting when the first of them ends.
func TestPerRequestNoBatch(t *testing.T) {
	e := NewEngine(perRequestConfig(2048, 3))
	reqs := make([]*EngineRequest, 4)
	for i := range reqs {
		reqs[i] = &EngineRequest{ID: string(rune('a' + i)), Prompt: tokens(100+50*i, uint32(10+i)), MaxTokens: 20}
		if err := e.Add(reqs[i]); err != nil {
			t.Fatal(err)
		}
	}
	runAll(t, e)
	for i, r := range reqs[:3] {
		want := 20*time.Millisecond + time.Duration(100+50*i)*100*time.Microsecond + 19*4*time.Millisecond
		if r.Scheduled != 0 || r.Finished != want {
			t.Errorf("request %d: started %v, finished %v; want 0 and %v", i, r.Scheduled, r.Finished, want)
		}
	}
	if r := reqs[3]; r.Scheduled != reqs[0].Finished {
		t.Errorf("the fourth request started at %v, want when the first ended (%v)", r.Scheduled, reqs[0].Finished)
	}
}

// overfill adds to e, of 100 blocks, a request of 80 blocks, one of 40
// that cannot start beside it, and one of a single block.
func overfill(t *testing.T, e *Engine) (big, next, small *EngineRequest) {
	t.Helper()
	big = &EngineRequest{ID: "big", Prompt: tokens(80*16, 1), MaxTokens: 3}
	next = &EngineRequest{ID: "next", Prompt: tokens(40*16, 2), MaxTokens: 3}
	small = &EngineRequest{ID: "small", Prompt: tokens(16, 3), MaxTokens: 3}
	for _, r := range []*EngineRequest{big, next, small} {
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	return big, next, small
}

// TestPerRequestWaitsWhereTheSimulatorRefuses fills the KV cache with one
// running request's blocks: the next, whose blocks do not fit, would be
// refused by llm-d-inference-sim; here it waits at the head of the queue
// (as vLLM keeps it) and starts when the first one's blocks are freed,
// evicting them least recently used first. A later small request does not
// pass it.
func TestPerRequestWaitsWhereTheSimulatorRefuses(t *testing.T) {
	e := NewEngine(perRequestConfig(100, 8))
	big, next, small := overfill(t, e)
	e.Step()
	if e.Running() != 1 || e.Waiting() != 2 || e.KVUsage() != 0.8 {
		t.Fatalf("running %d, waiting %d, KV %.2f; want 1, 2, 0.80", e.Running(), e.Waiting(), e.KVUsage())
	}
	runAll(t, e)
	if next.Scheduled != big.Finished || small.Scheduled != big.Finished {
		t.Errorf("next started %v and small %v, want both when big ended (%v)", next.Scheduled, small.Scheduled, big.Finished)
	}
	// next and small took the 20 blocks never used and 21 of big's, its
	// last blocks first: 59 of big's stay cached beside their 41
	if got := e.CachedBlocks(); got != 100 {
		t.Errorf("cached blocks %d, want 100", got)
	}
	again := &EngineRequest{ID: "again", Prompt: tokens(80*16, 1), MaxTokens: 1}
	if err := e.Add(again); err != nil {
		t.Fatal(err)
	}
	runAll(t, e)
	if again.CachedTokens >= 80*16 {
		t.Errorf("big found whole again (%d tokens) though 41 blocks were taken", again.CachedTokens)
	}
}

// TestPerRequestRefuses is TestPerRequestWaitsWhereTheSimulatorRefuses
// with Refuse, as llm-d-inference-sim runs: the request whose blocks do
// not fit beside the running one's leaves the engine without a token
// (EventRefused), and the small one behind it starts at once.
func TestPerRequestRefuses(t *testing.T) {
	cfg := perRequestConfig(100, 8)
	cfg.PerRequest.Refuse = true
	e := NewEngine(cfg)
	big, next, small := overfill(t, e)
	_, evs := e.Step()
	var refused []string
	for _, ev := range evs {
		if ev.Kind == EventRefused {
			refused = append(refused, ev.Req.ID)
		}
	}
	if !slices.Equal(refused, []string{"next"}) || !next.Done || len(next.Output) != 0 {
		t.Fatalf("refused %v (next done %v, %d tokens), want [next], done, none", refused, next.Done, len(next.Output))
	}
	if e.Running() != 2 || e.Waiting() != 0 || small.Scheduled != big.Scheduled {
		t.Fatalf("running %d, waiting %d, small started at %v; want 2, 0 and at once (%v)", e.Running(), e.Waiting(), small.Scheduled, big.Scheduled)
	}
	runAll(t, e)
	if len(big.Output) != 3 || len(small.Output) != 3 {
		t.Errorf("big %d tokens, small %d; want 3 each", len(big.Output), len(small.Output))
	}
	if st := e.Stats(); st.PrefixQueries != 80*16+16 {
		t.Errorf("prefix queries %d: the refused request must not count", st.PrefixQueries)
	}
}

// TestOutputLengthFollowsTheSimulatorsHistogram checks the ranges and
// shares of llm-d-inference-sim's response-length histogram.
func TestOutputLengthFollowsTheSimulatorsHistogram(t *testing.T) {
	ranges := []struct {
		max    int
		bucket [5][2]int
	}{
		{256, [5][2]int{{1, 20}, {21, 40}, {41, 60}, {61, 236}, {237, 255}}},
		{101, [5][2]int{{1, 20}, {21, 40}, {41, 60}, {61, 80}, {81, 100}}},
		{51, [5][2]int{{1, 10}, {11, 20}, {21, 30}, {31, 40}, {41, 50}}},
	}
	for _, c := range ranges {
		for b, want := range c.bucket {
			if lo, hi := outputBucket(c.max, b); lo != want[0] || hi != want[1] {
				t.Errorf("max_tokens %d, bucket %d: [%d, %d], want %v", c.max, b, lo, hi, want)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	sum, top := 0, 0
	for range n {
		v := OutputLength(256, r)
		if v < 1 || v > 256 {
			t.Fatalf("length %d out of [1, 256]", v)
		}
		sum += v
		if v == 256 {
			top++
		}
	}
	// mean: 0.2×10.5 + 0.3×30.5 + 0.2×50.5 + 0.05×148.5 + 0.1×246 + 0.15×256
	mean, share := float64(sum)/n, float64(top)/n
	if mean < 91.3 || mean > 92.3 || share < 0.147 || share > 0.153 {
		t.Errorf("mean %.2f tokens, %.3f at max_tokens; want about 91.8 and 0.15", mean, share)
	}
	for _, m := range []int{0, 1} {
		if got := OutputLength(m, r); got != m {
			t.Errorf("OutputLength(%d) = %d", m, got)
		}
	}
	for range 100 {
		if v := OutputLength(4, r); v < 1 || v > 4 {
			t.Fatalf("OutputLength(4) = %d", v)
		}
	}
}

// TestPerRequestOutputHistogram: with OutputHistogram a request generates
// OutputLength tokens, the same for the same prompt.
func TestPerRequestOutputHistogram(t *testing.T) {
	c := perRequestConfig(2048, 8)
	c.PerRequest.OutputHistogram = true
	lengths := map[int]int{}
	for i := range 200 {
		e := NewEngine(c)
		p := tokens(64, uint32(i))
		a, b := &EngineRequest{ID: "a", Prompt: p, MaxTokens: 256}, &EngineRequest{ID: "b", Prompt: p, MaxTokens: 256}
		for _, r := range []*EngineRequest{a, b} {
			if err := e.Add(r); err != nil {
				t.Fatal(err)
			}
		}
		runAll(t, e)
		if len(a.Output) != len(b.Output) || len(a.Output) < 1 || len(a.Output) > 256 {
			t.Fatalf("lengths %d and %d", len(a.Output), len(b.Output))
		}
		lengths[len(a.Output)]++
	}
	if len(lengths) < 50 || lengths[256] < 10 {
		t.Errorf("%d distinct lengths, %d at max_tokens, over 200 prompts", len(lengths), lengths[256])
	}
}
