package vllmstats

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// Target is one replica to poll: a vLLM server, or one data-parallel engine
// of a server started with --data-parallel-size N.
type Target struct {
	// ID names the replica in snapshots (unique).
	ID string
	// BaseURL is the server's root, e.g. "http://10.0.0.5:8000".
	BaseURL string
	// Engine is the engine label to read; "" means the server's only engine
	// (or engine "0"). Targets sharing a BaseURL are polled with one request.
	Engine string
}

// PollerConfig configures a Poller. Zero fields take the defaults noted.
type PollerConfig struct {
	Targets []Target
	// Interval between poll rounds; default 1 s.
	Interval time.Duration
	// Timeout of each request; default and maximum 80% of Interval.
	Timeout time.Duration
	// FailAfter is the number of consecutive failed polls after which a
	// replica is unreachable; default 3.
	FailAfter int
	// Window is the span of the windowed prefix hit rate; default 60 s.
	Window time.Duration
	// MetricsPath defaults to "/metrics".
	MetricsPath string
	// Client defaults to a client with its own transport.
	Client *http.Client
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
	// Dialect is the engine whose names are read; DialectAuto (the zero
	// value) detects it from each server's first exposition that carries
	// known series, and again when a later one carries none of its names.
	Dialect Dialect
	// OnSnapshot, when set, is called with the new snapshot after every poll
	// round (from the poller's goroutine) and after SetTargets (from its
	// caller's). It must not block for long: the next round waits for it.
	OnSnapshot func(*Snapshot)
}

// Snapshot is an immutable view of every replica after a poll round.
// Readers must not modify it.
type Snapshot struct {
	// Taken is when the round that produced it ended (zero before the first).
	Taken time.Time
	// Replicas are in the order of the targets.
	Replicas []ReplicaStats
}

// Replica returns the stats of the replica with the given ID. It does not
// allocate.
func (s *Snapshot) Replica(id string) (*ReplicaStats, bool) {
	for i := range s.Replicas {
		if s.Replicas[i].ID == id {
			return &s.Replicas[i], true
		}
	}
	return nil, false
}

// ReplicaStats is what the poller knows about one replica.
type ReplicaStats struct {
	ID, BaseURL, Engine string

	// Reachable is false after FailAfter consecutive failed polls and true
	// again after the next good one. A replica not yet polled is reachable
	// (LastSeen is zero).
	Reachable bool
	// LastError is the error of the last poll, "" when it succeeded.
	LastError string
	// LastSeen is when the replica last answered a poll.
	LastSeen time.Time
	// Failures counts consecutive failed polls.
	Failures int
	// Refused is true when the last poll failed because the connection was
	// refused or reset: nothing serves at the address any more (a stopped or
	// crashed server), unlike a slow or erroring one.
	Refused bool

	// Metrics are from the last good poll (kept while polls fail).
	Metrics EngineMetrics
	// Dialect is the engine the replica's exposition was read as: the
	// configured one, or the one detected (DialectAuto until then).
	Dialect Dialect
	// Unread, when not "", says why the last poll, which the server
	// answered with 200, gave no figures (no series of a known engine, or
	// not a Prometheus exposition): the replica is reachable, its figures
	// unknown.
	Unread string

	// HitRateWindow is Δhits/Δqueries of the prefix cache over the last
	// Window, HitRateTotal since the poller started; 0 when no queries.
	// Both are meaningful only when HitRateKnown, and HitRateWindow only
	// when HitRateWindowKnown too.
	HitRateWindow, HitRateTotal float64
	// HitRateWindowKnown is false when no prompt token was looked up in the
	// window: the replica was idle, its windowed rate is unknown, not 0 %.
	HitRateWindowKnown bool
	// HitRateKnown is true when the last good poll found both prefix-cache
	// counters (Metrics.Present has FigPrefix). When false the hit rates are
	// unknown, not 0.
	HitRateKnown bool
	// Prefix-cache counter increases since the poller started, summed over
	// restarts of the replica (a counter that goes down starts a new
	// baseline).
	QueriesSinceStart, HitsSinceStart float64
	// Resets counts counter drops seen (replica restarts).
	Resets uint64
}

// Poller polls the /metrics of every target's server at an interval and
// publishes a Snapshot after each round. Reading the snapshot never takes a
// lock and never allocates.
type Poller struct {
	cfg PollerConfig
	log *zap.Logger

	mu      sync.Mutex // targets, states, urls; never held during I/O
	targets []Target
	states  map[string]*targetState
	urls    map[string]*urlState // distinct base URLs, each polled once a round

	snap atomic.Pointer[Snapshot]

	startOnce, stopOnce sync.Once
	ctx                 context.Context
	cancel              context.CancelFunc
	done                chan struct{}
}

