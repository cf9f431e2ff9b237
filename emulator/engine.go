package emulator

import (
	"errors"
	"fmt"
	"time"
)

// EngineRequest is one generation request. The caller fills ID, Prompt and
// MaxTokens; the engine fills the rest while the request runs. Once added,
// the request belongs to the engine until it is finished or aborted: read
// its fields under the same lock that serialises calls into the engine.
type EngineRequest struct {
	ID        string
	Prompt    []uint32
	MaxTokens int

	// Arrival is the engine time of Add.
	Arrival time.Duration
	// Output holds the generated tokens so far.
	Output []uint32
	// CachedTokens is the number of prompt tokens found in the prefix cache
	// when the request was first scheduled (whole blocks); -1 before then.
	CachedTokens int
	// Scheduled, FirstToken and Finished are engine times of the first
	// schedule, the first generated token, and the last one.
	Scheduled, FirstToken, Finished time.Duration
	// Preemptions counts how often the request was preempted and recomputed.
	Preemptions int
	// Done is set when the request finished or was aborted.
	Done    bool
	Aborted bool

	// Data is free for the caller (the server keeps its stream here).
	Data any

	tokens     []uint32 // prompt then output
	hashes     []uint64 // chained hashes of full blocks of tokens
	blocks     []int32
	computed   int // tokens whose KV is computed
	registered int // leading blocks registered in the prefix cache
	seed       uint64
	target     int           // output tokens to generate (PerRequestTiming)
	next       time.Duration // engine time of the next token (PerRequestTiming)
	admitted   bool
	running    bool
	waiting    bool
}

// NumTokens is the prompt plus output length.
func (r *EngineRequest) NumTokens() int { return len(r.tokens) }

// EventKind tells what happened to a request in a step.
type EventKind uint8

const (
	// EventToken: a token was generated (Index 0 is the first token).
	EventToken EventKind = iota + 1
	// EventFinished: the request generated MaxTokens tokens and left the engine.
	EventFinished
	// EventPreempted: the request lost its KV blocks and waits to be recomputed.
	EventPreempted
	// EventRefused: the request's blocks did not fit beside those of the
	// running requests and it left the engine without a token
	// (PerRequestTiming.Refuse).
	EventRefused
)

