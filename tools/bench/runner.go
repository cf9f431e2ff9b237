package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// HTTPConfig is a run against live replicas over HTTP.
type HTTPConfig struct {
	Client   Client
	Workload Workload
	// Count sizes the workload's texts (nil: about 4 bytes per token).
	Count  TokenCounter
	Stages []int
	// Modes run in order for every stage; SetMode switches the router
	// before each (nil: the modes are only labels).
	Modes   []string
	SetMode func(ctx context.Context, mode string) error
	// Policy names the router of a mode in the report (nil: "external").
	Policy func(mode string) string
	// StageLength and Warmup are engine time.
	StageLength, Warmup time.Duration
	// Speed is engine seconds per wall second (1 for real vLLM).
	Speed float64
	// Metrics are the replicas' metrics URLs (http://host:port/metrics).
	// With one server and several data-parallel engines, one URL gives
	// one replica per engine.
	Metrics []string
	// PollInterval is engine time between polls (default 1 s).
	PollInterval time.Duration
	// Drain bounds the wall time waited after a stage for the replicas to
	// finish aborted work (default 30 s).
	Drain time.Duration
	// Progress receives the stages' progress (nil: none): with LiveProgress
	// (a terminal) one line rewritten in place every second, otherwise a
	// plain line every PlainProgressEvery of wall time, so a log or a pipe
	// holds readable lines.
	Progress     io.Writer
	LiveProgress bool
	// OnStage, when set, runs beside every stage from its start; its
	// context ends with the stage, and the stage waits for it to return
	// (a fault injected with it is lifted before the next stage).
	OnStage func(ctx context.Context)
	// EndSession, when set, is called at a stage's end for every session
	// its clients were running (by their ID): the clients go away, and the
	// router is told, so the next stage's placement does not count them.
	EndSession func(ctx context.Context, id string)
}

// PlainProgressEvery is how often a stage's progress is written as a plain
// line when HTTPConfig.LiveProgress is off.
const PlainProgressEvery = 15 * time.Second

type httpRun struct {
	cfg   HTTPConfig
	gen   *Generator
	genMu sync.Mutex
	t0    time.Time
	hc    *http.Client

	mu    sync.Mutex
	polls []Poll
	turns []TurnRecord

	lastPlain time.Time // when the last plain progress line was written
}

// RunHTTP runs every stage under every mode against the configured base
// URL and returns the report.
func RunHTTP(ctx context.Context, cfg HTTPConfig) (*Report, error) {
	if cfg.Speed <= 0 {
		cfg.Speed = 1
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 30 * time.Second
	}
	if cfg.StageLength <= 0 {
		return nil, fmt.Errorf("stage length must be positive")
	}
	if len(cfg.Modes) == 0 {
		cfg.Modes = []string{ModeOn}
	}
	if cfg.Client.HTTP == nil {
		cfg.Client.HTTP = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	}
	gen, err := NewGenerator(cfg.Workload, cfg.Count)
	if err != nil {
		return nil, err
	}
	r := &httpRun{cfg: cfg, gen: gen, t0: time.Now(), hc: &http.Client{Timeout: 5 * time.Second}}
	rep := &Report{Kind: "http", Speed: cfg.Speed, Workload: cfg.Workload}

	pollCtx, stopPoll := context.WithCancel(ctx)
	var pollWG sync.WaitGroup
	pollWG.Add(1)
	go func() {
		defer pollWG.Done()
		r.pollLoop(pollCtx)
	}()
	defer func() {
		stopPoll()
		pollWG.Wait()
	}()

	for _, n := range cfg.Stages {
		for _, m := range cfg.Modes {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			if cfg.SetMode != nil {
				if err := cfg.SetMode(ctx, m); err != nil {
					return rep, fmt.Errorf("switching to %s: %w", m, err)
				}
			}
			st := r.stage(ctx, m, n)
			rep.Stages = append(rep.Stages, st)
			r.drain(ctx)
		}
	}
	return rep, nil
}

// engineNow is the engine time since the run started.
func (r *httpRun) engineNow() time.Duration {
	return r.engineAt(time.Now())
}

func (r *httpRun) engineAt(t time.Time) time.Duration {
	return time.Duration(float64(t.Sub(r.t0)) * r.cfg.Speed)
}

