package caddymodule

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// Replaying a turn the replica never answered.
//
// Engines close kept-alive connections that sit idle (vLLM, SGLang and
// llama-server after 5 s, see keepalive.go), and a restarted engine has
// closed them all. When the proxy sends a turn on such a connection at the
// moment the engine closes it, the attempt fails before any response byte:
// EOF or a reset on the read, a broken pipe or a reset while writing the
// body. The engine never started the turn: it had closed the connection,
// and what it received on it, if anything, went nowhere.
//
// Go's transport replays such a request itself only when it is idempotent
// (GET and the like, or a request carrying an Idempotency-Key header), and
// only for failures on the read side: a write that broke after the request's
// first bytes is never replayed. reverse_proxy retries a POST only after a
// dial error, unless lb_retry_match says otherwise. So by default a turn
// that met a closing connection was answered 502, and the policy took the
// healthy replica out of placement for fail_cooldown.
//
// The handler replays it instead: when the proxy's attempt failed with a
// closed-connection error, on a connection the transport had reused (a
// kept-alive one), before the replica sent any response byte, and the
// handler holds the request's body (it read the body in full: bodies up to
// streamOver, see readKeys), it runs the proxy again. The failed attempt
// counts as neither a failure nor a success of its replica, and the replica
// is not excluded, so a bound conversation goes back to its replica on a
// new connection; if that fails too (the replica is down: the dial is
// refused), the proxy's failure rules apply as to any attempt. A turn
// whose replica had started answering is never replayed, nor one that
// failed on a fresh connection (the replica took the turn and then died or
// refused it: not a stale connection), nor one whose client has gone. A
// body over streamOver is streamed to the replica as it arrives and is not
// held, so such a turn is answered 502 as before (clients retry it).

// maxReplays bounds the replays of one request. Every replay follows a
// failure on a reused connection, which the transport then drops, so the
// replays end on their own when the stale connections to the replica have
// been used up (at most the transport's idle connections per host, 32 by
// default); the bound is there for a replica that keeps accepting and
// closing.
const maxReplays = 32

// attemptTrace follows the proxy's attempts of one request through the
// transport's client trace: whether the connection used was a reused one and
// whether any response byte came on it. The transport calls the hooks from
// its own goroutines, hence the atomics. Traces are pooled with their hooks
// bound (two closures a request saved); a hook the transport would call
// late, for a request that has ended, could at worst make another request's
// failed attempt look reused (one more attempt) or answered (no replay).
type attemptTrace struct {
	reused    atomic.Bool
	firstByte atomic.Bool
	trace     httptrace.ClientTrace
}

var tracePool = sync.Pool{New: func() any {
	at := new(attemptTrace)
	at.trace.GotConn = func(info httptrace.GotConnInfo) {
		// the last connection the transport got is the attempt's (it
		// may get several for one attempt when it replays a request
		// itself)
		at.reused.Store(info.Reused)
		at.firstByte.Store(false)
	}
	at.trace.GotFirstResponseByte = func() { at.firstByte.Store(true) }
	return at
}}

// withTrace returns r with a client trace that records its attempts'
// connections in st.at; releaseTrace gives it back.
func (st *routeState) withTrace(r *http.Request) *http.Request {
	at := tracePool.Get().(*attemptTrace)
	at.reused.Store(false)
	at.firstByte.Store(false)
	st.at = at
	return r.WithContext(httptrace.WithClientTrace(r.Context(), &at.trace))
}

// releaseTrace gives the request's trace back to the pool.
func (st *routeState) releaseTrace() {
	if st.at != nil {
		tracePool.Put(st.at)
		st.at = nil
	}
}

// replayable reports whether the proxy's failed attempt may be run again:
// see the comment at the top of this file.
func (st *routeState) replayable(rw *responseWatcher, r *http.Request, err error) bool {
	if err == nil || rw.wroteHeader || !st.routed || r.Context().Err() != nil {
		return false
	}
	if st.at == nil || !st.at.reused.Load() || st.at.firstByte.Load() {
		return false
	}
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 && !st.rb.held() {
		// a streamed body: what the failed attempt read of it is gone
		return false
	}
	var herr caddyhttp.HandlerError
	if !errors.As(err, &herr) || herr.StatusCode != http.StatusBadGateway {
		return false
	}
	return closedConn(herr.Err)
}

// closedConn reports whether err says the connection was closed or reset
// by its other end: EOF, a reset, a broken pipe, or the transport's "server
// closed idle connection".
func closedConn(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED) {
		return true
	}
	if errors.Is(err, net.ErrClosed) {
		// the transport closed the connection under the write of the
		// request: its read had met the replica's close or reset
		return true
	}
	// net/http's errServerClosedIdle is not exported
	return strings.Contains(err.Error(), "server closed idle connection")
}

// replay readies the request for another run of the proxy after a failed
// attempt that replayable accepted: the attempt's slot is freed without
// telling its replica anything, the replica may be chosen again, and the
// body starts again at its first byte.
func (st *routeState) replay() {
	st.dec.Release()
	st.routed = false
	st.replaying = true
	st.untryLast()
	if st.at != nil {
		st.at.reused.Store(false)
		st.at.firstByte.Store(false)
	}
	if st.rb.b != nil {
		st.rb.rewind()
	}
	st.replays++
}

// replayOf returns, for the routing of a replayed attempt, the decision of
// the attempt it replays: the router sends the turn back there without
// counting it again and counts the replay (placement.Request.Replay); nil
// for any other routing.
func (st *routeState) replayOf() *placement.Decision {
	if !st.replaying {
		return nil
	}
	st.replaying = false
	prev := st.dec
	return &prev
}

// untryLast forgets the replica chosen last, so that it may be chosen again.
func (st *routeState) untryLast() {
	if n := len(st.extra); n > 0 {
		st.extra = st.extra[:n-1]
		return
	}
	if st.ntried > 0 {
		st.ntried--
		st.tried[st.ntried] = ""
	}
}

// held reports whether the body was read in full and is kept for replays.
func (rb *replayBody) held() bool {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.b != nil && !rb.released
}
