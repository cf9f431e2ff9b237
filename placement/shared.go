package placement

import "time"

// Bindings shared between routers: several front-ends in front of the same
// replicas keep their bindings in a shared store (see the caddymodule
// package); each Router stays the local cache of that store. The Router
// itself does no I/O: the caller reads the store and tells the Router what
// it found with Adopt before it routes the turn, so Route treats the
// conversation as bound (sticky when its replica is usable, else re-placed
// by load as any binding would be).

// Adopt binds the conversation key to replica at now, as the binding a
// shared store holds: another front-end placed it there, won a race to
// place it, or moved it. An existing binding is moved (its cold mark
// dropped; its start replaced when start is not 0 and differs, as a turn
// with that start would); otherwise one is created, evicting the least
// recently used at MaxBindings. The replica need not be present or usable:
// the conversation's next Route then places it anew by load, as it would
// for any binding whose replica went away.
//
// It reports false, changing nothing, for an empty key or a replica ID this
// Router does not know (another front-end configured with other upstreams).
// Adopting counts no request: the turn that follows is counted by Route.
func (r *Router) Adopt(key, replica string, start uint64, now time.Time) bool {
	if key == "" {
		return false
	}
	h := r.hash(key)
	t := unixNanos(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.byID[replica]
	if !ok {
		return false
	}
	r.bind(h, r.reps[i], r.advance(t), start)
	return true
}
