package placement

// flagSide marks a binding with side starts pending in Router.side.
const flagSide uint16 = 64

// flagConfirmed marks a binding whose start came on two requests: it is
// the conversation's. Until then the start may be a side request's that
// came first (Claude Code sends a session's title request before its first
// turn), and a new start that recurs replaces it without a restart.
const flagConfirmed uint16 = 128

// sideSlots is how many recent side starts a binding remembers: a start
// that comes back while remembered is the conversation continuing. Two
// let a new start recur across one unrelated side request between its
// two turns (a session-title request sent with the next prompt).
const sideSlots = 2

// sideStarts are the starts of a binding's recent side requests, newest
// first, with the replica each was routed to (its new prefix is cached
// there).
type sideStarts struct {
	start [sideSlots]uint64
	rep   [sideSlots]int32
}

// A side request is a request under a bound conversation's key whose start
// differs from the conversation's: coding agents send, under the session's
// key, requests that are not turns of the conversation (a title for the
// session, a summary, a quota probe, a call to a smaller model). Each has a
// start of its own that does not come back, while a conversation that was
// compacted or cleared sends its new start on every later turn. So a new
// start is first taken for a side request: routed without moving or
// re-binding the conversation (to its replica while that is usable and not
// over the threshold, as its prompt is short; else to the least loaded)
// and, unless the request is lone (one message: no history of its own),
// remembered; when the same start arrives again before a request with
// the conversation's own start does, the conversation has continued with
// it and is restarted (restartAt). A request with the conversation's start
// forgets the remembered ones: they were side requests.

// sideRoute routes a side request with start s for the conversation of
// entry e, bound to bound: the binding is not moved, refreshed or counted
// keyed, and the turn holds no working-set slot. The start is remembered
// when remember (not a lone request). r.mu held.
func (r *Router) sideRoute(e int32, bound *replica, s uint64, remember bool) (Decision, error) {
	p := bound
	if !r.usable(p) || p.running() > r.threshold {
		if p = r.lenientPick(r.leastQueued); p == nil {
			return Decision{}, ErrNoReplica
		}
	}
	if remember {
		r.rememberSide(e, s, p.idx)
	}
	p.n.Side++
	return r.take(p, ReasonSide, nilIdx), nil
}

// rememberSide records s as entry e's newest side start, routed to
// replica rep. r.mu held.
func (r *Router) rememberSide(e int32, s uint64, rep int32) {
	en := &r.b.ents[e]
	if r.side == nil {
		r.side = make(map[uint64]sideStarts)
	}
	var ss sideStarts
	if en.flags&flagSide != 0 {
		ss = r.side[en.hash]
	}
	copy(ss.start[1:], ss.start[:sideSlots-1])
	copy(ss.rep[1:], ss.rep[:sideSlots-1])
	ss.start[0], ss.rep[0] = s, rep
	r.side[en.hash] = ss
	en.flags |= flagSide
}

// recurs reports whether s is one of entry e's remembered side starts, and
// the replica that request went to (nil when gone). r.mu held.
func (r *Router) recurs(e int32, s uint64) (bool, *replica) {
	en := &r.b.ents[e]
	if en.flags&flagSide == 0 {
		return false, nil
	}
	ss := r.side[en.hash]
	for i, v := range ss.start {
		if v == s {
			if j := ss.rep[i]; j >= 0 && int(j) < len(r.reps) && r.reps[j] != nil {
				return true, r.reps[j]
			}
			return true, nil
		}
	}
	return false, nil
}

// forgetSide drops entry e's remembered side starts. r.mu held.
func (r *Router) forgetSide(e int32) {
	en := &r.b.ents[e]
	if en.flags&flagSide != 0 {
		delete(r.side, en.hash)
		en.flags &^= flagSide
	}
}

// A key is not a credential: a session ID travels in clear, and any client
// that knows one can send requests under it with a start of its own. So a
// restart never moves a conversation off a replica that can still take it
// (usable, not marked for a move, its cache not lost): the new start is
// adopted in place, and the start it replaced is kept (entry.prev). A
// request that comes with that start again, with history, is the
// conversation itself going on (the restart was another client's): it
// takes its start back (unrestart) and is routed as any of its turns. A
// conversation that was really compacted never sends its old start again.
// Only a conversation whose replica cannot take it is placed anew, where
// the restarted start's first request went when that one can (its prefix is
// cached there), else by load.

// restartAt makes start s, which recurred, the conversation of entry e
// (bound to bound) and routes its turn (see above): on bound while it can
// take it, else to at, the replica its earlier request with that start went
// to, when at is usable and not over the threshold, else placed anew by
// load. Either way it is counted restarted once, unless the binding's start
// never recurred (a side request placed it) and the turn would stay: then
// the conversation only now shows its start, and restartAt routes nothing
// (sticky): the turn is routed as any of the conversation's turns. r.mu
// held.
func (r *Router) restartAt(e int32, bound, at *replica, s uint64, now int64) (d Decision, sticky bool, err error) {
	en := &r.b.ents[e]
	r.forgetSide(e)
	confirmed := en.flags&flagConfirmed != 0
	if confirmed {
		en.prev = en.start
	}
	en.start, en.prompt = s, 0
	en.flags |= flagConfirmed
	if r.usable(bound) && en.flags&(flagReplace|flagCold) == 0 {
		at = bound
	} else if at == nil || !r.usable(at) || at.running() > r.threshold || (at == bound && en.flags&flagReplace != 0) {
		d, err = r.replace(e, bound, now, ReasonRestarted)
		return d, false, err
	}
	if !confirmed && at == bound {
		// its start never came twice: the conversation only now shows
		// it, and its first request here just computed its prefix
		en.flags &^= flagCold
		return Decision{}, true, nil
	}
	en.flags &^= flagReplace | flagCold
	r.rebind(e, at, now)
	at.n.Restarted++
	d = r.take(at, ReasonRestarted, e)
	if at != bound {
		d.Previous = bound.id
	}
	return d, false, nil
}

// unrestart gives entry e back the start a restart replaced: a request came
// with it (see above). r.mu held.
func (r *Router) unrestart(e int32) {
	en := &r.b.ents[e]
	en.start, en.prev, en.prompt = en.prev, 0, 0
	r.forgetSide(e)
}
