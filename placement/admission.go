package placement

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

const (
	// AdmitHysteresis is how far below the high-water mark a replica's
	// working set must fall, once it reached the mark, before the card
	// stops showing it full (a fraction of its capacity).
	AdmitHysteresis = 0.1
	// residentGaps: a conversation whose pauses between turns are known
	// counts for this many times its longest pause after a turn ends.
	residentGaps = 2
	// peakQuantile of the recent turns' footprints is what a conversation
	// is assumed to grow to (see admission.peak).
	peakQuantile = 0.9
	// peakTurns: recent turns kept for it, the fewest with which the
	// simulation decides the same as with more (256 and 1,024 decided
	// every shape within the seeds' spread; 64 did not)
	peakTurns = 128
	// meanWeight is the weight of the newest observation in the router's
	// exponential means — a replica's hit rate (the share of its predicted
	// cached prefix the engine delivered on a returning turn), its mean
	// turn time and how far a slower turn pulls its prefill rate — so each
	// mean spans about its last meanSpan observations; the hit rate is
	// trusted once it has that many (losing). One weight for all three:
	// in every shape of the simulation, 0.05 or 0.1 for the rate and 8 or
	// 10 for the span decided nothing differently.
	meanWeight = 0.1
	meanSpan   = int(1 / meanWeight)
	// HitsLow: below this hit rate of its returning turns (hits falling) a
	// replica confirms that it evicts its conversations' caches
	// (AdmissionSnapshot.Strained). 0.5 held newcomers back from
	// replicas whose turns found 55 % of their caches (think 20s at 16
	// sessions, first-turn TTFB p95 14 s → 20 s).
	HitsLow = 0.75
	// busyPolls is the span, in polls, of a replica's busy share (an
	// exponential mean); idleBusy the share under which a moment without a
	// turn in flight counts as the replica idling rather than its
	// conversations pausing between turns (from the simulation: replicas
	// whose agents pause 3 s are busy 0.95 of the time, those whose
	// agents pause 20 s about 0.65).
	busyPolls = 50
	idleBusy  = 0.8
)

// ErrQueueFull is returned by Admit when a new conversation fits no replica
// and Config.AdmitQueue conversations are waiting already.
var ErrQueueFull = errors.New("placement: admission queue is full")

// admission is working-set admission and time-slicing (timeslice.go): the
// queue of conversations waiting for room, what it learned of turns and
// pauses, and its counters. The router asks it through its methods; it
// reads the replicas and bindings of the fleet it shares with the router,
// and acts on the router (binding a waiting conversation, a sticky turn)
// only through do.
type admission struct {
	*fleet
	do placer

	on        bool // in force
	queue     []*Ticket
	lastFirst int // context of the last first turn measured

	queued, admittedAfterWait, admittedAtLimit, refused, cancelled uint64
	oversized                                                      uint64 // placed at once: fitted no replica even empty
	waitedNanos                                                    uint64
	// conversations paused at a turn boundary, their turns queued, and how
	// long the last of those waited, in milliseconds (timeslice.go)
	pausedTotal, queuedTurns uint64
	pausedWaits              recent

	// the last admissions the wait candidate's comparison decided
	// (absorbs), for the card
	admitLog lastN[AdmitCost]

	turnFP recent // footprints of recent turns (peak)
	gaps   recent // recent pauses between turns, in milliseconds
	ages   recent // conversations' ages at their recent turns' ends, in milliseconds (ran)
}

const (
	// flagIdle: the conversation's last turn has ended (its entry's last is
	// then that end), so its next turn measures a pause.
	flagIdle uint16 = 8
	// flagGap: gap holds a measured pause.
	flagGap uint16 = 16
	// flagEstimated: ctx is an estimate from the request, not the
	// engine's count.
	flagEstimated uint16 = 32
)

// admissionReason reports whether admission is configured on and in force,
// and why not: in force while every replica polled so far exported its KV
// capacity (or kv_tokens gives it), and at least one did. A replica not
// polled yet (just added) is not chosen for new conversations until its
// capacity is known. a.mu held.
func (a *admission) admissionReason() (active bool, why string) {
	switch {
	case a.cfg.AdmissionOff:
		return false, "admission is off"
	case a.cfg.AffinityOff:
		return false, "affinity is off"
	case len(a.order) == 0:
		return false, "no replicas"
	}
	known := 0
	for _, i := range a.order {
		p := a.reps[i]
		switch {
		case a.capacity(p) > 0:
			known++
		case p.polled:
			return false, fmt.Sprintf("the KV capacity of replica %s is unknown (it exports no vllm:cache_config_info); set kv_tokens", p.id)
		}
	}
	if known == 0 {
		return false, "no replica has been polled yet"
	}
	return true, ""
}