// urlState is what the poller keeps of one server between rounds.
type urlState struct {
	dialect Dialect // detected (or configured); DialectAuto until known
	// capacity is the KV capacity in tokens from /props (llama.cpp); 0
	// until read.
	capacity int
}

type targetState struct {
	stats    ReplicaStats
	havePrev [2]bool // prev holds a value of that counter
	// without: a good poll found the server without that counter: one that
	// appears later started from 0 then (a client_golang counter has no
	// sample before its first increment), so all of it is new traffic
	without [2]bool
	prev    [2]float64 // prefix queries, hits
	// missing is the set of figures last logged as absent.
	missing Figures
	// unread is the Unread reason last logged ("" when the last poll read
	// figures).
	unread string
	window *hitWindow
}

// NewPoller returns a stopped poller with its first snapshot (every target
// reachable, nothing polled yet).
func NewPoller(cfg PollerConfig) *Poller {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if maxT := cfg.Interval * 8 / 10; cfg.Timeout <= 0 || cfg.Timeout > maxT {
		cfg.Timeout = maxT
	}
	if cfg.FailAfter <= 0 {
		cfg.FailAfter = 3
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Minute
	}
	if cfg.MetricsPath == "" {
		cfg.MetricsPath = "/metrics"
	}
	if cfg.Client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 4
		cfg.Client = &http.Client{Transport: tr}
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	p := &Poller{
		cfg:    cfg,
		log:    log,
		states: make(map[string]*targetState),
		urls:   make(map[string]*urlState),
		done:   make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.mu.Lock()
	p.setTargetsLocked(cfg.Targets)
	p.publishLocked(time.Time{})
	p.mu.Unlock()
	return p
}

// Start begins polling in a goroutine: one round now, then one per Interval.
func (p *Poller) Start() {
	p.startOnce.Do(func() { go p.run() })
}

// Stop ends polling, cancels requests in flight and waits for the goroutine.
// A stopped poller cannot be restarted; its last snapshot stays readable.
func (p *Poller) Stop() {
	p.stopOnce.Do(func() {
		p.cancel()
		started := true
		p.startOnce.Do(func() { started = false })
		if started {
			<-p.done
		}
	})
}

// Snapshot returns the latest snapshot; never nil.
func (p *Poller) Snapshot() *Snapshot { return p.snap.Load() }

// SetTargets replaces the targets. Replicas keeping their ID keep their
// state; a new snapshot is published at once.
func (p *Poller) SetTargets(targets []Target) {
	p.mu.Lock()
	p.setTargetsLocked(targets)
	s := p.publishLocked(p.snap.Load().Taken)
	p.mu.Unlock()
	if p.cfg.OnSnapshot != nil {
		p.cfg.OnSnapshot(s)
	}
}

func (p *Poller) setTargetsLocked(targets []Target) {
	seen := make(map[string]bool, len(targets))
	p.targets = p.targets[:0:0]
	for _, t := range targets {
		t.BaseURL = strings.TrimRight(t.BaseURL, "/")
		if seen[t.ID] {
			continue
		}
		seen[t.ID] = true
		p.targets = append(p.targets, t)
		st := p.states[t.ID]
		if st == nil || st.stats.BaseURL != t.BaseURL || st.stats.Engine != t.Engine {
			st = p.newState(t)
			p.states[t.ID] = st
		}
		if p.urls[t.BaseURL] == nil {
			p.urls[t.BaseURL] = &urlState{dialect: p.cfg.Dialect}
		}
	}
	for id := range p.states {
		if !seen[id] {
			delete(p.states, id)
		}
	}
	for u := range p.urls {
		used := false
		for _, t := range p.targets {
			used = used || t.BaseURL == u
		}
		if !used {
			delete(p.urls, u)
		}
	}
}

func (p *Poller) newState(t Target) *targetState {
	return &targetState{
		stats:  ReplicaStats{ID: t.ID, BaseURL: t.BaseURL, Engine: t.Engine, Reachable: true},
		window: newHitWindow(p.cfg.Window, p.cfg.Interval),
	}
}

// publishLocked builds and stores a new snapshot from the current states.
func (p *Poller) publishLocked(taken time.Time) *Snapshot {
	s := &Snapshot{Taken: taken, Replicas: make([]ReplicaStats, 0, len(p.targets))}
	for _, t := range p.targets {
		s.Replicas = append(s.Replicas, p.states[t.ID].stats)
	}
	p.snap.Store(s)
	return s
}

func (p *Poller) run() {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	for {
		p.round()
		select {
		case <-p.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

type urlResult struct {
	engines map[string]*EngineMetrics
	err     error
	// unread: the server answered 200 but its body gave no figures (err
	// says why); not a failed poll.
	unread  bool
	dialect Dialect
	// capacity from /props, when read this round
	capacity int
}

// round polls every distinct base URL once, concurrently, then applies the
// results and publishes a snapshot.
func (p *Poller) round() {
	p.mu.Lock()
	urls := make([]string, 0, len(p.urls))
	known := make([]urlState, 0, len(p.urls))
	for u, us := range p.urls {
		urls = append(urls, u)
		known = append(known, *us)
	}
	p.mu.Unlock()

	results := make([]urlResult, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = p.fetchMetrics(u, known[i])
		}()
	}
	wg.Wait()
	if p.ctx.Err() != nil {
		return // stopping: the cancelled requests say nothing about the replicas
	}

	now := time.Now()
	p.mu.Lock()
	for i, u := range urls {
		if us := p.urls[u]; us != nil {
			r := &results[i]
			if r.err == nil || r.unread {
				if p.cfg.Dialect == DialectAuto && r.dialect != DialectAuto && r.dialect != us.dialect {
					us.dialect, us.capacity = r.dialect, 0 // another engine: read its capacity anew
				}
			}
			if r.capacity > 0 {
				us.capacity = r.capacity
			}
			p.applyURL(u, r, us, now)
		} // else removed by SetTargets meanwhile
	}
	s := p.publishLocked(now)
	p.mu.Unlock()
	if p.cfg.OnSnapshot != nil {
		p.cfg.OnSnapshot(s)
	}
}

func (p *Poller) applyURL(url string, r *urlResult, us *urlState, now time.Time) {
	for _, t := range p.targets {
		if t.BaseURL != url {
			continue
		}
		st := p.states[t.ID]
		st.stats.Dialect = us.dialect
		if r.unread {
			p.reachedUnread(st, r.err, now)
			continue
		}
		err := r.err
		var em *EngineMetrics
		if err == nil {
			em, err = pickEngine(r.engines, t.Engine)
			if err != nil {
				err = fmt.Errorf("polling %s%s: %w", url, p.cfg.MetricsPath, err)
			}
		}
		if err != nil {
			p.fail(st, err)
			continue
		}
		if us.capacity > 0 && !em.Present.Has(FigCacheConfig) {
			em.KVCapacityTokens = us.capacity
			em.Present |= FigCacheConfig
		}
		p.succeed(st, em, now)
	}
}

// reachedUnread records a poll the server answered with 200 but whose body
// gave no figures: the replica is reachable, every figure unknown. Logged
// once per replica and reason.
func (p *Poller) reachedUnread(st *targetState, why error, now time.Time) {
	s := &st.stats
	if !s.Reachable {
		p.log.Info("replica reachable again", zap.String("replica", s.ID), zap.Time("last_seen", s.LastSeen))
	}
	s.Reachable, s.Failures, s.LastError, s.LastSeen, s.Refused = true, 0, "", now, false
	s.Metrics = EngineMetrics{Engine: s.Metrics.Engine}
	s.HitRateKnown = false
	s.Unread = why.Error()
	if st.unread != s.Unread {
		p.log.Warn("replica's /metrics gives no figure this module reads; it stays in placement with its load unknown (set engine, or check the engine's metrics flag)",
			zap.String("replica", s.ID), zap.String("reason", s.Unread))
		st.unread = s.Unread
		st.missing = AllFigures
	}
	// the window sees no new counts: its rate decays to idle
	s.HitRateWindow, s.HitRateWindowKnown = st.window.add(now, s.QueriesSinceStart, s.HitsSinceStart)
}

func pickEngine(engines map[string]*EngineMetrics, engine string) (*EngineMetrics, error) {
	if engine == "" {
		if len(engines) == 1 {
			for _, em := range engines {
				return em, nil
			}
		}
		engine = defaultEngineID
	}
	if em, ok := engines[engine]; ok {
		return em, nil
	}
	ids := make([]string, 0, len(engines))
	for id := range engines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return nil, fmt.Errorf("engine %q not in exposition (engines %s)", engine, strings.Join(ids, ","))
}

func (p *Poller) fail(st *targetState, err error) {
	s := &st.stats
	s.Failures++
	s.LastError = err.Error()
	s.Refused = errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
	if s.Failures >= p.cfg.FailAfter && s.Reachable {
		s.Reachable = false
		p.log.Warn("replica unreachable", zap.String("replica", s.ID), zap.Int("failures", s.Failures), zap.Error(err))
	}
}

// succeed records a good poll; it reports whether a counter reset was seen.
func (p *Poller) succeed(st *targetState, em *EngineMetrics, now time.Time) (reset bool) {
	s := &st.stats
	if !s.Reachable {
		p.log.Info("replica reachable again", zap.String("replica", s.ID), zap.Time("last_seen", s.LastSeen))
	}
	s.Reachable, s.Failures, s.LastError, s.LastSeen, s.Refused = true, 0, "", now, false
	s.Metrics = *em
	s.Dialect = em.Dialect
	s.Unread, st.unread = "", ""

	if missing := em.Present.Missing(); missing != st.missing {
		// Once per replica and change, not every poll.
		if missing != 0 {
			p.log.Warn("replica does not export some series; they are shown as unknown",
				zap.String("replica", s.ID), zap.String("engine", em.Dialect.String()),
				zap.String("missing", em.Dialect.Series(missing)))
		} else {
			p.log.Info("replica exports every series read", zap.String("replica", s.ID), zap.String("engine", em.Dialect.String()))
		}
		st.missing = missing
	}

	// A counter the poll did not find keeps its baseline and adds nothing.
	cur := [2]float64{em.PrefixQueries, em.PrefixHits}
	var have [2]bool
	for i, f := range [2]Figures{FigPrefixQueries, FigPrefixHits} {
		have[i] = em.Present.Has(f)
		if have[i] && st.havePrev[i] && cur[i] < st.prev[i] {
			reset = true
		}
	}
	if reset {
		s.Resets++
	}
	since := [2]*float64{&s.QueriesSinceStart, &s.HitsSinceStart}
	for i := range cur {
		if !have[i] {
			st.without[i] = !st.havePrev[i]
			continue
		}
		switch {
		case st.havePrev[i] && !reset:
			*since[i] += cur[i] - st.prev[i]
		case !st.havePrev[i] && st.without[i]:
			*since[i] += cur[i] // appeared since the last poll: from 0
		}
		st.prev[i], st.havePrev[i] = cur[i], true
	}
	s.HitRateKnown = em.Present.Has(FigPrefix)
	if s.QueriesSinceStart > 0 {
		s.HitRateTotal = s.HitsSinceStart / s.QueriesSinceStart
	}

	// Window: the cumulative (reset-safe) counts at each good poll.
	s.HitRateWindow, s.HitRateWindowKnown = st.window.add(now, s.QueriesSinceStart, s.HitsSinceStart)
	return reset
}

// maxBody bounds what is read from a replica.
const maxBody = 32 << 20

func (p *Poller) get(url string, accept string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", accept)
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("GET %s: status %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading body: %w", url, err)
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("GET %s: body over %d bytes", url, maxBody)
	}
	return b, nil
}

// fetchMetrics polls one server's /metrics and, for an engine whose KV
// capacity only /props gives (llama.cpp) while it is not known, its /props:
// one extra GET a round until it is read.
func (p *Poller) fetchMetrics(base string, known urlState) urlResult {
	b, err := p.get(base+p.cfg.MetricsPath, "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if err != nil {
		return urlResult{err: err}
	}
	d := known.dialect
	engines, err := ParseMetricsAs(bytes.NewReader(b), d)
	if errors.Is(err, ErrNoKnownSeries) && d != DialectAuto && p.cfg.Dialect == DialectAuto {
		// the engine detected before is gone: another one may serve here
		engines, err = ParseMetricsAs(bytes.NewReader(b), DialectAuto)
	}
	if err != nil {
		// The server answered 200: reachable, whatever its body says.
		return urlResult{err: fmt.Errorf("polling %s%s: %w", base, p.cfg.MetricsPath, err), unread: true, dialect: d}
	}
	r := urlResult{engines: engines}
	for _, em := range engines {
		r.dialect = em.Dialect
		break
	}
	if r.dialect.Capacity() == CapacityProps && (known.capacity == 0 || r.dialect != known.dialect) {
		if n, err := p.propsCapacity(base); err != nil {
			p.log.Debug("reading /props for the KV capacity", zap.String("server", base), zap.Error(err))
		} else {
			r.capacity = n
		}
	}
	return r
}

// propsCapacity reads llama.cpp's GET /props (tools/server/server-context.cpp,
// get_res_props): default_generation_settings.n_ctx is one slot's context
// (llama_n_ctx_seq), total_slots the slots (-np); their product is the KV
// cache the server allocated, unless it runs --kv-unified, where the slots
// share one n_ctx (then set kv_tokens).
func (p *Poller) propsCapacity(base string) (int, error) {
	b, err := p.get(base+"/props", "application/json")
	if err != nil {
		return 0, err
	}
	var props struct {
		Settings struct {
			NCtx int64 `json:"n_ctx"`
		} `json:"default_generation_settings"`
		TotalSlots int64 `json:"total_slots"`
	}
	if err := json.Unmarshal(b, &props); err != nil {
		return 0, fmt.Errorf("GET %s/props: %w", base, err)
	}
	n, slots := props.Settings.NCtx, max(props.TotalSlots, 1)
	if n <= 0 || n > math.MaxInt32 || slots > 1<<16 {
		return 0, fmt.Errorf("GET %s/props: no usable n_ctx (%d) × total_slots (%d)", base, n, props.TotalSlots)
	}
	return int(n * slots), nil
}
