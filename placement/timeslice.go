package placement

// Turn-boundary time-slicing (rule 6b): when a replica's conversations
// outgrow its KV cache, one of them is paused at the end of a turn: it
// leaves its replica's working set, and its next turn waits in the
// admission queue, behind those that waited before it, until it fits
// again. Paused and new conversations share the queue and its order, with
// one exception: a new conversation that fits somewhere starts past paused
// turns that fit nowhere (admitQueued). While everything fits, nothing is
// paused.

const (
	// flagPaused: the conversation was paused at a turn boundary; its next
	// turn waits in the admission queue (timeslice.go).
	flagPaused uint16 = 256
	// minRunsOver: the fewest turns a conversation runs after it was
	// admitted before it may be paused because its replica is over its
	// KV: the turn that paid a prefill to come in, and one that finds it
	// cached, so no admission's prefill goes unused.
	minRunsOver = 2
)

// maybePause pauses the conversation of entry e, whose turn just ended and
// which has run minRunsOver turns since it was admitted (it paid a prefill
// to come in), when its replica's conversations need more KV at once than
// it holds (see demand, by their actual sizes) or its engine queues for KV
// while others stay, and staying costs at least what pausing does: its
// room goes to those that stay. Staying costs the resident conversations
// the recompute of the overflow and the engine's queue its wait, for as
// long as conversations run (evictCost, queueCost); pausing costs this one
// its context computed again (its cache may be gone when it resumes). Where the mean
// of the need overflows, the KV runs short every cycle and staying always
// cost more (sim --matrix --modes default decided alike, every cell, with
// a rule that paused there without comparing). Its wait to
// resume is no cost of the comparison: in a replica that cannot hold
// them all, the turns that do not wait for it wait less (with the
// median paused turn's wait counted, the fleet preset at 40 agents, as
// TestSimFleetTimeSlicing runs it, fell to 57.2 % prefix hits and 4,205
// output tok/min, under that test's floor of 60 % and twice affinity
// alone's 2,643: a long wait made every pause look dear, and the caches
// thrashed). With a quantum set (Config.RotateTurns > 0, the
// deprecated rotate_turns), one that has run it is also paused when the
// first conversation waiting for room is a paused one. a.mu held.
func (a *admission) maybePause(e int32, now int64) {
	en := &a.b.ents[e]
	if a.cfg.RotateTurns < 0 || !a.on || en.busy > 0 || en.flags&flagPaused != 0 || en.runs < minRunsOver {
		return
	}
	rotate := a.cfg.RotateTurns > 0 && int(en.runs) >= a.cfg.RotateTurns && len(a.queue) > 0 && a.queue[0].paused
	if !rotate {
		p := a.reps[en.rep]
		c := a.capacity(p)
		if c <= 0 {
			return
		}
		if !a.pausePays(e, p, now, a.cfg.HighWater*float64(c)) {
			return
		}
	}
	a.setPaused(en, true)
	en.runs = 0
	a.pausedTotal++
	if len(a.queue) > 0 {
		a.admitQueued(now)
	}
}

// pausePays reports whether pausing the conversation of entry e costs no
// more than its staying on p, whose high-water mark is high tokens (see
// maybePause). Staying costs the overflow's recompute (evictCost) and,
// where the engine queues requests for KV while other conversations stay
// there, the queue's wait (queueCost); pausing costs the conversation its
// context computed again. The demand is taken now, by the sizes the
// engine just counted: a figure kept from before this turn grew its
// conversation would rule a pause out that is due. a.mu held.
func (a *admission) pausePays(e int32, p *replica, now int64, high float64) bool {
	stay := 0.0
	if _, load, _ := a.demand(p, 0, 0, now, a.footprint); load > high {
		stay = a.evictCost(p, load-high)
	}
	if a.kvQueued(p) && a.othersResident(e, p, now) {
		stay += a.queueCost(p)
	}
	return stay > 0 && stay >= float64(a.footprint(&a.b.ents[e]))/p.prefillRate()
}

// queueCost is what the requests p's engine holds for KV wait, in seconds,
// while the conversations there all stay: each waits for blocks to free,
// about a turn time (vLLM's scheduler takes a waiting request in when a
// running one ends and its blocks fit), at every cycle of a turn and a
// pause, for as long as conversations run (ran). a.mu held.
func (a *admission) queueCost(p *replica) float64 {
	return float64(p.waiting()) * p.turnTime() * a.cycles(p)
}

// queueTurn queues the turn of the paused conversation of entry e: it
// waits for room as a new conversation does. With the queue full it is
// not refused (its conversation was admitted once): it returns nil and
// the turn runs on its replica. a.mu held.
func (a *admission) queueTurn(req Request, e int32, h uint64, now int64) *Ticket {
	if len(a.queue) >= a.cfg.AdmitQueue {
		return nil
	}
	t := &Ticket{a: a, h: h, start: req.Start, est: a.footprint(&a.b.ents[e]), tokens: req.Tokens, enq: now, paused: true, ready: make(chan struct{})}
	a.queue = append(a.queue, t)
	a.queuedTurns++
	return t
}

// resumeTarget is where the paused conversation of entry e resumes: its
// replica when it fits there again by the actual sizes (see demand; some
// of its cache may be left), else the replica with the most room where it
// fits; nil while it fits nowhere. a.mu held.
func (a *admission) resumeTarget(e int32, now int64) *replica {
	en := &a.b.ents[e]
	fp := a.footprint(en)
	room := func(q *replica) float64 {
		c := a.capacity(q)
		if c <= 0 || !a.usable(q) {
			return -1
		}
		// under the low mark: a conversation resumed at the high one
		// would be paused again after its next turn
		inFlight, load, _ := a.demand(q, fp, fp, now, a.footprint)
		low := (a.cfg.HighWater - AdmitHysteresis) * float64(c)
		return min(low-float64(inFlight), low-load)
	}
	if q := a.reps[en.rep]; room(q) >= 0 {
		return q
	}
	var best *replica
	bestRoom := -1.0
	for _, i := range a.order {
		if q := a.reps[i]; q != a.reps[en.rep] {
			if m := room(q); m > bestRoom {
				best, bestRoom = q, m
			}
		}
	}
	return best
}

// resume admits the paused conversation of entry e on p at now. a.mu held.
func (a *admission) resume(e int32, p *replica, now int64) Decision {
	en := &a.b.ents[e]
	a.setPaused(en, false)
	en.runs = 0
	p.n.Resumed++
	if en.rep == p.idx {
		return a.do.stuck(e, p, now)
	}
	return a.do.moved(e, p, now)
}

// othersResident reports whether conversations other than entry e's are
// resident on p (in flight, or neither paused nor gone quiet). a.mu held.
func (a *admission) othersResident(e int32, p *replica, now int64) bool {
	horizon := now - int64(a.cfg.AdmitWindow)
	seen := 0
	for o := p.head; o != nilIdx; o = a.b.ents[o].rnext {
		en := &a.b.ents[o]
		if stop, skip := p.pastHorizon(en, horizon, &seen); stop {
			break
		} else if skip {
			continue
		}
		if o != e && (en.busy > 0 || !a.quiet(en, now)) {
			return true
		}
	}
	return false
}
