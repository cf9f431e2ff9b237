package peers

import (
	"math/rand/v2"
	"time"
)

// NVIDIA Dynamo's KV router (ai-dynamo/dynamo), as
// docs/components/router/router-concepts.md ("Cost Calculation") and
// router-configuration.md describe it, with its defaults:
//
//	raw_prefill  = active prefill blocks + the prompt's blocks
//	adjusted     = max(raw_prefill − overlap × overlap_score_credit (1.0), 0)
//	decode       = active decode blocks + the prompt's blocks
//	cost         = prefill_load_scale (1) × adjusted + decode
//
// and the lowest cost wins (router_temperature 0; ties at random). A
// request's prompt blocks count as prefill load until its first token and
// as decode load until it finishes (--router-track-active-blocks and
// --router-track-prefill-tokens, both on by default). Without KV events
// (--no-router-kv-events: the replicas here publish none) the router
// predicts each worker's cache from its own decisions, every routed
// block kept for --router-ttl-secs (120 s) after it was last routed
// there. Session affinity (--router-session-affinity-ttl-secs, off by
// default, on here as for agents with X-Dynamo-Session-ID): a session's
// later requests go to the worker its first was dispatched to while the
// binding is in use or idle less than DynamoSessionTTL.
const (
	DynamoOverlapCredit = 1.0
	DynamoPrefillScale  = 1.0
	DynamoBlockTTL      = 120 * time.Second
	// DynamoSessionTTL is the affinity idle timeout the bench sets
	// (Dynamo has none by default: affinity is off until one is given).
	DynamoSessionTTL = 300 * time.Second
)

// Dynamo is the Dynamo KV router in approximate mode.
type Dynamo struct {
	bs       int
	cache    []map[uint64]time.Time // predicted blocks per worker, with their expiry
	prefill  []int                  // active prefill blocks per worker
	decode   []int                  // active decode blocks per worker
	inflight inflight
	sessions map[string]*dynamoBinding
	rng      *rand.Rand
	lastGC   time.Time
}

type dynamoBinding struct {
	worker int
	active int
	idle   time.Time // when the last request of the binding ended
}

// NewDynamo returns the router for c's replicas.
func NewDynamo(c Config) *Dynamo {
	n := len(c.Replicas)
	p := &Dynamo{bs: c.BlockSize, prefill: make([]int, n), decode: make([]int, n), inflight: make(inflight, n),
		sessions: map[string]*dynamoBinding{}, rng: rand.New(rand.NewPCG(c.Seed, 0xd1a))}
	for range n {
		p.cache = append(p.cache, map[uint64]time.Time{})
	}
	return p
}

func (p *Dynamo) Name() string { return ModeDynamo }

// Costs returns every worker's cost for r, without routing it.
func (p *Dynamo) Costs(r Request) []float64 {
	hashes := chainHashes(r.Tokens, p.bs, 0)
	out := make([]float64, len(p.cache))
	for i := range out {
		out[i] = p.cost(i, hashes, r.Now)
	}
	return out
}

func (p *Dynamo) overlap(i int, hashes []uint64, now time.Time) int {
	n := 0
	for _, h := range hashes {
		exp, ok := p.cache[i][h]
		if !ok || !now.Before(exp) {
			break
		}
		n++
	}
	return n
}

func (p *Dynamo) cost(i int, hashes []uint64, now time.Time) float64 {
	blocks := float64(len(hashes))
	adjusted := max(float64(p.prefill[i])+blocks-DynamoOverlapCredit*float64(p.overlap(i, hashes, now)), 0)
	return DynamoPrefillScale*adjusted + float64(p.decode[i]) + blocks
}

// Pick implements Policy.
func (p *Dynamo) Pick(r Request) *Flight {
	p.gc(r.Now)
	hashes := chainHashes(r.Tokens, p.bs, 0)
	best := -1
	if b, ok := p.sessions[r.Key]; ok && r.Key != "" {
		if b.active > 0 || r.Now.Sub(b.idle) < DynamoSessionTTL {
			best = b.worker
		} else {
			delete(p.sessions, r.Key)
		}
	}
	if best < 0 {
		bc, ties := 0.0, 0
		for i := range p.cache {
			c := p.cost(i, hashes, r.Now)
			switch {
			case best < 0 || c < bc:
				best, bc, ties = i, c, 1
			case c == bc:
				ties++
				if p.rng.IntN(ties) == 0 {
					best = i
				}
			}
		}
	}
	return p.commit(r, hashes, best)
}

// pin routes r to worker w, with the router's bookkeeping (a program
// pinned by a scheduler above the router).
func (p *Dynamo) pin(r Request, w int) *Flight {
	p.gc(r.Now)
	r.Key = ""
	return p.commit(r, chainHashes(r.Tokens, p.bs, 0), w)
}

// commit counts r on worker best: its predicted blocks, its prefill and
// decode load, its session binding.
func (p *Dynamo) commit(r Request, hashes []uint64, best int) *Flight {
	uncached := len(hashes) - p.overlap(best, hashes, r.Now)
	exp := r.Now.Add(DynamoBlockTTL)
	for _, h := range hashes {
		p.cache[best][h] = exp
	}
	f := p.inflight.pick(best)
	f.uncached, f.blocks, f.key = uncached, len(hashes), r.Key
	p.prefill[best] += uncached
	p.decode[best] += len(hashes)
	if r.Key != "" {
		b, ok := p.sessions[r.Key]
		if !ok {
			b = &dynamoBinding{worker: best}
			p.sessions[r.Key] = b
		}
		b.active++
	}
	return f
}

// gc drops expired predicted blocks once a minute.
func (p *Dynamo) gc(now time.Time) {
	if now.Sub(p.lastGC) < time.Minute {
		return
	}
	p.lastGC = now
	for _, c := range p.cache {
		for h, exp := range c {
			if !now.Before(exp) {
				delete(c, h)
			}
		}
	}
}

// FirstToken implements Policy: the prompt's prefill load is released.
func (p *Dynamo) FirstToken(f *Flight, _ time.Time) {
	if f.prefill && !f.finished {
		f.prefill = false
		p.prefill[f.Replica] -= f.uncached
	}
}

// Done implements Policy.
func (p *Dynamo) Done(f *Flight, now time.Time) {
	if f == nil || f.finished {
		return
	}
	p.FirstToken(f, now)
	p.decode[f.Replica] -= f.blocks
	p.inflight.done(f)
	if b, ok := p.sessions[f.key]; ok && f.key != "" {
		b.active--
		b.idle = now
	}
}

func (p *Dynamo) Poll([]Load, time.Time)       {}
func (p *Dynamo) EndSession(string, time.Time) {}
