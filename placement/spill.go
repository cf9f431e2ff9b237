package placement

import (
	"strconv"
	"time"
)

// Defaults of the spill cost model (see the package doc, "Spill cost").
const (
	// DefaultPrefillRate is the prefill rate, in tokens per second, a
	// replica is assumed to compute at before one of its turns taught its
	// own: about what one GPU prefills for a 27–32B model. A faster
	// replica learns its rate from its first long turns; until then
	// spills from it look costlier than they are, never cheaper.
	DefaultPrefillRate = 2000
	// DefaultTurnTime is how long a turn is assumed to hold its place in
	// the engine's batch before one of the replica's turns finished.
	DefaultTurnTime = 10 * time.Second
	// recentSpills is how many spill and admission decisions Snapshot
	// reports of each.
	recentSpills = 8
)

// cost is a replica's state for the spill cost model. r.mu held for all of
// it.
type cost struct {
	rate    float64 // learned prefill rate, tokens/s; 0 = none yet
	turn    float64 // mean seconds a turn held a place in the batch; 0 = none yet
	backlog float64 // tokens of long prefills sent here not yet computed (estimate)
	// the means of the turns' expected and measured time to first token,
	// seconds, over checked turns
	expected, measured float64
	checked            uint64
	added              float64 // tokens ever counted in backlog
	// counted: a prefill was added to backlog for the turn being routed
	// (the next takeSlot claims it)
	counted bool
	at      int64 // Router.clock of backlog
}

// SpillCost is one spill decision with its estimates: the conversation's
// expected time to its first token on its replica (Stay) and on the
// target (Move, its history recomputed there), from Context tokens.
type SpillCost struct {
	At         time.Time
	From, To   string
	Stay, Move time.Duration
	Context    int // tokens the target would recompute
	// Evict is the part of Move that the recompute forced on the
	// target's resident conversations makes up (see evicts)
	Evict time.Duration
	Moved bool // the turn spilled; false: it stayed (declined)
}

// String renders the estimate as the route header gives it, e.g.
// "stay 4.10s, move 2.05s", or "stay 4.10s, move 3.05s (evicts 1.00s)"
// when the move would push resident conversations' caches out.
func (c SpillCost) String() string {
	b := appendSeconds(make([]byte, 0, 48), "stay ", c.Stay)
	b = appendSeconds(b, ", move ", c.Move)
	if c.Evict > 0 {
		b = append(appendSeconds(b, " (evicts ", c.Evict), ')')
	}
	return string(b)
}

// appendSeconds appends label and d in seconds as the route header gives
// costs: "stay 4.10s".
func appendSeconds(b []byte, label string, d time.Duration) []byte {
	b = append(b, label...)
	b = strconv.AppendFloat(b, d.Seconds(), 'f', 2, 64)
	return append(b, 's')
}

// prefillRate returns p's prefill rate in tokens per second.
func (p *replica) prefillRate() float64 {
	if p.cost.rate > 0 {
		return p.cost.rate
	}
	return DefaultPrefillRate
}

// backlog returns the tokens of long prefills still ahead on p at now: what
// was sent there, drained at its prefill rate since.
func (p *replica) backlog(now int64) float64 {
	c := &p.cost
	if c.backlog <= 0 {
		return 0
	}
	if now > c.at {
		c.backlog -= float64(now-c.at) / 1e9 * p.prefillRate()
		c.at = now
		if c.backlog < 0 {
			c.backlog = 0
		}
	}
	return c.backlog
}

// addBacklog counts tokens of prefill sent to p at now.
func (p *replica) addBacklog(tokens int64, now int64) {
	if tokens <= 0 {
		return
	}
	p.cost.backlog = p.backlog(now) + float64(tokens)
	p.cost.at = now
	p.cost.added += float64(tokens)
	p.cost.counted = true
}

// doneBefore bounds p's backlog at now by a turn that ended there: the
// engine prefills in arrival order, so what was ahead of it when it was
// routed (up to mark, the backlog's running total then, its own prefill
// included) is computed by now. A turn the engine refused, or that failed,
// ends its own prefill too. Only what was added since can still be ahead.
func (p *replica) doneBefore(mark float64, now int64) {
	if rest := p.cost.added - mark; p.backlog(now) > rest {
		p.cost.backlog = max(0, rest)
	}
}