// reconsider recomputes whether admission is in force; when it no
// longer is, every waiting conversation is admitted at once. a.mu held.
func (a *admission) reconsider() {
	a.on, _ = a.admissionReason()
	if !a.on && len(a.queue) > 0 {
		for len(a.queue) > 0 {
			a.admitTicket(a.queue[0], nil, a.clock, false)
		}
	}
}

// projected is what the conversation of en is counted with: its footprint,
// or what conversations grow to (peak), whichever is larger. Counting
// conversations at what they grow to keeps a replica from taking new ones
// while those it holds are young, only to run out of KV as they grow.
func (a *admission) projected(en *entry) int64 {
	return max(a.footprint(en), a.peak())
}

// recent keeps the last peakTurns figures of a kind (turn footprints,
// pauses) and their peakQuantile, computed when asked after a change.
type recent struct {
	v [peakTurns]uint32
	n int
	q int64 // the quantile, -1 when to be computed
}

func (rc *recent) add(x int64) {
	rc.v[rc.n%peakTurns] = uint32(min(max(x, 0), 1<<32-1))
	rc.n++
	rc.q = -1
}

// quantile is the peakQuantile of the figures kept (kept until the next
// add); 0 before any.
func (rc *recent) quantile() int64 {
	if rc.q < 0 {
		rc.q = rc.at(peakQuantile)
	}
	return rc.q
}

// at is the q-quantile (0 < q ≤ 1) of the figures kept; 0 before any.
func (rc *recent) at(q float64) int64 {
	n := min(rc.n, peakTurns)
	if n == 0 {
		return 0
	}
	buf := rc.v
	v := buf[:n]
	slices.Sort(v)
	return int64(v[min(n-1, int(q*float64(n)))])
}

// peak is the peakQuantile of the footprints of the last peakTurns turns
// the engine measured: what a conversation is expected to hold once it has
// grown (0 before any turn was measured). Turns late in their conversation
// hold more, so a high quantile approximates the size conversations reach.
// a.mu held.
func (a *admission) peak() int64 { return a.turnFP.quantile() }

// resident is how long after its last turn ended the conversation still
// counts in its replica's working set: twice its longest pause between
// turns, or, before it paused, twice what conversations pause (the 90th
// percentile of recent pauses), at most AdmitWindow; AdmitWindow before any
// pause was seen. A conversation whose pauses are milliseconds (a client
// in a closed loop) stops counting milliseconds after its turn: quiet for
// much longer than it has ever paused, it has most likely ended, and what
// its cache would save is then nothing. a.mu held.
func (a *admission) resident(en *entry) int64 {
	w := int64(a.cfg.AdmitWindow)
	var g int64
	switch {
	case en.flags&flagGap != 0:
		g = int64(en.gap)
	case a.gaps.n > 0:
		g = a.gaps.quantile() // what conversations pause
	default:
		return w
	}
	return min(w, residentGaps*g*int64(time.Millisecond))
}

// quiet reports whether the conversation of en, with no turn in flight,
// no longer counts on its replica at now: paused (timeslice.go), or quiet
// past its resident time. a.mu held.
func (a *admission) quiet(en *entry, now int64) bool {
	return en.flags&flagPaused != 0 || now-en.last > a.resident(en)
}

// workingSet is p's resident working set at now, in tokens: the footprints
// of the conversations in flight there and of those whose last turn ended
// within their resident time, plus the part they share (the system prompt,
// held once). a.mu held.
func (a *admission) workingSet(p *replica, now int64) int64 {
	ws, base := a.residentSet(p, now)
	return ws + base
}

// residentSet is workingSet as the conversations' own parts and the shared
// part apart. a.mu held.
func (a *admission) residentSet(p *replica, now int64) (own, shared int64) {
	ws := p.busyFP
	f, peak := a.fleet, a.peak()
	ents := f.b.ents
	horizon := now - int64(f.cfg.AdmitWindow)
	for e := p.head; e != nilIdx; e = ents[e].rnext {
		en := &ents[e]
		if en.last < horizon {
			break
		}
		if en.busy > 0 || a.quiet(en, now) {
			continue // in flight (counted in busyFP), paused, or gone quiet
		}
		ws += max(f.footprint(en), peak) // projected
	}
	if ws == 0 {
		return 0, 0
	}
	return ws, int64(p.base)
}

