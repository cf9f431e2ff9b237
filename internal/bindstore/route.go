package bindstore

import (
	"context"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// movedBy reports whether a decision changed the conversation's binding
// in a way the other front-ends must follow: another replica, or the same
// replica for a conversation that started over (its start changed).
func movedBy(dec placement.Decision) bool {
	return dec.Previous != "" || dec.Reason == placement.ReasonRestarted
}

// Route routes a keyed turn with the store as the source of truth and the
// router as its local cache:
//
//   - a move another front-end published for the conversation is applied
//     first (Adopt, or Unbind);
//   - a conversation the router holds and has confirmed with the store
//     routes locally; a move it makes is written and published in the
//     background, and its key's TTL refreshed once half of it has passed;
//   - any other reads the store first (within the timeout): a binding
//     found there is adopted; a new conversation is placed by the router
//     and claimed with SET NX; when another front-end won the claim, the
//     turn follows the winner.
//
// With the store out or slow, the turn routes with the local bindings
// (counted as a fallback); nothing on this path waits past the timeout.
func (s *Store) Route(req placement.Request) (placement.Decision, *placement.Ticket, error) {
	r := s.router
	if req.Now.IsZero() {
		req.Now = time.Now()
	}
	now := req.Now.UnixNano()
	h := storeHash(req.Key)
	if s.pending.size() > 0 {
		if mv, ok := s.pending.take(h); ok && now-mv.at < s.ttl.Load() {
			s.applyMove(req, h, mv)
		}
	}
	if !s.up.Load() {
		return s.fallback(req, h)
	}
	bound, held := r.Bound(req.Key)
	if held {
		if at, ok := s.confirmed.get(h); ok {
			dec, err := r.Route(req)
			if err != nil {
				return dec, nil, err
			}
			switch {
			case dec.Reason == placement.ReasonPlaced:
				// the binding expired between the two looks: a new one
				dec, err = s.claimPlaced(req, h, dec)
				return dec, nil, err
			case movedBy(dec):
				s.confirmed.put(h, now)
				s.enqueue(storeOp{kind: opMove, h: h, key: req.Key, value: storeValue{replica: dec.Replica, start: req.Start}})
			case now-at > s.ttl.Load()/2 && dec.Reason != placement.ReasonAffinityOff && dec.Reason != placement.ReasonNoKey && dec.Reason != placement.ReasonSide:
				s.confirmed.put(h, now)
				s.enqueue(storeOp{kind: opRefresh, h: h, key: req.Key, value: storeValue{replica: dec.Replica, start: req.Start}})
			}
			return dec, nil, nil
		}
	}
	if !r.Affinity() {
		dec, err := r.Route(req)
		return dec, nil, err
	}
	return s.routeRead(req, h, bound, held)
}

// fallback routes a turn with this front-end's bindings alone (the store
// is out, or did not answer in time). A conversation it places or moves
// is read from the store again at its next turn there.
func (s *Store) fallback(req placement.Request, h uint64) (placement.Decision, *placement.Ticket, error) {
	s.fallbacks.Add(1)
	dec, tk, err := s.router.Admit(req)
	if err == nil && (tk != nil || movedBy(dec) || dec.Reason == placement.ReasonPlaced) {
		s.confirmed.del(h)
	}
	return dec, tk, err
}

// applyMove applies a move another front-end published for the request's
// conversation.
func (s *Store) applyMove(req placement.Request, h uint64, mv move) {
	if mv.replica == "" {
		s.router.Unbind(req.Key)
		s.confirmed.del(h)
		return
	}
	if s.router.Adopt(req.Key, mv.replica, mv.start, req.Now) {
		s.adopted.Add(1)
		s.confirmed.put(h, mv.at)
		return
	}
	s.confirmed.del(h) // a replica unknown here: read the store
}

// routeRead is route for a conversation not held or not confirmed here.
func (s *Store) routeRead(req placement.Request, h uint64, bound string, held bool) (placement.Decision, *placement.Ticket, error) {
	r := s.router
	now := req.Now.UnixNano()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	key := s.key(h)
	cur, found, err := s.read(ctx, key)
	if err != nil {
		s.fail(err)
		return s.fallback(req, h)
	}
	known := true // the store's replica is one this front-end knows
	switch {
	case found && (!held || cur.replica != bound):
		if known = r.Adopt(req.Key, cur.replica, cur.start, req.Now); known {
			s.adopted.Add(1)
		}
	case !found && held:
		// the store lost it (restarted), or it was out when the
		// conversation was placed: claim this front-end's binding
		win, lost, err := s.claim(ctx, key, storeValue{replica: bound, start: req.Start})
		if err != nil {
			s.fail(err)
			return s.fallback(req, h)
		}
		if lost && r.Adopt(req.Key, win.replica, win.start, req.Now) {
			s.adopted.Add(1)
		}
	}
	dec, tk, err := r.Admit(req)
	if err != nil || tk != nil {
		// a new conversation waiting for room: claimed once admitted
		return dec, tk, err
	}
	switch {
	case dec.Reason == placement.ReasonPlaced && !found:
		dec, err = s.claimPlacedCtx(ctx, req, h, key, dec)
		return dec, nil, err
	case movedBy(dec) || (found && !known):
		s.enqueue(storeOp{kind: opMove, h: h, key: req.Key, value: storeValue{replica: dec.Replica, start: req.Start}})
	}
	s.confirmed.put(h, now)
	return dec, nil, nil
}

// claimPlaced claims a conversation the router has just placed.
func (s *Store) claimPlaced(req placement.Request, h uint64, dec placement.Decision) (placement.Decision, error) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	return s.claimPlacedCtx(ctx, req, h, s.key(h), dec)
}

