package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Reading a new conversation's whole body before admission holds it.
//
// Go's HTTP/1 server notices that a client closed its connection (and
// cancels the request's context) only once the handler has read the
// request body to its end: until then the connection's bytes are the
// body's, and nobody reads them. The handler reads only the start of a
// body whose key came from a header (the rest is streamed to the replica),
// so a client that gave up while its request was held for admission would
// go unnoticed until admit_wait passed, and its request would then reach
// an engine. So a new conversation under admission is placed or queued
// only once its whole body has been read (up to max_body, into the
// request's replay buffer, which the proxy then sends): from then on the
// server watches the connection, and a client that leaves takes its
// request out of the queue at once. Only first requests of conversations
// under admission pay for the copy; turns of bound conversations keep
// streaming their bodies.
//
// The read has a deadline (heldBodyTimeout): a client that sends part of
// its body and stops holds, until then, one goroutine, the bytes it sent
// and its connection, but no place in the admission queue and no room in
// a replica's working set, so stalled bodies cannot hold back the
// conversations behind them. It is answered 408 when the deadline passes.
// The read reads what the client sent; it is bounded by max_body.

// heldBodyTimeout is how long a new conversation's client has to send the
// rest of its body once the request has reached admission. Nanoseconds;
// tests shorten it.
var heldBodyTimeout atomic.Int64

func init() { heldBodyTimeout.Store(int64(DefaultHeldBodyTimeout)) }

// DefaultHeldBodyTimeout is the time a new conversation's client has to
// send its whole body once admission would hold its request.
const DefaultHeldBodyTimeout = 30 * time.Second

// unread reports whether the request's body may still have bytes the
// handler did not read.
func (st *routeState) unread(r *http.Request) bool {
	return st.rb.b == nil && st.bodyErr == nil && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// readRest reads the rest of the request's body into its replay buffer
// under heldBodyTimeout (see above). On failure it records in st.bodyErr
// how the request is to be answered: 413 over max_body, 408 past the
// deadline, 400 for a body that ended early (the client left).
func (st *routeState) readRest(w http.ResponseWriter, r *http.Request) error {
	maxBody := st.maxBody
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	var rc *http.ResponseController
	if w != nil {
		rc = http.NewResponseController(w)
		// ErrNotSupported (no deadline on this connection): read without
		_ = rc.SetReadDeadline(time.Now().Add(time.Duration(heldBodyTimeout.Load())))
	}
	_, tooBig, err := readWhole(r, maxBody, &st.rb)
	if rc != nil {
		// no deadline: the server reads on in the background to notice the
		// client leaving, and a deadline there would end the request
		_ = rc.SetReadDeadline(time.Time{})
	}
	switch {
	case tooBig:
		st.bodyErr = caddyhttp.Error(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body is larger than the gateway's limit of %d bytes", maxBody))
	case errors.Is(err, os.ErrDeadlineExceeded):
		st.bodyErr = caddyhttp.Error(http.StatusRequestTimeout,
			fmt.Errorf("the request body did not arrive within %v", time.Duration(heldBodyTimeout.Load())))
	case err != nil:
		st.bodyErr = caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
	}
	return st.bodyErr
}