// enterCost is what a new conversation of est tokens costs p's resident
// conversations, in seconds, by coming in there at now: 0 where p holds
// nothing yet, sits idle by its engine's figures (see idle), or its KV
// holds what its conversations and the new one need at the same time;
// where only the deviation of that need overflows, the recompute its
// coming in forces on them (see absorbs); +Inf where it may not come in
// now: p's capacity is not known yet, the mean of that need overflows,
// its engine queues, or the turns in flight there do not leave its first
// request room. waited (nanoseconds its first request has waited) bounds
// the work: a recompute known to exceed it is returned without the last
// check. The part p already shares among its conversations (the system
// prompt) is assumed shared by the new one too when est holds it; a
// conversation whose first request is shorter than that part cannot hold
// it (another client's), and counts whole. It updates p's full state for
// the card. a.mu held.
func (a *admission) enterCost(p *replica, est, now, waited int64) float64 {
	c := a.capacity(p)
	if c <= 0 {
		return math.Inf(1) // not polled yet: its room is not known
	}
	own, base := a.residentSet(p, now)
	ws := own + base
	first := uncachedStart(est, base)
	est = max(first, a.peak())
	high := a.markFull(p, ws, c)
	// everything counted whole fits: so it does at any share (absorbs
	// would say so, at the cost of another walk of the resident set)
	if ws == 0 || ws+est <= high || a.idle(p, now) {
		return 0
	}
	return a.absorbs(p, first, est, now, high, waited)
}

// uncachedStart is the part of a new conversation's first request of est
// tokens that a replica sharing base tokens among its conversations (the
// system prompt) does not hold: est less base when est holds it, else all
// of est (a request shorter than the shared part is another client's).
func uncachedStart(est, base int64) int64 {
	if est > base {
		return est - base
	}
	return est
}

// absorbs is enterCost where the new conversation does not fit counted
// whole: it compares what p's conversations need at the same time, now
// and as they come and go, with p's high-water mark high.
//
// Now: the new conversation's first turn (first tokens) beside the turns
// in flight there at their present sizes: it runs beside them, and where
// they do not fit together the engine preempts one (+Inf). As they come
// and go: each conversation (the new one at est, what conversations grow
// to) has a turn in flight a share of the time, turn/(turn + pause), with
// turn p's mean turn time (DefaultTurnTime before one ended) and pause the
// conversation's longest pause between turns (what conversations pause,
// before it paused); the KV they need at once is then on average Σ size ×
// share (the mean), and it must hold that plus one standard deviation
// (Σ size² × share × (1 − share)), or all of them whole where that is
// less: then it costs nothing. Without pauses every share is 1 and this
// is the working-set rule itself.
//
// Where only the deviation overflows — the mean fits, so the KV runs
// short only at moments when more of them are in flight than on average —
// coming in costs the resident conversations the recompute of what the
// overflow pushes out of the cache each time they come back, for as long
// as conversations run (evictCost), set against the new one's further
// wait by fits: the wait it has shown (waited: a conversation that has
// waited w is, with nothing else known, as likely as not to wait w more).
// It is a cost only where coming in is feasible at once: the engine
// queues nothing (by its own account its KV and batch have room: no
// request waiting) and the resident conversations at their present
// sizes, with its first request, fit; else +Inf. Where the mean itself
// overflows, the KV runs short every cycle and time-slicing would pause a
// conversation for it: +Inf. a.mu held.
func (a *admission) absorbs(p *replica, first, est, now, high, waited int64) float64 {
	inFlight, load, mean := a.demand(p, first, est, now, a.projected)
	over := load - float64(high)
	switch {
	case inFlight > high:
		return math.Inf(1)
	case over <= 0:
		return 0
	case mean > float64(high), p.waitingKnown() && p.waiting() > 0:
		return math.Inf(1)
	}
	evict := a.evictCost(p, over)
	if evict > float64(waited)/1e9 {
		return evict // it waits: the last check cannot change that
	}
	if _, present, _ := a.demand(p, first, first, now, a.footprint); present > float64(high) {
		return math.Inf(1)
	}
	return evict
}

// evictCost is what over tokens of p's resident conversations' caches
// pushed out of its KV cost them, in seconds, while a new conversation
// placed there stays: they compute them again at p's rate each time they
// come back (a turn and a pause apart), for as long as conversations run
// (ran). a.mu held.
func (a *admission) evictCost(p *replica, over float64) float64 {
	return over / p.prefillRate() * a.cycles(p)
}

// cycles is how many times a conversation on p comes back, a turn and a
// pause apart, while conversations run (ran). a.mu held.
func (a *admission) cycles(p *replica) float64 {
	return a.ran() / (p.turnTime() + float64(a.gaps.quantile())/1e3)
}

// ran is how long conversations run, in seconds: the peakQuantile of their
// ages (since their first request) at the ends of the recent turns, as
// peak is what they grow to; AdmitWindow before meanSpan turns ended.
// a.mu held.
func (a *admission) ran() float64 {
	if a.ages.n < meanSpan {
		return a.cfg.AdmitWindow.Seconds()
	}
	return float64(a.ages.quantile()) / 1e3
}

