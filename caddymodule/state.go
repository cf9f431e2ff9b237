package caddymodule

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// modelStates holds one modelState per model name. It is package level and
// reference counted so `caddy reload` keeps bindings, counters and token
// accounting: the new config takes a reference before the old one drops its
// own. When the last policy of a model goes, the state is destructed.
var modelStates = caddy.NewUsagePool()

// lookupModel returns the live model named name.
func lookupModel(name string) (*modelState, bool) {
	var found *modelState
	modelStates.Range(func(key, val any) bool {
		if key == name {
			found, _ = val.(*modelState)
			return false
		}
		return true
	})
	return found, found != nil
}

// models returns the live models sorted by name: those some loaded
// configuration's policy holds a reference to.
func models() []*modelState {
	var out []*modelState
	modelStates.Range(func(_, val any) bool {
		if m, ok := val.(*modelState); ok {
			out = append(out, m)
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// pollSettings are the parts of a policy's configuration the poller is built
// from; when a reload changes them the poller is replaced.
type pollSettings struct {
	Interval    time.Duration
	Timeout     time.Duration
	FailAfter   int
	MetricsPath string
	Scheme      string
	Dialect     vllmstats.Dialect
}

// The poller's defaults (poll_interval, poll_timeout, fail_after,
// metrics_path, poll_scheme).
const (
	DefaultPollInterval = time.Second
	DefaultFailAfter    = 3
	DefaultMetricsPath  = "/metrics"
	DefaultPollScheme   = "http"
)

// withDefaults fills the settings left zero; the timeout defaults to four
// fifths of the interval, so a poll is given up before the next is due.
func (ps pollSettings) withDefaults() pollSettings {
	if ps.Interval <= 0 {
		ps.Interval = DefaultPollInterval
	}
	if ps.Timeout <= 0 {
		ps.Timeout = ps.Interval * 4 / 5
	}
	if ps.FailAfter <= 0 {
		ps.FailAfter = DefaultFailAfter
	}
	if ps.MetricsPath == "" {
		ps.MetricsPath = DefaultMetricsPath
	}
	if ps.Scheme == "" {
		ps.Scheme = DefaultPollScheme
	}
	return ps
}

// modelState is the runtime of one model: its router, poller and token
// accountant.
type modelState struct {
	name   string
	router *placement.Router
	acct   *vllmstats.Accountant
	// reports tells an omitted cached count (0) from an unknown one for
	// engines that leave out a 0 (SGLang)
	reports vllmstats.CacheReports
	// sizes: the request bytes per prompt token of the turns answered so
	// far, which size new conversations (Policy.tokens)
	sizes placement.SizeRate

	mu        sync.Mutex
	poller    *vllmstats.Poller
	poll      pollSettings
	targets   []vllmstats.Target
	current   map[string]bool // replica IDs in the pool; replaced, never written
	started   bool
	stopped   bool
	logger    *zap.Logger
	pollErrs  map[string]uint64          // poll rounds that failed, per present replica
	resets    map[string]uint64          // counter resets (restarts) seen, per present replica
	outs      map[string]placement.Cause // causes (but poll failures) logged as holding, per replica (logOuts)
	lastTaken time.Time
	// overcommitted: the active conversations hold more than the replicas
	// cache (logged once per episode)
	overcommitted bool

	health atomic.Pointer[replicaSet] // the pool whose health checks feed the router

	store   atomic.Pointer[bindstore.Store] // the shared binding store; nil without one
	storeMu sync.Mutex                      // serialises replacing it

	keys  keyCounts  // requests by replica and the source of their key
	queue queueClock // recent waits in the admission queue (Retry-After)
}

func newModelState(name string, rcfg placement.Config) *modelState {
	m := &modelState{
		name:     name,
		router:   placement.NewRouter(rcfg),
		acct:     vllmstats.NewAccountant(),
		pollErrs: make(map[string]uint64),
		resets:   make(map[string]uint64),
		logger:   zap.NewNop(),
	}
	return m
}

// Destruct stops the poller and forgets the model; called by the usage pool
// when no configuration uses the model any more.
func (m *modelState) Destruct() error {
	m.mu.Lock()
	m.stopped = true
	p := m.poller
	m.poller = nil
	m.mu.Unlock()
	if p != nil {
		p.Stop()
	}
	m.closeStore()
	return nil
}

// configure applies a (re)loaded policy's settings: the router keeps its
// bindings and counters; the poller is rebuilt only when its own settings
// changed.
func (m *modelState) configure(rcfg placement.Config, ps pollSettings, logger *zap.Logger) {
	m.router.Reconfigure(rcfg)
	m.mu.Lock()
	if logger != nil {
		m.logger = logger
	}
	var old *vllmstats.Poller
	if m.poller == nil || m.poll != ps {
		old = m.poller
		m.poll = ps
		m.poller = m.newPoller()
		clear(m.resets) // the new poller counts resets from 0
		if m.started {
			m.poller.Start()
		}
	}
	m.mu.Unlock()
	if old != nil {
		old.Stop()
	}
}

// newPoller builds a poller from the current settings and targets; m.mu held.
func (m *modelState) newPoller() *vllmstats.Poller {
	return vllmstats.NewPoller(vllmstats.PollerConfig{
		Targets:     append([]vllmstats.Target(nil), m.targets...),
		Interval:    m.poll.Interval,
		Timeout:     m.poll.Timeout,
		FailAfter:   m.poll.FailAfter,
		MetricsPath: m.poll.MetricsPath,
		Dialect:     m.poll.Dialect,
		Client:      &http.Client{Timeout: m.poll.Timeout},
		Logger:      m.logger.Named("poller"),
		OnSnapshot:  m.onSnapshot,
	})
}

// start begins polling (idempotent); the lm_warden app calls it.
func (m *modelState) start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.stopped || m.poller == nil {
		return
	}
	m.started = true
	m.poller.Start()
}

// setTargets changes the replicas: the router's set and the poller's targets.
// Poll error counts of replicas that left go with them, as the poller's own
// state does.
func (m *modelState) setTargets(ids []string, targets []vllmstats.Target) {
	m.router.SetReplicas(ids)
	current := make(map[string]bool, len(ids))
	for _, id := range ids {
		current[id] = true
	}
	m.mu.Lock()
	m.targets = targets
	m.current = current
	for id := range m.pollErrs {
		if !current[id] {
			delete(m.pollErrs, id)
		}
	}
	for id := range m.resets {
		if !current[id] {
			delete(m.resets, id)
		}
	}
	p := m.poller
	m.mu.Unlock()
	if p != nil {
		p.SetTargets(targets) // publishes a snapshot: onSnapshot forgets
	} else {
		m.forgetGone(time.Now())
	}
}

// forgetGone drops the state of replicas that left the pool once it no
// longer shows anything: the router forgets them after idle_ttl (Sweep), the
// accountant once their last hour of token counts has passed. Replicas of
// dynamic upstreams that rotate addresses then cost nothing after that.
func (m *modelState) forgetGone(now time.Time) {
	m.router.Sweep(now)
	m.mu.Lock()
	current := m.current
	m.mu.Unlock()
	m.acct.ForgetIdle(now, func(id string) bool { return current[id] })
	m.reports.Forget(func(id string) bool { return current[id] })
}

// completeUsage fills a response's cached count that its engine left out
// because it was 0 (vllmstats.CacheReports).
func (m *modelState) completeUsage(replica string, u *vllmstats.Usage) {
	if !u.Measured {
		return
	}
	if rs, ok := m.pollerSnapshot().Replica(replica); ok {
		m.reports.Complete(replica, rs.Dialect, u)
	}
}

// pollerSnapshot returns the latest poll round (never nil).
func (m *modelState) pollerSnapshot() *vllmstats.Snapshot {
	m.mu.Lock()
	p := m.poller
	m.mu.Unlock()
	if p == nil {
		return &vllmstats.Snapshot{}
	}
	return p.Snapshot()
}

// onSnapshot feeds every poll round into the router and counts poll errors.
func (m *modelState) onSnapshot(s *vllmstats.Snapshot) {
	if s == nil {
		return
	}
	var failed []string
	for i := range s.Replicas {
		rs := &s.Replicas[i]
		// Out once the poll fails fail_after times in a row, or at once when
		// the connection was refused or reset: nothing listens there, so
		// every request sent would fail the same way.
		down := !rs.Reachable || (rs.Failures > 0 && rs.Refused)
		if m.router.SetPollDown(rs.ID, down) {
			m.logf(down, rs.ID, rs.LastError)
		}
		m.router.UpdateLoad(rs.ID, placement.Load{
			Running:   int(rs.Metrics.Running),
			Waiting:   int(rs.Metrics.Waiting),
			KVUsage:   rs.Metrics.KVUsage,
			Reachable: rs.Reachable,
			Seen:      rs.LastSeen,
			// Before the first good poll nothing is known either.
			RunningUnknown: !rs.Metrics.Present.Has(vllmstats.FigRunning),
			WaitingUnknown: !rs.Metrics.Present.Has(vllmstats.FigWaiting),
			KVUnknown:      !rs.Metrics.Present.Has(vllmstats.FigKVUsage),
			KVTokens:       rs.Metrics.KVCapacityTokens,
		})
		if rs.LastError != "" && rs.Failures > 0 {
			failed = append(failed, rs.ID)
			// counted below only while the replica is in the pool
		}
	}
	if rs := m.health.Load(); rs != nil {
		rs.syncAllHealth(m.router)
	}
	now := time.Now()
	m.forgetGone(now)
	// room appears as conversations go quiet, which no request reports
	m.router.AdmitWaiting(now)
	m.logOuts()
	m.checkOvercommit(m.router.Admission())
	var restarted []string
	m.mu.Lock()
	// the restarts seen now happened after the previous round
	prevRound := m.lastTaken
	for i := range s.Replicas {
		rs := &s.Replicas[i]
		if rs.Resets > m.resets[rs.ID] && m.current[rs.ID] {
			// the replica's counters dropped: it restarted with an empty
			// prefix cache, so none of its bindings holds a cache any more
			restarted = append(restarted, rs.ID)
			m.resets[rs.ID] = rs.Resets
		}
	}
	if !s.Taken.Equal(m.lastTaken) {
		// a new poll round (SetTargets republishes the previous one)
		m.lastTaken = s.Taken
		for _, id := range failed {
			if m.current[id] {
				m.pollErrs[id]++
			}
		}
	}
	m.mu.Unlock()
	for _, id := range restarted {
		// turns routed since the previous round may have run on the
		// restarted engine and filled its cache again
		m.router.ColdReplicaSince(id, prevRound)
	}
}

// logf logs a replica leaving or rejoining placement over its polls.
func (m *modelState) logf(down bool, id, lastErr string) {
	m.mu.Lock()
	l := m.logger
	m.mu.Unlock()
	if down {
		l.Warn("replica out of placement: its polls fail; its conversations are re-placed on their next turn",
			zap.String("model", m.name), zap.String("replica", id), zap.String("error", lastErr))
		return
	}
	l.Info("replica back in placement: its polls succeed", zap.String("model", m.name), zap.String("replica", id))
}

func (m *modelState) pollErrors() map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]uint64, len(m.pollErrs))
	for k, v := range m.pollErrs {
		out[k] = v
	}
	return out
}

