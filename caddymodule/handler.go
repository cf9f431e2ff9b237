package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
	"go.uber.org/zap"
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

// The conversation-key defaults, as the handler's documentation names them.
var DefaultSessionHeaders = convkey.DefaultSessionHeaders

const (
	DefaultAgentHeader       = convkey.DefaultAgentHeader
	DefaultParentAgentHeader = convkey.DefaultParentAgentHeader
)

// The handler's other defaults: max_body, and fingerprint_bytes (the
// bytes of the conversation's start a fingerprint reads).
const (
	DefaultMaxBody          = 32 << 20
	DefaultFingerprintBytes = convkey.DefaultFingerprintBytes
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
	// X-Claude-Code-Session-Id, X-Session-Affinity, Session-Id, X-Session-Id.
	// Caddy drops a request header whose name holds "_" (or ".") before
	// any handler runs unless the server's expected_underscore_headers
	// (expected_dot_headers) lists it; Provision warns about a configured
	// name no server lists.
	SessionHeaders []string `json:"session_headers,omitempty"`

	// Header naming a sub-agent; its value is appended to the session key so
	// each sub-agent's conversation is bound on its own, preferably next to
	// its parent. Default X-Claude-Code-Agent-Id; "-" disables.
	AgentHeader string `json:"agent_header,omitempty"`

	// Header naming the agent that started a sub-agent. Default
	// X-Claude-Code-Parent-Agent-Id; "-" disables.
	ParentAgentHeader string `json:"parent_agent_header,omitempty"`

	// Whether metadata.user_id / metadata.session_id and prompt_cache_key
	// are read from the body when no header carries a key (a /v1/responses
	// body's prompt_cache_key first). Default true.
	BodyKeys *bool `json:"body_keys,omitempty"`

	// Whether a request without a key gets the fallback key made from the
	// conversation's start (model, system prompt, first user message).
	// Default true.
	Fingerprint *bool `json:"fingerprint,omitempty"`

	// How many bytes of the conversation's start the fingerprint hashes.
	// Default 32 KiB.
	FingerprintBytes int `json:"fingerprint_bytes,omitempty"`

	// Whether restarts are detected. Default true. With it on, a request
	// whose key came from a header or the body's metadata carries a
	// fingerprint of its conversation's start (the
	// model and the messages up to the first user message), read from the
	// body (its first bytes when the body is over 1 MiB and they hold it:
	// the rest is streamed on). A request whose start differs from its
	// bound conversation's is a side request (a session title, a summary, a
	// probe, a call to another model under the same key), routed without
	// moving the conversation (side); when the same new start comes again
	// before the conversation's own in a request with more than one
	// message, the conversation was compacted or cleared and goes on with
	// it (restarted, once). Claude Code's
	// requests keep their start over a conversation's turns, over
	// --continue and in the summarising request of /compact; it changes
	// after /compact and when the model is switched, and its side
	// requests have starts of their own (testdata/claudecode,
	// testdata/claudecode-interactive). Turn it off for a client that
	// rewrites its first message from turn to turn.
	RestartDetection *bool `json:"restart_detection,omitempty"`

	// Headers that mark a session's last request: when one is present with
	// a value other than "0", "false" or "no", the request is routed as
	// usual and its conversation's binding is dropped when the response
	// ends (counted as ended). Default none: a session ID travels in clear
	// and proves nothing, so any client that knows one could end another's
	// conversation and make its next turn recompute its prompt elsewhere;
	// set it (e.g. ["X-Session-End"]) where only trusted clients, or a
	// gateway that authenticates them, reach the server. ["-"] is the same
	// as none.
	SessionEndHeaders []string `json:"session_end_headers,omitempty"`

	// Whether the body is read just to publish {http.vars.lm_warden.model}
	// when the key came from a header. Default true; with it false, the
	// model variable is filled only when the body was read anyway.
	ModelVar *bool `json:"model_var,omitempty"`

	// Deprecated spellings of BodyKeys, Fingerprint, RestartDetection and
	// ModelVar false, read as those with a warning in the log.
	NoBodyKeys         bool `json:"no_body_keys,omitempty"`
	NoFingerprint      bool `json:"no_fingerprint,omitempty"`
	NoRestartDetection bool `json:"no_restart_detection,omitempty"`
	NoModelVar         bool `json:"no_model_var,omitempty"`

	// The largest request body read, in bytes. Bigger bodies are refused
	// with 413 and a JSON error in the API's format. Default 32 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// How the failures the handler meets are answered: no replica
	// available or answering (503, 502, 504) and a body over max_body
	// (413). "api" (the default): when the server has error routes
	// (handle_errors), the error goes to them as any handler's error does;
	// otherwise the client gets a JSON error in its API's format
	// (Anthropic or OpenAI), and the failure is logged as Caddy logs
	// errors (error level for 5xx). "caddy": the error always goes to
	// Caddy, so without handle_errors the client gets an empty response
	// with the status.
	ErrorResponse string `json:"error_response,omitempty"`

	// Removes Claude Code's billing block (the first system block of an
	// Anthropic request, "x-anthropic-billing-header: cc_version=…;
	// cc_entrypoint=…;", different per conversation) before the request
	// goes on, so an engine that does not skip it itself (llama.cpp,
	// SGLang; vLLM does since about v0.18) caches the system prompt and
	// tools once for every conversation. Reads /v1/messages bodies in full.
	// Default off.
	StripBillingBlock bool `json:"strip_billing_block,omitempty"`

	// The file the turn trace is appended to (see trace.go and
	// docs/trace.md): one JSON line per turn a replica answered, with its
	// hashed conversation key, sizes, timing and marks, no text. Empty
	// (the default): no trace.
	TraceFile string `json:"trace_file,omitempty"`
	// The trace file's size cap in bytes: past it the file is moved to
	// TraceFile + ".1" (replacing an older one) and a new one started.
	// Default 100 MiB.
	TraceMaxSize int64 `json:"trace_max_size,omitempty"`

	trace     *turntrace.Writer // nil: no trace
	tracePath string            // its absolute path, its key in traceFiles

	keys   convkey.Extractor
	ends   []string // canonical session-end header names
	logger *zap.Logger
	// the switches resolved (withDefaults)
	bodyKeys, fingerprint, restartDetection, modelVar bool
}

