package peers

import (
	"slices"
	"time"
)

// SGLang model gateway (lightseekorg/smg), model_gateway/src/policies/
// cache_aware.rs, the approximate tree path (no KV events), with the
// defaults of CacheAwareConfig in policies/mod.rs:
//
//   - The pool is imbalanced when max−min load > balance_abs_threshold (32)
//     and max > balance_rel_threshold (1.1) × min, load being the
//     gateway's own in-flight count per worker; then the request goes to
//     the least loaded worker (ties: fewer processed requests, then lower
//     index).
//   - Otherwise the prompt is matched against one approximate radix tree
//     shared by the workers, each node recording the workers ("tenants")
//     it was routed to and when (crates/kv_index token_tree.rs: 16-token
//     pages, a page matches while any tenant holds it). If the match
//     ratio (matched / prompt tokens) > cache_threshold (0.5) the request
//     goes to a tenant of the deepest matched node, else to the least
//     loaded worker.
//   - The prompt is inserted into the tree for the chosen worker either
//     way.
//   - Every eviction_interval_secs (30 s) each tenant holding more than
//     max_tree_size (10,000) tokens is cut back to it, least recently used
//     leaves first.
//
// Over HTTP the gateway matches characters of the request text; here the
// tree is over the prompt's tokens, as its gRPC path does.
const (
	SMGCacheThreshold   = 0.5
	SMGBalanceAbs       = 32
	SMGBalanceRel       = 1.1
	SMGEvictionInterval = 30 * time.Second
	SMGMaxTreeSize      = 10000
	smgPage             = 16
)

// CacheAware is SMG's cache_aware policy.
type CacheAware struct {
	nodes     map[uint64]*smgNode
	tokens    []int // tokens held per tenant
	processed []int
	inflight  inflight
	lastEvict time.Time
}

type smgNode struct {
	depth   int
	tenants map[int]time.Time
}

// NewCacheAware returns the policy for c's replicas.
func NewCacheAware(c Config) *CacheAware {
	n := len(c.Replicas)
	return &CacheAware{nodes: map[uint64]*smgNode{}, tokens: make([]int, n), processed: make([]int, n), inflight: make(inflight, n)}
}

func (p *CacheAware) Name() string { return ModeSMG }

// Pick implements Policy.
func (p *CacheAware) Pick(r Request) *Flight {
	if p.lastEvict.IsZero() {
		p.lastEvict = r.Now
	}
	for r.Now.Sub(p.lastEvict) >= SMGEvictionInterval {
		p.lastEvict = p.lastEvict.Add(SMGEvictionInterval)
		p.evict()
	}
	minIdx := 0
	for i, n := range p.inflight {
		if n < p.inflight[minIdx] || (n == p.inflight[minIdx] && p.processed[i] < p.processed[minIdx]) {
			minIdx = i
		}
	}
	hashes := chainHashes(r.Tokens, smgPage, 0)
	choice := minIdx
	if !p.Imbalanced() {
		matched, tenant := p.match(hashes, r.Now)
		if len(r.Tokens) > 0 && float64(matched)/float64(len(r.Tokens)) > SMGCacheThreshold {
			choice = tenant
		}
	}
	p.insert(hashes, choice, r.Now)
	p.processed[choice]++
	return p.inflight.pick(choice)
}

// Imbalanced reports whether the in-flight counts are past both
// thresholds.
func (p *CacheAware) Imbalanced() bool {
	lo, hi := p.inflight[0], p.inflight[0]
	for _, n := range p.inflight {
		lo, hi = min(lo, n), max(hi, n)
	}
	return hi-lo > SMGBalanceAbs && float64(hi) > SMGBalanceRel*float64(lo)
}

// match walks the prompt's pages while some tenant holds them; it returns
// the matched tokens and the most recently used tenant of the deepest
// node, touching it.
func (p *CacheAware) match(hashes []uint64, now time.Time) (int, int) {
	matched, tenant := 0, -1
	for _, h := range hashes {
		nd, ok := p.nodes[h]
		if !ok || len(nd.tenants) == 0 {
			break
		}
		best, bt := -1, time.Time{}
		for t, at := range nd.tenants {
			if best < 0 || at.After(bt) || (at.Equal(bt) && t < best) {
				best, bt = t, at
			}
		}
		nd.tenants[best] = now
		matched, tenant = matched+smgPage, best
	}
	return matched, tenant
}

func (p *CacheAware) insert(hashes []uint64, tenant int, now time.Time) {
	for d, h := range hashes {
		nd, ok := p.nodes[h]
		if !ok {
			nd = &smgNode{depth: d, tenants: map[int]time.Time{}}
			p.nodes[h] = nd
		}
		if _, ok := nd.tenants[tenant]; !ok {
			p.tokens[tenant] += smgPage
		}
		nd.tenants[tenant] = now
	}
}

// evict cuts every tenant over SMGMaxTreeSize tokens back to it, least
// recently used first, deepest first among equals (leaves before their
// parents).
func (p *CacheAware) evict() {
	type entry struct {
		h     uint64
		depth int
		at    time.Time
	}
	for t, held := range p.tokens {
		if held <= SMGMaxTreeSize {
			continue
		}
		var es []entry
		for h, nd := range p.nodes {
			if at, ok := nd.tenants[t]; ok {
				es = append(es, entry{h, nd.depth, at})
			}
		}
		slices.SortFunc(es, func(a, b entry) int {
			if c := a.at.Compare(b.at); c != 0 {
				return c
			}
			return b.depth - a.depth
		})
		for _, e := range es {
			if p.tokens[t] <= SMGMaxTreeSize {
				break
			}
			nd := p.nodes[e.h]
			delete(nd.tenants, t)
			p.tokens[t] -= smgPage
			if len(nd.tenants) == 0 {
				delete(p.nodes, e.h)
			}
		}
	}
}

// TreeTokens returns the tokens the tree holds per tenant.
func (p *CacheAware) TreeTokens() []int { return append([]int(nil), p.tokens...) }

func (p *CacheAware) FirstToken(*Flight, time.Time) {}
func (p *CacheAware) Done(f *Flight, _ time.Time)   { p.inflight.done(f) }
func (p *CacheAware) Poll([]Load, time.Time)        {}
func (p *CacheAware) EndSession(string, time.Time)  {}