func (m *modelState) recordUsage(replica string, u vllmstats.Usage, now time.Time) {
	m.acct.Record(replica, u, now)
}

// feedback reports a finished turn's delivered cached tokens to the router,
// which checks them against its binding's prediction (placement.Feedback),
// and records a checked turn's prediction and delivery (at most the
// prediction) for the stats page's delivered share; first and total (the
// time to its first token, 0 when unknown, and to its end) teach the
// replica's prefill rate and turn time. Only a response that carried both
// counts says anything.
func (m *modelState) feedback(key string, dec placement.Decision, u vllmstats.Usage, first, total time.Duration, now time.Time) {
	if key == "" || !u.Measured || !u.CachedMeasured {
		return
	}
	cached := int(min(u.CachedTokens, 1<<31-1))
	predicted := m.router.Feedback(placement.Turn{
		Key: key, Replica: dec.Replica, Reason: dec.Reason,
		Prompt: int(min(u.PromptTokens, 1<<31-1)), Cached: cached,
		Completion: int(min(max(u.CompletionTokens, 0), 1<<31-1)),
		FirstToken: first, Duration: total, Expect: dec.Expect,
	})
	if predicted > 0 {
		m.acct.RecordDelivery(dec.Replica, predicted, min(cached, predicted), now)
	}
}

