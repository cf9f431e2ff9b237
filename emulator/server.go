package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultModel is the served model name when ServerConfig.Model is empty.
const DefaultModel = "Qwen/Qwen3-4B-Instruct-2507"

// EngineHeader names the engine that served a response: the replica index
// with one server per replica, the data-parallel rank with one
// data-parallel server.
const EngineHeader = "X-Emu-Engine"

// RankHeader pins a request to a data-parallel engine, as in vLLM.
const RankHeader = "X-data-parallel-rank"

// ServerConfig describes the replicas one process emulates.
type ServerConfig struct {
	// Replicas is the number of one-engine servers, each on its own port
	// (default 1). Ignored when DataParallel > 1.
	Replicas int
	// DataParallel > 1 starts one server with that many engines, balanced
	// like vLLM (lowest waiting×4 + running) unless the request names a
	// rank in X-data-parallel-rank.
	DataParallel int
	// Speed runs engine time this many times faster than the wall clock
	// (default 1). Timings reported by the API and metrics are engine time.
	Speed float64
	// DPStatsInterval is the engine-time period of the load snapshot the
	// data-parallel balancer decides on (default DefaultDPStatsInterval).
	DPStatsInterval time.Duration
	// DPRotate makes the data-parallel balancer rotate its tie-break after
	// every pick, as vLLM does from PR 47420 on (see DPBalancer).
	DPRotate bool
	// DPAPIServers is the number of vLLM API server processes balancing
	// on their own (default DataParallel, as `vllm serve
	// --data-parallel-size N` starts); each request is decided by one at
	// random, as the kernel spreads connections over them.
	DPAPIServers int
	// Model is the served model name (default DefaultModel). Requests may
	// name any model.
	Model string
	// Engine sizes every engine; the zero value means DefaultEngineConfig().
	Engine EngineConfig
	// DefaultMaxTokens bounds the output of a request that sets no maximum
	// (0: up to the model's length, as vLLM by default); vLLM's
	// --override-generation-config '{"max_new_tokens": N}' does the same.
	DefaultMaxTokens int
	// Host to listen on (default 127.0.0.1).
	Host string
	// BasePort: replica i listens on BasePort+i; 0 picks free ports.
	BasePort int
	// Logger (default zap.NewNop()).
	Logger *zap.Logger
}

// Server runs emulated replicas over HTTP.
type Server struct {
	cfg      ServerConfig
	log      *zap.Logger
	replicas []*replica
	seq      atomic.Uint64
	created  int64
}

type replica struct {
	s       *Server
	index   int
	addr    string
	runners []*runner

	mu      sync.Mutex
	srv     *http.Server
	ln      net.Listener
	stopped bool
	hang    chan struct{} // non-nil while /metrics hangs; closed to release
	reqHang chan struct{} // non-nil while generation requests hang; closed to release

	errors atomic.Bool

	balMu   sync.Mutex
	bal     *DPBalancer
	balQuit chan struct{}
	balDone chan struct{}
}

// NewServer starts listening and serving.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.Model == "" {
		cfg.Model = DefaultModel
	}
	if cfg.Engine == (EngineConfig{}) {
		cfg.Engine = DefaultEngineConfig()
	}
	if err := cfg.Engine.Validate(); err != nil {
		return nil, err
	}
	if cfg.DPStatsInterval <= 0 {
		cfg.DPStatsInterval = DefaultDPStatsInterval
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, created: time.Now().Unix()}
	n, engines := cfg.Replicas, 1
	if cfg.DataParallel > 1 {
		n, engines = 1, cfg.DataParallel
	}
	for i := 0; i < n; i++ {
		clients := cfg.DPAPIServers
		if clients <= 0 {
			clients = engines
		}
		rep := &replica{s: s, index: i, bal: NewDPBalancerClients(engines, clients)}
		rep.bal.Rotate = cfg.DPRotate
		for k := 0; k < engines; k++ {
			idx := i
			if engines > 1 {
				idx = k
			}
			// A one-engine server reports engine "0", as vLLM does.
			rep.runners = append(rep.runners, newRunner(idx, strconv.Itoa(k), cfg.Engine, cfg.Speed))
		}
		port := 0
		if cfg.BasePort > 0 {
			port = cfg.BasePort + i
		}
		rep.addr = net.JoinHostPort(cfg.Host, strconv.Itoa(port))
		if err := rep.start(); err != nil {
			s.Close()
			return nil, err
		}
		s.replicas = append(s.replicas, rep)
	}
	return s, nil
}