// demand is the KV p's conversations need at once (see absorbs), with a
// new one whose first request is first tokens and whose size is est (0:
// none): the turns in flight now at their present sizes with the new
// first request, and the sizes (by size) of all resident conversations
// and the new one at their shares of the time in flight plus one standard
// deviation, at most all of them whole. Paused conversations and those
// gone quiet do not count. A turn in flight counts however long ago it was
// sent: in an engine so full that turns take longer than AdmitWindow, a
// walk that stopped at the window's horizon would miss the turns holding
// its KV, find room there and overfill it further (the fleet at 40
// sessions did so until every turn recomputed its history); the walk goes
// past the horizon until it has met the replica's heldN turns. a.mu held.
func (a *admission) demand(p *replica, first, est, now int64, size func(*entry) int64) (inFlight int64, load, mean float64) {
	turn := p.turnTime()
	typical := float64(a.gaps.quantile()) / 1e3
	inFlight = int64(p.base) + first
	sn := turn / (turn + typical)
	avg := float64(p.base) + float64(est)*sn
	whole := float64(p.base) + float64(est)
	vr := float64(est) * float64(est) * sn * (1 - sn) // the variance
	f := a.fleet
	ents := f.b.ents
	horizon := now - int64(f.cfg.AdmitWindow)
	seen := 0
	for e := p.head; e != nilIdx; e = ents[e].rnext {
		en := &ents[e]
		if stop, skip := p.pastHorizon(en, horizon, &seen); stop {
			break
		} else if skip {
			continue
		}
		if en.busy > 0 {
			inFlight += f.footprint(en) // what its turn holds now
		} else if a.quiet(en, now) {
			continue
		}
		g := typical
		if en.flags&flagGap != 0 {
			g = float64(en.gap) / 1e3
		}
		sz, sh := float64(size(en)), turn/(turn+g)
		avg += sz * sh
		whole += sz
		vr += sz * sz * sh * (1 - sh)
	}
	return inFlight, min(whole, avg+math.Sqrt(vr)), avg
}

// pastHorizon is how a walk of p's conversations, most recent first,
// takes en: a conversation last used before horizon is skipped (skip),
// and the walk may stop there (stop) once it has met every turn in flight
// on p (heldN; seen counts them). A turn in flight counts however long ago
// it was sent (see demand).
func (p *replica) pastHorizon(en *entry, horizon int64, seen *int) (stop, skip bool) {
	if en.busy > 0 {
		*seen++
		return false, false
	}
	if en.last < horizon {
		return *seen >= p.heldN, true
	}
	return false, false
}

// idle reports whether p sits idle: nothing in flight to it through this
// router, nothing waiting in its engine, the engine's KV gauge below the
// high-water mark, and fewer than idleBusy of the recent polls found a
// turn in flight there (a replica whose conversations only pause between
// turns for seconds is busy, not idle). An idle replica takes a new
// conversation whatever the working-set estimate says: the estimate
// predicts evictions of paused conversations' caches, which may not
// happen, while a conversation held back from an idle replica loses its
// compute time for certain. A figure the engine does not export vetoes
// nothing. The router's in-flight count covers the poll's lag: once a
// conversation was placed there, the replica is no longer idle. A replica
// losing its conversations' caches already (see losing) idles whatever
// its busy share: the moments between its turns protect nothing that
// holding a newcomer back would save. a.mu held.
func (a *admission) idle(p *replica, now int64) bool {
	if p.inflight.Load() != 0 || (p.busy >= idleBusy && !p.losing()) {
		return false
	}
	if p.waitingKnown() && p.waiting() > 0 {
		return false
	}
	return !p.kvKnown() || p.kv() < a.cfg.HighWater
}

// sampleBusy updates p's busy share at a poll. a.mu held.
func (p *replica) sampleBusy() {
	var b float64
	if p.inflight.Load() > 0 {
		b = 1
	}
	if p.busyN < busyPolls {
		p.busyN++
	}
	runningMean(&p.busy, b, uint64(p.busyN), busyPolls)
}

// runningMean moves the mean m to x, the nth observation (n ≥ 1): the
// plain mean of the first span observations, then an exponential mean over
// about the last span.
func runningMean(m *float64, x float64, n uint64, span int) {
	*m += (x - *m) / float64(min(n, uint64(span)))
}

// oversize reports whether a new conversation of est tokens fits no
// usable replica even with nothing else resident: its part a replica does
// not share already (see uncachedStart) over the high-water mark of every
// replica's capacity. Waiting cannot make room for it: it comes in at
// once where that pushes out the least (see Router.cheapest). a.mu held.
func (a *admission) oversize(est int64) bool {
	found := false
	for _, i := range a.order {
		p := a.reps[i]
		if !a.usable(p) {
			continue
		}
		found = true
		c := a.capacity(p)
		if c <= 0 || uncachedStart(est, int64(p.base)) <= int64(a.cfg.HighWater*float64(c)) {
			return false
		}
	}
	return found
}

