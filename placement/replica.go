package placement

// The replicas as the router knows them, and the picks among them.

import (
	"math"
	"sync/atomic"
)

// replica is the Router's state for one replica ID. A removed replica is
// only marked absent at first, so bindings and outstanding decisions can
// refer to it by index or pointer; an ID that comes back within IdleTTL gets
// its old entry, and its bindings become valid again. Once it has been gone
// for longer than IdleTTL with nothing in flight, every binding it held has
// expired and the entry is dropped (see forgetGone): dynamic upstreams that
// rotate addresses do not grow the table.
type replica struct {
	id       string
	idx      int32
	present  bool
	avail    bool
	goneAt   int64 // Router.clock when it was last removed; meaningful while !present
	inflight atomic.Int64
	load     Load
	// pollGen counts the polls; doneSincePoll the requests routed before
	// the last poll that have finished since (so were counted in its
	// running and are gone)
	pollGen       atomic.Uint32
	doneSincePoll atomic.Int64

	down       Cause        // CausePoll, CauseHealth
	coolUntil  int64        // out for proxy errors until then (Router.clock)
	failStreak int          // proxy failures since the last success
	streak     atomic.Int32 // failStreak, read without the lock
	proxyFails uint64       // proxy failures reported, ever
	coolCause  Cause        // what the cool-down is for: CauseProxy or CauseAbandoned
	ab         abandonState // turns left unanswered until their clients gave up
	// probe is the token of the request sent to it after a cool-down,
	// while that one is unanswered (0 = none); it is out for others
	// meanwhile (see Decision.Failed)
	probe atomic.Uint64

	// bindings list, most recent first; entries head..activeTail are active.
	head, tail, activeTail int32
	bindings, active       int
	paused                 int // of the bindings, those paused at a turn boundary (flagPaused)

	n    Counters // what was decided here (snapshot.go)
	cost cost     // the spill cost model's figures (spill.go)

	measured, predicted, delivered uint64 // sticky turns with a prediction, and their tokens

	exclEpoch uint64 // equals fleet.exclEpoch when excluded for the current request

	kvCap  int   // KV capacity in tokens, last known (Load.KVTokens)
	polled bool  // a poll has reached it
	full   bool  // reached the high-water mark and not yet below the low-water mark
	busyFP int64 // footprints of the conversations' turns in flight here (admission)
	// heldN counts those turns: a walk of the replica's conversations
	// stops at the resident horizon only once it has met that many
	// (replica.pastHorizon)
	heldN int
	// base is what the last new conversation placed here found cached on
	// its first turn: the part conversations share here (the system
	// prompt), held once (admission)
	base uint32
	// the working set's check against the engine: the hit rate of the
	// turns returning here (hits, over hitsN turns)
	hits  float64
	hitsN uint64
	// busy is the share of recent polls that found a turn in flight here:
	// the plain mean of the first busyPolls polls (busyN counts them), then
	// an exponential mean over about busyPolls, so a few polls of a busy
	// replica already say busy instead of starting from idle
	busy  float64
	busyN int
}

func (p *replica) running() int {
	n := int(p.inflight.Load())
	if p.load.Reachable {
		if m := p.load.Running - int(p.doneSincePoll.Load()); m > n {
			n = m
		}
	}
	return n
}

func (p *replica) waiting() int {
	if p.load.Reachable {
		return p.load.Waiting
	}
	return 0
}

// waitingKnown reports whether waiting() is a polled figure.
func (p *replica) waitingKnown() bool { return p.load.Reachable && !p.load.WaitingUnknown }

func (p *replica) kv() float64 {
	if p.load.Reachable {
		return p.load.KVUsage
	}
	return 0
}

// kvKnown reports whether kv() is a polled figure.
func (p *replica) kvKnown() bool { return p.load.Reachable && !p.load.KVUnknown }

// usable reports whether p may be chosen for the request being routed: it
// is present, available, not excluded and, unless f.lenient, not out for a
// failure (poll, proxy errors, health check).
func (f *fleet) usable(p *replica) bool {
	if !p.present || !p.avail || p.exclEpoch == f.exclEpoch {
		return false
	}
	if f.lenient {
		return p.down&CauseHealth == 0
	}
	return p.down == 0 && p.coolUntil <= f.clock && p.probe.Load() == 0
}