func (rep *replica) start() error {
	ln, err := net.Listen("tcp", rep.addr)
	if err != nil {
		return fmt.Errorf("emulator: replica %d: %w", rep.index, err)
	}
	rep.addr = ln.Addr().String()
	rep.ln = ln
	for _, r := range rep.runners {
		r.startLoop()
	}
	if len(rep.runners) > 1 {
		rep.balQuit, rep.balDone = make(chan struct{}), make(chan struct{})
		go rep.publishLoop(rep.balQuit, rep.balDone)
	}
	rep.srv = &http.Server{Handler: rep, ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			rep.s.log.Warn("emulated replica stopped serving", zap.Int("replica", rep.index), zap.Error(err))
		}
	}(rep.srv)
	return nil
}

// URLs are the base URLs of the replicas (one with data parallel).
func (s *Server) URLs() []string {
	out := make([]string, len(s.replicas))
	for i, rep := range s.replicas {
		out[i] = "http://" + rep.addr
	}
	return out
}

// Engines is the number of engines across all replicas.
func (s *Server) Engines() int {
	n := 0
	for _, rep := range s.replicas {
		n += len(rep.runners)
	}
	return n
}

// Config returns the configuration with defaults filled.
func (s *Server) Config() ServerConfig { return s.cfg }

// Close stops every replica.
func (s *Server) Close() error {
	for _, rep := range s.replicas {
		rep.stop()
	}
	return nil
}

func (s *Server) replica(i int) (*replica, error) {
	if i < 0 || i >= len(s.replicas) {
		return nil, fmt.Errorf("emulator: no replica %d (have %d)", i, len(s.replicas))
	}
	return s.replicas[i], nil
}

// engine finds engine i: the replica index, or the rank with data parallel.
func (s *Server) engine(i int) (*runner, error) {
	for _, rep := range s.replicas {
		for _, r := range rep.runners {
			if r.index == i {
				return r, nil
			}
		}
	}
	return nil, fmt.Errorf("emulator: no engine %d (have %d)", i, s.Engines())
}

// Stop stops replica i: its port refuses connections, open requests fail,
// and its engines lose their cache and counters. With data parallel the
// one replica (0) holds every engine, and they stop together, as a vLLM
// server does when an engine dies.
func (s *Server) Stop(i int) error {
	rep, err := s.replica(i)
	if err != nil {
		return err
	}
	rep.stop()
	return nil
}

