package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Request variables the handler publishes. They appear as
// {http.vars.lm_warden.session} etc. in placeholders and can be matched with
// Caddy's vars matcher.
const (
	// VarSession holds the conversation key ("" when none was found).
	VarSession = "lm_warden.session"
	// VarModel holds the body's "model" field.
	VarModel = "lm_warden.model"
	// VarReplica holds the replica the policy chose (set by the policy).
	VarReplica = "lm_warden.replica"
	// VarReason holds why the policy chose it (set by the policy).
	VarReason = "lm_warden.reason"

	// varRoute carries the request's *routeState between handler and policy.
	varRoute = "lm_warden.route"
)

const (
	defaultMaxBody          = 32 << 20
	defaultFingerprintBytes = 32 << 10
)

// Handler finds the conversation a request belongs to and hands it to the
// lm_warden selection policy of the reverse_proxy that follows. It reads the
// key from headers, then (when needed) from the JSON body and finally from a
// fingerprint of the conversation's start; it watches the response to count
// the tokens the replica reports and frees the request's in-flight slot when
// the response ends.
//
// Place it before reverse_proxy (the Caddyfile directive is ordered so).
type Handler struct {
	// Headers that carry a conversation key, tried in order. Default:
	// X-Claude-Code-Session-Id, X-Session-Affinity, Session_id, Session-Id,
	// X-Session-Id.
	SessionHeaders []string `json:"session_headers,omitempty"`

	// Header naming a sub-agent; its value is appended to the session key so
	// each sub-agent's conversation is bound on its own, preferably next to
	// its parent. Default X-Claude-Code-Agent-Id; "-" disables.
	AgentHeader string `json:"agent_header,omitempty"`

	// Header naming the agent that started a sub-agent. Default
	// X-Claude-Code-Parent-Agent-Id; "-" disables.
	ParentAgentHeader string `json:"parent_agent_header,omitempty"`

	// Disables reading metadata.user_id / metadata.session_id from the body
	// when no header carries a key.
	NoBodyKeys bool `json:"no_body_keys,omitempty"`

	// Disables the fallback key made from the conversation's start (model,
	// system prompt, first user message).
	NoFingerprint bool `json:"no_fingerprint,omitempty"`

	// How many bytes of the conversation's start the fingerprint hashes.
	// Default 32 KiB.
	FingerprintBytes int `json:"fingerprint_bytes,omitempty"`

	// Disables reading the body just to publish {http.vars.lm_warden.model}
	// when the key came from a header. With it set, the model variable is
	// filled only when the body was read anyway.
	NoModelVar bool `json:"no_model_var,omitempty"`

	// The largest request body read, in bytes. Bigger bodies are refused
	// with 413 and a JSON error in the API's format. Default 32 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	keys   keyExtractor
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.lm_warden",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision fills in defaults.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	headers := h.SessionHeaders
	if len(headers) == 0 {
		headers = DefaultSessionHeaders
	}
	agent, parent := h.AgentHeader, h.ParentAgentHeader
	if agent == "" {
		agent = DefaultAgentHeader
	}
	if parent == "" {
		parent = DefaultParentAgentHeader
	}
	if agent == "-" {
		agent = ""
	}
	if parent == "-" {
		parent = ""
	}
	h.keys = newKeyExtractor(headers, agent, parent)
	if h.FingerprintBytes == 0 {
		h.FingerprintBytes = defaultFingerprintBytes
	}
	if h.MaxBody == 0 {
		h.MaxBody = defaultMaxBody
	}
	return nil
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	if h.MaxBody < 0 {
		return fmt.Errorf("max_body must not be negative, got %d", h.MaxBody)
	}
	if h.FingerprintBytes < 0 {
		return fmt.Errorf("fingerprint_bytes must not be negative, got %d", h.FingerprintBytes)
	}
	return nil
}

