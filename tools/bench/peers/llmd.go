package peers

import (
	"container/list"
	"math/rand/v2"
	"time"
)

// llm-d Router's endpoint picker (llm-d/llm-d-router), its default
// scheduling profile (pkg/epp/config/loader/defaults.go: queue-scorer ×2,
// kv-cache-utilization-scorer ×2, prefix-cache-scorer ×3, max-score
// picker) with the two plugins an operator adds for agent traffic: the
// prefix-cache-affinity-filter with its defaults and the
// session-affinity-scorer in its session_id strategy (weight 1, as the
// chart's payload-agnostic profile gives it).
//
//   - queue-scorer (scorer/queuedepth/queue.go): (max−q)/(max−min) of the
//     polled waiting queues, 1 for all when they are equal.
//   - kv-cache-utilization-scorer (scorer/kvcacheutilization): 1 − polled
//     KV usage.
//   - prefix-cache-scorer (scorer/prefix, matchLengthWeight 0): matched
//     blocks / prompt blocks, from the approximate prefix producer
//     (requestcontrol/dataproducer/approximateprefix): 64-token block
//     hashes (blockSizeTokens is clamped up to 64), at most 131,072 tokens
//     matched, one LRU index per pod sized by autoTune to the pod's
//     num_gpu_blocks, a block counting for every pod holding it until the
//     first block no pod holds. The chosen pod's blocks are recorded
//     after the pick.
//   - prefix-cache-affinity-filter (filter/prefixcacheaffinity, defaults
//     affinityThreshold 0.80, maxTTFTPenaltyMs 18,000): keep only pods with
//     a prefix score ≥ 0.80, unless the best of them has an estimated
//     TTFT worse than the best other pod's by more than 18 s; the estimate
//     is the pod's in-flight uncached prompt tokens (inflight-load
//     producer: released at the first token) over peakPrefillThroughput
//     (Config.PrefillTokensPerSecond, retuned to the replicas as its docs
//     ask).
//   - session-affinity-scorer, session_id strategy
//     (util/sessionaffinity/session_id.go): 1 for the pod the session was
//     last routed to, 0 elsewhere; a binding unused for 300 s is dropped
//     (evictionTtlSeconds).
//
// Ties of the max-score picker are broken at random.
const (
	LLMDQueueWeight      = 2.0
	LLMDKVWeight         = 2.0
	LLMDPrefixWeight     = 3.0
	LLMDSessionWeight    = 1.0
	LLMDBlockTokens      = 64
	LLMDMaxMatchTokens   = 131072
	LLMDAffinityScore    = 0.80
	LLMDMaxTTFTPenalty   = 18 * time.Second
	LLMDSessionTTL       = 300 * time.Second
	LLMDDefaultPrefillTP = 15928 // peakPrefillThroughput's default, tokens/s
)

// LLMD is the llm-d endpoint picker.
type LLMD struct {
	index    []*lruIndex
	loads    []Load
	inflight inflight
	tokens   []int // in-flight uncached prompt tokens per pod
	sessions map[string]llmdBinding
	rate     float64
	rng      *rand.Rand
	// BrokeStickiness counts the picks where the TTFT gate opened the
	// filter.
	BrokeStickiness int
}

type llmdBinding struct {
	pod  int
	last time.Time
}

// NewLLMD returns the picker for c's replicas.
func NewLLMD(c Config) *LLMD {
	n := len(c.Replicas)
	p := &LLMD{loads: make([]Load, n), inflight: make(inflight, n), tokens: make([]int, n),
		sessions: map[string]llmdBinding{}, rate: c.PrefillTokensPerSecond,
		rng: rand.New(rand.NewPCG(c.Seed, 0x11d))}
	if p.rate <= 0 {
		p.rate = LLMDDefaultPrefillTP
	}
	capacity := c.NumGPUBlocks
	if capacity <= 0 {
		capacity = 31250 // lruCapacityPerServer's default
	}
	for range n {
		p.index = append(p.index, newLRUIndex(capacity))
	}
	return p
}

func (p *LLMD) Name() string { return ModeLLMD }

// Poll implements Policy: the scraped queue and KV usage.
func (p *LLMD) Poll(loads []Load, _ time.Time) { copy(p.loads, loads) }

