package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

func init() {
	caddy.RegisterModule(new(Policy))
}

// RankHeader is the request header that pins a request to one engine of a
// vLLM server started with --data-parallel-size.
const RankHeader = "X-Data-Parallel-Rank"

// RouteHeader is the response header naming the replica that served and why:
// "X-LM-Warden-Route: 10.0.0.5:8001; sticky". A turn whose replica was over
// the spill threshold adds the estimates of its time to first token there
// and on the replica it could move to: "10.0.0.5:8001; spill-declined;
// stay 0.40s, move 6.20s", with "(evicts 1.20s)" when part of the move's
// cost is the recompute it forces on the target's resident conversations.
// A new conversation that admission let in once its wait outgrew the
// recompute its coming in forces on the resident conversations adds both:
// "10.0.0.5:8001; placed; wait 15.00s, evicts 3.20s".
const RouteHeader = "X-LM-Warden-Route"

// WaitHeader is the response header, sent with RouteHeader, of a request
// that waited for admission: the seconds it was held, e.g.
// "X-LM-Warden-Wait: 12.345".
const WaitHeader = "X-LM-Warden-Wait"

// ExpectHeader is the response header, sent with RouteHeader, of the turn's
// expected time to first token on the replica that served it, in seconds
// from the moment it was routed: the router's estimate (see the placement
// package, "Spill cost"), e.g. "X-LM-Warden-Expect: 0.420".
const ExpectHeader = "X-LM-Warden-Expect"

