package placement

import (
	"errors"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"
)

// sweepPerRoute is how many expired bindings each Route removes from the
// oldest end, so memory drains even when Sweep is never called.
const sweepPerRoute = 2

// ErrNoReplica is returned by Route when no replica is available.
var ErrNoReplica = errors.New("placement: no replica available")

// Load is the polled state of a replica.
type Load struct {
	Running   int       // requests the engine is running
	Waiting   int       // requests queued in the engine
	KVUsage   float64   // KV cache in use, 0–1
	Reachable bool      // the last poll succeeded; polled numbers are used only when true
	Seen      time.Time // when these numbers were taken
	// KVTokens is the engine's KV cache capacity in tokens (blocks ×
	// block size), 0 when unknown. The last known capacity is kept while
	// later polls do not report one.
	KVTokens int

	// WaitingUnknown and KVUnknown say the engine did not export that
	// figure (its field above is then meaningless). An unknown figure is no
	// information, never a real 0: it does not rank a replica as emptier
	// than one with a known figure (see the package doc, "Unknown figures").
	// An unknown running count changes no decision (Running 0 leaves the
	// router's own in-flight count, which is measured); RunningUnknown is
	// kept so the Load a Snapshot reports says which figures are real.
	RunningUnknown, WaitingUnknown, KVUnknown bool
}

// Request describes one turn to route.
type Request struct {
	Key     string    // conversation key; "" = none
	Pin     string    // replica the client asked for; "" = none
	Parent  string    // parent conversation's key (sub-agent); used when Key is new
	Now     time.Time // zero = time.Now()
	Exclude []string  // replicas not to choose for this request
	// Start is a fingerprint of the conversation's start (model, system
	// prompt, first user message); 0 = unknown. A request whose Key has a
	// binding recorded with another start is a side request (ReasonSide),
	// routed without moving the conversation, unless that start came in a
	// side request before with no turn of the conversation in between: the
	// conversation was compacted or cleared and goes on with it
	// (ReasonRestarted). See side.go.
	Start uint64
	// Lone says the request holds a single message: with a start other
	// than its conversation's it is a side request that never becomes the
	// conversation however often it comes (a title request, a permission
	// classifier's call retried); a conversation's turns after the first
	// carry its history.
	Lone bool
	// Tokens estimates the request's prompt in tokens (e.g. from its
	// body's size); 0 = unknown. Admission counts a conversation with it
	// until the engine reports the context (Feedback).
	Tokens int
	// Replay, when set, is the decision of this request's earlier attempt,
	// which met a connection its replica had closed before any byte of an
	// answer came (the replica never started the turn) and is sent again.
	// The turn was counted with that decision: this routing adds to no
	// counter but the Replays of that attempt's replica. When the replica
	// can still be chosen and the conversation is still bound there (and
	// not to be re-placed), the turn goes back to it with the earlier
	// decision's reason; otherwise it is routed as any turn, uncounted.
	Replay *Decision
}

// Reason says why a replica was chosen.
type Reason uint8

// Reasons returned in Decision.Reason.
const (
	ReasonAffinityOff Reason = iota + 1
	ReasonNoKey
	ReasonSticky
	ReasonPlaced
	ReasonSpilled
	ReasonStayedOverloaded
	ReasonReplaced
	ReasonClientPinned
	ReasonRestarted
	ReasonColdReplaced
	ReasonSide
	// ReasonSpillDeclined: the replica is over the threshold and another
	// could take the turn, but moving it was not expected to bring its
	// first token sooner by SpillMargin (see the package doc, "Spill
	// cost").
	ReasonSpillDeclined
)

// NumReasons bounds the Reason values: every Reason is below it.
const NumReasons = int(ReasonSpillDeclined) + 1

var reasonNames = [...]string{
	ReasonAffinityOff:      "affinity-off",
	ReasonNoKey:            "no-key",
	ReasonSticky:           "sticky",
	ReasonPlaced:           "placed",
	ReasonSpilled:          "spilled",
	ReasonStayedOverloaded: "stayed-overloaded",
	ReasonReplaced:         "re-placed",
	ReasonClientPinned:     "client-pinned",
	ReasonRestarted:        "restarted",
	ReasonColdReplaced:     "cold-replaced",
	ReasonSide:             "side",
	ReasonSpillDeclined:    "spill-declined",
}

