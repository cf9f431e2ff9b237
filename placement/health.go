package placement

import (
	"strings"
	"time"
)

// Cause says why a replica is out of placement. Several can hold at once.
type Cause uint8

// Causes a replica is out for.
const (
	// CausePoll: polling its /metrics failed (see SetPollDown).
	CausePoll Cause = 1 << iota
	// CauseProxy: requests proxied to it failed (dial error, no response
	// headers in time, 5xx, stream cut) and it is cooling down (see
	// Decision.Failed).
	CauseProxy
	// CauseHealth: the proxy's own health checks mark it down (see
	// SetHealthDown).
	CauseHealth
	// CauseAdmin: SetAvailable(false).
	CauseAdmin
)

var causeNames = [...]struct {
	c    Cause
	name string
}{
	{CausePoll, "poll failure"},
	{CauseProxy, "proxy errors"},
	{CauseHealth, "health check"},
	{CauseAdmin, "unavailable"},
}

// Names returns the causes held, e.g. ["poll failure", "proxy errors"].
func (c Cause) Names() []string {
	var out []string
	for _, n := range causeNames {
		if c&n.c != 0 {
			out = append(out, n.name)
		}
	}
	return out
}

// String joins Names with ", "; "" when none holds.
func (c Cause) String() string { return strings.Join(c.Names(), ", ") }

// Defaults of the passive failure signal.
const (
	DefaultFailCooldown    = 5 * time.Second
	DefaultMaxFailCooldown = time.Minute
)

// flagReplace marks a binding whose replica went down since its last turn:
// its next turn is placed anew (ReasonReplaced) even when the replica is
// back by then, so a replica coming back gets conversations by load, not all
// of its old ones at once.
const flagReplace uint16 = 2

// out returns the causes p is out for at now (r.mu held).
func (r *Router) out(p *replica) Cause {
	c := p.down
	if !p.avail {
		c |= CauseAdmin
	}
	if p.coolUntil > r.clock {
		c |= CauseProxy
	}
	return c
}

// orphan marks every binding of p for re-placement on its next turn.
func (r *Router) orphan(p *replica) {
	for e := p.head; e != nilIdx; e = r.b.ents[e].rnext {
		r.b.ents[e].flags |= flagReplace
	}
}

// setDown sets or clears cause c (CausePoll or CauseHealth) on id. Going
// down orphans the replica's bindings. It reports whether anything changed.
func (r *Router) setDown(id string, c Cause, down bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.byID[id]
	if !ok {
		return false
	}
	p := r.reps[i]
	was := p.down&c != 0
	if was == down {
		return false
	}
	if down {
		p.down |= c
		r.orphan(p)
		return true
	}
	p.down &^= c
	if c == CausePoll {
		// it answers polls again after failing them: a restarted server,
		// whose past proxy errors say nothing about the new one
		p.coolUntil, p.failStreak = 0, 0
		p.streak.Store(0)
	}
	return true
}

// SetPollDown marks a replica out (or back) because polling it failed.
// Going out, its bound conversations are placed anew on their next turn.
// Coming back clears its proxy cool-down too (a restarted server). Unknown
// IDs are ignored; it reports whether the state changed.
func (r *Router) SetPollDown(id string, down bool) bool { return r.setDown(id, CausePoll, down) }

// SetHealthDown marks a replica out (or back) because the proxy's health
// checks say it is down; bindings are handled as for SetPollDown. Unknown
// IDs are ignored; it reports whether the state changed.
func (r *Router) SetHealthDown(id string, down bool) bool { return r.setDown(id, CauseHealth, down) }

// Failed reports that the request this Decision routed failed at its replica
// (it could not be reached, sent no response headers in time, answered 5xx
// or cut its stream). The replica is then out for a cool-down of
// Config.FailCooldown, doubled for every further failure without a success
// in between, up to Config.MaxFailCooldown; from the second failure in a
// row its bound conversations are also placed anew on their next turn. Call
// it before Release; afterwards it does nothing. now zero means time.Now().
func (d Decision) Failed(now time.Time) {
	s := d.s
	if s == nil || d.tok == 0 || s.tok.Load() != d.tok {
		return
	}
	s.r.fail(s.rep, unixNanos(now))
}

// Succeeded reports that the request this Decision routed got a response
// from its replica (headers, status below 500): its run of failures ends.
// It takes no lock unless the replica had failures. Call it before Release.
func (d Decision) Succeeded() {
	s := d.s
	if s == nil || d.tok == 0 || s.tok.Load() != d.tok || s.rep.streak.Load() == 0 {
		return
	}
	r, p := s.r, s.rep
	r.mu.Lock()
	p.failStreak = 0
	p.streak.Store(0)
	r.mu.Unlock()
}

func (r *Router) fail(p *replica, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now = r.advance(now)
	p.proxyFails++
	cd := r.cfg.FailCooldown
	for i := 0; i < p.failStreak && cd < r.cfg.MaxFailCooldown; i++ {
		cd *= 2
	}
	cd = min(cd, r.cfg.MaxFailCooldown)
	p.failStreak++
	p.streak.Store(int32(min(p.failStreak, 1<<30)))
	if until := now + int64(cd); until > p.coolUntil {
		p.coolUntil = until
	}
	if p.failStreak == 2 {
		r.orphan(p)
	}
}