func init() {
	caddy.RegisterModule(new(App))
}

// App is the lm_warden Caddy app. It starts the replica pollers of the models
// used in the running configuration. It needs no configuration: the first
// lm_warden selection policy loads it. Pollers stop when their model leaves
// the configuration (the last policy using it is cleaned up).
type App struct {
	ctx      caddy.Context
	mu       sync.Mutex
	models   map[string]*modelState
	policies []*Policy
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "lm_warden",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision keeps the context for Start.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	return nil
}

// add records a policy of this configuration. Policies naming one model
// share its router and poller, so they must agree on every setting: a
// second policy that disagrees fails the configuration load instead of
// silently overwriting the first one's settings.
func (a *App) add(m *modelState, p *Policy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, q := range a.policies {
		if q.Model == p.Model && q.shared() != p.shared() {
			return fmt.Errorf("lm_warden: model %s is configured twice with different settings (%s); "+
				"policies naming one model share its router and poller, so give them the same settings or different model names",
				p.Model, q.shared().diff(p.shared()))
		}
	}
	if a.models == nil {
		a.models = make(map[string]*modelState)
	}
	a.models[m.name] = m
	a.policies = append(a.policies, p)
	return nil
}

// Start applies this configuration's settings to its models (a reload
// changes a running model only once the new configuration starts), tells
// them their static upstreams (so polling and the card start before the
// first request) and starts polling. It fails, changing nothing, when two
// reverse proxies give one model different upstreams.
func (a *App) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var seeds []upstreamSeed
	if a.ctx.Context != nil && len(a.policies) > 0 {
		if httpApp, err := a.ctx.AppIfConfigured("http"); err == nil {
			if app, ok := httpApp.(*caddyhttp.App); ok {
				seeds = findUpstreams(app, a.policies)
			}
		}
	}
	if err := checkUpstreams(seeds); err != nil {
		return err
	}
	for _, p := range a.policies {
		p.apply()
		p.applyStore() // connects only now: validating a configuration dials nothing
	}
	for _, s := range seeds {
		if len(s.h.Upstreams) > 0 {
			s.p.replicas(s.h.Upstreams)
		}
	}
	for _, m := range a.models {
		m.start()
	}
	return nil
}