// Restart starts a stopped replica again on the same port, empty.
func (s *Server) Restart(i int) error {
	rep, err := s.replica(i)
	if err != nil {
		return err
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if !rep.stopped {
		return nil
	}
	for _, r := range rep.runners {
		r.mu.Lock()
		r.reset()
		r.mu.Unlock()
	}
	if err := rep.start(); err != nil {
		return err
	}
	rep.stopped = false
	return nil
}

func (rep *replica) stop() {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.stopped {
		return
	}
	rep.stopped = true
	if rep.hang != nil {
		close(rep.hang)
		rep.hang = nil
	}
	if rep.reqHang != nil {
		close(rep.reqHang)
		rep.reqHang = nil
	}
	if rep.srv != nil {
		rep.srv.Close()
		rep.ln.Close() // Serve may not have taken the listener yet
	}
	if rep.balQuit != nil {
		close(rep.balQuit)
		<-rep.balDone
		rep.balQuit = nil
	}
	for _, r := range rep.runners {
		r.stopLoop()
		r.mu.Lock()
		r.reset()
		r.mu.Unlock()
	}
}

// Stopped reports whether replica i is stopped.
func (s *Server) Stopped(i int) bool {
	rep, err := s.replica(i)
	if err != nil {
		return false
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	return rep.stopped
}

// SetSlow makes engine i's steps take factor times longer (1 = normal).
func (s *Server) SetSlow(engine int, factor float64) error {
	r, err := s.engine(engine)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.eng.SetSlowdown(factor)
	r.mu.Unlock()
	return nil
}

// SetErrors makes replica i answer generation requests with 500.
func (s *Server) SetErrors(i int, on bool) error {
	rep, err := s.replica(i)
	if err != nil {
		return err
	}
	rep.errors.Store(on)
	return nil
}

// SetMetricsHang makes replica i's /metrics hang until cleared (or the
// client gives up).
func (s *Server) SetMetricsHang(i int, on bool) error {
	rep, err := s.replica(i)
	if err != nil {
		return err
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	setGate(&rep.hang, on)
	return nil
}

// setGate opens a hang (a channel that held requests wait on) or, when on
// is false, closes it and lets them go; rep.mu held.
func setGate(gate *chan struct{}, on bool) {
	switch {
	case on && *gate == nil:
		*gate = make(chan struct{})
	case !on && *gate != nil:
		close(*gate)
		*gate = nil
	}
}

// SetRequestsHang makes replica i accept generation requests and never
// answer them (no status, no byte) until cleared, while /metrics and
// /v1/models keep answering. It is what a server whose engine is wedged
// looks like from outside (an engine core stuck in a collective, a GPU
// fault the API server does not notice): the process listens, the
// metrics endpoint is served by the API server, and requests wait forever.
// A request held this way ends when the fault is cleared (then it is
// answered with 503) or its client goes away.
func (s *Server) SetRequestsHang(i int, on bool) error {
	rep, err := s.replica(i)
	if err != nil {
		return err
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	setGate(&rep.reqHang, on)
	return nil
}

// holdIfHanging holds a generation request while the requests-hang fault is
// on; it reports whether the request was held (and is finished).
func (rep *replica) holdIfHanging(w http.ResponseWriter, r *http.Request, anth bool) bool {
	rep.mu.Lock()
	hang := rep.reqHang
	rep.mu.Unlock()
	if hang == nil {
		return false
	}
	select {
	case <-hang:
		writeError(w, anth, http.StatusServiceUnavailable, "emulated engine was hung")
	case <-r.Context().Done():
	}
	return true
}

// EngineStats returns engine i's counters.
func (s *Server) EngineStats(engine int) (EngineStats, error) {
	r, err := s.engine(engine)
	if err != nil {
		return EngineStats{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.eng.Stats(), nil
}

// ServeHTTP routes by path (the query string is ignored).
func (rep *replica) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch path {
	case "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses":
		if r.Method != http.MethodPost {
			methodNotAllowed(w)
			return
		}
		rep.generate(w, r, path)
	case "/v1/messages/count_tokens":
		if r.Method != http.MethodPost {
			methodNotAllowed(w)
			return
		}
		rep.countTokens(w, r)
	case "/v1/models":
		rep.models(w)
	case "/health":
		w.WriteHeader(http.StatusOK)
	case "/metrics":
		rep.metrics(w, r)
	default:
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	}
}

func methodNotAllowed(w http.ResponseWriter) {
	writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"detail":"encoding failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b)
}

// openAIError is vLLM's error body for the OpenAI-compatible endpoints.
type openAIError struct {
	Error openAIErrorBody `json:"error"`
}

type openAIErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// anthropicError is the Messages API error body.
type anthropicError struct {
	Type  string             `json:"type"`
	Error anthropicErrorBody `json:"error"`
}

type anthropicErrorBody struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, anthropic bool, code int, msg string) {
	if anthropic {
		typ := "invalid_request_error"
		switch {
		case code >= 500:
			typ = "api_error"
		case code == http.StatusNotFound:
			typ = "not_found_error"
		}
		writeJSON(w, code, anthropicError{Type: "error", Error: anthropicErrorBody{Type: typ, Message: msg}})
		return
	}
	typ := "BadRequestError"
	switch {
	case code >= 500:
		typ = "InternalServerError"
	case code == http.StatusNotFound:
		typ = "NotFoundError"
	}
	writeJSON(w, code, openAIError{Error: openAIErrorBody{Message: msg, Type: typ, Code: code}})
}

func (rep *replica) models(w http.ResponseWriter) {
	s := rep.s
	model := s.cfg.Model
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": model, "object": "model", "created": s.created, "owned_by": "vllm",
			"root": model, "parent": nil, "max_model_len": rep.runners[0].eng.Config().MaxModelLen,
			"permission": []any{},
		}},
	})
}