// inUse is the KV p holds now, in tokens: by the engine's gauge where
// known (engineKV), else by the working set. a.mu held.
func (a *admission) inUse(p *replica, now int64) int64 {
	if kv := a.engineKV(p); kv >= 0 {
		return kv
	}
	return a.workingSet(p, now)
}

// hit records the share of its predicted cached prefix a returning turn
// on p found. a.mu held.
func (p *replica) hit(share float64) {
	if p.hitsN == 0 {
		p.hits = share
	} else {
		p.hits += (share - p.hits) * meanWeight
	}
	p.hitsN++
}

// losing reports whether the turns returning to p find less than HitsLow
// of their caches, measured over at least meanSpan of them: its
// conversations' caches are evicted. It confirms the overcommit warning
// (strained), and with admission holding newcomers back it says the wait
// buys no cache hit (idle). a.mu held.
func (p *replica) losing() bool { return p.hitsN >= uint64(meanSpan) && p.hits < HitsLow }

// markFull updates p's hysteresis state (full) for its working set ws of
// capacity c and returns the high-water mark in tokens. a.mu held.
func (a *admission) markFull(p *replica, ws, c int64) (high int64) {
	high = int64(a.cfg.HighWater * float64(c))
	low := int64((a.cfg.HighWater - AdmitHysteresis) * float64(c))
	switch {
	case ws >= high:
		p.full = true
	case ws <= low:
		p.full = false
	}
	return high
}

// estimate is the context assumed for a new conversation whose request
// says tokens (0 = unknown: the last first turn the engine measured).
func (a *admission) estimate(tokens int) int64 {
	if tokens > 0 {
		return int64(tokens)
	}
	return int64(a.lastFirst)
}

// arrive notes a turn of the bound conversation e arriving at now: the
// pause since its previous turn ended, and a larger estimate of its
// context while the engine has not measured it. a.mu held.
func (a *admission) arrive(e int32, tokens int, now int64) {
	en := &a.b.ents[e]
	if en.flags&flagIdle != 0 {
		en.flags &^= flagIdle
		g := uint32(max(min((now-en.last)/int64(time.Millisecond), 1<<32-1), 0))
		a.gaps.add(int64(g))
		if en.flags&flagGap == 0 || g > en.gap {
			en.gap = g
			en.flags |= flagGap
		}
	}
	if tokens > 0 && en.flags&flagEstimated != 0 && uint32(min(tokens, 1<<32-1)) > en.ctx {
		en.ctx = uint32(min(tokens, 1<<32-1))
	}
}

// hold counts the turn routed to p as in flight for the working set of
// the conversation of entry e. It does whether admission is on or off, so
// the working set means the same in both and admission switched on starts
// from what was learned. a.mu held.
func (a *admission) hold(p *replica, e int32, s *slot) {
	s.ent = nilIdx
	if e == nilIdx {
		return
	}
	en := &a.b.ents[e]
	fp := a.projected(en)
	en.busy++
	p.busyFP += fp
	p.heldN++
	s.ent, s.hash, s.fp = e, en.hash, fp
}

// ended ends a held turn (see hold) at now: the conversation's last turn
// ended then, and room may have appeared for a waiting one. a.mu held.
func (a *admission) ended(s *slot, now int64) {
	s.rep.busyFP -= s.fp
	s.rep.heldN--
	ended := nilIdx
	if int(s.ent) < len(a.b.ents) {
		en := &a.b.ents[s.ent]
		if en.hash == s.hash && en.busy > 0 {
			en.busy--
			if en.busy == 0 {
				en.flags |= flagIdle
				if en.runs < 1<<16-1 {
					en.runs++
				}
				// the pause is measured from the turn's end, with
				// admission on or off
				a.refresh(s.ent, now)
				a.ages.add((now - en.born) / int64(time.Millisecond))
				ended = s.ent
			}
		}
	}
	s.ent = nilIdx
	if len(a.queue) > 0 {
		a.admitQueued(now)
	}
	if ended != nilIdx {
		a.maybePause(ended, now)
	}
}

// refresh marks entry e used at now (when later than its last use) without
// touching its flags.
func (a *admission) refresh(e int32, now int64) {
	if now > a.b.ents[e].last {
		a.do.touched(e, now)
	}
}

// Ticket is a new conversation's first request waiting for admission: it
// fitted on no replica when it arrived. Wait for Ready, then take the
// Decision; or Cancel it when the client goes away, and Force it when it
// has waited long enough.
type Ticket struct {
	a       *admission
	h       uint64
	start   uint64
	est     int64
	tokens  int   // the request's tokens (Request.Tokens)
	enq, at int64 // when it was queued and admitted (Router clock)
	ready   chan struct{}
	dec     Decision
	err     error
	state   uint8 // ticketWaiting, ticketAdmitted, ticketCancelled
	forced  bool
	paused  bool // the turn of a paused conversation (timeslice.go)
}

