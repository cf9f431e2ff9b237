package placement

import "sync"

// fleet is what the router and admission share: the lock that guards
// both, the settings, the clock, the replicas and the bindings. The router
// decides which conversation is bound where (router.go, bindings.go);
// admission reads that and keeps, in the entries and the replicas, what it
// learned of the conversations' sizes and pauses (admission.go). Neither
// calls the other through it: admission acts on the router only through
// placer (gate.go).
type fleet struct {
	mu    sync.Mutex
	cfg   Config
	clock int64 // latest time seen, unix nanos

	reps  []*replica // known replicas by index; nil where one was forgotten
	order []int32    // present replicas, in SetReplicas order

	b bindings

	exclEpoch uint64 // a replica whose exclEpoch equals it is excluded (SetReplicas, a retry's tried ones)
	lenient   bool   // usable ignores poll and proxy failures (Router.lenientPick)
}

// advance moves the clock to n unless it is already later, and returns
// it: time never runs backwards for bindings. f.mu held.
func (f *fleet) advance(n int64) int64 {
	if n > f.clock {
		f.clock = n
	}
	return f.clock
}

// capacity is p's KV cache in tokens, 0 when unknown. f.mu held.
func (f *fleet) capacity(p *replica) int64 {
	if f.cfg.KVTokens > 0 {
		return int64(f.cfg.KVTokens)
	}
	return int64(p.kvCap)
}

// footprint is the part of the conversation's context its replica holds
// for it alone: its context minus what it shares with the replica's other
// conversations, which is what it found cached when it arrived or, when
// more, what new conversations find cached there (the common system
// prompt: a conversation that arrived on a cold replica put it there and
// shares it as much as those after it). f.mu held.
func (f *fleet) footprint(en *entry) int64 {
	shared := en.shared
	if p := f.reps[en.rep]; p != nil {
		shared = max(shared, p.base)
	}
	return int64(en.ctx - min(shared, en.ctx))
}

// setPaused marks the conversation of en paused at a turn boundary or
// not (flagPaused), counted on its replica (replica.paused, which the
// replica's list keeps as it links and unlinks entries). f.mu held.
func (f *fleet) setPaused(en *entry, on bool) {
	if (en.flags&flagPaused != 0) == on {
		return
	}
	en.flags ^= flagPaused
	if on {
		f.reps[en.rep].paused++
	} else {
		f.reps[en.rep].paused--
	}
}

// engineKV is the KV p's engine reports in use, in tokens: its gauge times
// its capacity; -1 when either is unknown. f.mu held.
func (f *fleet) engineKV(p *replica) int64 {
	c := f.capacity(p)
	if c <= 0 || !p.kvKnown() {
		return -1
	}
	return int64(p.kv() * float64(c))
}
