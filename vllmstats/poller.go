package vllmstats

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	// MetricsPath and ModelsPath default to "/metrics" and "/v1/models".
	MetricsPath, ModelsPath string
	// Client defaults to a client with its own transport.
	Client *http.Client
	// Logger defaults to a no-op logger.
	Logger *zap.Logger
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
	// MaxModelLen and ModelID are from GET /v1/models.
	MaxModelLen int
	ModelID     string

	// HitRateWindow is Δhits/Δqueries of the prefix cache over the last
	// Window, HitRateTotal since the poller started; 0 when no queries.
	HitRateWindow, HitRateTotal float64
	// WindowQueries are the prefix-cache queries (tokens) within the window.
	WindowQueries float64
	// Counter increases since the poller started, summed over restarts of
	// the replica (a counter that goes down starts a new baseline).
	QueriesSinceStart, HitsSinceStart, PromptTokensSinceStart, GenerationTokensSinceStart float64
	// Resets counts counter drops seen (replica restarts).
	Resets uint64

	// Samples counts good polls, BusySamples those with running > 0.
	Samples, BusySamples uint64
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
	urls    map[string]*urlState

	snap atomic.Pointer[Snapshot]

	startOnce, stopOnce sync.Once
	ctx                 context.Context
	cancel              context.CancelFunc
	done                chan struct{}
}

type windowSample struct {
	at            time.Time
	queries, hits float64
}

type targetState struct {
	stats    ReplicaStats
	havePrev bool
	prev     [4]float64 // queries, hits, prompt, generation
	ring     []windowSample
	ringNext int
	ringLen  int
}

type urlState struct {
	needModels  bool
	failing     bool
	modelName   string
	maxModelLen int
	modelID     string
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
	if cfg.ModelsPath == "" {
		cfg.ModelsPath = "/v1/models"
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
			p.urls[t.BaseURL] = &urlState{needModels: true}
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
	n := int(p.cfg.Window/p.cfg.Interval) + 2
	n = min(max(n, 4), 3600)
	return &targetState{
		stats: ReplicaStats{ID: t.ID, BaseURL: t.BaseURL, Engine: t.Engine, Reachable: true},
		ring:  make([]windowSample, n),
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
	engines      map[string]*EngineMetrics
	err          error
	modelsWanted bool
	models       *modelsInfo
}

type modelsInfo struct {
	id          string
	maxModelLen int
}

// round polls every distinct base URL once, concurrently, then applies the
// results and publishes a snapshot.
func (p *Poller) round() {
	p.mu.Lock()
	type job struct {
		url        string
		needModels bool
	}
	jobs := make([]job, 0, len(p.urls))
	for u, us := range p.urls {
		jobs = append(jobs, job{u, us.needModels || us.failing})
	}
	p.mu.Unlock()

	results := make([]urlResult, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			r.modelsWanted = j.needModels
			r.engines, r.err = p.fetchMetrics(j.url)
			if r.err == nil && j.needModels {
				m, err := p.fetchModels(j.url)
				if err != nil {
					p.log.Debug("reading models", zap.String("url", j.url), zap.Error(err))
				} else {
					r.models = m
				}
			}
		}()
	}
	wg.Wait()
	if p.ctx.Err() != nil {
		return // stopping: the cancelled requests say nothing about the replicas
	}

	now := time.Now()
	p.mu.Lock()
	for i, j := range jobs {
		us := p.urls[j.url]
		if us == nil {
			continue // removed by SetTargets meanwhile
		}
		p.applyURL(j.url, us, &results[i], now)
	}
	s := p.publishLocked(now)
	p.mu.Unlock()
	if p.cfg.OnSnapshot != nil {
		p.cfg.OnSnapshot(s)
	}
}

func (p *Poller) applyURL(url string, us *urlState, r *urlResult, now time.Time) {
	us.failing = r.err != nil
	if r.modelsWanted && r.err == nil && r.models == nil {
		us.needModels = true // try again next round
	}
	if r.models != nil {
		us.needModels = false
		us.modelID, us.maxModelLen = r.models.id, r.models.maxModelLen
	}
	for _, t := range p.targets {
		if t.BaseURL != url {
			continue
		}
		st := p.states[t.ID]
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
			us.failing = true // read the models again when it comes back
			continue
		}
		if us.modelName != "" && em.ModelName != us.modelName {
			us.needModels = true // the server now serves another model
		}
		us.modelName = em.ModelName
		if p.succeed(st, em, now) {
			us.needModels = true // restarted: its configuration may have changed
		}
		st.stats.MaxModelLen, st.stats.ModelID = us.maxModelLen, us.modelID
	}
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
		p.log.Warn("vLLM replica unreachable", zap.String("replica", s.ID), zap.Int("failures", s.Failures), zap.Error(err))
	}
}