// Paused reports whether the ticket holds the turn of a conversation
// paused at a turn boundary (timeslice.go), not a new conversation's
// first request.
func (t *Ticket) Paused() bool { return t.paused }

const (
	ticketWaiting uint8 = iota
	ticketAdmitted
	ticketCancelled
)

// Ready is closed when the ticket's request was admitted (or found no
// replica at all); Decision then returns the outcome.
func (t *Ticket) Ready() <-chan struct{} { return t.ready }

// Decision returns the admitted request's decision, or ErrNoReplica. Call
// it after Ready is closed; the caller owns the Decision (Release it).
func (t *Ticket) Decision() (Decision, error) {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	return t.dec, t.err
}

// Waited returns how long the ticket waited: until its admission, or until
// now (the Router's latest time) while it waits.
func (t *Ticket) Waited() time.Duration {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	end := t.at
	if t.state != ticketAdmitted {
		end = t.a.clock
	}
	return time.Duration(max(end-t.enq, 0))
}

// Forced reports whether the ticket was admitted because it had waited
// AdmitWait (or was forced), rather than because room appeared.
func (t *Ticket) Forced() bool {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	return t.forced
}

// Cancel takes a waiting ticket out of the queue (its client went away)
// and reports true. When the ticket was admitted already it reports false:
// the caller then owns the Decision and must Release it.
func (t *Ticket) Cancel() bool {
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.state != ticketWaiting {
		return false
	}
	t.state = ticketCancelled
	a.unqueue(t)
	a.cancelled++
	// a cancelled head may have been holding back the ones behind it
	if len(a.queue) > 0 {
		a.admitQueued(a.clock)
	}
	return true
}

// Force admits a waiting ticket at once on the best replica, whether the
// conversation fits there or not (it has waited AdmitWait). now zero means
// time.Now(). It does nothing to a ticket no longer waiting.
func (t *Ticket) Force(now time.Time) {
	a := t.a
	n := unixNanos(now)
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.state != ticketWaiting {
		return
	}
	a.admitTicket(t, nil, a.advance(n), true)
}

// Deadline is when the ticket reaches AdmitWait (as configured now).
func (t *Ticket) Deadline() time.Time {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	return time.Unix(0, t.enq+int64(t.a.cfg.AdmitWait))
}

func (a *admission) unqueue(t *Ticket) {
	if i := slices.Index(a.queue, t); i >= 0 {
		a.queue = slices.Delete(a.queue, i, i+1)
	}
}

// admitTicket admits t on p, or on the best replica when p is nil; forced
// counts it as admitted at AdmitWait. A ticket whose key is bound by now
// (an earlier request of the same conversation was admitted) follows its
// binding. With no replica at all the ticket gets ErrNoReplica. a.mu held.
func (a *admission) admitTicket(t *Ticket, p *replica, now int64, forced bool) {
	a.unqueue(t)
	t.state, t.at, t.forced = ticketAdmitted, now, forced
	defer close(t.ready)
	defer func() {
		if t.dec.s != nil {
			t.dec.Expect = a.do.expect(t.dec, t.tokens, now)
		}
	}()
	if e := a.do.lookup(t.h, now); e != nilIdx && a.b.ents[e].flags&flagPaused != 0 {
		if p == nil || !a.usable(p) {
			if p = a.reps[a.b.ents[e].rep]; !a.usable(p) {
				p = a.do.pick(now)
			}
		}
		if p != nil {
			t.dec = a.resume(e, p, now)
			a.countAdmitted(t, forced)
			a.pausedWaits.add((now - t.enq) / int64(time.Millisecond))
			return
		}
		a.do.forget(e)
	} else if d, ok := a.follow(e, now); ok {
		t.dec = d
		a.countAdmitted(t, forced)
		return
	}
	if p == nil {
		p = a.do.pick(now)
	}
	if p == nil {
		t.err = ErrNoReplica
		return
	}
	t.dec = a.do.place(t.h, t.start, p, t.est, t.tokens, now)
	a.countAdmitted(t, forced)
}

// follow routes a request of the conversation of entry e (nilIdx: none)
// that a waiting request of it got bound meanwhile: sticky to its replica
// when usable; otherwise the binding is dropped and ok is false. a.mu
// held.
func (a *admission) follow(e int32, now int64) (d Decision, ok bool) {
	if e == nilIdx {
		return Decision{}, false
	}
	if q := a.reps[a.b.ents[e].rep]; a.usable(q) {
		return a.do.stuck(e, q, now), true
	}
	a.do.forget(e)
	return Decision{}, false
}