// String returns the reason's short name, e.g. "sticky".
func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return "unknown"
}

// Router places conversations on replicas. Create one with NewRouter.
type Router struct {
	fleet           // the replicas, bindings, settings and clock (fleet.go)
	adm   admission // working-set admission (admission.go)

	threshold int
	seed      maphash.Seed
	since     time.Time

	byID map[string]int32 // ID → index
	free []int32          // indices of forgotten replicas, for reuse
	gone int              // known replicas not present
	rr   uint32           // round-robin offset for ties

	requests, keyed, sticky uint64
	expired, evicted        uint64

	inflight atomic.Int64
	slots    slotPool

	side map[uint64]sideStarts // recent side starts of bindings with flagSide, by hash (side.go)

	// the last spill decisions (spill.go), a ring
	spillLog lastN[SpillCost]
}

// NewRouter returns a Router with cfg (defaults filled) and no replicas.
func NewRouter(cfg Config) *Router {
	r := &Router{
		seed:  maphash.MakeSeed(),
		since: time.Now(),
		byID:  make(map[string]int32),
	}
	r.b.init()
	r.adm.fleet, r.adm.do = &r.fleet, r
	r.setConfig(cfg)
	return r
}

func (r *Router) setConfig(cfg Config) {
	r.cfg = cfg.withDefaults()
	r.threshold = r.cfg.threshold()
	r.adm.reconsider()
}

// Reconfigure replaces the policy settings, keeping replicas, bindings and
// counters. Lowering MaxBindings evicts the least recently used at once.
func (r *Router) Reconfigure(cfg Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setConfig(cfg)
	for r.b.n > r.cfg.MaxBindings {
		r.removeEntry(r.b.gtail)
		r.evicted++
	}
}

// Config returns the settings in use, defaults filled in. SpillThreshold
// stays 0 when it is derived (auto), so the result can be passed back to
// Reconfigure unchanged; SpillThreshold() gives the value in use.
func (r *Router) Config() Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

// SpillThreshold returns the threshold in use and whether it was derived
// from MaxNumSeqs (auto).
func (r *Router) SpillThreshold() (n int, auto bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.threshold, r.cfg.SpillThreshold == 0
}

// SetAffinity turns conversation affinity on or off. Bindings are kept.
func (r *Router) SetAffinity(on bool) {
	r.mu.Lock()
	r.cfg.AffinityOff = !on
	r.adm.reconsider()
	r.mu.Unlock()
}

// Affinity reports whether conversation affinity is on.
func (r *Router) Affinity() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.cfg.AffinityOff
}

// SetReplicas sets the replica IDs. New IDs are added as available; IDs not
// in ids are removed, and conversations bound to them are placed anew on
// their next turn (ReasonReplaced). A removed ID that comes back within
// IdleTTL finds its bindings again; after that its state is forgotten.
// Order matters only for round-robin.
func (r *Router) SetReplicas(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exclEpoch++ // marks the replicas named in ids
	mark := r.exclEpoch
	r.order = r.order[:0]
	for _, id := range ids {
		i, ok := r.byID[id]
		if !ok {
			if n := len(r.free); n > 0 {
				i, r.free = r.free[n-1], r.free[:n-1]
			} else {
				i = int32(len(r.reps))
				r.reps = append(r.reps, nil)
			}
			r.reps[i] = &replica{id: id, idx: i, head: nilIdx, tail: nilIdx, activeTail: nilIdx}
			r.byID[id] = i
		}
		p := r.reps[i]
		if p.exclEpoch == mark {
			continue // duplicate ID
		}
		p.exclEpoch = mark
		if !p.present {
			p.present, p.avail = true, true
		}
		r.order = append(r.order, i)
	}
	r.gone = 0
	for _, p := range r.reps {
		if p == nil || p.exclEpoch == mark {
			continue
		}
		if p.present {
			p.present, p.goneAt = false, r.clock
		}
		r.gone++
	}
	r.exclEpoch++
	r.forgetGone()
	r.adm.reconsider()
	if len(r.adm.queue) > 0 {
		r.adm.admitQueued(r.clock) // a replica may have joined
	}
}