func (r *httpRun) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) / r.cfg.Speed)
}

func (r *httpRun) stage(ctx context.Context, mode string, n int) Stage {
	start := r.engineNow()
	w := Window{From: start + r.cfg.Warmup, To: start + r.cfg.Warmup + r.cfg.StageLength}
	sctx, cancel := context.WithTimeout(ctx, r.wall(r.cfg.Warmup+r.cfg.StageLength))
	defer cancel()
	r.mu.Lock()
	first := len(r.turns)
	r.mu.Unlock()

	var wg sync.WaitGroup
	if r.cfg.OnStage != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.cfg.OnStage(sctx)
		}()
	}
	last := make([]string, n) // each client's session when the stage ended
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last[i] = r.client(sctx, start, r.cfg.Workload.FirstTurn(i, n))
		}()
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	label := fmt.Sprintf("%s %d", modeLabel(mode), n)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			r.progress(label, start, w, first)
		}
	}
	if r.cfg.EndSession != nil {
		for _, id := range last {
			if id != "" {
				r.cfg.EndSession(ctx, id)
			}
		}
	}
	r.mu.Lock()
	turns := append([]TurnRecord(nil), r.turns[first:]...)
	r.mu.Unlock()
	// Wait for a poll at or after the window's end.
	r.waitPoll(ctx, w.To)
	r.mu.Lock()
	st := Measure(turns, r.polls, w)
	r.mu.Unlock()
	st.Mode, st.Sessions = mode, n
	st.Policy = "external"
	if r.cfg.Policy != nil {
		st.Policy = r.cfg.Policy(mode)
	}
	if r.cfg.Progress != nil {
		lead, hits := "", fhit(st)
		if !st.PrefixHitUnknown {
			hits += "%"
		}
		if r.cfg.LiveProgress {
			lead = "\r"
		}
		fmt.Fprintf(r.cfg.Progress, "%s%-22s done: %d requests, %d errors (%d before the first token), %s tok/min, TTFB p50 %ss p95 %ss, prefix hits %s, stayed %s%%\n",
			lead, label, st.Requests, st.Errors, st.ErrorsBeforeFirstToken, fnum(st.OutputTokensPerMin, 0), fsec(st.TTFBP50S), fsec(st.TTFBP95S), hits, fnum(st.StayedPct, 1))
	}
	return st
}

// client is one closed-loop session slot: it runs sessions back to back
// (or each at the next wave, Workload.Waves, counted from stageStart)
// until ctx ends, the first one from turn start, and returns the ID of the
// session it was running then, "" when none of that session's requests was
// answered (it was never bound).
func (r *httpRun) client(ctx context.Context, stageStart time.Duration, start int) (last string) {
	for first := true; ctx.Err() == nil; first = false {
		if at := stageStart + r.cfg.Workload.NextStart(r.engineNow()-stageStart); !first && at > r.engineNow() {
			// sessions start in waves: wait for the next one
			select {
			case <-ctx.Done():
				return last
			case <-time.After(r.wall(at - r.engineNow())):
			}
		}
		r.genMu.Lock()
		sess := r.gen.NextAt(start)
		r.genMu.Unlock()
		last = ""
		for t := start; t < sess.Turns(); t++ {
			if t > start && sess.Think[t] > 0 {
				select {
				case <-ctx.Done():
					return last
				case <-time.After(r.wall(sess.Think[t])):
				}
			}
			res, err := r.cfg.Client.Send(ctx, sess, t)
			if res.Route != "" || res.Replica != "" {
				last = sess.ID // answered: routed, so bound
			}
			rec := TurnRecord{Session: sess.Serial, Turn: t, LastTurn: t == sess.Turns()-1, Replica: res.Replica, Output: res.OutputTokens}
			if !res.Sent.IsZero() {
				rec.Start = r.engineAt(res.Sent)
			} else {
				rec.Start = r.engineNow()
			}
			if !res.FirstToken.IsZero() {
				rec.FirstToken = r.engineAt(res.FirstToken)
			}
			if res.Expect > 0 {
				rec.Expect = time.Duration(float64(res.Expect) * r.cfg.Speed)
			}
			if res.Waited > 0 && !res.Sent.IsZero() {
				rec.Routed = r.engineAt(res.Sent.Add(res.Waited))
			}
			rec.End = r.engineNow()
			switch {
			case ctx.Err() != nil:
				rec.Aborted = true
			case err != nil:
				rec.Err = true
			}
			r.mu.Lock()
			r.turns = append(r.turns, rec)
			r.mu.Unlock()
			if rec.Aborted {
				return last
			}
			if rec.Err {
				// Give up on the session; a new one takes its place.
				select {
				case <-ctx.Done():
					return last
				case <-time.After(100 * time.Millisecond):
				}
				break
			}
			sess.Answer(res.Text)
		}
		start = 0
	}
	return last
}

