package placement

import (
	"strings"
	"sync/atomic"
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
	// CauseAbandoned: turns sent to it got no response headers until
	// their clients gave up, repeatedly, while other replicas answered
	// (see Decision.Abandoned); it cools down as for proxy errors.
	CauseAbandoned
)

var causeNames = [...]struct {
	c    Cause
	name string
}{
	{CausePoll, "poll failure"},
	{CauseProxy, "proxy errors"},
	{CauseHealth, "health check"},
	{CauseAdmin, "unavailable"},
	{CauseAbandoned, "abandoned turns"},
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
	if p.coolUntil > r.clock || p.probe.Load() != 0 {
		c |= p.coolCause
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
		p.coolUntil = 0
		p.endFailures()
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
// Config.FailCooldown. After it, the next request routed there is a
// probe: until it is answered the replica stays out for every other
// request, and its failure starts another cool-down. A probe answered
// (Succeeded), or released with nothing reported (a proxy without the
// lm_warden handler reports only failures), ends the run; one whose
// client gave up first (Abandoned) says nothing and frees the way for the
// next. A replica that keeps failing thus gets one request per cool-down
// and that request's timeout, however long it stays broken. Its
// conversations keep their binding: a turn that comes while it is out
// moves (ReasonReplaced) and takes its binding along; one that comes after
// finds its cache where it was, since an engine that fails requests keeps
// its cache (one that restarts is seen by the poll and its conversations
// are placed anew). Call it before Release; afterwards it does nothing.
// now zero means time.Now().
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
	if s == nil || d.tok == 0 || s.tok.Load() != d.tok {
		return
	}
	p := s.rep
	p.ab.answered.Add(1)
	if p.streak.Load() == 0 && p.ab.n.Load() == 0 {
		return
	}
	r := s.r
	r.mu.Lock()
	p.endFailures()
	r.mu.Unlock()
}

// endFailures ends p's run of failures: it answered (or restarted). Its
// probe, if one was out, is answered too. r.mu held.
func (p *replica) endFailures() {
	p.failStreak = 0
	p.streak.Store(0)
	p.probe.Store(0)
	p.ab.reset()
}

func (r *Router) fail(p *replica, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p.proxyFails++
	r.failLocked(p, r.advance(now), CauseProxy)
}

// failLocked puts p out for a failure (cause CauseProxy or
// CauseAbandoned) at now: see Decision.Failed. r.mu held.
func (r *Router) failLocked(p *replica, now int64, cause Cause) {
	p.coolCause = cause
	p.failStreak++
	p.streak.Store(int32(min(p.failStreak, 1<<30)))
	p.probe.Store(0)
	if until := now + int64(r.cfg.FailCooldown); until > p.coolUntil {
		p.coolUntil = until
	}
}

// probeWith makes the request of token tok the probe of p when p failed
// since its last answer and no probe is out (see Decision.Failed). r.mu
// held.
func (p *replica) probeWith(tok uint64) {
	if p.failStreak > 0 && p.probe.Load() == 0 {
		p.probe.Store(tok)
	}
}

// probeReleased ends p's run of failures when the request of token tok,
// its probe, ended with nothing reported: as far as the router can tell,
// it was answered (see Decision.Failed).
func (r *Router) probeReleased(p *replica, tok uint64) {
	if p.probe.Load() != tok {
		return
	}
	r.mu.Lock()
	if p.probe.Load() == tok {
		p.endFailures()
	}
	r.mu.Unlock()
}

// abandonState counts the turns a replica left without response headers
// until their clients gave up (Decision.Abandoned), since its last answer.
type abandonState struct {
	n        atomic.Int32  // abandoned turns in a row (written with r.mu held)
	clients  [2]uint64     // hashes of the first two clients among them
	nclients int           // how many of clients are set
	others   uint64        // other replicas' answers when the run began
	answered atomic.Uint64 // answers (Succeeded) ever
}

func (a *abandonState) reset() {
	a.n.Store(0)
	a.nclients = 0
}

// Abandoned reports that the client of the request this Decision routed
// went away before the replica sent any response header. client names the
// client (the conversation's key, else e.g. its address). One abandoned
// turn says nothing about the replica (clients give up, users interrupt),
// so it is not a failure; but a run of them at one replica that spans two
// clients (and holds Config.AbandonAfter turns when that is set), while
// other replicas answered since the first, is taken as the replica's
// failure (CauseAbandoned, cooled down as Failed does; an abandoned probe
// frees the way for the next): a replica whose engine hangs is then found
// even when every client gives up before the proxy's
// response_header_timeout. An answer from the replica (Succeeded) ends
// the run. Call it before Release; afterwards it does nothing. now zero
// means time.Now().
func (d Decision) Abandoned(client string, now time.Time) {
	s := d.s
	if s == nil || d.tok == 0 || s.tok.Load() != d.tok {
		return
	}
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	s.rep.probe.CompareAndSwap(d.tok, 0) // no answer: the next request probes
	if r.cfg.AbandonAfter < 0 {
		return
	}
	r.abandoned(s.rep, r.hash(client), r.advance(unixNanos(now)))
}

// abandoned counts an abandoned turn of client h at p. r.mu held.
func (r *Router) abandoned(p *replica, h uint64, now int64) {
	a := &p.ab
	if a.n.Load() == 0 {
		a.others = r.othersAnswered(p)
		a.clients[0], a.nclients = h, 1
	} else if a.nclients == 1 && a.clients[0] != h {
		a.clients[1], a.nclients = h, 2
	}
	a.n.Add(1)
	if a.nclients < 2 || int(a.n.Load()) < r.cfg.AbandonAfter || r.othersAnswered(p) == a.others {
		return
	}
	a.reset()
	r.failLocked(p, now, CauseAbandoned)
}

// othersAnswered sums the answers of the replicas other than p. r.mu held.
func (r *Router) othersAnswered(p *replica) uint64 {
	var n uint64
	for _, i := range r.order {
		if q := r.reps[i]; q != p {
			n += q.ab.answered.Load()
		}
	}
	return n
}

// ReplicaOut is a replica's out-of-placement state (see Outs).
type ReplicaOut struct {
	ID            string
	Out           Cause     // why it is out; 0 when it is available
	CooldownUntil time.Time // when its failure cool-down ends (zero when none)
	ProxyFailures uint64
}

// Outs appends every present replica's state at the latest time seen to
// dst, without the rest of Snapshot.
func (r *Router) Outs(dst []ReplicaOut) []ReplicaOut {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, i := range r.order {
		p := r.reps[i]
		o := ReplicaOut{ID: p.id, Out: r.out(p), ProxyFailures: p.proxyFails}
		if p.coolUntil > r.clock {
			o.CooldownUntil = time.Unix(0, p.coolUntil)
		}
		dst = append(dst, o)
	}
	return dst
}