// lenientPick returns f's choice; when f finds nothing, it asks again with
// the failure signals the router infers itself (poll failures, proxy errors)
// ignored: when every replica is out for those, one of them is still tried
// rather than refusing the request, so a setup where no poll can succeed
// (wrong metrics_path) keeps serving. The proxy's health checks stay
// binding, as they are without this module.
// A replica f passes over for its own reasons (a new conversation that
// does not fit there) while another is in is no reason to try the ones
// that are out: f's nil then stands.
func (r *Router) lenientPick(f func() *replica) *replica {
	if p := f(); p != nil {
		return p
	}
	if !r.noneUsable() {
		return nil
	}
	r.lenient = true
	p := f()
	r.lenient = false
	return p
}

// noneUsable reports whether no replica may be chosen now.
func (r *Router) noneUsable() bool {
	for _, i := range r.order {
		if r.usable(r.reps[i]) {
			return false
		}
	}
	return true
}

// stuckWith reports whether no replica is usable and p would be tried all
// the same (see lenientPick): out only for the failures the router infers
// itself (poll failures, proxy errors), like all the others.
func (r *Router) stuckWith(p *replica) bool {
	if !r.noneUsable() {
		return false
	}
	r.lenient = true
	ok := r.usable(p)
	r.lenient = false
	return ok
}

// leastQueued implements the per-request pick: least waiting×4 + running,
// then fewer in-flight, then round-robin.
func (r *Router) leastQueued() *replica {
	n := len(r.order)
	if n == 0 {
		return nil
	}
	r.rr++
	start := int(r.rr % uint32(n))
	var best *replica
	var bRun, bWait int
	var bKnown bool
	var bIn int64
	for k := 0; k < n; k++ {
		j := start + k
		if j >= n {
			j -= n
		}
		p := r.reps[r.order[j]]
		if !r.usable(p) {
			continue
		}
		run, wait, known := p.running(), p.waiting(), p.waitingKnown()
		in := p.inflight.Load()
		// The queue counts only when both queues are known; otherwise
		// running alone is compared.
		score, bScore := run, bRun
		if known && bKnown {
			score, bScore = wait*4+run, bWait*4+bRun
		}
		if best == nil || score < bScore || (score == bScore && in < bIn) {
			best, bRun, bWait, bKnown, bIn = p, run, wait, known, in
		}
	}
	return best
}

// best returns the usable replica with the best placement score: every
// one a candidate at the same cost.
func (r *Router) best(now int64) *replica {
	p, _ := r.cheapestBy(now, func(*replica) float64 { return 0 })
	return p
}

// cheapestBy returns the usable replica of least cost (in seconds; +Inf:
// not a candidate), the best placement score among equals, and its cost.
func (r *Router) cheapestBy(now int64, cost func(*replica) float64) (best *replica, bCost float64) {
	n := len(r.order)
	if n == 0 {
		return nil, 0
	}
	r.rr++
	start := int(r.rr % uint32(n))
	cutoff := now - int64(r.cfg.ActiveWindow)
	var bOver, bKVKnown bool
	var bRun, bAct int
	var bKV float64
	for k := 0; k < n; k++ {
		j := start + k
		if j >= n {
			j -= n
		}
		p := r.reps[r.order[j]]
		if !r.usable(p) {
			continue
		}
		c := cost(p)
		if math.IsInf(c, 1) {
			continue
		}
		r.expireActive(p, cutoff)
		if best != nil && c > bCost {
			continue
		}
		run := p.running()
		over := run > r.threshold
		act, kv, kvKnown := p.active, p.kv(), p.kvKnown()
		switch {
		case best == nil || c < bCost:
		case over != bOver:
			if over {
				continue
			}
		case run != bRun:
			if run > bRun {
				continue
			}
		case act != bAct:
			if act > bAct {
				continue
			}
		// KV decides only between two known figures: an unknown one is
		// no information, so the tie stays with the rotation order.
		case !kvKnown || !bKVKnown || kv >= bKV:
			continue
		}
		best, bCost, bOver, bRun, bAct, bKV, bKVKnown = p, c, over, run, act, kv, kvKnown
	}
	return best, bCost
}