// Pick implements Policy.
func (p *LLMD) Pick(r Request) *Flight {
	n := len(p.index)
	hashes := chainHashes(r.Tokens, LLMDBlockTokens, LLMDMaxMatchTokens/LLMDBlockTokens)
	match := make([]int, n)
	for _, h := range hashes {
		any := false
		for i, ix := range p.index {
			if ix.has(h) {
				match[i]++
				any = true
			}
		}
		if !any {
			break
		}
	}
	prefix := make([]float64, n)
	for i := range prefix {
		if len(hashes) > 0 {
			prefix[i] = float64(match[i]) / float64(len(hashes))
		}
	}
	cands := p.filter(prefix)
	// the session binding (expired ones are swept)
	bound := -1
	if b, ok := p.sessions[r.Key]; ok && r.Key != "" {
		if r.Now.Sub(b.last) < LLMDSessionTTL {
			bound = b.pod
		} else {
			delete(p.sessions, r.Key)
		}
	}
	qmin, qmax := p.loads[cands[0]].Waiting, p.loads[cands[0]].Waiting
	for _, i := range cands {
		qmin, qmax = min(qmin, p.loads[i].Waiting), max(qmax, p.loads[i].Waiting)
	}
	best, bs, ties := -1, 0.0, 0
	for _, i := range cands {
		q := 1.0
		if qmax != qmin {
			q = float64(qmax-p.loads[i].Waiting) / float64(qmax-qmin)
		}
		s := LLMDQueueWeight*q + LLMDKVWeight*(1-p.loads[i].KVUsage) + LLMDPrefixWeight*prefix[i]
		if i == bound {
			s += LLMDSessionWeight
		}
		switch {
		case best < 0 || s > bs:
			best, bs, ties = i, s, 1
		case s == bs:
			ties++
			if p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if r.Key != "" {
		p.sessions[r.Key] = llmdBinding{pod: best, last: r.Now}
	}
	for _, h := range hashes {
		p.index[best].add(h)
	}
	f := p.inflight.pick(best)
	f.uncached = max(0, len(r.Tokens)-match[best]*LLMDBlockTokens)
	p.tokens[best] += f.uncached
	return f
}

// filter is the prefix-cache affinity filter: the pods at or above the
// affinity threshold, unless none is or the TTFT gate breaks stickiness.
func (p *LLMD) filter(prefix []float64) []int {
	all := make([]int, len(prefix))
	var sticky, other []int
	for i, s := range prefix {
		all[i] = i
		if s >= LLMDAffinityScore {
			sticky = append(sticky, i)
		} else {
			other = append(other, i)
		}
	}
	if len(all) <= 1 || len(sticky) == 0 {
		return all
	}
	if len(other) > 0 && p.bestTTFT(sticky)-p.bestTTFT(other) > LLMDMaxTTFTPenalty {
		p.BrokeStickiness++
		return all
	}
	return sticky
}

// TTFT is the filter's estimate for pod i: its in-flight uncached prompt
// tokens over the prefill rate.
func (p *LLMD) TTFT(i int) time.Duration {
	return time.Duration(float64(p.tokens[i]) / p.rate * float64(time.Second))
}

func (p *LLMD) bestTTFT(pods []int) time.Duration {
	best := p.TTFT(pods[0])
	for _, i := range pods[1:] {
		best = min(best, p.TTFT(i))
	}
	return best
}

// FirstToken implements Policy: the in-flight prompt tokens are released
// at the start of the stream.
func (p *LLMD) FirstToken(f *Flight, _ time.Time) {
	if f.prefill && !f.finished {
		f.prefill = false
		p.tokens[f.Replica] -= f.uncached
	}
}

// Done implements Policy.
func (p *LLMD) Done(f *Flight, now time.Time) {
	if f == nil || f.finished {
		return
	}
	p.FirstToken(f, now)
	p.inflight.done(f)
}

func (p *LLMD) EndSession(string, time.Time) {}

// lruIndex is one pod's LRU set of block hashes.
type lruIndex struct {
	cap   int
	order *list.List
	at    map[uint64]*list.Element
}

func newLRUIndex(capacity int) *lruIndex {
	return &lruIndex{cap: capacity, order: list.New(), at: map[uint64]*list.Element{}}
}

func (x *lruIndex) has(h uint64) bool {
	_, ok := x.at[h]
	return ok
}

func (x *lruIndex) add(h uint64) {
	if e, ok := x.at[h]; ok {
		x.order.MoveToFront(e)
		return
	}
	x.at[h] = x.order.PushFront(h)
	for x.order.Len() > x.cap {
		e := x.order.Back()
		x.order.Remove(e)
		delete(x.at, e.Value.(uint64))
	}
}