// routeState is what one request carries between the handler, the policy and
// the response wrapper. The policy fills model and dec; the handler releases
// dec when the response ends. Only the request's goroutine touches it.
type routeState struct {
	key, parent string
	api         apiKind
	model       *modelState // set by the policy that routed the request
	dec         placement.Decision
	routed      bool
	detached    bool       // routed without the handler: the slot is freed with the request context
	rb          replayBody // the request body the handler read and put back (rb.b != nil), rewound on retries
	ntried      int
	tried       [4]string // replicas chosen for this request so far
	extra       []string  // more of them, past len(tried)
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

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Not pooled: the request's variables keep pointing at it after the
	// response, and they must not be written then (see finish).
	st := new(routeState)
	st.api = apiOf(r.URL.Path)
	st.key, st.parent = h.keys.fromHeaders(r.Header)

	var model string
	keyFromBody := st.key == "" && (!h.NoBodyKeys || !h.NoFingerprint)
	if (keyFromBody || !h.NoModelVar) && hasJSONBody(r) {
		var body []byte
		var tooBig bool
		var err error
		if keyFromBody {
			body, tooBig, err = h.readBody(r, &st.rb)
		} else {
			// only the model variable: read the body's start when that
			// holds the model, else all of it
			model, body, tooBig, err = h.peekModel(r, &st.rb)
		}
		if tooBig {
			writeAPIError(w, st.api, http.StatusRequestEntityTooLarge,
				fmt.Sprintf("request body is larger than the gateway's limit of %d bytes", h.MaxBody))
			return nil
		}
		if err != nil {
			return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
		}
		if body != nil {
			view := bytesView(body)
			if st.key == "" && !h.NoBodyKeys {
				st.key = sessionFromBody(view)
			}
			if st.key == "" && !h.NoFingerprint {
				st.key = fingerprint(view, h.FingerprintBytes)
			}
			model = modelFromBody(view)
		}
	}
	if vars := requestVars(r); vars != nil {
		vars[VarSession] = st.key
		vars[VarModel] = model
		vars[varRoute] = st
	}

	rw := watcherPool.Get().(*responseWatcher)
	rw.ResponseWriter, rw.st = w, st
	rw.measure = r.Method == http.MethodPost && !strings.HasSuffix(r.URL.Path, "/count_tokens")
	rw.ctx = r.Context()
	defer h.finish(rw)

	err := next.ServeHTTP(rw, r)
	if err != nil && !rw.wroteHeader {
		var herr caddyhttp.HandlerError
		if errors.As(err, &herr) && (herr.StatusCode == http.StatusBadGateway || herr.StatusCode == http.StatusGatewayTimeout) {
			// the replica chosen last could not be reached, or sent no
			// response headers in time (response_header_timeout)
			rw.failed()
		}
		if errors.As(err, &herr) && (herr.StatusCode == http.StatusServiceUnavailable || herr.StatusCode == http.StatusBadGateway || herr.StatusCode == http.StatusGatewayTimeout) {
			writeAPIError(rw, st.api, herr.StatusCode, noReplicaMessage(st, herr.StatusCode))
			if h.logger != nil {
				h.logger.Debug("no replica answered", zap.String("key", st.key), zap.Error(err))
			}
			return nil
		}
	}
	return err
}

// requestVars returns the request's variables (what caddyhttp.SetVar and
// GetVar use), nil outside a Caddy server, so that several are read and set
// with one walk of the context chain. Values stored must not be nil.
func requestVars(r *http.Request) map[string]any {
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	return vars
}

func noReplicaMessage(st *routeState, status int) string {
	name := "the model"
	if st.model != nil {
		name = "model " + st.model.name
	}
	if status == http.StatusServiceUnavailable {
		return "no replica of " + name + " is available"
	}
	return "no replica of " + name + " answered"
}