// SessionEndHeader is the header session_end_headers names when the
// Caddyfile turns it on without naming one.
const SessionEndHeader = "X-Session-End"

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
	for _, name := range h.withDefaults() {
		h.logger.Warn("lm_warden: "+name+" is deprecated; set "+strings.TrimPrefix(name, "no_")+" to false instead",
			zap.String("setting", name))
	}
	agent, parent := h.AgentHeader, h.ParentAgentHeader
	if agent == "-" {
		agent = ""
	}
	if parent == "-" {
		parent = ""
	}
	h.keys = convkey.NewExtractor(h.SessionHeaders, agent, parent)
	h.warnDroppedHeaders(ctx, append(append(slices.Clone(h.SessionHeaders), agent, parent), h.SessionEndHeaders...))
	h.ends = nil
	for _, e := range h.SessionEndHeaders {
		if e != "-" && e != "" {
			h.ends = append(h.ends, http.CanonicalHeaderKey(e))
		}
	}
	return h.provisionTrace(ctx)
}

// withDefaults fills the settings left empty and resolves the switches,
// the deprecated no_… spellings included (deprecated lists those set).
func (h *Handler) withDefaults() (deprecated []string) {
	for _, sw := range []struct {
		on   **bool
		off  bool
		name string
		to   *bool
	}{
		{&h.BodyKeys, h.NoBodyKeys, "no_body_keys", &h.bodyKeys},
		{&h.Fingerprint, h.NoFingerprint, "no_fingerprint", &h.fingerprint},
		{&h.RestartDetection, h.NoRestartDetection, "no_restart_detection", &h.restartDetection},
		{&h.ModelVar, h.NoModelVar, "no_model_var", &h.modelVar},
	} {
		if sw.off {
			deprecated = append(deprecated, sw.name)
			*sw.on = new(bool)
		}
		*sw.to = *sw.on == nil || **sw.on
	}
	if len(h.SessionHeaders) == 0 {
		h.SessionHeaders = slices.Clone(DefaultSessionHeaders)
	}
	if h.AgentHeader == "" {
		h.AgentHeader = DefaultAgentHeader
	}
	if h.ParentAgentHeader == "" {
		h.ParentAgentHeader = DefaultParentAgentHeader
	}
	if h.FingerprintBytes == 0 {
		h.FingerprintBytes = DefaultFingerprintBytes
	}
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	return deprecated
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	if h.MaxBody < 0 {
		return fmt.Errorf("max_body must not be negative, got %d", h.MaxBody)
	}
	if h.FingerprintBytes < 0 {
		return fmt.Errorf("fingerprint_bytes must not be negative, got %d", h.FingerprintBytes)
	}
	if h.ErrorResponse != "" && h.ErrorResponse != "api" && h.ErrorResponse != "caddy" {
		return fmt.Errorf("error_response must be api or caddy, got %q", h.ErrorResponse)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Not pooled: the request's variables keep pointing at it after the
	// response, and they must not be written then (see finish).
	st := new(routeState)
	var arrived time.Time
	if h.trace != nil {
		arrived = time.Now()
	}
	st.api = apiOf(r.URL.Path)
	if st.api == vllmstats.APIResponses {
		st.shape = convkey.ShapeResponses
	}
	st.key, st.parent = h.keys.FromHeaders(r.Header)
	if st.key != "" {
		st.keySource = keySrcHeader
	}

	st.end = h.sessionEnds(r.Header)

	model, err := h.readKeys(w, r, st)
	if err != nil {
		return h.fail(w, r, st, err)
	}
	if st.unread(r) && isInference(r) {
		// streamed: kept as read until the policy routes it
		st.streamed = &keptBody{body: r.Body, keep: true}
		r.Body = st.streamed
	}
	if vars := requestVars(r); vars != nil {
		vars[VarSession] = st.key
		vars[VarModel] = model
		vars[varRoute] = st
	}

	rw := watcherPool.Get().(*responseWatcher)
	rw.ResponseWriter, rw.st = w, st
	rw.inference = isInference(r)
	rw.measure = rw.inference
	rw.ctx, rw.remote = r.Context(), r.RemoteAddr
	rw.arrived = arrived
	defer h.finish(rw)

	if r.ContentLength == 0 || st.rb.held() {
		// a turn met by a connection the replica closed can be sent
		// again (replay.go)
		r = st.withTrace(r)
	}
	err = next.ServeHTTP(rw, r)
	for {
		if !rw.wroteHeader && (st.held != nil || st.wantBody) {
			// the policy chose no upstream yet (a replay's run too)
			var answered bool
			if answered, err = h.hold(rw, r, st, err, next); answered {
				return err
			}
		}
		if st.replays >= maxReplays || !st.replayable(rw, r, err) {
			break
		}
		st.replay()
		err = next.ServeHTTP(rw, r)
	}
	if !rw.wroteHeader {
		// before any answer the handler writes itself below
		rw.abandoned()
	}
	if err != nil && !rw.wroteHeader {
		var herr caddyhttp.HandlerError
		if errors.As(err, &herr) {
			switch herr.StatusCode {
			case http.StatusBadGateway, http.StatusGatewayTimeout:
				// the replica chosen last could not be reached, or sent no
				// response headers in time (response_header_timeout)
				rw.failed()
				return h.fail(rw, r, st, err)
			case http.StatusServiceUnavailable:
				if st.refused && st.model != nil {
					return h.refuse(rw, r, st)
				}
				return h.fail(rw, r, st, err)
			}
		}
	}
	return err
}

// maxHolds bounds the runs of the proxy a request is held between: the
// rest of its body read, its admission ticket waited for.
const maxHolds = 4

// hold runs the proxy again for a request its policy chose no upstream
// for, yet: it reads the rest of the body the policy asked for
// (unread.go), or holds the request while its admission ticket waits (the
// wait, its deadline and its client leaving: heldTurn.wait), and then runs
// the proxy, whose policy maps the decision made to its upstream. Nothing
// waits inside the proxy, so lb_try_duration does not bound the wait. It
// returns the last run's error, or the answer to a body that failed
// (answered true).
func (h *Handler) hold(rw *responseWatcher, r *http.Request, st *routeState, err error, next caddyhttp.Handler) (answered bool, _ error) {
	for range maxHolds {
		switch ht := st.held; {
		case rw.wroteHeader:
			return false, err
		case st.wantBody:
			st.wantBody = false
			if berr := h.readRest(rw, r, st); berr != nil {
				return true, h.fail(rw, r, st, berr)
			}
			if st.noStart {
				st.noStart = false
				st.start = convkey.StartFingerprintOf(convkey.BytesView(st.rb.b), h.FingerprintBytes, st.shape)
			}
		case ht != nil:
			if ht.state.Load() != heldWaiting {
				// decided, yet the proxy did not take it (another
				// model's policy ran): nothing more to wait for
				return false, err
			}
			if st.streamed != nil {
				// a held turn's streamed body (a paused conversation's):
				// read in full, so that its client leaving is noticed
				// and the proxy's next run sends it whole
				if berr := h.readRest(rw, r, st); berr != nil {
					ht.cancel(time.Now())
					return true, h.fail(rw, r, st, berr)
				}
			}
			if ht.wait(r.Context()) != nil {
				// the client left (the ticket is cancelled), or no
				// replica is left: answered as the proxy's 503
				return false, err
			}
			if st.rb.b != nil {
				st.rb.rewind()
			}
		default:
			return false, err
		}
		err = next.ServeHTTP(rw, r)
	}
	return false, err
}

// readKeys reads from the body what the request's routing needs and the
// handler's settings ask for: the key when no header gave one, the
// conversation's start for restart detection, the model variable; and it
// strips Claude Code's billing block (strip_billing_block). The body is
// read under bodyTimeout (unread.go) and put back for the proxy. A failure
// is a caddyhttp.HandlerError to answer: 413 over max_body, 408 past the
// deadline, 400 for a body that ended early or names its model twice.
func (h *Handler) readKeys(w http.ResponseWriter, r *http.Request, st *routeState) (model string, err error) {
	strip := h.StripBillingBlock && st.api == vllmstats.APIAnthropic && r.Method == http.MethodPost
	keyFromBody := st.key == "" && (h.bodyKeys || h.fingerprint)
	wantStart := st.key != "" && h.restartDetection
	// an inference request admission may hold: its body, held, lets the
	// server notice a client that leaves while it waits (unread.go)
	holdable := isInference(r)
	if !(strip || keyFromBody || h.modelVar || wantStart || holdable) || !hasJSONBody(r) {
		return "", nil
	}
	rc := bodyDeadline(w)
	defer clearBodyDeadline(rc)
	var full []byte // the body, when read in full already
	if strip {
		body, tooBig, err := h.readBody(r, &st.rb)
		if tooBig {
			return "", bodyTooBig(h.MaxBody)
		}
		if err != nil {
			return "", bodyReadError(err)
		}
		if nb, ok := stripBillingBlock(body); ok {
			replay(r, nb, &st.rb)
			body = nb
		}
		full = body
	}
	var body []byte
	var tooBig bool
	switch {
	case full != nil:
		body = full
	case keyFromBody || r.ContentLength <= streamOver:
		// in full: the key may be anywhere, and a body up to streamOver
		// costs less read whole than relayed (see streamOver)
		body, tooBig, err = h.readBody(r, &st.rb)
	case wantStart:
		// the start, compared with a binding's (a new conversation's is
		// recorded with it): read from the body's start when that holds
		// it (and the model); else the policy asks for the rest when the
		// conversation is bound (noStart)
		st.start, st.noStart, model, body, tooBig, err = h.peekStart(r, &st.rb, st.shape)
	case h.modelVar:
		// only the model variable: as for the start
		model, body, tooBig, err = h.peekModel(r, &st.rb)
	}
	if tooBig {
		return "", bodyTooBig(h.MaxBody)
	}
	if errors.Is(err, errModelTwice) {
		return "", caddyhttp.Error(http.StatusBadRequest, err)
	}
	if err != nil {
		return "", bodyReadError(err)
	}
	if body == nil {
		return model, nil
	}
	view := convkey.BytesView(body)
	if st.key == "" && h.bodyKeys {
		// the shape's own key first: a Responses body's prompt_cache_key
		// (Codex's thread ID), found near its end, before a scan of the
		// whole body for metadata it rarely has; Claude Code's
		// metadata.user_id first otherwise
		if st.shape == convkey.ShapeResponses {
			st.key = convkey.PromptCacheKey(view)
		}
		if st.key == "" {
			st.key = convkey.SessionFromBody(view)
		}
		if st.key == "" && st.shape != convkey.ShapeResponses {
			st.key = convkey.PromptCacheKey(view)
		}
		if st.key != "" {
			st.keySource = keySrcBody
		}
	}
	if st.key != "" && h.restartDetection {
		// a key from a header or the body: its start tells a restarted
		// conversation (a fingerprint key is the start itself)
		st.start = convkey.StartFingerprintOf(view, h.FingerprintBytes, st.shape)
	}
	if st.key == "" && h.fingerprint {
		st.key = convkey.FingerprintOf(view, h.FingerprintBytes, st.shape)
		if st.key != "" {
			st.keySource = keySrcFingerprint
		}
	}
	if model == "" {
		var twice bool
		if model, twice = convkey.ModelFromBody(view); twice {
			return "", caddyhttp.Error(http.StatusBadRequest, errModelTwice)
		}
	}
	return model, nil
}

// sessionEnds reports whether a session-end header marks the request as its
// session's last.
func (h *Handler) sessionEnds(hd http.Header) bool {
	for _, name := range h.ends {
		v := hd[name]
		if len(v) == 0 {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(v[0])) {
		case "", "0", "false", "no":
			continue
		}
		return true
	}
	return false
}

// fail hands a failure (a caddyhttp.HandlerError) to Caddy, or answers it
// with a JSON error in the request's API format; see ErrorResponse.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, st *routeState, err error) error {
	var herr caddyhttp.HandlerError
	if !errors.As(err, &herr) || h.ErrorResponse == "caddy" || hasErrorRoutes(r) {
		return err
	}
	msg := herr.Err.Error()
	if herr.StatusCode >= 500 {
		msg = noReplicaMessage(st, herr.StatusCode)
	}
	writeAPIError(w, st.api, herr.StatusCode, msg)
	if h.logger != nil {
		level := zap.DebugLevel
		if herr.StatusCode >= 500 && r.Context().Err() == nil {
			// a client that left (a held request cancelled) is not an error
			level = zap.ErrorLevel
		}
		if c := h.logger.Check(level, msg); c != nil {
			c.Write(zap.Int("status", herr.StatusCode), zap.String("key", st.key),
				zap.String("uri", r.RequestURI), zap.Error(err))
		}
	}
	return nil
}

// hasErrorRoutes reports whether the request's server has error routes
// (handle_errors) to render a handler's error.
func hasErrorRoutes(r *http.Request) bool {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return srv != nil && srv.Errors != nil && len(srv.Errors.Routes) > 0
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
	if rw.parser != nil {
		u := rw.parser.Usage()
		now := time.Now()
		rw.st.finished(rw.status, &u, now)
		if h.trace != nil {
			h.traceTurn(rw, &u, now)
		}
		putParser(rw.parser)
		rw.parser = nil
	} else {
		rw.st.finished(rw.status, nil, time.Now())
	}
	if rw.st.held != nil {
		// a ticket still waiting, or a decision the proxy did not take
		rw.st.held.drop(time.Now())
	}
	// the body the handler read is not read again (see replayBody)
	rw.st.rb.release()
	rw.st.releaseTrace()
	// The request's variables are left alone: the proxy's transport may
	// still be dialling for this request in another goroutine (a client
	// gone during the dial) and reads them there.
	*rw = responseWatcher{}
	watcherPool.Put(rw)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