// forgetGone drops the replicas that have been absent for longer than
// IdleTTL (as of the latest time seen) and have nothing in flight. Their
// bindings cannot have had a turn since they left (only present replicas
// are chosen), so all of them have expired; they are removed with them.
// Without in-flight requests no Decision refers to the replica any more.
func (r *Router) forgetGone() {
	if r.gone == 0 {
		return
	}
	cut := r.clock - int64(r.cfg.IdleTTL)
	for i, p := range r.reps {
		if p == nil || p.present || p.goneAt >= cut || p.inflight.Load() != 0 {
			continue
		}
		for p.head != nilIdx {
			r.removeEntry(p.head)
			r.expired++
		}
		delete(r.byID, p.id)
		r.reps[i] = nil
		r.free = append(r.free, int32(i))
		r.gone--
	}
}

// SetAvailable marks a replica available or not. Unknown IDs are ignored.
func (r *Router) SetAvailable(id string, ok bool) {
	r.mu.Lock()
	if i, found := r.byID[id]; found {
		r.reps[i].avail = ok
	}
	r.mu.Unlock()
}

// UpdateLoad records polled numbers for a replica. Unknown IDs are ignored.
func (r *Router) UpdateLoad(id string, l Load) {
	r.mu.Lock()
	if i, found := r.byID[id]; found {
		p := r.reps[i]
		p.load = l
		p.pollGen.Add(1)
		p.doneSincePoll.Store(0)
		if (l.KVTokens > 0 && l.KVTokens != p.kvCap) || (l.Reachable && !p.polled) {
			p.kvCap = max(l.KVTokens, p.kvCap)
			p.polled = p.polled || l.Reachable
			r.adm.reconsider()
		}
		if l.Reachable {
			p.sampleBusy()
		}
	}
	r.mu.Unlock()
}

// unixNanos returns t in Unix nanoseconds, the wall clock when t is zero.
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return time.Now().UnixNano()
	}
	return t.UnixNano()
}

// Route chooses the replica for one request and takes an in-flight slot on
// it; call Release on the Decision when the request is done. It returns
// ErrNoReplica when no replica is available. A new conversation that fits
// no replica under admission is placed on the best one at once; Admit
// queues it instead.
func (r *Router) Route(req Request) (Decision, error) {
	d, _, err := r.route(req, false)
	return d, err
}

// Admit is Route with working-set admission's queue: a new conversation
// that fits no replica (see the package doc, "Admission") gets a Ticket to
// wait on instead of a Decision, or ErrQueueFull when AdmitQueue are
// waiting already. Every other request is routed as by Route.
func (r *Router) Admit(req Request) (Decision, *Ticket, error) {
	return r.route(req, true)
}