func (a *admission) countAdmitted(t *Ticket, forced bool) {
	if forced {
		a.admittedAtLimit++
	} else {
		a.admittedAfterWait++
	}
	a.waitedNanos += uint64(max(t.at-t.enq, 0))
}

// estimated records est as the new binding e's context until the engine
// measures it.
func (a *admission) estimated(e int32, est int64) {
	en := &a.b.ents[e]
	en.ctx = uint32(min(max(est, 0), 1<<32-1))
	en.flags |= flagEstimated
}

// allows reports whether a conversation of est tokens may go to p at once:
// its coming in costs p's resident conversations nothing (see enterCost),
// or admission is not in force. a.mu held.
func (a *admission) allows(p *replica, est, now int64) bool {
	return !a.on || a.enterCost(p, est, now, 0) == 0
}

// admitQueued admits waiting tickets in arrival order; a ticket that has
// waited AdmitWait is admitted on the best replica. A new conversation
// that fits nowhere holds back every ticket behind it. The turn of a
// paused conversation that fits nowhere (it resumes by its actual size,
// and preferably where its cache may be left) holds back the paused ones
// behind it, not the new conversations: one that fits now starts in room
// the paused turn cannot use yet, instead of waiting with the engines
// idle (sim --preset fleet --compact-share 0, 16 agents: their first
// turns waited 75 s at the median behind paused ones, 7 s after, over
// three seeds, output and hits within the seeds' spread). a.mu held.
func (a *admission) admitQueued(now int64) int {
	n := 0
	pausedHeld := false // a paused turn ahead fits nowhere
	for i := 0; i < len(a.queue); {
		t := a.queue[i]
		if now-t.enq >= int64(a.cfg.AdmitWait) {
			a.admitTicket(t, nil, now, true)
			n++
			continue
		}
		if e := a.do.lookup(t.h, now); e != nilIdx {
			var p *replica // a bound conversation follows its binding
			if a.b.ents[e].flags&flagPaused != 0 {
				if !pausedHeld {
					p = a.resumeTarget(e, now)
				}
				if p == nil {
					pausedHeld = true
					i++
					continue
				}
			}
			if p != nil || a.usable(a.reps[a.b.ents[e].rep]) {
				a.admitTicket(t, p, now, false)
				n++
				continue
			}
		}
		p, enter, fitted, oversize := a.do.bestFor(now, t.est, now-t.enq)
		if !fitted {
			break
		}
		a.admitTicket(t, p, now, false)
		if oversize {
			a.oversized++
		} else if enter > 0 && t.dec.s != nil {
			// let in by the comparison with its wait: the card and the
			// route header show both costs
			c := AdmitCost{At: time.Unix(0, now), To: p.id, Wait: time.Duration(now - t.enq), Evict: time.Duration(enter * 1e9)}
			t.dec.Wait, t.dec.Evict = c.Wait, c.Evict
			a.admitLog.add(c)
		}
		n++
	}
	return n
}

// newWaiting reports whether a new conversation's first request waits (a
// ticket not of a paused conversation). a.mu held.
func (a *admission) newWaiting() bool {
	for _, t := range a.queue {
		if !t.paused {
			return true
		}
	}
	return false
}

// queueNew queues a new conversation's first request, or refuses it with
// ErrQueueFull when AdmitQueue are waiting already. a.mu held.
func (a *admission) queueNew(req Request, h uint64, est, now int64) (Decision, *Ticket, error) {
	if len(a.queue) >= a.cfg.AdmitQueue {
		a.refused++
		return Decision{}, nil, ErrQueueFull
	}
	t := &Ticket{a: a, h: h, start: req.Start, est: est, tokens: req.Tokens, enq: now, ready: make(chan struct{})}
	a.queue = append(a.queue, t)
	a.queued++
	return Decision{}, t, nil
}

// AdmissionSnapshot is the state of working-set admission for the card.
type AdmissionSnapshot struct {
	On     bool   // configured on (Config.AdmissionOff false, affinity on)
	Active bool   // on and in force: every replica's KV capacity is known
	Why    string // why it is not in force, when not
	// Settings in use.
	HighWater  float64
	Window     time.Duration
	Wait       time.Duration
	QueueLimit int
	// Waiting conversations now, and their estimated context.
	Waiting       int
	WaitingTokens int64
	// Since the Router was created: conversations that waited, admitted
	// when room appeared, admitted at AdmitWait, refused with the queue
	// full, and whose client left while waiting; the total time the
	// admitted ones waited.
	Queued, AdmittedAfterWait, AdmittedAtLimit, Refused, Cancelled uint64
	WaitedTotal                                                    time.Duration
	// Oversized counts the new conversations placed at once, where they
	// pushed out the least, because they fit no replica even empty.
	Oversized uint64
	// Time-slicing (timeslice.go): the quantum in turns (0: none,
	// negative: time-slicing off), the conversations paused now, and since
	// the Router was created the pauses and the turns of paused
	// conversations that waited.
	RotateTurns              int
	Paused                   int
	PausedTotal, QueuedTurns uint64
	// Resumed counts the paused conversations' turns that resumed;
	// PausedWaitP50 and PausedWaitP95 are how long the last 128 of them
	// waited (0 before any).
	Resumed                      uint64
	PausedWaitP50, PausedWaitP95 time.Duration
	// Recent are the last new conversations admitted because their wait
	// outgrew what their coming in costs the resident conversations
	// (Decision.Wait), oldest first.
	Recent []AdmitCost
	// The replicas' working sets and KV capacities, summed, and the KV
	// their engines report in use (EngineKVTokens, -1 when no engine
	// exports its gauge).
	WorkingSetTokens, CapacityTokens, EngineKVTokens int64
	// Strained: an engine confirms the pressure: requests wait in it, or
	// the turns returning to it find less than HitsLow of their cache.
	Strained bool
}

