package caddymodule

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Reading request bodies under a deadline, and a new conversation's whole
// body before admission holds it.
//
// Every body the handler reads is read under a deadline (bodyTimeout,
// 30 s): a client that sends part of its body and stops holds, until then,
// one goroutine, the bytes it sent and its connection, but no place in the
// admission queue and no room in a replica's working set, so stalled
// bodies cannot hold back the conversations behind them. It is answered
// 408 when the deadline passes. The read is bounded by max_body.
//
// Go's HTTP/1 server notices that a client closed its connection (and
// cancels the request's context) only once the handler has read the
// request body to its end: until then the connection's bytes are the
// body's, and nobody reads them. The handler reads inference bodies up to
// streamOver (1 MiB) in full before the proxy runs; of a larger one whose
// key came from a header it reads only the start (the rest is streamed to
// the replica), so a client that gave up while its request was held for
// admission would go unnoticed until admit_wait passed, and its request
// would then reach an engine. So the policy routes such a body only when
// its conversation is bound or admission is not in force; otherwise it
// chooses no upstream and asks for the body (routeState.wantBody), and the
// handler reads the rest (up to max_body, into the request's replay
// buffer, which the proxy then sends) and runs the proxy again: the
// request is placed or queued only once its whole body has arrived, and
// from then on the server watches the connection, so a client that leaves
// takes its request out of the queue at once. Over streamOver, only first
// requests of conversations under admission pay for the copy; turns of
// bound conversations keep streaming their bodies, but for a turn whose
// conversation's start (restart detection) was not in the part the
// handler read (noStart): the policy asks for the rest of that one too.

// bodyTimeout is how long a client has to send the part of its body the
// handler reads (all of it up to streamOver, and all of a new
// conversation's under admission). Nanoseconds; tests shorten it.
var bodyTimeout atomic.Int64

func init() { bodyTimeout.Store(int64(DefaultBodyTimeout)) }

// DefaultBodyTimeout is the time a client has to send the body the handler
// reads, from the moment it starts reading.
const DefaultBodyTimeout = 30 * time.Second

// readDeadliner is what sets a request's read deadline: Go's HTTP/1 and
// HTTP/2 response writers, found as http.ResponseController finds them
// (without the controller's allocation and its errors' for a writer
// without one).
type readDeadliner interface{ SetReadDeadline(time.Time) error }

// bodyDeadline sets the read deadline of the request's connection to
// bodyTimeout from now and returns what clears it (nil when w has none:
// the body is then read without a deadline, as over HTTP/3). After that,
// without a deadline, the server reads on in the background to notice the
// client leaving; a deadline there would end the request.
func bodyDeadline(w http.ResponseWriter) readDeadliner {
	for w != nil {
		switch t := w.(type) {
		case readDeadliner:
			_ = t.SetReadDeadline(time.Now().Add(time.Duration(bodyTimeout.Load())))
			return t
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// clearBodyDeadline ends bodyDeadline's deadline.
func clearBodyDeadline(d readDeadliner) {
	if d != nil {
		_ = d.SetReadDeadline(time.Time{})
	}
}

// bodyReadError is how a failed read of the request body is answered: 408
// past the deadline, 400 otherwise (a body that ended early: the client
// left, or sent less than it announced).
func bodyReadError(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return caddyhttp.Error(http.StatusRequestTimeout,
			fmt.Errorf("the request body did not arrive within %v", time.Duration(bodyTimeout.Load())))
	}
	return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
}

// bodyTooBig is the answer to a body over max_body.
func bodyTooBig(maxBody int64) error {
	return caddyhttp.Error(http.StatusRequestEntityTooLarge,
		fmt.Errorf("request body is larger than the gateway's limit of %d bytes", maxBody))
}

// unread reports whether the request's body may still have bytes the
// handler did not read.
func (st *routeState) unread(r *http.Request) bool {
	return st.rb.b == nil && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// readRest reads the rest of the request's body into its replay buffer
// under bodyTimeout (see above), for the policy that asked for it. A
// failure is a caddyhttp.HandlerError to answer: 413 over max_body, 408
// past the deadline, 400 for a body that ended early (the client left).
func (h *Handler) readRest(w http.ResponseWriter, r *http.Request, st *routeState) error {
	if st.streamed != nil {
		// from its first byte: the proxy may have read its start
		// (request_buffers)
		r.Body, st.streamed = st.streamed.rewound(), nil
	}
	rc := bodyDeadline(w)
	_, tooBig, err := readWhole(r, h.MaxBody, &st.rb)
	clearBodyDeadline(rc)
	switch {
	case tooBig:
		return bodyTooBig(h.MaxBody)
	case err != nil:
		return bodyReadError(err)
	}
	return nil
}

// keptBody is a body the handler streams (not read in full: over
// streamOver, or not JSON) while the policy may still ask for it whole:
// until the policy routes the request, what is read of it is also kept.
// reverse_proxy's request_buffers reads the body's start before the policy
// runs; when the policy asks for the whole body (wantBody), or admission
// holds the request, the handler reads it again from its first byte
// (rewound).
type keptBody struct {
	body io.ReadCloser
	keep bool // keep what is read in kept
	kept []byte
}

func (kb *keptBody) Read(p []byte) (int, error) {
	n, err := kb.body.Read(p)
	if kb.keep {
		kb.kept = append(kb.kept, p[:n]...)
	}
	return n, err
}

func (kb *keptBody) Close() error { return kb.body.Close() }

// routed ends the keeping: the request goes to a replica with the body as
// read so far.
func (kb *keptBody) routed() {
	kb.keep, kb.kept = false, nil
}

// rewound returns the body from its first byte: what was read of it
// (kept), then the rest.
func (kb *keptBody) rewound() io.ReadCloser {
	kept := kb.kept
	kb.routed()
	if len(kept) == 0 {
		return kb
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(kept), kb), kb}
}
