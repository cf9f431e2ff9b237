package caddymodule

import (
	"context"
	"net/http"
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// routeState is what one request carries between the handler, the policy and
// the response wrapper. The policy fills model and dec; the handler releases
// dec when the response ends. Only the request's goroutine touches it.
type routeState struct {
	key, parent string
	start       uint64 // fingerprint of the conversation's start; 0 = unknown
	end         bool   // the client marked this request as its session's last
	api         vllmstats.API
	shape       convkey.Shape // where the body keeps its conversation
	keySource   keySource     // where key came from
	model       *modelState   // set by the policy that routed the request
	dec         placement.Decision
	routed      bool
	refused     bool       // the admission queue was full: answered 429
	detached    bool       // routed without the handler: the slot is freed with the request context
	rb          replayBody // the request body the handler read and put back (rb.b != nil), rewound on retries
	bodyBytes   int64      // the body's size, when the policy knew it (Policy.tokens)
	held        *heldTurn  // the request's admission ticket, from the policy (admission.go)
	wantBody    bool       // the policy asks for the whole body before it routes (unread.go)
	noStart     bool       // the body streams and its start was not in the part read (unread.go)
	streamed    *keptBody  // the body while streamed and not yet routed (unread.go)
	ntried      int
	tried       [4]string // replicas chosen for this request so far
	extra       []string  // more of them, past len(tried)
	// when this attempt was routed, and when its streamed answer's first
	// bytes came (zero when not streamed): the replica's prefill rate and
	// turn time are learned from them (placement.Turn)
	routedAt, firstAt time.Time
	at                *attemptTrace // the connection of the proxy's last attempt (replay.go)
	replays           int           // how often the proxy was run again (replay.go)
	replaying         bool          // the next routing is a replay of dec (replayOf)
}

func (st *routeState) addTried(id string) {
	if st.ntried < len(st.tried) {
		st.tried[st.ntried] = id
		st.ntried++
		return
	}
	st.extra = append(st.extra, id)
}

func (st *routeState) triedList(dst []string) []string {
	dst = append(dst, st.tried[:st.ntried]...)
	return append(dst, st.extra...)
}

// beginAttempt readies the state for an attempt of its request: a previous
// attempt that got this far failed (the proxy retries), so its replica is
// told, its slot freed and the body put back to its first byte.
func (st *routeState) beginAttempt() {
	if !st.routed {
		return
	}
	st.dec.Failed(time.Time{})
	st.dec.Release()
	st.routed = false
	if st.rb.b != nil {
		// the failed attempt may have sent (part of) the body
		st.rb.rewind()
	}
}

// routedTo records the policy's decision for this attempt. Without the
// handler nobody watches the response end, so the slot is freed with the
// request's context.
// timing returns the attempt's time to first token (0 when its answer
// was not streamed) and to its end at now, for placement.Turn.
func (st *routeState) timing(now time.Time) (first, total time.Duration) {
	if !st.firstAt.IsZero() {
		first = st.firstAt.Sub(st.routedAt)
	}
	return first, now.Sub(st.routedAt)
}

func (st *routeState) routedTo(r *http.Request, dec placement.Decision, m *modelState) {
	st.dec, st.routed, st.model = dec, true, m
	st.routedAt, st.firstAt = time.Now(), time.Time{}
	st.addTried(dec.Replica)
	if st.detached {
		context.AfterFunc(r.Context(), dec.Release)
	}
}

// finished frees the request's slot when its response has ended and
// records the tokens the replica reported for a successful answer (u is
// nil when the response was not measured).
func (st *routeState) finished(status int, u *vllmstats.Usage, now time.Time) {
	if !st.routed {
		return
	}
	st.dec.ReleaseAt(now)
	if st.model != nil {
		st.model.keys.add(st.dec.Replica, st.keySource)
	}
	if u != nil && st.model != nil && status >= 200 && status < 300 {
		st.model.completeUsage(st.dec.Replica, u)
		st.model.recordUsage(st.dec.Replica, *u, now)
		if u.Measured {
			st.model.sizes.Observe(st.bodyBytes, u.PromptTokens)
		}
		first, total := st.timing(now)
		st.model.feedback(st.key, st.dec, *u, first, total, now)
	}
	if st.end && st.key != "" && st.model != nil && status < 500 {
		// the session's last request is done: nothing will use its
		// cache through this binding again
		st.model.router.End(st.key, now)
		st.model.ended(st.key)
	}
}
