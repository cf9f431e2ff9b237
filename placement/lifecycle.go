package placement

import "time"

// flagCold marks a binding whose replica no longer holds its conversation's
// cache: the replica restarted (ColdReplica) since the conversation's last
// turn. Its next turn is placed by load (ReasonColdReplaced).
const flagCold uint16 = 4

// DefaultBlockTokens is vLLM's default KV block size (--block-size 16).
const DefaultBlockTokens = 16

// Turn is what the engine reported for one finished turn, for Feedback.
type Turn struct {
	Key     string // the conversation key the turn was routed with
	Replica string // the replica that answered
	Reason  Reason // why it was routed there (Decision.Reason)
	Prompt  int    // prompt tokens of the turn
	Cached  int    // of those, the ones the engine found in its prefix cache
	// Completion is the tokens the engine generated for the turn; with
	// Prompt it is the conversation's context, which admission counts.
	Completion int
	// FirstToken is the time from routing to the answer's first token and
	// Duration to its end, as the proxy saw them; 0 = unknown. They teach
	// the replica's prefill rate and turn time (the spill cost model).
	FirstToken, Duration time.Duration
	// Expect is the decision's expected time to first token
	// (Decision.Expect); with FirstToken it shows how far the estimate
	// was from what the turn met (ReplicaSnapshot.ExpectedTTFT). 0 =
	// none.
	Expect time.Duration
}

// Feedback records what the engine delivered for a finished turn and checks
// it against the binding's prediction. A turn that stayed on its replica
// (ReasonSticky, ReasonStayedOverloaded, ReasonSpillDeclined) is predicted to find the previous
// turn's prompt cached, minus one block (vLLM caches full blocks and always
// computes the last prompt token); never more than its own prompt minus a
// block, since a client may send a shorter history than before. The
// prediction and what was delivered of it are counted on the replica
// (PredictedTokens, DeliveredTokens); a shortfall (the conversation's cache
// was evicted, or the replica restarted) does not mark the binding cold:
// the turn that found its cache gone computed its whole prompt on this
// replica, which holds it again, so its next turn finds it here and nowhere
// else. Every turn then becomes the prediction for the next one.
//
// It returns the prediction (0 when there was none: not a sticky turn, a
// binding's first turn, or a turn for a replica the conversation is no
// longer bound to); a side request (ReasonSide) changes nothing.
func (r *Router) Feedback(t Turn) (predicted int) {
	if t.Key == "" || t.Prompt < 0 || t.Cached < 0 || t.Reason == ReasonSide {
		// a side request's prompt is not the conversation's
		return 0
	}
	h := r.hash(t.Key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.byID[t.Replica]; ok {
		// the replica's rate and turn time, whatever the binding (with
		// affinity off there is none)
		r.reps[i].learn(t)
	}
	e, ok := r.b.idx[h]
	if !ok {
		return 0
	}
	en := &r.b.ents[e]
	p := r.reps[en.rep]
	if p.id != t.Replica {
		return 0
	}
	if base := min(int(en.prompt), t.Prompt); (t.Reason == ReasonSticky || t.Reason == ReasonStayedOverloaded || t.Reason == ReasonSpillDeclined) && base > DefaultBlockTokens {
		predicted = base - DefaultBlockTokens
		got := min(t.Cached, predicted)
		p.measured++
		p.predicted += uint64(predicted)
		p.delivered += uint64(got)
		p.hit(float64(got) / float64(predicted))
	}
	en.prompt = uint32(min(t.Prompt, 1<<32-1))
	// The conversation's context as the engine counted it; on its first
	// turn on this replica, what it found cached there is the part it
	// shares with the replica's other conversations (the system prompt).
	if en.flags&flagEstimated != 0 {
		r.adm.lastFirst = t.Prompt
	}
	en.flags &^= flagEstimated
	en.ctx = uint32(min(t.Prompt+max(t.Completion, 0), 1<<32-1))
	if t.Reason != ReasonSticky && t.Reason != ReasonStayedOverloaded && t.Reason != ReasonSpillDeclined {
		en.shared = uint32(min(t.Cached, t.Prompt))
		if t.Reason == ReasonPlaced && en.shared > 0 {
			p.base = en.shared // what a new conversation shares here
		}
	}
	r.adm.turnFP.add(r.footprint(en))
	return predicted
}

// ColdReplica marks every binding of replica id cold, as when its counters
// reset: the engine restarted and its prefix cache is empty. It returns how
// many bindings it marked; unknown IDs mark none.
func (r *Router) ColdReplica(id string) int {
	return r.ColdReplicaSince(id, time.Unix(0, 1<<62))
}

// ColdReplicaSince marks cold the bindings of replica id whose last turn
// was routed before since: a restart seen at a poll happened after the
// previous poll (since), and a turn routed after that may have run on the
// restarted engine, computing its whole prompt there, so the replica holds
// that conversation again; should it have run before the restart after
// all, its next turn computes its prompt once more on the same replica,
// which costs no more than moving it. It returns how many bindings it
// marked; unknown IDs mark none.
func (r *Router) ColdReplicaSince(id string, since time.Time) int {
	cut := unixNanos(since)
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.byID[id]
	if !ok {
		return 0
	}
	p := r.reps[i]
	n := 0
	for e := p.head; e != nilIdx; e = r.b.ents[e].rnext {
		en := &r.b.ents[e]
		if en.last >= cut {
			continue
		}
		if en.flags&flagCold == 0 {
			en.flags |= flagCold
			p.n.ColdMarked++
			n++
		}
	}
	return n
}

// End forgets the conversation's binding because the client said the
// session ended, counting it on its replica (Ended). It reports whether a
// live binding existed.
func (r *Router) End(key string, now time.Time) bool {
	h := r.hash(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.lookup(h, r.advance(unixNanos(now)))
	if e == nilIdx {
		return false
	}
	r.reps[r.b.ents[e].rep].n.Ended++
	r.removeEntry(e)
	if len(r.adm.queue) > 0 {
		r.adm.admitQueued(r.clock) // its room is free
	}
	return true
}