// Policy is the lm_warden reverse_proxy selection policy: it sends every turn
// of a conversation to the replica that served the previous turn (where its
// prefix is cached) unless that replica is over the spill threshold, and
// places new conversations on the least-loaded replica.
//
// Replicas are the upstreams, keyed by their dial address; with
// data_parallel_size N each upstream is one vLLM server with N engines, and
// the replicas are its engines ("dial#k"), chosen with the
// X-data-parallel-rank request header. Only available upstreams are chosen,
// so Caddy's health checks and max_requests keep working; on a retry the
// replicas already tried for the request are skipped.
//
// With the lm_warden handler in front, the policy uses the key the handler
// found and the handler frees the in-flight slot when the response ends.
// Without it, the policy reads the key from the default session headers
// itself and frees the slot when the request's context ends.
//
// All policies naming the same model share one router, poller and token
// accounting, which survive config reloads.
type Policy struct {
	// Name of the model: shown on the routing card, in the admin API paths
	// and as the "model" label of the metrics. Required.
	Model string `json:"model,omitempty"`

	// Turns conversation affinity off when false: every request then goes to
	// the least-loaded replica (the baseline to compare against); counting,
	// polling and the card keep working. Default true.
	Affinity *bool `json:"affinity,omitempty"`

	// Running requests above which a replica is over the threshold and new
	// turns spill to another replica. 0 means auto: max(1, max_num_seqs/4).
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	SpillThreshold int `json:"spill_threshold,omitempty"`

	// Requests waiting in a replica's vLLM queue (polled) at which its
	// conversations also spill, to a replica with an empty queue that is not
	// over the spill threshold. Under KV pressure vLLM runs fewer requests
	// than the threshold and queues the rest, so the running count alone
	// never moves a turn. 0 (the default) turns it off.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	SpillWaiting int `json:"spill_waiting,omitempty"`

	// The model's --max-num-seqs per replica (vLLM does not publish it).
	// Default 256.
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`

	// How long a conversation stays bound without a turn. Default 1h.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	IdleTTL caddy.Duration `json:"idle_ttl,omitempty"`

	// How recently a conversation must have had a turn to count as active
	// on its replica when placing new ones. Default 10m.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	ActiveWindow caddy.Duration `json:"active_window,omitempty"`

	// Most conversations kept bound; the least recently used is dropped
	// beyond it. Default 100000.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	MaxSessions int `json:"max_sessions,omitempty"`

	// How often every replica's /metrics is polled. Default 1s.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`

	// Timeout of one poll. Default: 80% of poll_interval.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	PollTimeout caddy.Duration `json:"poll_timeout,omitempty"`

	// Failed polls in a row after which a replica counts as unreachable and
	// its polled numbers are ignored. Default 3.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	FailAfter int `json:"fail_after,omitempty"`

	// How long a replica stays out of placement after a request to it
	// failed (no connection, no response headers within the transport's
	// response_header_timeout, a 5xx answer, a stream cut); after it, one
	// request probes it and it stays out for the others until that one is
	// answered. Default 5s.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	FailCooldown caddy.Duration `json:"fail_cooldown,omitempty"`

	// How many turns in a row a replica must leave without response
	// headers until their clients give up, from at least two clients and
	// while other replicas answer, before it is out as for a failure
	// (cause "abandoned turns", cooled down as fail_cooldown says). It
	// finds a hung replica when clients give up before the transport's
	// response_header_timeout. Default 3; -1 (Caddyfile: off) turns it
	// off.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	AbandonAfter int `json:"abandon_after,omitempty"`

	// Path of the replicas' Prometheus metrics. Default /metrics.
	MetricsPath string `json:"metrics_path,omitempty"`

	// The engine whose metric names the replicas export: auto (default:
	// detected from each replica's first exposition), vllm, sglang,
	// llamacpp or tgi.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	Engine string `json:"engine,omitempty"`

	// Scheme used to poll the replicas: http (default) or https.
	PollScheme string `json:"poll_scheme,omitempty"`

	// Engines per upstream. Set it when one vLLM server runs
	// --data-parallel-size N: the policy then chooses an engine and sends
	// X-data-parallel-rank. Default 1 (every upstream is one replica).
	DataParallelSize int `json:"data_parallel_size,omitempty"`

	// Request header with which a client may pin a request to a replica
	// (its ID as shown on the card, or the engine rank in data-parallel
	// mode). Empty (default) disables pinning.
	ClientPinHeader string `json:"client_pin_header,omitempty"`

	// Whether to answer with X-LM-Warden-Route: <replica>; <reason>.
	// Default true.
	RouteHeader *bool `json:"route_header,omitempty"`

	// Working-set admission: a new conversation is placed only on a
	// replica whose KV cache holds it beside the conversations active
	// there; when none does, its first request waits in Caddy, in arrival
	// order, until room appears. Default true; it is in force while the
	// replicas export their KV capacity (vllm:cache_config_info) or
	// kv_tokens gives it.
	Admission *bool `json:"admission,omitempty"`

	// Every replica's KV cache in tokens (blocks × block size), for
	// engines that do not export vllm:cache_config_info. 0: as polled.
	KVTokens int `json:"kv_tokens,omitempty"`

	// Share of a replica's KV capacity that new conversations may fill,
	// counting every conversation at what conversations grow to.
	// Default 1.0.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	AdmitHighWater float64 `json:"admit_high_water,omitempty"`

	// Longest a conversation counts in its replica's working set after
	// its last turn (shorter once its pauses between turns are known).
	// Default 1m.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	AdmitWindow caddy.Duration `json:"admit_window,omitempty"`

	// Longest a new conversation waits for room; it is then placed on the
	// best replica anyway. Default 5m.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	AdmitWait caddy.Duration `json:"admit_wait,omitempty"`

	// Most conversations waiting; beyond it new ones get 429 with
	// Retry-After. Default 1024.
	AdmitQueue int `json:"admit_queue,omitempty"`

	// Time-slicing's quantum: while a paused conversation waits first for
	// room, a conversation that has run this many turns since it was
	// admitted is paused at the end of its turn for it; -1 pauses nothing
	// (not even for an over-full replica). Default: no quantum, a
	// conversation is paused only when its replica's conversations
	// outgrow the KV cache.
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	RotateTurns int `json:"rotate_turns,omitempty"`

	// Request body bytes per prompt token, to estimate a new
	// conversation's size before the engine counts it. Default: the ratio
	// of the turns the engine has counted (4 before the first).
	//
	// Deprecated: loads with a warning in this release (deprecated.go).
	BytesPerToken float64 `json:"bytes_per_token,omitempty"`

	// Store shares the bindings with other front-ends through Redis or
	// Valkey (see StoreConfig). Default none: bindings are this
	// instance's own.
	Store *StoreConfig `json:"store,omitempty"`

	m           *modelState
	logger      *zap.Logger
	routeHeader bool
	pinHeader   string
	ranks       []string
	mu          sync.Mutex // serialises replica-set changes
	set         atomic.Pointer[replicaSet]
}