// succeed records a good poll; it reports whether a counter reset was seen.
func (p *Poller) succeed(st *targetState, em *EngineMetrics, now time.Time) (reset bool) {
	s := &st.stats
	if !s.Reachable {
		p.log.Info("vLLM replica reachable again", zap.String("replica", s.ID), zap.Time("last_seen", s.LastSeen))
	}
	s.Reachable, s.Failures, s.LastError, s.LastSeen, s.Refused = true, 0, "", now, false
	s.Metrics = *em
	s.Samples++
	if em.Running > 0 {
		s.BusySamples++
	}

	cur := [4]float64{em.PrefixQueries, em.PrefixHits, em.PromptTokens, em.GenerationTokens}
	if st.havePrev {
		for i := range cur {
			if cur[i] < st.prev[i] {
				reset = true
			}
		}
		if reset {
			s.Resets++
		} else {
			s.QueriesSinceStart += cur[0] - st.prev[0]
			s.HitsSinceStart += cur[1] - st.prev[1]
			s.PromptTokensSinceStart += cur[2] - st.prev[2]
			s.GenerationTokensSinceStart += cur[3] - st.prev[3]
		}
	}
	st.prev, st.havePrev = cur, true
	if s.QueriesSinceStart > 0 {
		s.HitRateTotal = s.HitsSinceStart / s.QueriesSinceStart
	}

	// Window: cumulative (reset-safe) values at each poll in a fixed ring.
	st.ring[st.ringNext] = windowSample{now, s.QueriesSinceStart, s.HitsSinceStart}
	st.ringNext = (st.ringNext + 1) % len(st.ring)
	st.ringLen = min(st.ringLen+1, len(st.ring))
	// The window starts at the newest earlier sample at least Window old (or
	// the oldest kept, early on).
	oldest := st.ring[(st.ringNext-st.ringLen+len(st.ring))%len(st.ring)]
	for k := st.ringLen - 1; k > 1; k-- {
		w := st.ring[(st.ringNext-k+len(st.ring))%len(st.ring)]
		if now.Sub(w.at) < p.cfg.Window {
			break
		}
		oldest = w
	}
	s.WindowQueries = s.QueriesSinceStart - oldest.queries
	s.HitRateWindow = 0
	if s.WindowQueries > 0 {
		s.HitRateWindow = (s.HitsSinceStart - oldest.hits) / s.WindowQueries
	}
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

func (p *Poller) fetchMetrics(base string) (map[string]*EngineMetrics, error) {
	b, err := p.get(base+p.cfg.MetricsPath, "text/plain;version=0.0.4;q=1,*/*;q=0.1")
	if err != nil {
		return nil, err
	}
	engines, err := ParseMetrics(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("polling %s%s: %w", base, p.cfg.MetricsPath, err)
	}
	return engines, nil
}

func (p *Poller) fetchModels(base string) (*modelsInfo, error) {
	b, err := p.get(base+p.cfg.ModelsPath, "application/json")
	if err != nil {
		return nil, err
	}
	var body struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
			Parent      string `json:"parent"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &body); err != nil {
		return nil, fmt.Errorf("reading %s%s: %w", base, p.cfg.ModelsPath, err)
	}
	for _, m := range body.Data {
		if m.Parent == "" { // a base model, not a LoRA adapter
			return &modelsInfo{id: m.ID, maxModelLen: m.MaxModelLen}, nil
		}
	}
	return nil, errors.New("no base model in " + base + p.cfg.ModelsPath)
}
