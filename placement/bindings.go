package placement

const nilIdx int32 = -1

const flagActive uint16 = 1

// entry is one binding: 64 bytes. Links are indices into bindings.ents, so
// the garbage collector has no pointers to trace. The global list (gprev,
// gnext) orders every binding by last use for TTL expiry and LRU eviction;
// the replica list (rprev, rnext) orders a replica's bindings the same way
// for counting its active conversations.
type entry struct {
	hash         uint64
	last         int64 // unix nanos of the last turn
	gprev, gnext int32
	rprev, rnext int32
	rep          int32
	flags        uint16
	busy         uint16 // its turns in flight, counted while admission tracks them
	runs         uint16 // turns ended since it was admitted or resumed (timeslice.go)
	start        uint64 // fingerprint of the conversation's start; 0 = unknown
	prev         uint64 // the start a restart replaced (side.go); 0 = none
	prompt       uint32 // prompt tokens of its last finished turn; 0 = none yet
	born         int64  // unix nanos of its first request here or elsewhere (admission.ran)

	// For working-set admission (admission.go): the conversation's context
	// in tokens (the last finished turn's prompt + completion, or an
	// estimate from its request while flagEstimated), the part of it its
	// replica held already when it arrived there (the shared system
	// prompt), and the longest pause between a turn's end and its next
	// turn, in milliseconds (valid with flagGap).
	ctx, shared, gap uint32
}

type bindings struct {
	idx          map[uint64]int32
	ents         []entry
	free         int32 // free entries, chained through gnext
	ghead, gtail int32 // most recent first
	n            int
}

func (b *bindings) init() {
	b.idx = make(map[uint64]int32)
	b.free, b.ghead, b.gtail = nilIdx, nilIdx, nilIdx
}

// lookup returns the live entry for h, removing it when expired.
func (r *Router) lookup(h uint64, now int64) int32 {
	e, ok := r.b.idx[h]
	if !ok {
		return nilIdx
	}
	if now-r.b.ents[e].last > int64(r.cfg.IdleTTL) {
		r.removeEntry(e)
		r.expired++
		return nilIdx
	}
	return e
}

// bind binds h to p, creating or moving the entry, and returns the replica
// a live binding pointed to before when that was another one, and the entry.
func (r *Router) bind(h uint64, p *replica, now int64, start uint64) (previous string, e int32) {
	if e = r.lookup(h, now); e != nilIdx {
		en := &r.b.ents[e]
		if q := r.reps[en.rep]; q != p {
			previous = q.id
		}
		if start != 0 && en.start != start {
			en.start, en.prompt = start, 0
		}
		en.flags &^= flagCold
		r.rebind(e, p, now)
		return previous, e
	}
	return "", r.insert(h, p, now, start)
}

// insert adds a new binding, evicting the least recently used at
// MaxBindings, and returns its entry.
func (r *Router) insert(h uint64, p *replica, now int64, start uint64) int32 {
	for r.b.n >= r.cfg.MaxBindings && r.b.gtail != nilIdx {
		r.removeEntry(r.b.gtail)
		r.evicted++
	}
	var e int32
	if r.b.free != nilIdx {
		e = r.b.free
		r.b.free = r.b.ents[e].gnext
	} else {
		e = int32(len(r.b.ents))
		r.b.ents = append(r.b.ents, entry{})
	}
	r.b.ents[e] = entry{hash: h, last: now, rep: p.idx, gprev: nilIdx, gnext: nilIdx, rprev: nilIdx, rnext: nilIdx, start: start, born: now}
	r.b.idx[h] = e
	r.b.n++
	r.gpushFront(e)
	r.rpushFront(p, e)
	return e
}

// touch marks the entry used at now.
func (r *Router) touch(e int32, now int64) {
	r.b.ents[e].flags &^= flagReplace
	r.toFront(e, now)
}