// CaddyModule returns the Caddy module information.
func (*Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.lm_warden",
		New: func() caddy.Module { return new(Policy) },
	}
}

func (p *Policy) routerConfig() placement.Config {
	return placement.Config{
		AffinityOff:    p.Affinity != nil && !*p.Affinity,
		MaxNumSeqs:     p.MaxNumSeqs,
		SpillThreshold: p.SpillThreshold,
		SpillWaiting:   p.SpillWaiting,
		IdleTTL:        time.Duration(p.IdleTTL),
		ActiveWindow:   time.Duration(p.ActiveWindow),
		MaxBindings:    p.MaxSessions,
		FailCooldown:   time.Duration(p.FailCooldown),
		AbandonAfter:   p.AbandonAfter,
		AdmissionOff:   p.Admission != nil && !*p.Admission,
		KVTokens:       p.KVTokens,
		HighWater:      p.AdmitHighWater,
		AdmitWindow:    time.Duration(p.AdmitWindow),
		AdmitWait:      time.Duration(p.AdmitWait),
		AdmitQueue:     p.AdmitQueue,
		RotateTurns:    p.RotateTurns,
	}
}

// DefaultBytesPerToken is the request body bytes per prompt token assumed
// before the engine has answered a turn whose body size was known: the
// emulator's Anthropic and OpenAI bodies of the reference workload measure
// 4.2 (its tokenizer counts about four bytes of text per token, as real
// ones do for English; code tokenizes denser, JSON escapes add bytes).
// From the first such turn on, the model's own ratio applies
// (modelState.sizes), unless bytes_per_token sets one.
const DefaultBytesPerToken = 4.0

// tokens estimates the prompt tokens of r from its body's size (its
// Content-Length, or the body the handler read; 0 when unknown) and keeps
// that size in st, for the model to learn its bytes per token when the
// engine's count comes back. The estimate counts only until the engine
// reports the conversation's first turn.
func (p *Policy) tokens(r *http.Request, st *routeState) int {
	n := r.ContentLength
	if n <= 0 && st.rb.b != nil {
		n = int64(len(st.rb.b))
	}
	if n <= 0 {
		return 0
	}
	st.bodyBytes = n
	bpt := p.BytesPerToken
	if bpt <= 0 {
		bpt = p.m.sizes.Rate(DefaultBytesPerToken)
	}
	return int(min(float64(n)/bpt, 1<<31-1))
}

func (p *Policy) pollSettings() pollSettings {
	ps := pollSettings{
		Interval:    time.Duration(p.PollInterval),
		Timeout:     time.Duration(p.PollTimeout),
		FailAfter:   p.FailAfter,
		MetricsPath: p.MetricsPath,
		Scheme:      p.PollScheme,
	}
	ps.Dialect, _ = vllmstats.ParseDialect(p.Engine) // checked by Validate
	return ps.withDefaults()
}

// Provision joins (or creates) the model's shared state and applies this
// configuration to it.
func (p *Policy) Provision(ctx caddy.Context) error {
	if err := p.Validate(); err != nil {
		return err
	}
	rcfg := p.routerConfig()
	val, loaded, err := modelStates.LoadOrNew(p.Model, func() (caddy.Destructor, error) {
		return newModelState(p.Model, rcfg), nil
	})
	if err != nil {
		return fmt.Errorf("model %s: %w", p.Model, err)
	}
	p.m = val.(*modelState)
	p.logger = ctx.Logger()
	for _, w := range p.deprecations() {
		p.logger.Warn(w, zap.String("model", p.Model))
	}
	if !loaded {
		// nobody else uses this state yet
		p.apply()
	}
	// else the running configuration keeps its settings until this one
	// starts (App.Start): a configuration that fails to load changes nothing
	p.routeHeader = p.RouteHeader == nil || *p.RouteHeader
	if p.ClientPinHeader != "" {
		p.pinHeader = textproto.CanonicalMIMEHeaderKey(p.ClientPinHeader)
	}
	if p.DataParallelSize > 1 {
		p.ranks = make([]string, p.DataParallelSize)
		for i := range p.ranks {
			p.ranks[i] = strconv.Itoa(i)
		}
	}
	appVal, err := ctx.App("lm_warden")
	if err != nil {
		return fmt.Errorf("loading lm_warden app: %w", err)
	}
	if err := appVal.(*App).add(p.m, p); err != nil {
		return err
	}
	if err := p.defaultKeepAlive(ctx); err != nil {
		return fmt.Errorf("lm_warden %s: the proxy's transport: %w", p.Model, err)
	}
	return registerMetrics(ctx.GetMetricsRegistry())
}