func (r *httpRun) progress(label string, start time.Duration, w Window, first int) {
	if r.cfg.Progress == nil {
		return
	}
	if !r.cfg.LiveProgress {
		if now := time.Now(); now.Sub(r.lastPlain) >= PlainProgressEvery {
			r.lastPlain = now
		} else {
			return
		}
	}
	now := r.engineNow()
	r.mu.Lock()
	var reqs, errs int
	var ttfb []float64
	for _, t := range r.turns[first:] {
		if t.Aborted {
			continue
		}
		reqs++
		if t.Err {
			errs++
		} else if t.FirstToken > 0 {
			ttfb = append(ttfb, (t.FirstToken - t.Start).Seconds())
		}
	}
	r.mu.Unlock()
	sort.Float64s(ttfb)
	phase := "measuring"
	if now < w.From {
		phase = "warm-up"
	}
	lead, end := "\r", " "
	if !r.cfg.LiveProgress {
		lead, end = "", "\n"
	}
	fmt.Fprintf(r.cfg.Progress, "%s%-22s %-9s %4.0fs/%.0fs  requests %d  errors %d  TTFB p50 %ss%s",
		lead, label, phase, (now - start).Seconds(), (w.To - start).Seconds(), reqs, errs, fsec(Percentile(ttfb, 0.5)), end)
}

func (r *httpRun) pollLoop(ctx context.Context) {
	tick := time.NewTicker(r.wall(r.cfg.PollInterval))
	defer tick.Stop()
	for {
		p := r.pollOnce(ctx)
		r.mu.Lock()
		r.polls = append(r.polls, p)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// pollOnce reads every metrics URL; a replica that fails is left out.
func (r *httpRun) pollOnce(ctx context.Context) Poll {
	p := Poll{Replicas: map[string]ReplicaCounters{}}
	for _, u := range r.cfg.Metrics {
		ms, err := fetchMetrics(ctx, r.hc, u)
		if err != nil {
			continue
		}
		for eng, m := range ms {
			id := u
			if len(ms) > 1 {
				id = u + "#" + eng
			}
			p.Replicas[id] = ReplicaCounters{Running: m.Running, Hits: m.PrefixHits, Queries: m.PrefixQueries,
				PrefixUnknown: !m.Present.Has(vllmstats.FigPrefix)}
		}
	}
	p.At = r.engineNow()
	return p
}

func fetchMetrics(ctx context.Context, hc *http.Client, url string) (map[string]*vllmstats.EngineMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("polling %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("polling %s: status %d", url, resp.StatusCode)
	}
	ms, err := vllmstats.ParseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("polling %s: %w", url, err)
	}
	return ms, nil
}

// waitPoll waits (bounded) until a poll at or after t has been recorded.
func (r *httpRun) waitPoll(ctx context.Context, t time.Duration) {
	if len(r.cfg.Metrics) == 0 {
		return
	}
	deadline := time.Now().Add(r.wall(3*r.cfg.PollInterval) + 5*time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		r.mu.Lock()
		ok := len(r.polls) > 0 && r.polls[len(r.polls)-1].At >= t
		r.mu.Unlock()
		if ok {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drain waits until no replica runs or queues a request, so stages do not
// overlap; bounded by cfg.Drain.
func (r *httpRun) drain(ctx context.Context) {
	if len(r.cfg.Metrics) == 0 {
		return
	}
	deadline := time.Now().Add(r.cfg.Drain)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		busy := false
		for _, u := range r.cfg.Metrics {
			ms, err := fetchMetrics(ctx, r.hc, u)
			if err != nil {
				continue
			}
			for _, m := range ms {
				if m.Running+m.Waiting > 0 {
					busy = true
				}
			}
		}
		if !busy {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
