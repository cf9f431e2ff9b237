package peers

import (
	"time"

	"github.com/cespare/xxhash/v2"
)

// vllm-project/router, src/policies/sticky_least_loaded.rs: a session's
// first request goes to the healthy replica with the fewest active
// sessions, ties broken by rendezvous hashing of "session:replica"
// (highest wins); every later request of the session goes back there
// while the replica is healthy, whatever its load. A session stays active
// until finish_session or until unused for the expiration (2 h,
// VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S); expired sessions are swept at
// most once a minute. Requests without a session ID go to the least
// loaded replica and are not recorded.
const (
	StickyExpiration    = 2 * time.Hour
	StickySweepInterval = time.Minute
)

// StickyLeastLoaded is vllm-project/router's sticky_least_loaded policy.
type StickyLeastLoaded struct {
	names     []string
	sessions  map[string]*stickySession
	active    []int // active sessions per replica
	lastSweep time.Time
	inflight  inflight
}

type stickySession struct {
	replica int
	last    time.Time
}

// NewStickyLeastLoaded returns the policy for c's replicas.
func NewStickyLeastLoaded(c Config) *StickyLeastLoaded {
	return &StickyLeastLoaded{names: c.Replicas, sessions: map[string]*stickySession{},
		active: make([]int, len(c.Replicas)), inflight: make(inflight, len(c.Replicas))}
}

func (p *StickyLeastLoaded) Name() string { return ModeSticky }

// Pick implements Policy.
func (p *StickyLeastLoaded) Pick(r Request) *Flight {
	p.sweep(r.Now)
	if r.Key == "" {
		return p.inflight.pick(p.leastLoaded(string(tokenBytes(r.Tokens, 64))))
	}
	if s, ok := p.sessions[r.Key]; ok {
		s.last = r.Now
		return p.inflight.pick(s.replica)
	}
	i := p.leastLoaded(r.Key)
	p.sessions[r.Key] = &stickySession{replica: i, last: r.Now}
	p.active[i]++
	return p.inflight.pick(i)
}

// Active returns the active sessions per replica.
func (p *StickyLeastLoaded) Active() []int { return append([]int(nil), p.active...) }

func (p *StickyLeastLoaded) leastLoaded(key string) int {
	lo := p.active[0]
	for _, n := range p.active {
		lo = min(lo, n)
	}
	best, bw := -1, uint64(0)
	for i, n := range p.active {
		if n != lo {
			continue
		}
		if w := xxhash.Sum64String(key + ":" + p.names[i]); best < 0 || w > bw {
			best, bw = i, w
		}
	}
	return best
}

func (p *StickyLeastLoaded) sweep(now time.Time) {
	if now.Sub(p.lastSweep) < StickySweepInterval {
		return
	}
	p.lastSweep = now
	for k, s := range p.sessions {
		if now.Sub(s.last) >= StickyExpiration {
			delete(p.sessions, k)
			p.active[s.replica]--
		}
	}
}

func (p *StickyLeastLoaded) FirstToken(*Flight, time.Time) {}
func (p *StickyLeastLoaded) Done(f *Flight, _ time.Time)   { p.inflight.done(f) }
func (p *StickyLeastLoaded) Poll([]Load, time.Time)        {}

// EndSession is POST /finish_session.
func (p *StickyLeastLoaded) EndSession(key string, _ time.Time) {
	if s, ok := p.sessions[key]; ok {
		delete(p.sessions, key)
		p.active[s.replica]--
	}
}

// tokenBytes is the first n tokens as bytes, a stand-in for the request
// text a router hashes when it has no session ID.
func tokenBytes(t []uint32, n int) []byte {
	t = t[:min(n, len(t))]
	b := make([]byte, 0, 4*len(t))
	for _, x := range t {
		b = append(b, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return b
}