// sharedSettings are a policy's settings that its model's shared state
// takes: every policy naming one model must agree on them.
type sharedSettings struct {
	Router           placement.Config
	Poll             pollSettings
	DataParallelSize int
	ClientPinHeader  string
	RouteHeader      bool
	Store            string
}

func (p *Policy) shared() sharedSettings {
	return sharedSettings{
		Router:           p.routerConfig(),
		Poll:             p.pollSettings(),
		DataParallelSize: max(p.DataParallelSize, 1),
		ClientPinHeader:  textproto.CanonicalMIMEHeaderKey(p.ClientPinHeader),
		RouteHeader:      p.RouteHeader == nil || *p.RouteHeader,
		Store:            p.storeConfig().Identity(),
	}
}

// diff lists the settings in which s and o differ, as "Name a ≠ b".
func (s sharedSettings) diff(o sharedSettings) string {
	var out []string
	var walk func(prefix string, a, b reflect.Value)
	walk = func(prefix string, a, b reflect.Value) {
		for i := range a.NumField() {
			name := prefix + a.Type().Field(i).Name
			fa, fb := a.Field(i), b.Field(i)
			if fa.Kind() == reflect.Struct {
				walk(name+".", fa, fb)
			} else if !fa.Equal(fb) {
				out = append(out, fmt.Sprintf("%s %v ≠ %v", name, fa, fb))
			}
		}
	}
	walk("", reflect.ValueOf(s), reflect.ValueOf(o))
	return strings.Join(out, ", ")
}

// apply gives the model's shared state this policy's settings.
func (p *Policy) apply() {
	p.m.configure(p.routerConfig(), p.pollSettings(), p.logger)
}

// Validate checks the configuration.
func (p *Policy) Validate() error {
	switch {
	case strings.TrimSpace(p.Model) == "":
		return errors.New("lm_warden: model is required")
	case p.SpillThreshold < 0:
		return fmt.Errorf("lm_warden %s: spill_threshold must not be negative", p.Model)
	case p.SpillWaiting < 0:
		return fmt.Errorf("lm_warden %s: spill_waiting must not be negative", p.Model)
	case p.AbandonAfter < -1:
		return fmt.Errorf("lm_warden %s: abandon_after must be -1 (off) or positive, got %d", p.Model, p.AbandonAfter)
	case p.FailCooldown < 0:
		return fmt.Errorf("lm_warden %s: fail_cooldown must not be negative", p.Model)
	case p.MaxNumSeqs < 0, p.MaxSessions < 0, p.FailAfter < 0, p.DataParallelSize < 0:
		return fmt.Errorf("lm_warden %s: counts must not be negative", p.Model)
	case !validEngine(p.Engine):
		_, err := vllmstats.ParseDialect(p.Engine)
		return fmt.Errorf("lm_warden %s: %w", p.Model, err)
	case p.PollScheme != "" && p.PollScheme != "http" && p.PollScheme != "https":
		return fmt.Errorf("lm_warden %s: poll_scheme must be http or https, got %q", p.Model, p.PollScheme)
	case p.PollTimeout > 0 && p.PollInterval > 0 && p.PollTimeout >= p.PollInterval:
		return fmt.Errorf("lm_warden %s: poll_timeout must be shorter than poll_interval", p.Model)
	case p.KVTokens < 0, p.AdmitQueue < 0, p.AdmitWindow < 0, p.AdmitWait < 0:
		return fmt.Errorf("lm_warden %s: kv_tokens, admit_queue, admit_window and admit_wait must not be negative", p.Model)
	case p.RotateTurns < -1:
		return fmt.Errorf("lm_warden %s: rotate_turns must be -1 (off) or a positive number of turns, got %d", p.Model, p.RotateTurns)
	case p.AdmitHighWater < 0 || p.AdmitHighWater > 4:
		return fmt.Errorf("lm_warden %s: admit_high_water must be in (0, 4], got %g", p.Model, p.AdmitHighWater)
	case p.BytesPerToken < 0 || p.BytesPerToken > 64:
		return fmt.Errorf("lm_warden %s: bytes_per_token must be in (0, 64], got %g", p.Model, p.BytesPerToken)
	case p.Store != nil:
		return p.storeConfig().Validate(p.Model)
	}
	return nil
}

