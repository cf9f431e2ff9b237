package placement

import (
	"sync"
	"sync/atomic"
	"time"
)

// Decision is the outcome of Route: the replica, why, and the in-flight slot
// it holds. Copies share the slot; Release frees it once.
type Decision struct {
	Replica string
	Reason  Reason
	// Previous is the replica the conversation was bound to before this
	// decision moved it (spilled, re-placed, or pinned elsewhere); "" when
	// it did not move.
	Previous string
	// Stay and Move are the spill cost model's estimates of the turn's
	// time to first token on its replica and on the target, for a turn
	// whose replica was over the threshold and that another could take
	// (ReasonSpilled, ReasonSpillDeclined, ReasonStayedOverloaded); zero
	// otherwise. Evict is the part of Move that the recompute the move
	// forces on the target's resident conversations makes up.
	Stay, Move, Evict time.Duration
	// Wait is set for a new conversation that admission let in where its
	// coming in pushes part of the resident conversations' caches out:
	// the further wait compared (its wait so far) against Evict, the
	// recompute that costs them (see AdmitCost); zero otherwise.
	Wait time.Duration
	// Expect is the turn's expected time to first token on Replica from
	// this decision, by the same model (see the package doc, "Spill
	// cost"): its wait there, then the prefill of what it is expected to
	// find uncached. Set for every decision that chose a replica; a
	// turn admission held waited besides.
	Expect time.Duration

	s   *slot
	tok uint64
}

// Release gives the in-flight slot back. Only the first call, on any copy
// of the Decision, has an effect; the zero Decision releases nothing.
func (d Decision) Release() { d.ReleaseAt(time.Time{}) }

// ReleaseAt is Release for a request that ended at now: admission counts
// its conversation's pause from then (zero = the latest time the Router
// has seen).
func (d Decision) ReleaseAt(now time.Time) {
	s := d.s
	if s == nil || d.tok == 0 {
		return
	}
	if !s.tok.CompareAndSwap(d.tok, 0) {
		return
	}
	p, r := s.rep, s.r
	p.inflight.Add(-1)
	r.inflight.Add(-1)
	r.probeReleased(p, d.tok)
	if s.gen != p.pollGen.Load() {
		// in flight at the replica's last poll, so counted in its polled
		// running; gone since
		p.doneSincePoll.Add(1)
	}
	if s.ent != nilIdx {
		var n int64
		if !now.IsZero() {
			n = now.UnixNano()
		}
		r.released(s, n)
	}
	r.slots.put(s)
}

// slot is one in-flight hold. tok is the token of the Decision holding it,
// 0 when free.
type slot struct {
	tok  atomic.Uint64
	rep  *replica
	r    *Router
	next *slot

	// the conversation's entry whose turn it holds for admission (nilIdx
	// = none), that entry's hash and the footprint counted (admission.hold)
	ent  int32
	hash uint64
	fp   int64
	// gen is the replica's poll generation when the hold began
	gen uint32
	// mark is the replica's backlog total when the turn was routed
	// (replica.doneBefore); counted: the turn's own prefill is in it
	// (Router.expect)
	mark    float64
	counted bool
}

const slotChunk = 64

// slotPool recycles slots. Slots are never returned to the garbage
// collector, so a stale Decision's pointer always refers to a slot whose
// token no longer matches.
type slotPool struct {
	mu   sync.Mutex
	free *slot
	seq  uint64
}

func (sp *slotPool) get(p *replica, r *Router) (*slot, uint64) {
	sp.mu.Lock()
	s := sp.free
	if s == nil {
		chunk := make([]slot, slotChunk)
		for i := 0; i < slotChunk-1; i++ {
			chunk[i].next = &chunk[i+1]
		}
		s = &chunk[0]
	}
	sp.free = s.next
	sp.seq++
	tok := sp.seq
	sp.mu.Unlock()
	s.next = nil
	s.rep, s.r = p, r
	s.gen = p.pollGen.Load()
	s.tok.Store(tok)
	return s, tok
}

func (sp *slotPool) put(s *slot) {
	sp.mu.Lock()
	s.next = sp.free
	sp.free = s
	sp.mu.Unlock()
}