// toFront sets the entry's last use to now and moves it to the front of
// the global and its replica's lists (as active).
func (r *Router) toFront(e int32, now int64) {
	en := &r.b.ents[e]
	en.last = now
	if r.b.ghead != e {
		r.gunlink(e)
		r.gpushFront(e)
	}
	p := r.reps[en.rep]
	if p.head != e || en.flags&flagActive == 0 {
		r.runlink(p, e)
		r.rpushFront(p, e)
	}
}

// rebind moves the entry to p and marks it used at now.
func (r *Router) rebind(e int32, p *replica, now int64) {
	en := &r.b.ents[e]
	if en.rep == p.idx {
		r.touch(e, now)
		return
	}
	r.runlink(r.reps[en.rep], e)
	en.rep = p.idx
	en.last = now
	en.flags &^= flagReplace | flagCold
	r.gunlink(e)
	r.gpushFront(e)
	r.rpushFront(p, e)
}

func (r *Router) removeEntry(e int32) {
	en := &r.b.ents[e]
	r.gunlink(e)
	r.runlink(r.reps[en.rep], e)
	delete(r.b.idx, en.hash)
	r.forgetSide(e)
	r.b.n--
	*en = entry{gnext: r.b.free}
	r.b.free = e
}

// expireOldest removes up to limit bindings (all when limit < 0) idle for
// longer than IdleTTL at now.
func (r *Router) expireOldest(now int64, limit int) int {
	cut := now - int64(r.cfg.IdleTTL)
	n := 0
	for r.b.gtail != nilIdx && n != limit && r.b.ents[r.b.gtail].last < cut {
		r.removeEntry(r.b.gtail)
		r.expired++
		n++
	}
	return n
}

// expireActive stops counting as active p's bindings last used before cutoff.
func (r *Router) expireActive(p *replica, cutoff int64) {
	for p.activeTail != nilIdx {
		en := &r.b.ents[p.activeTail]
		if en.last >= cutoff {
			return
		}
		en.flags &^= flagActive
		p.active--
		p.activeTail = en.rprev
	}
}

func (r *Router) gpushFront(e int32) {
	en := &r.b.ents[e]
	en.gprev, en.gnext = nilIdx, r.b.ghead
	if r.b.ghead != nilIdx {
		r.b.ents[r.b.ghead].gprev = e
	} else {
		r.b.gtail = e
	}
	r.b.ghead = e
}

func (r *Router) gunlink(e int32) {
	en := &r.b.ents[e]
	if en.gprev != nilIdx {
		r.b.ents[en.gprev].gnext = en.gnext
	} else {
		r.b.ghead = en.gnext
	}
	if en.gnext != nilIdx {
		r.b.ents[en.gnext].gprev = en.gprev
	} else {
		r.b.gtail = en.gprev
	}
	en.gprev, en.gnext = nilIdx, nilIdx
}

// rpushFront adds e at the front of p's list as active.
func (r *Router) rpushFront(p *replica, e int32) {
	en := &r.b.ents[e]
	en.rprev, en.rnext = nilIdx, p.head
	if p.head != nilIdx {
		r.b.ents[p.head].rprev = e
	} else {
		p.tail = e
	}
	p.head = e
	en.flags |= flagActive
	p.active++
	if p.activeTail == nilIdx {
		p.activeTail = e
	}
	p.bindings++
	if en.flags&flagPaused != 0 {
		p.paused++
	}
}

func (r *Router) runlink(p *replica, e int32) {
	en := &r.b.ents[e]
	if en.flags&flagActive != 0 {
		en.flags &^= flagActive
		p.active--
		if p.activeTail == e {
			p.activeTail = en.rprev
		}
	}
	if en.rprev != nilIdx {
		r.b.ents[en.rprev].rnext = en.rnext
	} else {
		p.head = en.rnext
	}
	if en.rnext != nilIdx {
		r.b.ents[en.rnext].rprev = en.rprev
	} else {
		p.tail = en.rprev
	}
	en.rprev, en.rnext = nilIdx, nilIdx
	p.bindings--
	if en.flags&flagPaused != 0 {
		p.paused--
	}
}