// Cleanup drops this configuration's reference to the model's state; the
// last reference stops its poller.
func (p *Policy) Cleanup() error {
	if p.m == nil {
		return nil
	}
	_, err := modelStates.Delete(p.Model)
	return err
}

// replicaSet maps the upstream pool last seen to replica IDs.
type replicaSet struct {
	dials   []string
	ids     [][]string // per upstream: its replica IDs (one, or one per engine)
	where   map[string]pick
	ups     []*reverseproxy.Upstream
	healthy []atomic.Bool // per upstream: Healthy() as last told to the router
	hmu     sync.Mutex    // serialises telling the router
}

// syncHealth tells the router when Caddy's health state of upstream i (its
// active or passive health checks, its circuit breaker) differs from what it
// was last told; h is the upstream's Healthy().
func (rs *replicaSet) syncHealth(router *placement.Router, i int, h bool) {
	rs.hmu.Lock()
	defer rs.hmu.Unlock()
	if rs.healthy[i].Load() == h {
		return
	}
	rs.healthy[i].Store(h)
	for _, id := range rs.ids[i] {
		router.SetHealthDown(id, !h)
	}
}

// syncAllHealth syncs every upstream's health state; the poll rounds call
// it, so the card follows the health checks with no traffic.
func (rs *replicaSet) syncAllHealth(router *placement.Router) {
	for i, u := range rs.ups {
		if h := u.Healthy(); h != rs.healthy[i].Load() {
			rs.syncHealth(router, i, h)
		}
	}
}

type pick struct {
	up, rank int
	id       any                 // the replica ID, boxed once for the request variables
	routes   *[numReasons]string // RouteHeader values by reason
}

// numReasons bounds placement.Reason values.
const numReasons = placement.NumReasons

// reasonVars are the reasons' names, boxed once for the request variables.
var reasonVars = func() (out [numReasons]any) {
	for i := range out {
		out[i] = placement.Reason(i).String()
	}
	return out
}()

// routeHeaderKey is RouteHeader in canonical form, so setting it allocates
// nothing for the key.
var routeHeaderKey = http.CanonicalHeaderKey(RouteHeader)

// expectHeaderKey is ExpectHeader in canonical form.
var expectHeaderKey = http.CanonicalHeaderKey(ExpectHeader)

func newPick(up, rank int, id string) pick {
	routes := new([numReasons]string)
	for i := range routes {
		routes[i] = id + "; " + placement.Reason(i).String()
	}
	return pick{up: up, rank: rank, id: id, routes: routes}
}

func (rs *replicaSet) matches(pool reverseproxy.UpstreamPool) bool {
	if len(rs.dials) != len(pool) {
		return false
	}
	for i, u := range pool {
		if u.Dial != rs.dials[i] {
			return false
		}
	}
	return true
}

