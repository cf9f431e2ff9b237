package caddymodule

import (
	"bytes"
	"errors"
	"io"
	"math/bits"
	"mime"
	"net/http"
	"strings"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
)

// Reading the request body for its keys and model, and putting it back for
// the proxy and its retries.

// hasJSONBody reports whether the request may carry a JSON body worth
// reading: a method with a body, no content coding, a JSON (or absent)
// content type.
func hasJSONBody(r *http.Request) bool {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return false
	}
	if r.Header.Get("Content-Encoding") != "" {
		return false
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	if strings.EqualFold(ct, jsonType) {
		// what clients send: no parameters to parse
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

const jsonType = "application/json"

// readBody reads the whole body, bounded by MaxBody, and puts it back so the
// proxy (and its retries) send it unchanged. tooBig reports a body over the
// limit; the body is then not restored, since the request is refused.
func (h *Handler) readBody(r *http.Request, rb *replayBody) (body []byte, tooBig bool, err error) {
	return readWhole(r, h.MaxBody, rb)
}

// readWhole is readBody with the limit given.
func readWhole(r *http.Request, maxBody int64, rb *replayBody) (body []byte, tooBig bool, err error) {
	if r.ContentLength > maxBody {
		return nil, true, nil
	}
	if r.ContentLength > 0 {
		// known length: one exact buffer, from the pool when the body is
		// large (it goes back when the request ends: rb.release)
		body = rb.alloc(int(r.ContentLength))
		if _, err := io.ReadFull(r.Body, body); err != nil {
			rb.pool = 0 // not in use: the garbage collector takes it
			return nil, false, err
		}
	} else {
		b := bytes.NewBuffer(make([]byte, 0, 16<<10))
		n, err := b.ReadFrom(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			return nil, false, err
		}
		if n > maxBody {
			return nil, true, nil
		}
		body = b.Bytes()
	}
	replay(r, body, rb)
	return body, false, nil
}

// replay puts body, read in full, back as the request's body.
func replay(r *http.Request, body []byte, rb *replayBody) {
	_ = r.Body.Close()
	rb.mu.Lock()
	rb.b, rb.off = body, 0
	rb.mu.Unlock()
	r.Body = rb
	r.GetBody = rb.getBody
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Del("Transfer-Encoding")
}

// replayBody is the request body put back after reading it. The proxy
// reuses one request body for all attempts of a request, so when an upstream
// read the body and its answer is retried (lb_retry_match on a response),
// the next attempt would send nothing; the policy rewinds it before every
// retry.
//
// A large body read with a known length lives in a pooled buffer (alloc),
// given back when the request ends (release): a 256 KB conversation then
// costs no allocation and no clearing per request. Every read of the
// buffer happens under mu, and a write in progress (WriteTo) keeps the
// buffer out of the pool, so a transport still sending the body after the
// handler returned never sees another request's bytes: it reads EOF.
type replayBody struct {
	mu       sync.Mutex
	b        []byte
	off      int
	pool     int  // 1 + the pool class b came from; 0 none
	writing  int  // WriteTo calls in progress
	released bool // release ran: b is gone
}

func (rb *replayBody) Read(p []byte) (int, error) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.off >= len(rb.b) {
		return 0, io.EOF
	}
	n := copy(p, rb.b[rb.off:])
	rb.off += n
	return n, nil
}

// WriteTo lets io.Copy send the rest in one write.
func (rb *replayBody) WriteTo(w io.Writer) (int64, error) {
	rb.mu.Lock()
	rest := rb.b[rb.off:]
	rb.off = len(rb.b)
	rb.writing++
	rb.mu.Unlock()
	n, err := w.Write(rest)
	rb.mu.Lock()
	rb.writing--
	rb.mu.Unlock()
	return int64(n), err
}

// getBody is the request's GetBody: the transport's own retries of a
// request read the body from its start again.
func (rb *replayBody) getBody() (io.ReadCloser, error) {
	return &replayCopy{rb: rb}, nil
}

// replayCopy is a reader of a replayBody's bytes with its own offset.
type replayCopy struct {
	rb  *replayBody
	off int
}

func (rc *replayCopy) Read(p []byte) (int, error) {
	rb := rc.rb
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.released {
		return 0, io.ErrUnexpectedEOF
	}
	if rc.off >= len(rb.b) {
		return 0, io.EOF
	}
	n := copy(p, rb.b[rc.off:])
	rc.off += n
	return n, nil
}

func (rc *replayCopy) Close() error { return nil }

// Pooled body buffers: classes of powers of two from bodyPoolMin to
// bodyPoolMax bytes; smaller and larger bodies are allocated.
const (
	bodyPoolMinShift = 12 // 4 KiB
	bodyPoolMaxShift = 22 // 4 MiB
)

var bodyPools [bodyPoolMaxShift - bodyPoolMinShift + 1]sync.Pool

// alloc returns a buffer of n bytes for the body, from the pool when n is
// in its range.
func (rb *replayBody) alloc(n int) []byte {
	rb.pool = 0
	if n < 1<<bodyPoolMinShift || n > 1<<bodyPoolMaxShift {
		return make([]byte, n)
	}
	c := bits.Len(uint(n-1)) - bodyPoolMinShift
	rb.pool = c + 1
	if bp, ok := bodyPools[c].Get().(*[]byte); ok {
		return (*bp)[:n]
	}
	return make([]byte, n, 1<<(c+bodyPoolMinShift))
}

// release ends the body's life: later reads get EOF, and a pooled buffer
// goes back to its pool unless a write of it is in progress.
func (rb *replayBody) release() {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.released {
		return
	}
	rb.released = true
	b, c := rb.b, rb.pool-1
	rb.b, rb.off, rb.pool = nil, 0, 0
	if c >= 0 && rb.writing == 0 && cap(b) == 1<<(c+bodyPoolMinShift) {
		b = b[:0]
		bodyPools[c].Put(&b)
	}
}

func (rb *replayBody) Close() error { return nil }

// rewind makes the next read start at the body's first byte again.
func (rb *replayBody) rewind() {
	rb.mu.Lock()
	rb.off = 0
	rb.mu.Unlock()
}

// streamOver is the size above which a body keyed by a header is streamed
// to the replica after its start (peek) instead of read in full into a
// pooled buffer (readBody). Reading in full costs no allocation (the
// buffers are pooled) and fewer system calls than the proxy's own 32 KiB
// relay: each read takes what the connection holds, up to the whole rest
// of the body, where the relay reads at most 32 KiB at a time. With a
// 256 KB body that is about 6 reads a request against 13 (perf stat on
// Caddy under bombardier), which took the header-keyed path from 0.93 to
// 1.05 of plain Caddy's req/s (scripts/overhead). It also keeps the body for
// the proxy's retries and lets Go's server notice a client that leaves
// while its turn waits (see unread.go). The engine cannot start before the
// last byte either, so holding the body costs a turn only the copy to the
// replica over its (fast) link. Larger bodies stream, so memory stays
// bounded by streamOver a request in flight.
const streamOver = 1 << 20

// peekSize is how much of a body's start peek reads first.
const peekSize = 4 << 10

// peekModel finds the body's "model" field when nothing else in the body is
// needed (the key came from a header): clients put the model first, so
// usually the first peekSize bytes hold it (see peek).
func (h *Handler) peekModel(r *http.Request, rb *replayBody) (model string, body []byte, tooBig bool, err error) {
	var twice bool
	body, tooBig, err = h.peek(r, rb, peekSize, func(prefix string) bool {
		var ok bool
		model, ok, twice = modelFromPrefix(prefix)
		return ok
	})
	if err == nil && twice {
		err = errModelTwice
	}
	return model, body, tooBig, err
}

// peekStartSize is the most of a bound conversation's body peekStart reads
// for its start.
const peekStartSize = 64 << 10

// peekStart reads the start of a body keyed by a header for restart
// detection, and the model with it. Clients send the model and the
// messages first (Claude Code: model, messages, system, tools…), so the
// first peekSize bytes, or peekStartSize, usually hold the messages up to
// the first user message (see peek). When peekStartSize bytes do not hold
// them but the first peekSize bytes hold the model (what peekModel
// accepts), the body is streamed on with the start unknown (unknown true):
// the policy asks for the rest only for a bound conversation, whose start
// it compares (unread.go). start is 0 when the body was read in full (the
// caller computes it from body).
func (h *Handler) peekStart(r *http.Request, rb *replayBody, shape convkey.Shape) (start uint64, unknown bool, model string, body []byte, tooBig bool, err error) {
	var twice, early, earlyTwice bool
	var earlyModel string
	body, tooBig, err = h.peek(r, rb, peekStartSize, func(prefix string) bool {
		if fp, ok := convkey.StartFromPrefixOf(prefix, h.FingerprintBytes, shape); ok {
			start = fp
			model, _, twice = modelFromPrefix(prefix)
			return true
		}
		if len(prefix) <= peekSize {
			earlyModel, early, earlyTwice = modelFromPrefix(prefix)
			return false
		}
		if early {
			model, twice, unknown = earlyModel, earlyTwice, true
		}
		return early
	})
	if err == nil && twice {
		err = errModelTwice
	}
	return start, unknown, model, body, tooBig, err
}

// peek reads the start of a body of known length over peekSize (the
// handler calls it for bodies over streamOver) — its first peekSize bytes,
// then up to limit while found does not accept them — and when found
// accepts the bytes read sends the body on as those bytes followed by the
// unread rest: a multi-megabyte conversation is then streamed to the
// replica, not held in memory. Such a body is not kept for retries after
// an upstream has read it (as with Caddy's own unbuffered bodies;
// reverse_proxy's request_buffers keeps it). Otherwise it reads the whole
// body as readBody does and returns it in body.
func (h *Handler) peek(r *http.Request, rb *replayBody, limit int, found func(prefix string) bool) (body []byte, tooBig bool, err error) {
	n := r.ContentLength
	if n > h.MaxBody {
		return nil, true, nil
	}
	if n <= peekSize {
		return h.readBody(r, rb)
	}
	limit = int(min(int64(limit), n))
	hp := headPool.Get().(*[]byte)
	head := *hp
	if _, err := io.ReadFull(r.Body, head); err != nil {
		headPool.Put(hp)
		return nil, false, err
	}
	for {
		if found(convkey.BytesView(head)) {
			r.Body = &prefixBody{head: head, body: r.Body, pooled: hp}
			return nil, false, nil
		}
		if len(head) >= limit {
			break
		}
		more := len(head)
		head = append(head, make([]byte, limit-more)...)
		if hp != nil {
			// copied into a larger buffer: the pool's is free
			headPool.Put(hp)
			hp = nil
		}
		if _, err := io.ReadFull(r.Body, head[more:]); err != nil {
			return nil, false, err
		}
	}
	body = rb.alloc(int(n))
	copy(body, head)
	if hp != nil {
		headPool.Put(hp)
	}
	if _, err := io.ReadFull(r.Body, body[len(head):]); err != nil {
		rb.pool = 0
		return nil, false, err
	}
	replay(r, body, rb)
	return body, false, nil
}

// modelFromPrefix returns the top-level "model" string of a JSON document
// of which prefix is the start; ok is false when prefix ends before the
// member does (or before it is reached). twice reports a second "model"
// member in what prefix holds after it (convkey.SecondModel).
func modelFromPrefix(prefix string) (model string, ok, twice bool) {
	v := gjson.Get(prefix, "model")
	if !v.Exists() {
		return "", false, false
	}
	if !convkey.EndsInside(v, prefix) {
		return "", false, false
	}
	if v.Type == gjson.String && (len(v.Raw) < 2 || v.Raw[len(v.Raw)-1] != '"') {
		return "", false, false
	}
	twice = convkey.SecondModel(prefix, v)
	if v.Type != gjson.String {
		return "", true, twice
	}
	return strings.Clone(convkey.Clip(v.Str)), true, twice
}

// errModelTwice refuses a body that names its model twice.
var errModelTwice = errors.New(`the request body has two "model" members: the engine would read the last, LM Warden routes by the first; send one`)

// headPool holds the peekSize buffers peek reads a body's start into; a
// prefixBody gives its buffer back once the proxy has read the start, so
// a request whose body streams to the replica allocates none.
var headPool = sync.Pool{New: func() any { b := make([]byte, peekSize); return &b }}

// prefixBody is a body whose start was read: the start, then the rest.
// A Read that returns the last of the start goes on reading the rest into
// the same buffer, so the proxy writes the start and the rest's first bytes
// to the replica in one piece, as it would the plain body (a Read of the
// start alone costs one more write to the replica's connection).
type prefixBody struct {
	head   []byte
	body   io.ReadCloser
	pooled *[]byte // head's buffer, from headPool: back to it once read
}

func (pb *prefixBody) Read(p []byte) (int, error) {
	if len(pb.head) == 0 {
		return pb.body.Read(p)
	}
	n := copy(p, pb.head)
	pb.head = pb.head[n:]
	if len(pb.head) == 0 && pb.pooled != nil {
		// nothing refers to the buffer any more
		headPool.Put(pb.pooled)
		pb.pooled = nil
	}
	if len(pb.head) > 0 || n == len(p) {
		return n, nil
	}
	m, err := pb.body.Read(p[n:])
	if err == io.EOF {
		err = nil // the next Read reports it
	}
	return n + m, err
}

func (pb *prefixBody) Close() error { return pb.body.Close() }