// finish runs when the response has ended, however it ended (normally, client
// gone, upstream error, panic): it records the tokens the replica reported
// and frees the in-flight slot.
//
// A stream the replica cut after its headers (the proxy then aborts the
// response with http.ErrAbortHandler) is reported as the replica's failure
// before the panic goes on.
func (h *Handler) finish(rw *responseWatcher) {
	v := recover()
	if v != nil {
		rw.failed()
		defer panic(v)
	}
	st := rw.st
	if st.routed {
		st.dec.Release()
		if rw.parser != nil && st.model != nil && rw.status >= 200 && rw.status < 300 {
			st.model.recordUsage(st.dec.Replica, rw.parser.Usage(), time.Now())
		}
	}
	if rw.parser != nil {
		putParser(rw.parser)
		rw.parser = nil
	}
	// The request's variables are left alone: the proxy's transport may
	// still be dialling for this request in another goroutine (a client
	// gone during the dial) and reads them there.
	*rw = responseWatcher{}
	watcherPool.Put(rw)
}

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
	if r.ContentLength > h.MaxBody {
		return nil, true, nil
	}
	if r.ContentLength > 0 {
		// known length: one exact allocation
		body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, false, err
		}
	} else {
		b := bytes.NewBuffer(make([]byte, 0, 16<<10))
		n, err := b.ReadFrom(io.LimitReader(r.Body, h.MaxBody+1))
		if err != nil {
			return nil, false, err
		}
		if n > h.MaxBody {
			return nil, true, nil
		}
		body = b.Bytes()
	}
	h.replay(r, body, rb)
	return body, false, nil
}

// replay puts body, read in full, back as the request's body.
func (h *Handler) replay(r *http.Request, body []byte, rb *replayBody) {
	_ = r.Body.Close()
	rb.b, rb.off = body, 0
	r.Body = rb
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	r.Header.Del("Transfer-Encoding")
}

// replayBody is the request body put back after reading it. The proxy
// reuses one request body for all attempts of a request, so when an upstream
// read the body and its answer is retried (lb_retry_match on a response),
// the next attempt would send nothing; the policy rewinds it before every
// retry.
type replayBody struct {
	mu  sync.Mutex
	b   []byte
	off int
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
	rb.mu.Unlock()
	n, err := w.Write(rest)
	return int64(n), err
}

func (rb *replayBody) Close() error { return nil }

// rewind makes the next read start at the body's first byte again.
func (rb *replayBody) rewind() {
	rb.mu.Lock()
	rb.off = 0
	rb.mu.Unlock()
}

// peekSize is how much of a body's start peekModel reads for the model.
const peekSize = 4 << 10

// peekModel finds the body's "model" field when nothing else in the body is
// needed (the key came from a header). Clients put the model first, so for
// a body of known length over peekSize it reads only the first peekSize
// bytes and, when they hold the whole top-level "model" member, sends the
// body on as those bytes followed by the unread rest: a megabyte
// conversation is then streamed to the replica, not copied. Such a body is
// not kept for retries after an upstream has read it (as with Caddy's own
// unbuffered bodies; reverse_proxy's request_buffers keeps it). Otherwise it
// reads the whole body as readBody does and returns it in body.
func (h *Handler) peekModel(r *http.Request, rb *replayBody) (model string, body []byte, tooBig bool, err error) {
	n := r.ContentLength
	if n > h.MaxBody {
		return "", nil, true, nil
	}
	if n <= peekSize {
		body, tooBig, err = h.readBody(r, rb)
		return "", body, tooBig, err
	}
	head := make([]byte, peekSize)
	if _, err := io.ReadFull(r.Body, head); err != nil {
		return "", nil, false, err
	}
	if m, ok := modelFromPrefix(bytesView(head)); ok {
		r.Body = &prefixBody{Reader: io.MultiReader(bytes.NewReader(head), r.Body), body: r.Body}
		return m, nil, false, nil
	}
	body = make([]byte, n)
	copy(body, head)
	if _, err := io.ReadFull(r.Body, body[peekSize:]); err != nil {
		return "", nil, false, err
	}
	h.replay(r, body, rb)
	return "", body, false, nil
}