// slotWait estimates how long one more turn waits on p for a place in the
// engine's batch: none while the engine runs fewer than it can; beyond
// that, one turn time per batch of turns ahead of it. An engine with
// requests waiting runs what its KV cache allows, which may be fewer than
// max_num_seqs: what it runs then is its batch. held is 1 for a turn
// already counted in p's in-flight turns (routed there), else 0.
func (r *Router) slotWait(p *replica, held int) float64 {
	seqs := r.cfg.MaxNumSeqs
	load := int(p.inflight.Load()) - held
	if p.load.Reachable {
		polled := p.load.Running
		if p.waitingKnown() {
			polled += p.load.Waiting
			if p.load.Waiting > 0 && p.load.Running > 0 {
				seqs = min(seqs, p.load.Running)
			}
		}
		load = max(load, polled)
	}
	ahead := load - seqs + 1
	if ahead <= 0 {
		return 0
	}
	return float64(ahead) * p.turnTime() / float64(seqs)
}

// turnTime is how long a turn holds its place in p's batch, in seconds:
// its mean over p's finished turns, DefaultTurnTime before one finished.
func (p *replica) turnTime() float64 {
	if p.cost.turn > 0 {
		return p.cost.turn
	}
	return DefaultTurnTime.Seconds()
}

// wait estimates, in seconds, how long a turn routed to p at now waits
// before its own prefill starts: its place in the batch, then the long
// prefills ahead of it; held as for slotWait.
func (r *Router) wait(p *replica, now int64, held int) float64 {
	return r.slotWait(p, held) + p.backlog(now)/p.prefillRate()
}

// expect returns the expected time to first token of the turn of d, of
// tokens tokens (the request's estimate), on the replica d chose, at now.
// A turn whose prefill was counted in that replica's backlog when it was
// routed (placed, moved, re-placed: slot.counted) finds it in its wait;
// any other computes what it finds uncached: beyond its conversation's
// last prompt where it stayed (a restart or a new binding has none), else
// beyond the replica's system prompt. r.mu held.
func (r *Router) expect(d Decision, tokens int, now int64) time.Duration {
	s := d.s
	secs := r.wait(s.rep, now, 1) // its own slot is taken
	if !s.counted {
		cached := int64(s.rep.base)
		if s.ent != nilIdx && d.Previous == "" {
			cached = max(cached, int64(r.b.ents[s.ent].prompt))
		}
		secs += float64(max(0, int64(tokens)-cached)) / s.rep.prefillRate()
	}
	return time.Duration(secs * 1e9)
}

// recompute returns the tokens the conversation of entry e would compute
// on q that its replica holds: its context as the engine last counted it
// (else the request's estimate), less what q shares with every
// conversation (the system prompt).
func (r *Router) recompute(e int32, q *replica, tokens int) int64 {
	en := &r.b.ents[e]
	ctx := int64(en.prompt)
	if ctx == 0 {
		ctx = int64(tokens)
	}
	return max(0, ctx-int64(q.base))
}

// pays decides whether the turn of entry e on from, over the threshold,
// moves to q: its expected wait on from must exceed the move's cost by
// SpillMargin (the one hysteresis). The move costs, in seconds, its wait
// on q and its history recomputed there, a turn time more when q's KV
// cache, by its engine's gauge, has no room for that history (it waits
// for blocks to free), and the recompute it forces on q's resident
// conversations (evicts). It records the decision for Snapshot and
// returns the estimate.
func (r *Router) pays(e int32, from, q *replica, tokens int, now int64) (SpillCost, bool) {
	stay := r.wait(from, now, 0)
	move, evict, ctx := r.moveCost(e, q, tokens, now)
	c := SpillCost{
		At: time.Unix(0, now), From: from.id, To: q.id, Context: int(ctx),
		Stay: time.Duration(stay * 1e9), Move: time.Duration(move * 1e9),
		Evict: time.Duration(evict * 1e9),
	}
	c.Moved = stay > move+r.cfg.SpillMargin.Seconds()
	r.spillLog.add(c)
	return c, c.Moved
}

