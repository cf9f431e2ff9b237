package emulator

import (
	"sync"
	"time"
)

// runner drives one Engine on the wall clock: engine time t is wall time
// start + t/speed. One goroutine per engine steps it, sleeps until the
// step's end, then hands the step's tokens to the waiting handlers.
type runner struct {
	index int    // engine index in the server (replica index or DP rank)
	label string // the engine label in /metrics
	speed float64

	mu      sync.Mutex
	eng     *Engine
	start   time.Time
	created float64
	ttft    histogram
	e2e     histogram
	aborted uint64
	pending []delivery

	wake chan struct{}
	quit chan struct{}
	done chan struct{}
}

type delivery struct {
	st     *stream
	kind   EventKind
	token  uint32
	cached int
}

// stream is what a handler waits on for one request.
type stream struct {
	mu       sync.Mutex
	toks     []uint32
	cached   int
	finished bool
	failed   bool
	refused  bool // failed: the engine refused it (EventRefused)
	notify   chan struct{}
}

func newStream() *stream { return &stream{notify: make(chan struct{}, 1)} }

func (s *stream) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// snapshot returns the tokens so far and the state.
func (s *stream) snapshot() (toks []uint32, cached int, finished, failed, refused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.toks, s.cached, s.finished, s.failed, s.refused
}

func newRunner(index int, label string, cfg EngineConfig, speed float64) *runner {
	r := &runner{index: index, label: label, speed: speed, eng: NewEngine(cfg)}
	r.reset()
	return r
}

// reset empties the engine and its metrics (a restart). Callers hold mu
// or own the runner exclusively.
func (r *runner) reset() {
	r.failAll()
	r.eng.Reset()
	r.start = time.Now()
	r.created = float64(r.start.UnixNano()) / 1e9
	r.ttft = newHistogram(ttftBuckets)
	r.e2e = newHistogram(e2eBuckets)
	r.aborted = 0
	r.eng.now = 0
}

// failAll ends every request in the engine with an error.
func (r *runner) failAll() {
	for _, list := range [][]*EngineRequest{r.eng.running, r.eng.waiting} {
		for _, req := range list {
			if st, ok := req.Data.(*stream); ok {
				st.mu.Lock()
				st.failed = true
				st.mu.Unlock()
				st.signal()
			}
		}
	}
}

func (r *runner) startLoop() {
	r.wake = make(chan struct{}, 1)
	r.quit = make(chan struct{})
	r.done = make(chan struct{})
	go r.loop(r.wake, r.quit, r.done)
}

func (r *runner) stopLoop() {
	if r.quit == nil {
		return
	}
	close(r.quit)
	<-r.done
	r.quit = nil
}

func (r *runner) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// engineNowWall is the engine time that corresponds to the wall clock now.
func (r *runner) engineNowWall() time.Duration {
	return time.Duration(float64(time.Since(r.start)) * r.speed)
}

func (r *runner) loop(wake, quit, done chan struct{}) {
	defer close(done)
	var out []delivery
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		r.mu.Lock()
		if r.eng.Idle() {
			r.mu.Unlock()
			// Add moved the engine clock up to the wall clock already.
			select {
			case <-wake:
			case <-quit:
				return
			}
			continue
		}
		_, events := r.eng.Step()
		out = out[:0]
		for _, ev := range events {
			st, _ := ev.Req.Data.(*stream)
			if st == nil {
				continue
			}
			switch ev.Kind {
			case EventToken:
				if ev.Index == 0 {
					r.ttft.observe((ev.Req.FirstToken - ev.Req.Arrival).Seconds())
				}
			case EventFinished:
				r.e2e.observe((ev.Req.Finished - ev.Req.Arrival).Seconds())
			case EventRefused:
			default:
				continue
			}
			out = append(out, delivery{st: st, kind: ev.Kind, token: ev.Token, cached: ev.Req.CachedTokens})
		}
		wallEnd := r.start.Add(time.Duration(float64(r.eng.Now()) / r.speed))
		r.mu.Unlock()

		if d := time.Until(wallEnd); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-quit:
				timer.Stop()
				return
			}
		}
		for _, d := range out {
			d.st.mu.Lock()
			switch d.kind {
			case EventToken:
				d.st.toks = append(d.st.toks, d.token)
				d.st.cached = d.cached
			case EventFinished:
				d.st.finished = true
			case EventRefused:
				d.st.failed, d.st.refused = true, true
			}
			d.st.mu.Unlock()
			d.st.signal()
		}
	}
}

// load is vLLM's data-parallel balancing score.
func (r *runner) load() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return DPScore(r.eng.Waiting(), r.eng.Running())
}

// DPScore is vLLM's data-parallel balancing score: a request goes to the
// engine with the lowest waiting×4 + running.
func DPScore(waiting, running int) int { return waiting*4 + running }

func (r *runner) sample() engineSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	cfg := r.eng.Config()
	s := engineSample{
		engine:    r.label,
		stats:     r.eng.Stats(),
		running:   r.eng.Running(),
		waiting:   r.eng.Waiting(),
		kvUsage:   r.eng.KVUsage(),
		aborted:   r.aborted,
		created:   r.created,
		blockSize: cfg.BlockSize,
		numBlocks: cfg.NumGPUBlocks,
	}
	s.ttft = r.ttft
	s.ttft.counts = append([]uint64(nil), r.ttft.counts...)
	s.e2e = r.e2e
	s.e2e.counts = append([]uint64(nil), r.e2e.counts...)
	return s
}