// upstreamSeed is a reverse proxy using one of this configuration's
// policies.
type upstreamSeed struct {
	p *Policy
	h *reverseproxy.Handler
}

// findUpstreams finds the reverse proxies that use one of policies.
func findUpstreams(app *caddyhttp.App, policies []*Policy) []upstreamSeed {
	ours := make(map[*Policy]bool, len(policies))
	for _, p := range policies {
		ours[p] = true
	}
	var out []upstreamSeed
	var walk func(routes caddyhttp.RouteList)
	walk = func(routes caddyhttp.RouteList) {
		for _, rt := range routes {
			for _, h := range rt.Handlers {
				switch h := h.(type) {
				case *caddyhttp.Subroute:
					walk(h.Routes)
					if h.Errors != nil {
						walk(h.Errors.Routes)
					}
				case *reverseproxy.Handler:
					if h.LoadBalancing == nil {
						continue
					}
					if p, ok := h.LoadBalancing.SelectionPolicy.(*Policy); ok && ours[p] {
						out = append(out, upstreamSeed{p: p, h: h})
					}
				}
			}
		}
	}
	for _, srv := range app.Servers {
		walk(srv.Routes)
		if srv.Errors != nil {
			walk(srv.Errors.Routes)
		}
		for _, rt := range srv.NamedRoutes {
			if rt != nil {
				walk(caddyhttp.RouteList{*rt})
			}
		}
	}
	return out
}

// checkUpstreams refuses a model whose reverse proxies list different
// upstreams, or that has dynamic upstreams in more than one proxy: its
// policies share one replica set, which would otherwise flip between the
// lists on every request and answer 503 for replicas the other list lacks.
func checkUpstreams(seeds []upstreamSeed) error {
	first := make(map[string]upstreamSeed)
	for _, s := range seeds {
		f, seen := first[s.p.Model]
		if !seen {
			first[s.p.Model] = s
			continue
		}
		if f.h == s.h {
			continue
		}
		if f.h.DynamicUpstreams != nil || s.h.DynamicUpstreams != nil {
			return fmt.Errorf("lm_warden: model %s is used by more than one reverse_proxy and one of them has dynamic upstreams; "+
				"give each its own model name, or route to one reverse_proxy", s.p.Model)
		}
		a, b := dials(f.h.Upstreams), dials(s.h.Upstreams)
		if !slices.Equal(a, b) {
			return fmt.Errorf("lm_warden: model %s is used by reverse proxies with different upstreams (%s and %s); "+
				"policies naming one model share its replicas, so list the same upstreams in the same order or use different model names",
				s.p.Model, strings.Join(a, " "), strings.Join(b, " "))
		}
	}
	return nil
}

func dials(ups reverseproxy.UpstreamPool) []string {
	out := make([]string, len(ups))
	for i, u := range ups {
		out[i] = u.Dial
	}
	return out
}

// Stop does nothing: a model's poller outlives a reload and stops when the
// model is gone from the configuration.
func (a *App) Stop() error { return nil }

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
	_ caddy.Destructor  = (*modelState)(nil)
)