// Overcommitted reports whether the active conversations (resident and
// waiting) hold more context than the replicas cache and an engine's
// figures confirm it (Strained): an estimate the engines contradict (their
// caches keep the conversations, nothing waits) is no reason to warn.
func (a AdmissionSnapshot) Overcommitted() bool {
	return a.Strained && a.CapacityTokens > 0 && a.WorkingSetTokens+a.WaitingTokens > a.CapacityTokens
}

// strained reports whether p's engine confirms KV pressure (see
// AdmissionSnapshot.Strained): requests wait in it for KV (see kvQueued),
// or it loses its conversations' caches (see losing). a.mu held.
func (a *admission) strained(p *replica) bool {
	return a.kvQueued(p) || p.losing()
}

// kvQueued reports whether requests wait in p's engine while it runs
// fewer than max_num_seqs: they wait for KV (or the batch's token budget),
// not for a place in the batch. A queue of an engine that runs
// max_num_seqs says nothing about its cache. a.mu held.
func (a *admission) kvQueued(p *replica) bool {
	if !p.waitingKnown() || p.waiting() == 0 {
		return false
	}
	return p.load.RunningUnknown || p.load.Running < a.cfg.MaxNumSeqs
}

// snapshot fills the model's admission state but the replicas'
// sums; a.mu held.
func (a *admission) snapshot() AdmissionSnapshot {
	active, why := a.admissionReason()
	s := AdmissionSnapshot{
		On: !a.cfg.AdmissionOff && !a.cfg.AffinityOff, Active: active, Why: why,
		HighWater: a.cfg.HighWater, Window: a.cfg.AdmitWindow, Wait: a.cfg.AdmitWait, QueueLimit: a.cfg.AdmitQueue,
		Waiting: len(a.queue), Queued: a.queued, AdmittedAfterWait: a.admittedAfterWait,
		AdmittedAtLimit: a.admittedAtLimit, Refused: a.refused, Cancelled: a.cancelled,
		WaitedTotal: time.Duration(a.waitedNanos), Oversized: a.oversized, EngineKVTokens: -1,
		RotateTurns: a.cfg.RotateTurns, PausedTotal: a.pausedTotal, QueuedTurns: a.queuedTurns,
		Resumed:       uint64(a.pausedWaits.n),
		PausedWaitP50: time.Duration(a.pausedWaits.at(0.5)) * time.Millisecond,
		PausedWaitP95: time.Duration(a.pausedWaits.at(0.95)) * time.Millisecond,
	}
	for _, t := range a.queue {
		s.WaitingTokens += t.est
	}
	s.Recent = a.admitLog.list()
	return s
}

// AdmitCost is one admission the wait candidate decided: a new
// conversation that had waited Wait came in on To, where its coming in
// pushes Evict seconds of recompute onto the resident conversations (see
// the package doc, "Admission"), because Wait, its further wait by its
// wait so far, exceeded it.
type AdmitCost struct {
	At    time.Time
	To    string
	Wait  time.Duration
	Evict time.Duration
}

// String renders the comparison as the route header gives it, e.g.
// "wait 15.00s, evicts 3.20s".
func (c AdmitCost) String() string {
	return string(appendSeconds(appendSeconds(make([]byte, 0, 32), "wait ", c.Wait), ", evicts ", c.Evict))
}

// add sums one replica's working set ws, capacity c, engine's KV in use
// kv (-1 unknown) and paused conversations into a; strained says its
// engine confirms pressure.
func (a *AdmissionSnapshot) add(ws, c, kv int64, strained bool, paused int) {
	a.Paused += paused
	a.WorkingSetTokens += ws
	a.CapacityTokens += c
	if kv >= 0 {
		a.EngineKVTokens = max(a.EngineKVTokens, 0) + kv
	}
	a.Strained = a.Strained || strained
}