// replicas returns the replica set for pool, telling the router and the
// poller when the pool has changed (dynamic upstreams, reloads).
func (p *Policy) replicas(pool reverseproxy.UpstreamPool) *replicaSet {
	if rs := p.set.Load(); rs != nil && rs.matches(pool) {
		return rs
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rs := p.set.Load(); rs != nil && rs.matches(pool) {
		return rs
	}
	ps := p.pollSettings()
	rs := &replicaSet{
		dials:   make([]string, len(pool)),
		ids:     make([][]string, len(pool)),
		where:   make(map[string]pick),
		ups:     append([]*reverseproxy.Upstream(nil), pool...),
		healthy: make([]atomic.Bool, len(pool)),
	}

	var all []string
	var targets []vllmstats.Target
	for i, u := range pool {
		rs.dials[i] = u.Dial
		base := ps.Scheme + "://" + u.Dial
		if p.DataParallelSize > 1 {
			for k := 0; k < p.DataParallelSize; k++ {
				id := u.Dial + "#" + p.ranks[k]
				rs.ids[i] = append(rs.ids[i], id)
				rs.where[id] = newPick(i, k, id)
				all = append(all, id)
				targets = append(targets, vllmstats.Target{ID: id, BaseURL: base, Engine: p.ranks[k]})
			}
			continue
		}
		rs.ids[i] = []string{u.Dial}
		rs.where[u.Dial] = newPick(i, -1, u.Dial)
		all = append(all, u.Dial)
		targets = append(targets, vllmstats.Target{ID: u.Dial, BaseURL: base})
	}
	p.m.setTargets(all, targets)
	p.set.Store(rs)
	for i, u := range pool {
		// replicas that stay keep their state in the router: set it anew
		h := u.Healthy()
		rs.healthy[i].Store(h)
		for _, id := range rs.ids[i] {
			p.m.router.SetHealthDown(id, !h)
		}
	}
	p.m.health.Store(rs)
	return rs
}

// pinned turns a client's pin header value into a replica ID.
func (p *Policy) pinned(v string, rs *replicaSet) string {
	if _, ok := rs.where[v]; ok || p.DataParallelSize <= 1 || len(rs.dials) == 0 {
		return v
	}
	if k, err := strconv.Atoi(v); err == nil && k >= 0 && k < p.DataParallelSize {
		return rs.ids[0][k]
	}
	return v
}

// route asks the router for a request not held: Caddy's health state of
// the upstreams synced, full and tried replicas excluded.
func (p *Policy) route(rs *replicaSet, pool reverseproxy.UpstreamPool, r *http.Request, st *routeState) (placement.Request, placement.Decision, *placement.Ticket, error) {
	// nil unless a replica is full or was tried already: the request is
	// passed on (a stack buffer would escape with it)
	var exclude []string
	for i, u := range pool {
		// The router keeps Caddy's health state itself (an unhealthy
		// upstream is out, CauseHealth); only a full one is excluded here.
		if h := u.Healthy(); h != rs.healthy[i].Load() {
			rs.syncHealth(p.m.router, i, h)
		}
		if u.Full() {
			exclude = append(exclude, rs.ids[i]...)
		}
	}
	exclude = st.triedList(exclude)

	start, lone := convkey.SplitStart(st.start)
	req := placement.Request{Key: st.key, Parent: st.parent, Start: start, Lone: lone, Tokens: p.tokens(r, st)}
	if len(exclude) > 0 {
		req.Exclude = exclude
	}
	if p.pinHeader != "" {
		if v := r.Header[p.pinHeader]; len(v) > 0 && v[0] != "" {
			req.Pin = p.pinned(v[0], rs)
		}
	}
	req.Replay = st.replayOf()
	dec, tk, err := p.m.route(req)
	return req, dec, tk, err
}

// wantsBody reports whether routing needs the whole body of a request
// whose body the handler streams: admission is in force and the
// conversation is not bound here (a new one admission may hold), or it is
// bound and its start, to compare with the binding's, was not in the part
// the handler read.
func (p *Policy) wantsBody(st *routeState) bool {
	if st.key != "" {
		if _, ok := p.m.router.Bound(st.key); ok {
			return st.noStart
		}
	}
	return p.m.router.AdmissionActive()
}

// Select chooses the upstream for one attempt of a request. It never
// waits and never reads the body: a request that admission holds gets a
// ticket, kept in the request's routeState, and no upstream; the lm_warden
// handler holds it and runs the proxy again once the router has decided,
// and Select then maps that decision to its upstream. A later Select of
// the same request in the proxy's own retry loop (lb_try_duration,
// lb_retries) does the same when the ticket is ready by then, and chooses
// no upstream again when it is not.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	if len(pool) == 0 {
		return nil
	}
	rs := p.replicas(pool)
	vars := requestVars(r)
	st, _ := vars[varRoute].(*routeState)
	if st == nil {
		// no lm_warden handler ran: keep the request's picks ourselves
		st = &routeState{detached: true}
		st.key, st.parent = convkey.DefaultExtractor.FromHeaders(r.Header)
		if vars != nil {
			vars[varRoute] = st
		}
	}
	st.beginAttempt()
	if st.refused || st.wantBody {
		// the admission queue was full (the handler answers 429), or the
		// handler is to read the rest of the body first
		return nil
	}

	var dec placement.Decision
	var err error
	held := st.held
	if held != nil {
		// held by admission: the router's decision, once it has made it
		if r.Context().Err() != nil {
			// the client left while the proxy retried (lb_try_duration)
			held.cancel(time.Now())
			return nil
		}
		if held.m != p.m || !held.ready(time.Now()) {
			return nil
		}
		dec, err = held.settle(time.Now())
		held.used = true
		st.held = nil
		if err != nil {
			return nil
		}
	} else {
		if st.streamed != nil && p.wantsBody(st) {
			// a body the handler streams (over streamOver), not sent
			// yet, that routing needs whole: the handler reads the rest
			// and runs the proxy again (unread.go)
			st.wantBody = true
			return nil
		}
		var req placement.Request
		var tk *placement.Ticket
		if req, dec, tk, err = p.route(rs, pool, r, st); tk != nil {
			held = p.m.hold(tk, req, time.Now())
			st.held, st.model = held, p.m
			if st.detached && vars != nil {
				// nobody holds the request: the proxy's retries may find
				// the ticket ready; the request's end cancels it
				context.AfterFunc(r.Context(), func() { held.cancel(time.Now()) })
			}
			return nil
		}
		if err != nil {
			if errors.Is(err, placement.ErrQueueFull) {
				st.refused = true
				st.model = p.m
			}
			return nil
		}
	}
	at, ok := rs.where[dec.Replica]
	if !ok {
		dec.Release()
		return nil
	}
	if at.rank >= 0 {
		r.Header.Set(RankHeader, p.ranks[at.rank])
	}
	st.routedTo(r, dec, p.m)
	if st.streamed != nil {
		st.streamed.routed()
		st.streamed = nil
	}
	reason := int(dec.Reason)
	if reason >= numReasons {
		reason = 0
	}
	if p.routeHeader && w != nil {
		// the two headers' values share one allocation
		vals := []string{routeValue(at.routes[reason], dec), strconv.FormatFloat(dec.Expect.Seconds(), 'f', 3, 64)}
		w.Header()[routeHeaderKey] = vals[0:1:1]
		w.Header()[expectHeaderKey] = vals[1:2:2]
		if held != nil {
			w.Header().Set(WaitHeader, strconv.FormatFloat(held.waited.Seconds(), 'f', 3, 64))
		}
	}
	if vars != nil {
		vars[VarReplica] = at.id
		vars[VarReason] = reasonVars[reason]
	}
	return pool[at.up]
}

// routeValue is RouteHeader's value for dec, whose replica and reason are
// route ("10.0.0.5:8001; sticky"): with the costs in seconds that decided
// it where two candidates were compared.
func routeValue(route string, dec placement.Decision) string {
	switch {
	case dec.Stay != 0 || dec.Move != 0:
		// a turn over the threshold: staying against moving
		return route + "; " + placement.SpillCost{Stay: dec.Stay, Move: dec.Move, Evict: dec.Evict}.String()
	case dec.Wait != 0:
		// a new conversation let in once its wait outgrew what its
		// coming in costs the resident conversations
		return route + "; " + placement.AdmitCost{Wait: dec.Wait, Evict: dec.Evict}.String()
	}
	return route
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Policy)(nil)
	_ caddy.Validator       = (*Policy)(nil)
	_ caddy.CleanerUpper    = (*Policy)(nil)
	_ reverseproxy.Selector = (*Policy)(nil)
)

func validEngine(s string) bool {
	_, err := vllmstats.ParseDialect(s)
	return err == nil
}
