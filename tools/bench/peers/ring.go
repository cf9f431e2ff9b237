package peers

import (
	"slices"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// ring is a consistent-hash ring: vnodes points per replica, each at the
// hash of the replica's name followed by the point's number.
type ring struct {
	points []uint64
	owner  map[uint64]int
}

func newRing(names []string, vnodes int) *ring {
	r := &ring{owner: map[uint64]int{}}
	for i, n := range names {
		for v := range vnodes {
			h := xxhash.Sum64String(n + strconv.Itoa(v))
			r.owner[h] = i
			r.points = append(r.points, h)
		}
	}
	slices.Sort(r.points)
	return r
}

// search returns the index of the first point at or after h (wrapping).
func (r *ring) search(h uint64) int {
	i, _ := slices.BinarySearch(r.points, h)
	if i >= len(r.points) {
		i = 0
	}
	return i
}

// KubeAI's PrefixHash load balancing (substratusai/kubeai),
// internal/loadbalancer/balance_chwbl.go, with the defaults of
// api/k8s/v1/model_types.go (PrefixHash): the key is the first
// prefixCharLength (100) characters of the first user message
// (ChatCompletionRequest.Prefix); the ring has replication (256) points
// per endpoint; walking clockwise from the key's hash, the first endpoint
// whose in-flight count is ≤ meanLoadFactor (125 %) × (total in flight + 1)
// / endpoints takes the request (no in-flight at all: the first); if none
// is, the first endpoint on the walk does. In-flight counts are the load
// balancer's own.
const (
	KubeAIPrefixChars = 100
	KubeAIReplication = 256
	KubeAILoadFactor  = 1.25
)

// CHWBL is KubeAI's consistent hashing with bounded loads.
type CHWBL struct {
	ring     *ring
	inflight inflight
	// Walked counts the picks that passed the key's first endpoint
	// because it was over the bound.
	Walked int
}

// NewCHWBL returns the balancer for c's replicas.
func NewCHWBL(c Config) *CHWBL {
	return &CHWBL{ring: newRing(c.Replicas, KubeAIReplication), inflight: make(inflight, len(c.Replicas))}
}

func (p *CHWBL) Name() string { return ModeKubeAI }

// Key is the text KubeAI hashes for r.
func (p *CHWBL) Key(r Request) string {
	s := r.FirstUser
	n := 0
	for i := range s {
		if n == KubeAIPrefixChars {
			return s[:i]
		}
		n++
	}
	return s
}

// Home is the first endpoint on the ring for r's key, load aside.
func (p *CHWBL) Home(r Request) int {
	return p.ring.owner[p.ring.points[p.ring.search(xxhash.Sum64String(p.Key(r)))]]
}

// Pick implements Policy.
func (p *CHWBL) Pick(r Request) *Flight {
	total := 0
	for _, n := range p.inflight {
		total += n
	}
	start := p.ring.search(xxhash.Sum64String(p.Key(r)))
	first := p.ring.owner[p.ring.points[start]]
	for k := range p.ring.points {
		i := p.ring.owner[p.ring.points[(start+k)%len(p.ring.points)]]
		if p.loadOK(p.inflight[i], total) {
			if i != first {
				p.Walked++
			}
			return p.inflight.pick(i)
		}
	}
	return p.inflight.pick(first)
}

func (p *CHWBL) loadOK(load, total int) bool {
	if total == 0 {
		return true
	}
	mean := float64(total+1) / float64(len(p.inflight))
	return float64(load) <= mean*KubeAILoadFactor
}

func (p *CHWBL) FirstToken(*Flight, time.Time) {}
func (p *CHWBL) Done(f *Flight, _ time.Time)   { p.inflight.done(f) }
func (p *CHWBL) Poll([]Load, time.Time)        {}
func (p *CHWBL) EndSession(string, time.Time)  {}

// vLLM production-stack's router (vllm-project/production-stack),
// src/vllm_router/routers/routing_logic.py, SessionRouter: the session key
// (--session-key, a header) is looked up on a consistent-hash ring of the
// endpoints (uhashring's HashRing, 160 points per node by default), with
// no regard to load; a request without the key goes to the endpoint with
// the lowest QPS (an endpoint with no requests at all first).
const (
	ProdStackVNodes    = 160
	ProdStackQPSWindow = time.Minute
)

// SessionRing is production-stack's session router.
type SessionRing struct {
	ring     *ring
	inflight inflight
	recent   [][]time.Time // request times per endpoint, for the QPS fallback
}

// NewSessionRing returns the router for c's replicas.
func NewSessionRing(c Config) *SessionRing {
	return &SessionRing{ring: newRing(c.Replicas, ProdStackVNodes), inflight: make(inflight, len(c.Replicas)),
		recent: make([][]time.Time, len(c.Replicas))}
}

func (p *SessionRing) Name() string { return ModeProdStack }

// Owner is the endpoint the ring gives key.
func (p *SessionRing) Owner(key string) int {
	return p.ring.owner[p.ring.points[p.ring.search(xxhash.Sum64String(key))]]
}

// Pick implements Policy.
func (p *SessionRing) Pick(r Request) *Flight {
	var i int
	if r.Key != "" {
		i = p.Owner(r.Key)
	} else {
		i = p.lowestQPS(r.Now)
	}
	ts := append(p.recent[i], r.Now)
	k := 0
	for k < len(ts) && r.Now.Sub(ts[k]) > ProdStackQPSWindow {
		k++
	}
	p.recent[i] = ts[k:]
	return p.inflight.pick(i)
}

func (p *SessionRing) lowestQPS(now time.Time) int {
	best, bq := 0, -1
	for i, ts := range p.recent {
		k := 0
		for k < len(ts) && now.Sub(ts[k]) > ProdStackQPSWindow {
			k++
		}
		p.recent[i] = ts[k:]
		if len(p.recent[i]) == 0 {
			return i
		}
		if bq < 0 || len(p.recent[i]) < bq {
			best, bq = i, len(p.recent[i])
		}
	}
	return best
}

func (p *SessionRing) FirstToken(*Flight, time.Time) {}
func (p *SessionRing) Done(f *Flight, _ time.Time)   { p.inflight.done(f) }
func (p *SessionRing) Poll([]Load, time.Time)        {}
func (p *SessionRing) EndSession(string, time.Time)  {}