func (k EventKind) String() string {
	switch k {
	case EventToken:
		return "token"
	case EventFinished:
		return "finished"
	case EventPreempted:
		return "preempted"
	case EventRefused:
		return "refused"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one thing that happened to a request in a step, at engine time
// At (the end of the step).
type Event struct {
	Req   *EngineRequest
	Kind  EventKind
	Token uint32
	Index int
	At    time.Duration
}

// EngineStats are the engine's cumulative counters (vLLM's _total series).
type EngineStats struct {
	PrefixQueries    uint64 // prompt tokens looked up in the prefix cache
	PrefixHits       uint64 // of those, found cached
	PromptTokens     uint64 // prompt tokens of requests that produced a first token
	GenerationTokens uint64
	Finished         uint64
	Preemptions      uint64
	Steps            uint64
	Busy             time.Duration // engine time spent in steps
}

// ErrTooLong is returned by Add for a request longer than MaxModelLen.
var ErrTooLong = errors.New("emulator: request exceeds max model len")

// Engine is a vLLM V1-like engine: prefix-cached paged KV blocks and a
// step scheduler with chunked prefill and recompute preemption. It has no
// clock of its own: Step advances engine time by the duration of the step
// it runs, AdvanceTo moves an idle engine forward. Not safe for concurrent
// use.
type Engine struct {
	cfg     EngineConfig
	pool    *blockPool
	now     time.Duration
	slow    float64
	waiting []*EngineRequest
	running []*EngineRequest
	stats   EngineStats

	sched  []scheduled
	events []Event
	hits   []int32
}

type scheduled struct {
	r     *EngineRequest
	n     int // tokens computed this step
	start int // computed tokens before the step
}

// NewEngine builds an engine with an empty cache at engine time 0. It
// panics on an invalid configuration (see EngineConfig.Validate).
func NewEngine(cfg EngineConfig) *Engine {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if c := cfg.KVCapacityTokens(); cfg.MaxModelLen > c {
		cfg.MaxModelLen = c
	}
	return &Engine{cfg: cfg, pool: newBlockPool(cfg.NumGPUBlocks), slow: 1}
}

// Config returns the configuration in use (MaxModelLen possibly lowered).
func (e *Engine) Config() EngineConfig { return e.cfg }

// Now is the engine time.
func (e *Engine) Now() time.Duration { return e.now }

// AdvanceTo moves engine time forward to t (never back); used while idle.
func (e *Engine) AdvanceTo(t time.Duration) {
	if t > e.now {
		e.now = t
	}
}

// SetSlowdown multiplies every later step's duration by f (1 = normal).
func (e *Engine) SetSlowdown(f float64) {
	if f <= 0 {
		f = 1
	}
	e.slow = f
}

// Running is the number of requests in the running batch.
func (e *Engine) Running() int { return len(e.running) }

// Waiting is the number of queued requests.
func (e *Engine) Waiting() int { return len(e.waiting) }

// Idle reports whether there is nothing to step.
func (e *Engine) Idle() bool { return len(e.running) == 0 && len(e.waiting) == 0 }

// KVUsage is the share of KV blocks referenced by requests (vLLM's
// kv_cache_usage_perc, 0–1); cached blocks nobody uses count as free.
func (e *Engine) KVUsage() float64 { return e.pool.usage() }

// CachedBlocks is the number of blocks currently holding a cached prefix.
func (e *Engine) CachedBlocks() int { return len(e.pool.cached) }

// Stats returns the cumulative counters.
func (e *Engine) Stats() EngineStats { return e.stats }

// Add queues a request at the current engine time. It fails when the prompt
// is empty, MaxTokens is below 1, or prompt plus MaxTokens exceeds
// MaxModelLen.
func (e *Engine) Add(r *EngineRequest) error {
	if len(r.Prompt) == 0 {
		return fmt.Errorf("emulator: request %q has an empty prompt", r.ID)
	}
	if r.MaxTokens < 1 {
		return fmt.Errorf("emulator: request %q: max tokens %d must be at least 1", r.ID, r.MaxTokens)
	}
	if len(r.Prompt)+r.MaxTokens > e.cfg.MaxModelLen {
		return fmt.Errorf("%w: %d prompt + %d output tokens > %d", ErrTooLong, len(r.Prompt), r.MaxTokens, e.cfg.MaxModelLen)
	}
	r.tokens = make([]uint32, len(r.Prompt), len(r.Prompt)+r.MaxTokens)
	copy(r.tokens, r.Prompt)
	r.Output = r.tokens[len(r.Prompt):]
	r.hashes = r.hashes[:0]
	bs := e.cfg.BlockSize
	e.ensureHashes(r, len(r.Prompt)/bs)
	r.seed = chainHash(0, r.Prompt)
	if n := len(r.hashes); n > 0 {
		r.seed = chainHash(r.hashes[n-1], r.Prompt[n*bs:])
	}
	r.Arrival = e.now
	r.CachedTokens = -1
	r.waiting = true
	e.waiting = append(e.waiting, r)
	return nil
}

// Abort removes a request (a client went away), freeing its blocks.
// It returns false when the request is not in the engine.
func (e *Engine) Abort(r *EngineRequest) bool {
	switch {
	case r.running:
		e.running = removeReq(e.running, r)
		e.release(r)
	case r.waiting:
		e.waiting = removeReq(e.waiting, r)
		r.waiting = false
	default:
		return false
	}
	r.Done, r.Aborted = true, true
	return true
}

// Reset empties the engine: queues, cache and counters (a restart).
// Requests inside are dropped without events.
func (e *Engine) Reset() {
	for _, r := range e.running {
		r.running, r.Done, r.Aborted = false, true, true
	}
	for _, r := range e.waiting {
		r.waiting, r.Done, r.Aborted = false, true, true
	}
	e.running, e.waiting = nil, nil
	e.pool = newBlockPool(e.cfg.NumGPUBlocks)
	e.stats = EngineStats{}
}

// emitToken generates r's next token at the engine's time and, once r has
// want tokens, finishes it (its blocks freed, still cached); it reports
// whether r finished.
func (e *Engine) emitToken(r *EngineRequest, want int) bool {
	idx := len(r.Output)
	tok := outputToken(r.seed, idx)
	r.tokens = append(r.tokens, tok)
	r.Output = r.tokens[len(r.Prompt):]
	e.stats.GenerationTokens++
	if idx == 0 {
		r.FirstToken = e.now
		e.stats.PromptTokens += uint64(len(r.Prompt))
	}
	e.events = append(e.events, Event{Req: r, Kind: EventToken, Token: tok, Index: idx, At: e.now})
	if len(r.Output) < want {
		return false
	}
	e.release(r)
	r.Done = true
	r.Finished = e.now
	e.stats.Finished++
	e.events = append(e.events, Event{Req: r, Kind: EventFinished, Index: idx, At: e.now})
	return true
}

// dropFinished removes the requests that left the running batch.
func (e *Engine) dropFinished() {
	kept := e.running[:0]
	for _, r := range e.running {
		if r.running {
			kept = append(kept, r)
		}
	}
	for i := len(kept); i < len(e.running); i++ {
		e.running[i] = nil
	}
	e.running = kept
}

func removeReq(list []*EngineRequest, r *EngineRequest) []*EngineRequest {
	for i, x := range list {
		if x == r {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

func (e *Engine) ensureHashes(r *EngineRequest, nblocks int) {
	bs := e.cfg.BlockSize
	for b := len(r.hashes); b < nblocks; b++ {
		var parent uint64
		if b > 0 {
			parent = r.hashes[b-1]
		}
		r.hashes = append(r.hashes, chainHash(parent, r.tokens[b*bs:(b+1)*bs]))
	}
}

// release frees a running request's blocks (they stay cached).
func (e *Engine) release(r *EngineRequest) {
	e.pool.free(r.blocks)
	r.blocks = r.blocks[:0]
	r.computed, r.registered = 0, 0
	r.running = false
}

// grow gives r blocks to hold upto tokens; false when the pool is short.
func (e *Engine) grow(r *EngineRequest, upto int) bool {
	need := (upto+e.cfg.BlockSize-1)/e.cfg.BlockSize - len(r.blocks)
	if need <= 0 {
		return true
	}
	if e.pool.nfree < need {
		return false
	}
	for ; need > 0; need-- {
		r.blocks = append(r.blocks, e.pool.allocate())
	}
	return true
}

func (e *Engine) preempt(r *EngineRequest) {
	e.release(r)
	r.Preemptions++
	e.stats.Preemptions++
	r.waiting = true
	e.waiting = append(e.waiting, nil)
	copy(e.waiting[1:], e.waiting)
	e.waiting[0] = r
	e.events = append(e.events, Event{Req: r, Kind: EventPreempted, Index: len(r.Output)})
}

// Step runs one scheduler step and returns its engine duration and what
// happened (events carry the engine time at the end of the step). The
// event slice is reused by the next call. An idle engine returns 0, nil.
//
// The schedule follows vLLM V1: running requests first, in order, each
// taking its remaining prefill (or one decode token) out of the token
// budget; when KV blocks run out the last running request is preempted and
// requeued at the front. Then, if nothing was preempted, waiting requests
// are admitted first come first served while sequence slots, budget and
// blocks allow, after a prefix cache lookup of whole blocks (at most
// prompt length − 1 tokens, so a fully cached prompt recomputes its last
// block). Under PerRequestTiming a step instead moves to the next token
// of any running request, at most a tick (see PerRequestTiming).
func (e *Engine) Step() (time.Duration, []Event) {
	e.events = e.events[:0]
	if e.Idle() {
		return 0, nil
	}
	if e.cfg.PerRequest.On() {
		return e.stepPerRequest()
	}
	bs := e.cfg.BlockSize
	budget := e.cfg.MaxNumBatchedTokens
	e.sched = e.sched[:0]
	preempted := false

	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := len(r.tokens) - r.computed
		if n > budget {
			n = budget
		}
		if n <= 0 {
			continue
		}
		for r != nil && !e.grow(r, r.computed+n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == r {
				r = nil
			}
		}
		if r == nil {
			break
		}
		e.sched = append(e.sched, scheduled{r: r, n: n, start: r.computed})
		budget -= n
	}

	for !preempted && len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		r := e.waiting[0]
		maxHit := (len(r.tokens) - 1) / bs
		e.ensureHashes(r, maxHit)
		e.hits = e.pool.lookup(e.hits[:0], r.hashes[:maxHit])
		cached := len(e.hits) * bs
		n := len(r.tokens) - cached
		if n > budget {
			n = budget
		}
		if e.cfg.CountEveryLookup && !r.admitted && r.Preemptions == 0 {
			// get_computed_blocks recorded the lookup before allocation.
			e.stats.PrefixQueries += uint64(len(r.tokens))
			e.stats.PrefixHits += uint64(cached)
		}
		need := (cached+n+bs-1)/bs - len(e.hits)
		if e.cfg.ReserveFullSequence {
			// allocate_slots(full_sequence_must_fit=True): the whole
			// sequence must fit, hits that are free still counting as
			// taken from the free blocks.
			need = max(need, (len(r.tokens)+bs-1)/bs-len(e.hits))
		}
		if e.pool.nfree-e.pool.evictable(e.hits) < need {
			break
		}
		e.pool.touch(e.hits)
		r.blocks = append(r.blocks[:0], e.hits...)
		r.registered = len(e.hits)
		r.computed = cached
		e.grow(r, cached+n)
		if !r.admitted {
			r.admitted = true
			r.CachedTokens = cached
			r.Scheduled = e.now
			if !e.cfg.CountEveryLookup {
				e.stats.PrefixQueries += uint64(len(r.tokens))
				e.stats.PrefixHits += uint64(cached)
			}
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		r.waiting, r.running = false, true
		e.running = append(e.running, r)
		e.sched = append(e.sched, scheduled{r: r, n: n, start: cached})
		budget -= n
	}

	if len(e.sched) == 0 {
		// Nothing fits (a preemption freed nothing usable yet); count the
		// overhead so time moves on.
		d := time.Duration(e.cfg.Timing.StepOverhead * e.slow * float64(time.Second))
		e.now += d
		e.stats.Steps++
		e.stats.Busy += d
		return d, e.events
	}

	tokens := 0
	var pairs, ctx float64
	for _, s := range e.sched {
		tokens += s.n
		if s.n == 1 && s.start > 0 {
			ctx += float64(s.start + 1)
		} else {
			n, p := float64(s.n), float64(s.start)
			pairs += n*p + n*(n+1)/2
		}
	}
	d := e.cfg.Timing.StepTime(tokens, pairs, ctx)
	if e.slow != 1 {
		d = time.Duration(float64(d) * e.slow)
	}
	e.now += d
	e.stats.Steps++
	e.stats.Busy += d

	finished := false
	for _, s := range e.sched {
		r := s.r
		r.computed += s.n
		if full := r.computed / bs; full > r.registered {
			e.ensureHashes(r, full)
			for b := r.registered; b < full; b++ {
				e.pool.register(r.blocks[b], r.hashes[b])
			}
			r.registered = full
		}
		if r.computed < len(r.tokens) {
			continue // prefill chunk, more to come
		}
		if e.emitToken(r, r.MaxTokens) {
			finished = true
		}
	}
	if finished {
		e.dropFinished()
	}
	for i := range e.events {
		e.events[i].At = e.now
	}
	return d, e.events
}