func (r *Router) route(req Request, queue bool) (Decision, *Ticket, error) {
	// the clock and the hashes need no lock
	t := unixNanos(req.Now)
	var h, parent uint64
	if req.Key != "" {
		h = r.hash(req.Key)
		if req.Parent != "" {
			parent = r.hash(req.Parent)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.advance(t)
	d, tk, err := r.decide(req, h, parent, now, queue)
	if d.s != nil && d.Expect == 0 {
		d.Expect = r.expect(d, req.Tokens, now)
	}
	return d, tk, err
}

// decide routes req at now (route's hashes given). r.mu held.
func (r *Router) decide(req Request, h, parent uint64, now int64, queue bool) (Decision, *Ticket, error) {
	r.exclEpoch++
	for _, id := range req.Exclude {
		if i, ok := r.byID[id]; ok {
			r.reps[i].exclEpoch = r.exclEpoch
		}
	}
	r.expireOldest(now, sweepPerRoute)
	affinity := !r.cfg.AffinityOff && req.Key != ""
	if req.Replay != nil {
		if i, ok := r.byID[req.Replay.Replica]; ok {
			r.reps[i].n.Replays++
		}
		if d, ok := r.again(req, h, now, affinity); ok {
			return d, nil, nil
		}
		// routed anew (the replica went out meanwhile): counted with
		// the first attempt, not again; and never queued, as its first
		// attempt was admitted (a ticket would be counted when admitted,
		// after the counters are put back)
		queue = false
		defer r.restoreCounts(r.saveCounts())
	}

	// Rule: client pin.
	if req.Pin != "" {
		if i, ok := r.byID[req.Pin]; ok && r.usable(r.reps[i]) {
			p := r.reps[i]
			var prev string
			e := nilIdx
			if affinity {
				if e0 := r.lookup(h, now); e0 != nilIdx {
					// a turn as any other: its pause is learnt
					r.adm.arrive(e0, req.Tokens, now)
				}
				prev, e = r.bind(h, p, now, req.Start)
			}
			p.n.ClientPinned++
			d := r.take(p, ReasonClientPinned, e)
			d.Previous = prev
			return d, nil, nil
		}
	}
	if !affinity {
		p := r.lenientPick(r.leastQueued)
		if p == nil {
			return Decision{}, nil, ErrNoReplica
		}
		reason := ReasonNoKey
		if r.cfg.AffinityOff {
			reason = ReasonAffinityOff
			p.n.AffinityOff++
		} else {
			p.n.NoKey++
		}
		return r.take(p, reason, nilIdx), nil, nil
	}

	e := r.lookup(h, now)
	if e == nilIdx {
		return r.placeNew(req, h, parent, now, queue)
	}

	bound := r.reps[r.b.ents[e].rep]
	var again bool
	var at *replica
	if en := &r.b.ents[e]; req.Start != 0 && en.prev != 0 && req.Start == en.prev && !req.Lone {
		// the start a restart replaced: the conversation itself goes on
		// (the restart was another client's, under the same key), a turn
		// as any other (side.go)
		r.unrestart(e)
	}
	if en := &r.b.ents[e]; req.Start != 0 && en.start != 0 && en.start != req.Start {
		// Same key, another start: a side request (side.go), unless the
		// start recurs
		if !req.Lone {
			again, at = r.recurs(e, req.Start)
		}
		if !again {
			d, err := r.sideRoute(e, bound, req.Start, !req.Lone)
			return d, nil, err
		}
	}
	r.adm.arrive(e, req.Tokens, now) // learnt with admission off too
	if r.b.ents[e].flags&flagPaused != 0 {
		if queue && r.adm.on {
			if t := r.adm.queueTurn(req, e, h, now); t != nil {
				return Decision{}, t, nil
			}
		}
		r.setPaused(&r.b.ents[e], false)
	}
	if again {
		// the conversation was compacted or cleared and continues with
		// the new start: its old prefix buys nothing
		d, sticky, err := r.restartAt(e, bound, at, req.Start, now)
		if !sticky {
			return d, nil, err
		}
		// the conversation only now shows its start: a turn of it like
		// any other, below
	}
	if en := &r.b.ents[e]; req.Start != 0 {
		if en.start == 0 {
			en.start = req.Start
		} else {
			en.flags |= flagConfirmed
			if en.flags&flagSide != 0 {
				r.forgetSide(e) // the conversation went on: they were side requests
			}
		}
	}
	if r.b.ents[e].flags&flagCold != 0 && r.usable(bound) && r.b.ents[e].flags&flagReplace == 0 {
		// The engine reported the conversation's cache gone: staying buys
		// nothing, so it is placed by load.
		d, err := r.replace(e, bound, now, ReasonColdReplaced)
		return d, nil, err
	}
	if !r.usable(bound) || r.b.ents[e].flags&flagReplace != 0 {
		// removed, unavailable, excluded, out for a failure, or out since
		// this conversation's last turn: placed anew by load
		d, err := r.replace(e, bound, now, ReasonReplaced)
		return d, nil, err
	}
	r.keyed++
	if bound.running() > r.threshold {
		return r.overThreshold(e, bound, req.Tokens, now), nil, nil
	}
	if k := r.cfg.SpillWaiting; k > 0 && bound.waitingKnown() && bound.waiting() >= k {
		if p := r.spillTarget(e, bound, req.Tokens, now, func(q *replica) bool {
			return q.waitingKnown() && q.waiting() == 0 && q.running() <= r.threshold
		}); p != nil {
			if c, ok := r.pays(e, bound, p, req.Tokens, now); ok {
				return r.spill(e, bound, p, c, now), nil, nil
			}
		}
	}
	return r.stay(e, bound, now, ReasonSticky), nil, nil
}

// overThreshold routes a turn whose replica is over the threshold (rule
// 4): to the other replica not over it where the move costs least, or,
// when every other one is, the cheapest of those, if moving pays (see
// "Spill cost" in the package doc); otherwise it stays. r.mu held.
func (r *Router) overThreshold(e int32, bound *replica, tokens int, now int64) Decision {
	under := true
	p := r.spillTarget(e, bound, tokens, now, func(q *replica) bool { return q.running() <= r.threshold })
	if p == nil {
		under = false
		p = r.spillTarget(e, bound, tokens, now, func(*replica) bool { return true })
	}
	if p == nil {
		bound.n.StayedOverloaded++
		return r.stay(e, bound, now, ReasonStayedOverloaded)
	}
	c, ok := r.pays(e, bound, p, tokens, now)
	if ok {
		return r.spill(e, bound, p, c, now)
	}
	var d Decision
	if under {
		bound.n.SpillDeclined++
		d = r.stay(e, bound, now, ReasonSpillDeclined)
	} else {
		bound.n.StayedOverloaded++
		d = r.stay(e, bound, now, ReasonStayedOverloaded)
	}
	d.Stay, d.Move, d.Evict = c.Stay, c.Move, c.Evict
	return d
}

// placeNew places a new conversation (rule 6): its parent's replica when
// that can take it, else the best replica; under admission only where it
// fits, and when it fits nowhere it waits (queue) or goes to the best
// replica anyway. A sub-agent never waits: its parent was admitted.
func (r *Router) placeNew(req Request, h, parent uint64, now int64, queue bool) (Decision, *Ticket, error) {
	est := r.adm.estimate(req.Tokens)
	var p *replica
	sub := false
	if req.Parent != "" {
		if pe := r.lookup(parent, now); pe != nilIdx {
			sub = true
			if q := r.reps[r.b.ents[pe].rep]; r.usable(q) && q.running() <= r.threshold && r.adm.allows(q, est, now) {
				p = q
			}
		}
	}
	queue = queue && r.adm.on && !sub
	if queue && len(r.adm.queue) > 0 {
		// new conversations start in arrival order: this one waits behind
		// those waiting unless room lets them in now; the turns of paused
		// conversations it may pass (see admitQueued)
		r.adm.admitQueued(now)
		// an earlier request of this conversation waited and was
		// admitted just now: this one follows it
		if d, ok := r.adm.follow(r.lookup(h, now), now); ok {
			return d, nil, nil
		}
		if r.adm.newWaiting() {
			return r.adm.queueNew(req, h, est, now)
		}
	}
	if p == nil {
		var fitted, oversize bool
		if p, _, fitted, oversize = r.bestFor(now, est, 0); p == nil {
			return Decision{}, nil, ErrNoReplica
		}
		if queue && !fitted {
			return r.adm.queueNew(req, h, est, now)
		}
		if oversize {
			r.adm.oversized++
		}
	}
	return r.place(h, req.Start, p, est, req.Tokens, now), nil, nil
}

// bestFor returns the best replica for a conversation of est tokens, whose
// first request has waited waited nanoseconds: under admission the one
// where its coming in costs the resident conversations least (see
// admission.enterCost), at most its further wait (fitted, with that cost
// in seconds), the best by score among equals; else, or when that is
// nowhere, the best by score. nil when no replica can be chosen (see
// lenientPick). oversize: under admission, it fits no replica even empty
// (see cheapest). r.mu held.
func (r *Router) bestFor(now, est, waited int64) (p *replica, enter float64, fitted, oversize bool) {
	if r.adm.on {
		oversize = r.adm.oversize(est)
		if p = r.lenientPick(func() (q *replica) {
			q, enter = r.cheapest(now, est, waited, oversize)
			return q
		}); p != nil {
			return p, enter, true, oversize
		}
	}
	return r.pick(now), 0, false, false
}

// cheapest is bestFor's pick under admission: the usable replica where the
// new conversation's coming in costs least, if that is no more than its
// wait, and that cost. A conversation that fits no replica even empty
// (oversize, see admission.oversize) would wait for ever: it comes in at
// once where it costs least, all the KV in use there pushed out. r.mu
// held.
func (r *Router) cheapest(now, est, waited int64, oversize bool) (*replica, float64) {
	if oversize {
		return r.cheapestBy(now, func(q *replica) float64 {
			return r.adm.evictCost(q, float64(r.adm.inUse(q, now)))
		})
	}
	bound := float64(waited) / 1e9
	return r.cheapestBy(now, func(q *replica) float64 {
		if c := r.adm.enterCost(q, est, now, waited); c <= bound {
			return c
		}
		return math.Inf(1)
	})
}

// spillTarget returns, among the replicas other than from that ok accepts
// and, under admission, on which the conversation of entry e fits, the
// one where moving its turn of tokens tokens costs least (see moveCost),
// the best by placement score among equals. r.mu held.
func (r *Router) spillTarget(e int32, from *replica, tokens int, now int64, ok func(*replica) bool) *replica {
	var fp int64
	if r.adm.on {
		fp = r.adm.projected(&r.b.ents[e])
	}
	p, _ := r.cheapestBy(now, func(q *replica) float64 {
		if q == from || !ok(q) || !r.adm.allows(q, fp, now) {
			return math.Inf(1)
		}
		move, _, _ := r.moveCost(e, q, tokens, now)
		return move
	})
	return p
}

// spill moves the conversation of entry e from its replica to p, where it
// recomputes c.Context tokens.
func (r *Router) spill(e int32, from, p *replica, c SpillCost, now int64) Decision {
	r.rebind(e, p, now)
	p.n.SpillAccepted++
	p.addBacklog(int64(c.Context), now)
	d := r.take(p, ReasonSpilled, e)
	d.Previous, d.Stay, d.Move, d.Evict = from.id, c.Stay, c.Move, c.Evict
	return d
}

// replace places the conversation of entry e, bound to from, anew by load
// and re-binds it, for reason: ReasonReplaced (its replica cannot take it),
// ReasonColdReplaced (its cache there is gone) or ReasonRestarted (it
// started over). The binding's replace and cold marks are cleared. A
// restarted conversation is new, so it does not count as keyed.
func (r *Router) replace(e int32, from *replica, now int64, reason Reason) (Decision, error) {
	// With every replica out for a failure the router inferred itself,
	// its own is as good a try as any, and its cache is there.
	p := from
	if reason != ReasonReplaced || !r.stuckWith(from) {
		// where it fits first: it never waits, but it should not push a
		// replica over its mark when another has room
		var est int64
		if r.adm.on {
			est = r.adm.projected(&r.b.ents[e])
		}
		if p, _, _, _ = r.bestFor(now, est, 0); p == nil {
			return Decision{}, ErrNoReplica
		}
	}
	r.b.ents[e].flags &^= flagReplace | flagCold
	if p != from || reason != ReasonReplaced {
		p.addBacklog(r.recompute(e, p, 0), now)
	}
	r.rebind(e, p, now)
	switch reason {
	case ReasonRestarted:
		p.n.Restarted++
	case ReasonColdReplaced:
		r.keyed++
		p.n.ColdReplaced++
	default:
		r.keyed++
		p.n.Replaced++
	}
	d := r.take(p, reason, e)
	if p != from {
		d.Previous = from.id
	}
	return d, nil
}

// stay keeps the conversation of entry e on its replica p.
func (r *Router) stay(e int32, p *replica, now int64, reason Reason) Decision {
	r.touch(e, now)
	r.sticky++
	p.n.Sticky++
	return r.take(p, reason, e)
}

func (r *Router) hash(key string) uint64 { return maphash.String(r.seed, key) }

// take counts the request and holds an in-flight slot on p for the
// conversation of entry e (nilIdx = none).
func (r *Router) take(p *replica, reason Reason, e int32) Decision {
	r.requests++
	return r.takeSlot(p, reason, e)
}

// takeSlot holds an in-flight slot on p for the conversation of entry e
// (nilIdx = none), counting nothing.
func (r *Router) takeSlot(p *replica, reason Reason, e int32) Decision {
	p.inflight.Add(1)
	r.inflight.Add(1)
	s, tok := r.slots.get(p, r)
	p.probeWith(tok)
	s.mark, s.counted = p.cost.added, p.cost.counted
	p.cost.counted = false
	r.adm.hold(p, e, s)
	return Decision{Replica: p.id, Reason: reason, s: s, tok: tok}
}

// Unbind forgets the conversation's binding; it reports whether one existed.
func (r *Router) Unbind(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.b.idx[r.hash(key)]
	if !ok {
		return false
	}
	r.removeEntry(e)
	if len(r.adm.queue) > 0 {
		r.adm.admitQueued(r.clock) // its room is free
	}
	return true
}

// Bound returns the replica the conversation is bound to, if its binding is
// live as of the latest time seen by Route or Sweep. It does not refresh
// the binding.
func (r *Router) Bound(key string) (replica string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, found := r.b.idx[r.hash(key)]
	if !found || r.clock-r.b.ents[e].last > int64(r.cfg.IdleTTL) {
		return "", false
	}
	return r.reps[r.b.ents[e].rep].id, true
}

// Sweep removes every binding idle for longer than IdleTTL at now and
// returns how many it removed; it also forgets replicas removed for longer
// than IdleTTL. Call it periodically; Route also removes a few expired
// bindings on each call.
func (r *Router) Sweep(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.expireOldest(r.advance(unixNanos(now)), -1)
	r.forgetGone()
	return n
}

// Len returns the number of bindings held (expired ones not yet swept
// included).
func (r *Router) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.b.n
}

// again sends a replayed request (Request.Replay) back to the replica of
// its earlier attempt with that attempt's decision, counting nothing: when
// the replica can still be chosen and, for a keyed request under affinity,
// the conversation is still bound there, neither to be re-placed nor
// paused. r.mu held.
func (r *Router) again(req Request, h uint64, now int64, affinity bool) (Decision, bool) {
	prev := req.Replay
	i, ok := r.byID[prev.Replica]
	if !ok || !r.usable(r.reps[i]) {
		return Decision{}, false
	}
	p := r.reps[i]
	e := nilIdx
	if affinity {
		e = r.lookup(h, now)
		if e == nilIdx || r.reps[r.b.ents[e].rep] != p || r.b.ents[e].flags&(flagReplace|flagCold|flagPaused) != 0 {
			return Decision{}, false
		}
		r.toFront(e, now)
	}
	d := r.takeSlot(p, prev.Reason, e)
	d.Previous, d.Stay, d.Move, d.Evict = prev.Previous, prev.Stay, prev.Move, prev.Evict
	return d, true
}

// routeCounts are the counters a routing adds to: the router's and every
// replica's.
type routeCounts struct {
	requests, keyed, sticky uint64
	n                       []Counters
}

// saveCounts returns the counters a routing adds to, for restoreCounts.
// r.mu held.
func (r *Router) saveCounts() routeCounts {
	c := routeCounts{requests: r.requests, keyed: r.keyed, sticky: r.sticky, n: make([]Counters, len(r.reps))}
	for i, p := range r.reps {
		if p != nil {
			c.n[i] = p.n
		}
	}
	return c
}

// restoreCounts puts back the counters saveCounts returned, undoing what
// the routing in between counted (r.mu held throughout).
func (r *Router) restoreCounts(c routeCounts) {
	r.requests, r.keyed, r.sticky = c.requests, c.keyed, c.sticky
	for i, p := range r.reps {
		if p != nil && i < len(c.n) {
			p.n = c.n[i]
		}
	}
}