// moveCost is what moving the turn of entry e, of tokens tokens, to q
// costs at now, in seconds (see pays), the part of it the recompute forced
// on q's resident conversations makes up (evicts), and the tokens q would
// recompute. r.mu held.
func (r *Router) moveCost(e int32, q *replica, tokens int, now int64) (move, evict float64, ctx int64) {
	ctx = r.recompute(e, q, tokens)
	evict = r.evicts(q, ctx, now)
	move = r.wait(q, now, 0) + float64(ctx)/q.prefillRate() + evict
	if !r.room(q, ctx) {
		move += q.turnTime()
	}
	return move, evict, ctx
}

// room reports whether q's KV cache, by its engine's gauge, has room for
// tokens more: a history moved onto a replica without it waits for blocks
// to free. An unknown gauge or capacity is no information: room is
// assumed.
func (r *Router) room(q *replica, tokens int64) bool {
	capacity := r.capacity(q)
	if capacity <= 0 || !q.kvKnown() {
		return true
	}
	return float64(tokens) <= (1-q.kv())*float64(capacity)
}

// evicts is the recompute, in seconds at q's rate, that tokens of history
// moved onto q force on the conversations resident there: the part of
// their context that q's working set (see admission.workingSet: the
// conversations in flight there and those expected back within their
// resident time) and the moved history hold beyond q's high-water mark.
// The engine evicts that much of their cached prefixes, and a
// conversation counted resident is expected to return and compute it
// again. 0 where admission is not in force (off, or a capacity unknown):
// the working set is then no estimate the router acts on.
func (r *Router) evicts(q *replica, tokens, now int64) float64 {
	c := r.capacity(q)
	if !r.adm.on || c <= 0 {
		return 0
	}
	ws := r.adm.workingSet(q, now)
	over := ws + tokens - int64(r.cfg.HighWater*float64(c))
	return float64(min(max(over, 0), ws)) / q.prefillRate()
}

// learn updates p's prefill rate and turn time from a finished turn
// routed there: computed tokens over its time to first token, and the
// place it held in the batch. A turn's rate can only understate the
// replica's (a queue ahead of it, or the engine's step overhead, adds to
// its time), so a faster turn sets the rate, and a slower one pulls it
// meanWeight of the way times the share of its time to first token that
// its prefill at the present rate explains: a turn that computed a few
// tokens, whose time is mostly overhead or queue, teaches next to
// nothing. r.mu held.
func (p *replica) learn(t Turn) {
	c := &p.cost
	if computed := t.Prompt - min(t.Cached, t.Prompt); computed > 0 && t.FirstToken > 0 {
		rate := float64(computed) / t.FirstToken.Seconds()
		if rate > c.rate {
			c.rate = rate
		} else {
			// (computed / c.rate) / FirstToken = rate / c.rate
			c.rate += (rate - c.rate) * meanWeight * rate / c.rate
		}
	}
	if t.Expect > 0 && t.FirstToken > 0 {
		c.checked++
		runningMean(&c.expected, t.Expect.Seconds(), c.checked, meanSpan)
		runningMean(&c.measured, t.FirstToken.Seconds(), c.checked, meanSpan)
	}
	if t.Duration > 0 {
		// the place it held in the batch: its decode, and its prefill at
		// the replica's rate; not the queue before it
		held := t.Duration.Seconds()
		if t.FirstToken > 0 && t.FirstToken < t.Duration {
			held = (t.Duration - t.FirstToken).Seconds() + float64(t.Prompt-min(t.Cached, t.Prompt))/p.prefillRate()
		}
		if c.turn <= 0 {
			c.turn = held
		} else {
			c.turn += (held - c.turn) * meanWeight
		}
	}
}

// lastN keeps the last recentSpills decisions of a kind for Snapshot.
type lastN[T any] struct {
	v [recentSpills]T
	n int
}

func (l *lastN[T]) add(x T) {
	l.v[l.n%recentSpills] = x
	l.n++
}

// list returns the decisions kept, oldest first.
func (l *lastN[T]) list() []T {
	n := min(l.n, recentSpills)
	out := make([]T, 0, n)
	for i := l.n - n; i < l.n; i++ {
		out = append(out, l.v[i%recentSpills])
	}
	return out
}