func (rep *replica) metrics(w http.ResponseWriter, r *http.Request) {
	rep.mu.Lock()
	hang := rep.hang
	rep.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	samples := make([]engineSample, len(rep.runners))
	for i, run := range rep.runners {
		samples[i] = run.sample()
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(w, rep.s.cfg.Model, samples)
}

func (rep *replica) countTokens(w http.ResponseWriter, r *http.Request) {
	var req anthropicRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, true, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	text, err := req.render()
	if err != nil {
		writeError(w, true, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": CountTokens(text)})
}

// pick chooses the engine for a request: the rank header when present,
// else vLLM's data-parallel balancer (DPBalancer).
func (rep *replica) pick(r *http.Request) (*runner, error) {
	if len(rep.runners) == 1 && r.Header.Get(RankHeader) == "" {
		return rep.runners[0], nil
	}
	if h := r.Header.Get(RankHeader); h != "" {
		k, err := strconv.Atoi(strings.TrimSpace(h))
		if err != nil || k < 0 || k >= len(rep.runners) {
			return nil, fmt.Errorf("data parallel rank %q must be in [0, %d)", h, len(rep.runners))
		}
		return rep.runners[k], nil
	}
	rep.balMu.Lock()
	defer rep.balMu.Unlock()
	return rep.runners[rep.bal.PickBy(rand.IntN(rep.bal.Clients()))], nil
}

// publishLoop publishes the engines' counts to the balancer every
// DPStatsInterval of engine time, as vLLM's coordinator does.
func (rep *replica) publishLoop(quit, done chan struct{}) {
	defer close(done)
	every := time.Duration(float64(rep.s.cfg.DPStatsInterval) / rep.s.cfg.Speed)
	if every < time.Millisecond {
		every = time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	load := func(i int) (int, int) {
		run := rep.runners[i]
		run.mu.Lock()
		defer run.mu.Unlock()
		return run.eng.Waiting(), run.eng.Running()
	}
	for {
		rep.balMu.Lock()
		rep.bal.Publish(load)
		rep.balMu.Unlock()
		select {
		case <-t.C:
		case <-quit:
			return
		}
	}
}

type apiKind uint8

const (
	apiChat apiKind = iota
	apiCompletion
	apiMessages
	apiResponses
)

// genRequest is a parsed generation request of any API.
type genRequest struct {
	kind         apiKind
	model        string
	text         string
	ids          []uint32
	maxTokens    *int
	stream       bool
	includeUsage bool
}

func parseGen(kind apiKind, body io.Reader) (*genRequest, error) {
	g := &genRequest{kind: kind}
	dec := json.NewDecoder(body)
	var err error
	switch kind {
	case apiChat:
		var req chatRequest
		if err = dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("invalid JSON body: %w", err)
		}
		g.model, g.maxTokens, g.stream = req.Model, req.maxTokens(), req.Stream
		g.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		g.text, err = req.render()
	case apiCompletion:
		var req completionRequest
		if err = dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("invalid JSON body: %w", err)
		}
		g.model, g.maxTokens, g.stream = req.Model, req.MaxTokens, req.Stream
		g.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		if g.maxTokens == nil {
			n := 16 // the OpenAI completions default, kept by vLLM
			g.maxTokens = &n
		}
		g.text, g.ids, err = req.prompt()
	case apiMessages:
		var req anthropicRequest
		if err = dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("invalid JSON body: %w", err)
		}
		if req.MaxTokens == nil {
			return nil, fmt.Errorf("max_tokens: Field required")
		}
		g.model, g.maxTokens, g.stream = req.Model, req.MaxTokens, req.Stream
		g.text, err = req.render()
	case apiResponses:
		var req responsesRequest
		if err = dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("invalid JSON body: %w", err)
		}
		g.model, g.maxTokens, g.stream = req.Model, req.MaxOutputTokens, req.Stream
		g.text, err = req.render()
	}
	return g, err
}

