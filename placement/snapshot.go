package placement

// The routing card's view of a Router: its counters and every replica's
// state, copied under the lock.

import (
	"slices"
	"time"
)

// Snapshot is the Router's state for the routing card.
type Snapshot struct {
	Affinity       bool
	SpillThreshold int
	SpillAuto      bool
	MaxNumSeqs     int
	InFlight       int
	Requests       uint64  // routed requests since start
	KeyedRequests  uint64  // requests with affinity on whose key had a live binding (no honoured pin)
	StickyRequests uint64  // of those, the ones that stayed on their replica
	StickyShare    float64 // StickyRequests / KeyedRequests; 0 when none
	Bindings       int
	Expired        uint64            // bindings removed after IdleTTL without a turn
	Evicted        uint64            // bindings removed as least recently used at MaxBindings
	Since          time.Time         // when the counters started
	Replicas       []ReplicaSnapshot // present replicas, sorted by ID
	Admission      AdmissionSnapshot
	// RecentSpills are the last spill decisions (turns over the threshold
	// that another replica could take), oldest first, with the estimates
	// that decided them.
	RecentSpills []SpillCost
}

// ReplicaSnapshot is one replica's row of the routing card.
type ReplicaSnapshot struct {
	ID        string
	Available bool  // can be chosen now: not unavailable and out for nothing
	Out       Cause // why it is out; 0 when Available
	// CooldownUntil is when its proxy-error cool-down ends (zero when none).
	CooldownUntil time.Time
	ProxyFailures uint64 // requests reported failed at it (Decision.Failed)
	InFlight      int    // requests held through this router now

	Sticky           uint64 // turns that stayed (including StayedOverloaded)
	StayedOverloaded uint64 // stayed because every other replica was over the threshold too
	Placed           uint64 // new conversations placed here
	SpillAccepted    uint64 // conversations moved here from a replica over the threshold
	SpillDeclined    uint64 // turns that stayed here over the threshold: moving did not pay (ReasonSpillDeclined)
	ClientPinned     uint64 // requests the client pinned here
	Replaced         uint64 // conversations moved here because their replica went away
	AffinityOff      uint64 // per-request picks with affinity off
	NoKey            uint64 // per-request picks for requests without a key

	Restarted    uint64 // conversations placed here after their start changed (compacted, cleared)
	Side         uint64 // side requests routed here: another start under a bound conversation's key, not moving it
	ColdReplaced uint64 // conversations placed here because their replica's cache was found gone
	ColdMarked   uint64 // bindings here marked cold (delivered far below predicted, or the replica restarted)
	Ended        uint64 // bindings here dropped because the client ended the session

	// Sticky turns here with a prediction (Feedback), the cached tokens
	// predicted for them and the cached tokens delivered (each turn's
	// delivery capped at its prediction).
	MeasuredTurns, PredictedTokens, DeliveredTokens uint64

	Bindings int // conversations currently bound here
	Active   int // of those, used within ActiveWindow
	Paused   int // of those, paused at a turn boundary (their next turn waits)
	Load     Load

	// Admission: the resident working set and the KV capacity in tokens
	// (0 when unknown), and whether the replica reached its high-water
	// mark and takes no new conversation until below the low-water mark.
	WorkingSet, Capacity int64
	Full                 bool
	// The working set's check against the engine: the KV the engine
	// reports in use (its gauge times the capacity; -1 when unknown), the
	// share of their predicted cache the turns returning here found
	// (recent, 0 before any), and the share of recent polls that found a
	// turn of this router in flight here (Busy; see the package doc,
	// "Admission").
	EngineKV int64
	Hits     float64
	Busy     float64

	// The spill cost model's figures: the prefill rate learned from the
	// turns here, in tokens per second, and the mean time from routing to
	// a turn's end (0 when none was learned yet: DefaultPrefillRate and
	// DefaultTurnTime apply).
	PrefillRate float64
	TurnTime    time.Duration
}

// DeliveredShare is DeliveredTokens / PredictedTokens; 0 when nothing was
// predicted.
func (s ReplicaSnapshot) DeliveredShare() float64 {
	if s.PredictedTokens == 0 {
		return 0
	}
	return float64(s.DeliveredTokens) / float64(s.PredictedTokens)
}

// Snapshot returns counters and state as of the latest time seen by Route
// or Sweep.
func (r *Router) Snapshot() Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Snapshot{
		Affinity:       !r.cfg.AffinityOff,
		SpillThreshold: r.threshold,
		SpillAuto:      r.cfg.SpillThreshold == 0,
		MaxNumSeqs:     r.cfg.MaxNumSeqs,
		InFlight:       int(r.inflight.Load()),
		Requests:       r.requests,
		KeyedRequests:  r.keyed,
		StickyRequests: r.sticky,
		Bindings:       r.b.n,
		Expired:        r.expired,
		Evicted:        r.evicted,
		Since:          r.since,
		Replicas:       make([]ReplicaSnapshot, 0, len(r.order)),
		Admission:      r.adm.snapshot(),
		RecentSpills:   r.recentSpillCosts(),
	}
	if r.keyed > 0 {
		s.StickyShare = float64(r.sticky) / float64(r.keyed)
	}
	cutoff := r.clock - int64(r.cfg.ActiveWindow)
	for _, i := range r.order {
		p := r.reps[i]
		r.expireActive(p, cutoff)
		out := r.out(p)
		var until time.Time
		if p.coolUntil > r.clock {
			until = time.Unix(0, p.coolUntil)
		}
		ws, c := r.adm.workingSet(p, r.clock), r.capacity(p)
		if c > 0 {
			// full follows the working set between placements too (the
			// queue drained, conversations went quiet)
			r.adm.markFull(p, ws, c)
		}
		s.Replicas = append(s.Replicas, ReplicaSnapshot{
			ID: p.id, Available: out == 0, Out: out, CooldownUntil: until, ProxyFailures: p.proxyFails,
			InFlight: int(p.inflight.Load()),
			Sticky:   p.sticky, StayedOverloaded: p.stayed, Placed: p.placed, SpillAccepted: p.spill, SpillDeclined: p.declined,
			ClientPinned: p.pinned, Replaced: p.replaced, AffinityOff: p.affOff, NoKey: p.noKey,
			Restarted: p.restarted, Side: p.side, ColdReplaced: p.coldReplaced, ColdMarked: p.coldMarked, Ended: p.ended,
			MeasuredTurns: p.measured, PredictedTokens: p.predicted, DeliveredTokens: p.delivered,
			Bindings: p.bindings, Active: p.active, Paused: r.adm.pausedOn(p), Load: p.load,
			WorkingSet: ws, Capacity: c, Full: p.full,
			EngineKV: r.engineKV(p), Hits: p.hits, Busy: p.busy,
			PrefillRate: p.cost.rate, TurnTime: time.Duration(p.cost.turn * 1e9),
		})
		row := &s.Replicas[len(s.Replicas)-1]
		s.Admission.add(row.WorkingSet, row.Capacity, row.EngineKV, r.adm.strained(p))
		s.Admission.Paused += row.Paused
	}
	slices.SortFunc(s.Replicas, func(a, b ReplicaSnapshot) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return s
}