// modelFromPrefix returns the top-level "model" string of a JSON document
// of which prefix is the start; ok is false when prefix ends before the
// member does (or before it is reached).
func modelFromPrefix(prefix string) (model string, ok bool) {
	v := gjson.Get(prefix, "model")
	if !v.Exists() {
		return "", false
	}
	end := v.Index + len(v.Raw)
	if v.Index <= 0 || end >= len(prefix) {
		return "", false
	}
	if v.Type == gjson.String && (len(v.Raw) < 2 || v.Raw[len(v.Raw)-1] != '"') {
		return "", false
	}
	if v.Type != gjson.String {
		return "", true
	}
	return strings.Clone(clip(v.Str)), true
}

// prefixBody is a body whose start was read: the start, then the rest.
type prefixBody struct {
	io.Reader
	body io.ReadCloser
}

func (pb *prefixBody) Close() error { return pb.body.Close() }

// responseWatcher passes the response through unchanged and at once, and
// feeds a copy of the bytes to the usage parser. Watchers are pooled: one is
// taken per request and put back when the handler returns.
type responseWatcher struct {
	caddyhttp.ResponseWriterWrapper
	ctx         context.Context // the request's: done when the client has gone
	answered    bool            // the replica's answer was reported a success
	failReport  bool            // the request's failure was reported
	st          *routeState
	parser      *vllmstats.UsageParser
	measure     bool
	wroteHeader bool
	status      int
	encoded     bool // the response has a Content-Encoding: usage cannot be read
}

var watcherPool = sync.Pool{New: func() any { return new(responseWatcher) }}

// WriteHeader starts usage parsing for successful generation responses.
func (rw *responseWatcher) WriteHeader(status int) {
	if rw.wroteHeader {
		rw.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	if status >= 100 && status < 200 {
		rw.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	rw.wroteHeader = true
	rw.status = status
	if rw.st.routed && !rw.answered {
		// the replica answered: a 5xx is its failure, anything else ends
		// its run of failures (a stream it cuts later is still one)
		if status >= 500 {
			rw.failed()
		} else {
			rw.answered = true
			rw.st.dec.Succeeded()
		}
	}
	rw.encoded = rw.Header().Get("Content-Encoding") != ""
	if rw.measure && rw.st.routed && status >= 200 && status < 300 {
		h := rw.Header()
		if !rw.encoded {
			stream := strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
			api := vllmstats.APIOpenAI
			if rw.st.api == apiAnthropic {
				api = vllmstats.APIAnthropic
			}
			rw.parser = getParser(api, stream)
		} else {
			// compressed: cannot read usage; the request still counts, unmeasured
			rw.parser = getParser(vllmstats.APIOpenAI, false)
		}
	}
	rw.ResponseWriterWrapper.WriteHeader(status)
}

// failed reports the request's failure at its replica, once, unless the
// client went away first (then the replica is not to blame).
func (rw *responseWatcher) failed() {
	if rw.failReport || rw.st == nil || !rw.st.routed || (rw.ctx != nil && rw.ctx.Err() != nil) {
		return
	}
	rw.failReport = true
	rw.st.dec.Failed(time.Time{})
}

// Write passes b through and parses a copy.
func (rw *responseWatcher) Write(b []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	n, err := rw.ResponseWriterWrapper.Write(b)
	if rw.parser != nil && n > 0 && !rw.encoded {
		_, _ = rw.parser.Write(b[:n])
	}
	return n, err
}

// ReadFrom keeps io.Copy going through Write, so the parser sees the bytes.
func (rw *responseWatcher) ReadFrom(src io.Reader) (int64, error) {
	return io.Copy(writerOnly{rw}, src)
}

type writerOnly struct{ io.Writer }

var parserPool sync.Pool

func getParser(api vllmstats.API, stream bool) *vllmstats.UsageParser {
	if p, ok := parserPool.Get().(*vllmstats.UsageParser); ok {
		p.Reset(api, stream)
		return p
	}
	return vllmstats.NewUsageParser(api, stream)
}

func putParser(p *vllmstats.UsageParser) { parserPool.Put(p) }

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ http.ResponseWriter         = (*responseWatcher)(nil)
	_ io.ReaderFrom               = (*responseWatcher)(nil)
)