func (rep *replica) generate(w http.ResponseWriter, r *http.Request, path string) {
	kind := apiChat
	switch path {
	case "/v1/completions":
		kind = apiCompletion
	case "/v1/messages":
		kind = apiMessages
	case "/v1/responses":
		kind = apiResponses
	}
	anth := kind == apiMessages
	if rep.holdIfHanging(w, r, anth) {
		return
	}
	run, err := rep.pick(r)
	if err != nil {
		writeError(w, anth, http.StatusBadRequest, err.Error())
		return
	}
	w.Header().Set(EngineHeader, strconv.Itoa(run.index))
	if rep.errors.Load() {
		writeError(w, anth, http.StatusInternalServerError, "emulated engine failure")
		return
	}
	g, err := parseGen(kind, r.Body)
	if err != nil {
		writeError(w, anth, http.StatusBadRequest, err.Error())
		return
	}
	if g.model == "" {
		g.model = rep.s.cfg.Model
	}
	prompt := g.ids
	if prompt == nil {
		prompt = Tokenize(g.text)
	}
	maxLen := run.eng.Config().MaxModelLen // immutable after NewEngine
	if len(prompt) >= maxLen {
		writeError(w, anth, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, len(prompt)))
		return
	}
	maxTokens := maxLen - len(prompt)
	if d := rep.s.cfg.DefaultMaxTokens; d > 0 && g.maxTokens == nil {
		maxTokens = min(maxTokens, d)
	}
	if g.maxTokens != nil {
		maxTokens = *g.maxTokens
		if maxTokens < 1 {
			writeError(w, anth, http.StatusBadRequest, fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens))
			return
		}
		if len(prompt)+maxTokens > maxLen {
			writeError(w, anth, http.StatusBadRequest, fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).", maxTokens, maxLen, len(prompt), maxTokens, maxLen, len(prompt)))
			return
		}
	}

	st := newStream()
	req := &EngineRequest{ID: rep.s.newID(), Prompt: prompt, MaxTokens: maxTokens, Data: st}
	run.mu.Lock()
	if run.eng.Idle() {
		// An idle engine's clock catches up with the wall clock; a busy
		// one's runs step by step.
		run.eng.AdvanceTo(run.engineNowWall())
	}
	err = run.eng.Add(req)
	run.mu.Unlock()
	if err != nil {
		writeError(w, anth, http.StatusBadRequest, err.Error())
		return
	}
	run.kick()
	out := &responder{w: w, g: g, id: req.ID, prompt: len(prompt), created: time.Now().Unix(), late: run.eng.Config().PerRequest.Refuse}
	ok := out.serve(r.Context(), st)
	if !ok {
		run.mu.Lock()
		if run.eng.Abort(req) {
			run.aborted++
		}
		run.mu.Unlock()
	}
}

func (s *Server) newID() string {
	return fmt.Sprintf("%016x", s.seq.Add(1)^uint64(s.created)<<20)
}

// errStreamFailed: the replica stopped under a request.
var errStreamFailed = errors.New("emulator: replica stopped")

// errRefused: the engine refused the request (PerRequestTiming.Refuse),
// with the message llm-d-inference-sim answers then.
var errRefused = errors.New("the kv cache does not have sufficient capacity to store this request")

// wait blocks until the stream has more than have tokens or ends.
func wait(ctx context.Context, st *stream, have int) (toks []uint32, cached int, finished bool, err error) {
	for {
		toks, cached, finished, failed, refused := st.snapshot()
		switch {
		case refused:
			return toks, cached, finished, errRefused
		case failed:
			return toks, cached, finished, errStreamFailed
		}
		if len(toks) > have || finished {
			return toks, cached, finished, nil
		}
		select {
		case <-st.notify:
		case <-ctx.Done():
			return toks, cached, finished, ctx.Err()
		}
	}
}
