package emulator

import (
	"math/rand/v2"
	"time"
)

// PerRequestTiming replaces the step scheduler's batch timing with the
// timing of llm-d-inference-sim (github.com/llm-d/llm-d-inference-sim, its
// "per token" latency calculator in pkg/llm-d-inference-sim/latencies.go and
// its worker pool in pkg/llm-d-inference-sim/simulator.go), where every
// request runs on its own timeline:
//
//   - up to MaxNumSeqs requests run at once (the simulator's max_num_seqs
//     workers); the others wait first come first served;
//   - a request's first token comes PrefillOverhead + PrefillPerToken ×
//     (prompt tokens not found in the prefix cache) after it starts
//     (GetTimeToFirstToken with time-factor-under-load 1, its default);
//   - every later token InterTokenLatency after the one before
//     (GetInterTokenLatency), whatever else runs: there is no batch;
//   - the KV cache holds the full blocks of the prompt only, taken when the
//     request starts and released when it ends, least recently used blocks
//     evicted first (blockCache.startRequest and finishRequest in
//     pkg/kv-cache/block_cache.go); every full block of the prompt found in
//     the cache counts as cached, the last one included.
//
// A request whose blocks do not fit beside those of the running requests
// waits at the head of the queue until they free enough, as in vLLM;
// with Refuse it is refused, as in the simulator.
type PerRequestTiming struct {
	PrefillOverhead   time.Duration // --prefill-overhead
	PrefillPerToken   time.Duration // --prefill-time-per-token
	InterTokenLatency time.Duration // --inter-token-latency
	// OutputHistogram draws each request's output length as the
	// simulator's default dataset does for a request that gives
	// max_tokens without ignore_eos (OutputLength). Off, every request
	// generates MaxTokens tokens.
	OutputHistogram bool
	// Refuse: a request whose blocks do not fit when it would start is
	// refused (EventRefused), as the simulator answers it with an error
	// (blockCache.startRequest's "the kv cache does not have sufficient
	// capacity to store this request", a 500 from
	// kvCacheOnRequestStart in pkg/llm-d-inference-sim/request.go); the
	// requests behind it start if theirs fit, as the simulator's other
	// workers go on. Off, it waits as in vLLM.
	Refuse bool
	// Tick bounds a step (default 1 ms), so a request that arrives while
	// the engine is in a step starts within a tick, as a free worker of
	// the simulator picks it up at once.
	Tick time.Duration
}

// On reports whether the per-request timing is in use.
func (p PerRequestTiming) On() bool { return p.InterTokenLatency > 0 }

// The response-length histogram of llm-d-inference-sim's default dataset
// (pkg/dataset/histogram_helper.go): five ranges and max_tokens itself,
// with these probabilities.
var outputBucketShare = [...]float64{0.2, 0.3, 0.2, 0.05, 0.1, 0.15}

const (
	outputFlexBucket = 3  // the range that stretches when max_tokens is large
	outputBucketSize = 20 // the size of the other ranges then
)

// OutputLength draws the number of tokens llm-d-inference-sim generates
// for a request with the given max_tokens (and no ignore_eos), by its
// histogram: 15 % of answers are max_tokens long, the rest fall in five
// ranges below it, 20-token ranges except the fourth, which stretches to
// cover what is left. For max_tokens 256 the ranges are 1–20, 21–40,
// 41–60, 61–236 and 237–255, and the mean is about 92 tokens.
func OutputLength(maxTokens int, r *rand.Rand) int {
	if maxTokens <= 1 {
		return maxTokens
	}
	n := len(outputBucketShare)
	if maxTokens <= n {
		return 1 + r.IntN(maxTokens)
	}
	u := r.Float64()
	cum := 0.0
	b := n - 1
	for i, p := range outputBucketShare {
		cum += p
		if u <= cum {
			b = i
			break
		}
	}
	if b == n-1 {
		return maxTokens
	}
	lo, hi := outputBucket(maxTokens, b)
	if hi < lo {
		return lo
	}
	return lo + r.IntN(hi-lo+1)
}

// outputBucket is the range [lo, hi] of histogram bucket b for maxTokens.
func outputBucket(maxTokens, b int) (lo, hi int) {
	n := len(outputBucketShare)
	if maxTokens <= outputBucketSize*(n-1)+1 {
		size := float64(maxTokens-1) / float64(n-1)
		lo, hi = int(size*float64(b))+1, int(size*float64(b+1))
	} else {
		flex := maxTokens - outputBucketSize*(n-2)
		switch {
		case b < outputFlexBucket:
			lo, hi = outputBucketSize*b+1, outputBucketSize*(b+1)
		case b == outputFlexBucket:
			lo, hi = outputBucketSize*b+1, outputBucketSize*b+flex
		default:
			lo, hi = outputBucketSize*(b-1)+flex+1, outputBucketSize*b+flex
		}
	}
	return lo, min(hi, maxTokens-1)
}

// stepPerRequest is Step under PerRequestTiming.
func (e *Engine) stepPerRequest() (time.Duration, []Event) {
	p := e.cfg.PerRequest
	bs := e.cfg.BlockSize
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		full := len(r.Prompt) / bs
		e.hits = e.pool.lookup(e.hits[:0], r.hashes[:full])
		if e.pool.nfree-e.pool.evictable(e.hits) < full-len(e.hits) {
			if !p.Refuse {
				break // vLLM waits for running requests to free blocks
			}
			e.waiting[0] = nil
			e.waiting = e.waiting[1:]
			r.waiting, r.Done = false, true
			e.events = append(e.events, Event{Req: r, Kind: EventRefused, At: e.now})
			continue
		}
		e.pool.touch(e.hits)
		r.blocks = append(r.blocks[:0], e.hits...)
		e.grow(r, full*bs)
		// the simulator stores a request's blocks when it starts, so a
		// request starting later finds them before this one's prefill ends
		for b := len(e.hits); b < full; b++ {
			e.pool.register(r.blocks[b], r.hashes[b])
		}
		r.registered = full
		cached := len(e.hits) * bs
		r.computed = len(r.Prompt)
		r.CachedTokens = cached
		r.Scheduled = e.now
		r.admitted = true
		e.stats.PrefixQueries += uint64(len(r.Prompt))
		e.stats.PrefixHits += uint64(cached)
		r.target = r.MaxTokens
		if p.OutputHistogram {
			r.target = OutputLength(r.MaxTokens, rand.New(rand.NewPCG(r.seed, 0x6c6c6d64)))
		}
		ttft := p.PrefillOverhead + time.Duration(len(r.Prompt)-cached)*p.PrefillPerToken
		r.next = e.now + e.scaled(ttft)
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		r.waiting, r.running = false, true
		e.running = append(e.running, r)
	}
	tick := p.Tick
	if tick <= 0 {
		tick = time.Millisecond
	}
	d := tick
	for _, r := range e.running {
		d = min(d, r.next-e.now)
	}
	d = max(d, 0)
	e.now += d
	e.stats.Steps++
	e.stats.Busy += d
	finished := false
	for _, r := range e.running {
		if r.next > e.now {
			continue
		}
		if e.emitToken(r, r.target) {
			finished = true
			continue
		}
		r.next += e.scaled(p.InterTokenLatency)
	}
	if finished {
		e.dropFinished()
	}
	return d, e.events
}

// scaled applies the engine's slowdown to a duration.
func (e *Engine) scaled(d time.Duration) time.Duration {
	if e.slow == 1 {
		return d
	}
	return time.Duration(float64(d) * e.slow)
}
