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

	// What the router decided for the requests it routed here, and what
	// became of the bindings here.
	Counters

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
	// turns here, in tokens per second, and the mean place a turn held in
	// the batch (0 when none was learned yet: DefaultPrefillRate and
	// DefaultTurnTime apply).
	PrefillRate float64
	TurnTime    time.Duration
	// The model checked: the recent mean of the turns' expected time to
	// first token here (Turn.Expect) and of the time they met
	// (Turn.FirstToken), over TTFTTurns turns that had both.
	ExpectedTTFT, MeasuredTTFT time.Duration
	TTFTTurns                  uint64
}

// Counters are a replica's event counters since the Router was created.
// Each is one key of a replica's row in the card's JSON (its json name)
// and, through that key, one column of the card's table where the column
// list names it (a doc tag says what one without a column counts, for the
// README); one with a reason is also the requests with that reason in
// lm_warden_requests_total. A counter added here reaches the JSON and the
// metrics by itself.
type Counters struct {
	// Turns that stayed, including StayedOverloaded and SpillDeclined.
	Sticky           uint64 `json:"sticky"`
	StayedOverloaded uint64 `json:"stayed_overloaded" reason:"stayed-overloaded" doc:"of the sticky turns, those that stayed although the replica was over the threshold: every other replica was too"`
	// Turns that stayed here over the threshold: moving did not pay
	// (ReasonSpillDeclined).
	SpillDeclined uint64 `json:"spill_declined" reason:"spill-declined"`
	Placed        uint64 `json:"placed" reason:"placed" doc:"new conversations placed here"`
	// Conversations moved here from a replica over the threshold.
	SpillAccepted uint64 `json:"spill_accepted" reason:"spilled"`
	ClientPinned  uint64 `json:"client_pinned" reason:"client-pinned"` // requests the client pinned here
	Replaced      uint64 `json:"re_placed" reason:"re-placed" doc:"conversations moved here because their replica went away or failed, or a paused conversation resumed here from another"`
	// Conversations placed here after their start changed (compacted,
	// cleared).
	Restarted uint64 `json:"restarted" reason:"restarted"`
	// Side requests routed here: another start under a bound
	// conversation's key, not moving it.
	Side uint64 `json:"side" reason:"side"`
	// Conversations placed here because their replica's cache was found
	// gone.
	ColdReplaced uint64 `json:"cold_replaced" reason:"cold-replaced"`
	AffinityOff  uint64 `json:"affinity_off" reason:"affinity-off" doc:"per-request picks with affinity off"`
	NoKey        uint64 `json:"no_key" reason:"no-key" doc:"per-request picks for requests without a conversation key"`

	ColdMarked uint64 `json:"cold_marked" doc:"bindings here marked cold: delivered far below predicted, or the replica restarted since their last turn"`
	// Bindings here dropped because the client ended the session.
	Ended   uint64 `json:"ended"`
	Resumed uint64 `json:"resumed" doc:"paused conversations whose turn resumed here after waiting for room (time-slicing): sticky, or moved here (then also re_placed)"`
	// Turns sent again after this replica closed the kept-alive
	// connection they went out on before answering (Request.Replay).
	Replays uint64 `json:"replays" doc:"turns sent again after this replica closed the kept-alive connection they went out on before answering (it never started them; see *When a replica fails*): each turn is counted once among the others, with its first attempt's reason"`
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
		RecentSpills:   r.spillLog.list(),
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
			InFlight:      int(p.inflight.Load()),
			Counters:      p.n,
			MeasuredTurns: p.measured, PredictedTokens: p.predicted, DeliveredTokens: p.delivered,
			Bindings: p.bindings, Active: p.active, Paused: p.paused, Load: p.load,
			WorkingSet: ws, Capacity: c, Full: p.full,
			EngineKV: r.engineKV(p), Hits: p.hits, Busy: p.busy,
			PrefillRate: p.cost.rate, TurnTime: time.Duration(p.cost.turn * 1e9),
			ExpectedTTFT: time.Duration(p.cost.expected * 1e9), MeasuredTTFT: time.Duration(p.cost.measured * 1e9), TTFTTurns: p.cost.checked,
		})
		row := &s.Replicas[len(s.Replicas)-1]
		s.Admission.add(row.WorkingSet, row.Capacity, row.EngineKV, r.adm.strained(p), row.Paused)
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