// claimPlacedCtx writes the router's placement of a new conversation to
// the store unless another front-end got there first; then the turn is
// routed again, to the winner's replica.
func (s *Store) claimPlacedCtx(ctx context.Context, req placement.Request, h uint64, key string, dec placement.Decision) (placement.Decision, error) {
	win, lost, err := s.claim(ctx, key, storeValue{replica: dec.Replica, start: req.Start})
	if err != nil {
		s.fail(err)
		s.fallbacks.Add(1)
		return dec, nil
	}
	s.confirmed.put(h, req.Now.UnixNano())
	if !lost || win.replica == dec.Replica {
		return dec, nil
	}
	if !s.router.Adopt(req.Key, win.replica, win.start, req.Now) {
		// the winner's replica is unknown here: keep this placement,
		// and make it the store's
		s.enqueue(storeOp{kind: opMove, h: h, key: req.Key, value: storeValue{replica: dec.Replica, start: req.Start}})
		return dec, nil
	}
	s.adopted.Add(1)
	dec.Release()
	return s.router.Route(req)
}

// ClaimPlaced finishes routing a new conversation that waited for
// admission: the replica the router placed it on is claimed in the store
// (another front-end may have placed it meanwhile: the turn then follows
// that).
func (s *Store) ClaimPlaced(req placement.Request, dec placement.Decision) (placement.Decision, error) {
	if req.Now.IsZero() {
		req.Now = time.Now()
	}
	return s.claimPlaced(req, storeHash(req.Key), dec)
}

// Unbind forgets a conversation's binding in the store and at the other
// front-ends (the admin API's unpin; the router's own binding is the
// caller's). It reports whether the store held one.
func (s *Store) Unbind(key string) bool {
	h := storeHash(key)
	s.confirmed.del(h)
	s.pending.del(h)
	if !s.up.Load() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(20*s.timeout, 100*time.Millisecond))
	defer cancel()
	n, err := s.rdb.Del(ctx, s.key(h)).Result()
	s.commands.Add(1)
	if err != nil {
		s.fail(err)
		return false
	}
	s.enqueue(storeOp{kind: opDelete, h: h, key: key})
	return n > 0
}

// Ended tells the store that a conversation's session ended here: its
// binding is dropped everywhere.
func (s *Store) Ended(key string) {
	h := storeHash(key)
	s.confirmed.del(h)
	s.enqueue(storeOp{kind: opDelete, h: h, key: key})
}

// Config is the store's settings, as given to New.
func (s *Store) Config() Config { return s.cfg }

// Key is the store key of a conversation key under a prefix and model (no
// conversation key is stored in clear): what Store writes its binding to.
func Key(prefix, model, key string) string {
	return keyName(prefix+model+":b:", storeHash(key))
}
