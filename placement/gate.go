package placement

import "time"

// The seam between the router and admission. The router asks admission
// through admission's methods (enterCost, hold, ended, queueNew, …); admission
// acts on the router only through placer, which the Router implements
// here. Both read the fleet they share (fleet.go), and which replicas may
// be chosen (fleet.usable).

// placer is the router as admission acts on it: where a conversation may
// go, and binding it there.
type placer interface {
	// pick returns the best usable replica, asking again with the
	// router's own failure signals ignored when none is (see
	// Router.lenientPick); nil when there is none.
	pick(now int64) *replica
	// bestFor returns the best replica for a conversation of est tokens:
	// the one where it is cheapest to come in, at a cost no greater than
	// its wait (fitted; enter is that cost in seconds), else the best by
	// score; oversize when it fits no replica even empty (see
	// Router.bestFor).
	bestFor(now, est, waited int64) (p *replica, enter float64, fitted, oversize bool)
	// lookup returns the live binding of key hash h (nilIdx: none).
	lookup(h uint64, now int64) int32
	// forget drops the binding e.
	forget(e int32)
	// touched marks the binding e used at now.
	touched(e int32, now int64)
	// place binds key hash h (the conversation's start) to p as a new
	// conversation of est tokens and routes its request, of tokens
	// tokens, there.
	place(h, start uint64, p *replica, est int64, tokens int, now int64) Decision
	// stuck routes a turn of the conversation of e to its replica p.
	stuck(e int32, p *replica, now int64) Decision
	// moved re-binds the conversation of e to p and routes its turn there.
	moved(e int32, p *replica, now int64) Decision
	// expect is the expected time to first token of the turn of d, of
	// tokens tokens (see Router.expect).
	expect(d Decision, tokens int, now int64) time.Duration
}

func (r *Router) pick(now int64) *replica {
	return r.lenientPick(func() *replica { return r.best(now) })
}

func (r *Router) forget(e int32) { r.removeEntry(e) }

func (r *Router) touched(e int32, now int64) { r.toFront(e, now) }

func (r *Router) place(h, start uint64, p *replica, est int64, tokens int, now int64) Decision {
	// its prefill is ahead of the turns routed there after it
	p.addBacklog(int64(tokens)-int64(p.base), now)
	e := r.insert(h, p, now, start)
	r.adm.estimated(e, est)
	p.n.Placed++
	return r.take(p, ReasonPlaced, e)
}

func (r *Router) stuck(e int32, p *replica, now int64) Decision {
	r.keyed++
	return r.stay(e, p, now, ReasonSticky)
}

func (r *Router) moved(e int32, p *replica, now int64) Decision {
	r.keyed++
	p.addBacklog(r.recompute(e, p, 0), now)
	r.rebind(e, p, now)
	p.n.Replaced++
	return r.take(p, ReasonReplaced, e)
}

// released ends a held turn (see admission.hold) at now (0 = the latest
// time seen).
func (r *Router) released(s *slot, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now > 0 {
		now = r.advance(now)
	} else {
		now = r.clock
	}
	s.rep.doneBefore(s.mark, now)
	r.adm.ended(s, now)
}

// SetAdmission turns working-set admission on or off; turned off, every
// waiting conversation is admitted at once.
func (r *Router) SetAdmission(on bool) {
	r.mu.Lock()
	r.cfg.AdmissionOff = !on
	r.adm.reconsider()
	r.mu.Unlock()
}

// AdmitWaiting admits the waiting conversations that fit at now (room
// appears as conversations go quiet, which no request reports) and those
// that have waited AdmitWait. Call it periodically, e.g. after every poll
// round. It returns how many it admitted.
func (r *Router) AdmitWaiting(now time.Time) int {
	n := unixNanos(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.adm.queue) == 0 {
		r.advance(n)
		return 0
	}
	return r.adm.admitQueued(r.advance(n))
}

// Waiting returns the number of conversations waiting for admission.
func (r *Router) Waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.adm.queue)
}

// AdmissionActive reports whether working-set admission is in force (see
// AdmissionSnapshot.Active), without summing the replicas' working sets as
// Admission does.
func (r *Router) AdmissionActive() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adm.on
}

// Admission returns the state of working-set admission, with the
// replicas' working sets and capacities summed, without the rest of
// Snapshot.
func (r *Router) Admission() AdmissionSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.adm.snapshot()
	for _, i := range r.order {
		p := r.reps[i]
		a.add(r.adm.workingSet(p, r.clock), r.capacity(p), r.engineKV(p), r.adm.strained(p), p.paused)
	}
	return a
}
