package peers

import (
	"slices"
	"time"
)

// Dynamo's ThunderAgent program scheduler (ai-dynamo/dynamo,
// docs/agents/thunderagent-router.md, experimental; after the ThunderAgent
// paper, arXiv 2602.13692) on top of the KV router (Dynamo above), with
// its defaults:
//
//   - A program is a conversation (its trajectory: the session key here).
//     Its first turn is placed by the KV router's cost and pins the
//     program to that worker. A program is REASONING while a turn is in
//     flight and ACTING between turns (at a tool boundary); its tokens
//     are its last turn's prompt (the working set it keeps resident).
//   - A worker's utilisation is the tokens of its unpaused programs over
//     its KV pool.
//   - Every scheduler tick (--scheduler-interval-seconds, 5 s): first
//     resume, then pause. Resume runs only on a worker at least
//     --resume-hysteresis (0.10) below --pause-threshold (0.95) and takes
//     paused programs smallest first while each fits under the pause
//     threshold (on its own worker when it fits there, else on the worker
//     it fits best, best-fit); a program paused for
//     --resume-timeout-seconds (1,800 s) is resumed whatever the room.
//     Pause runs on a worker at or above 0.95: its smallest ACTING
//     programs first until it is down to --pause-target (0.80); when no
//     ACTING program is left, the smallest REASONING one is marked and
//     paused at its next tool boundary.
//   - A turn of a paused program waits at the router until a tick resumes
//     it (Pick returns nil). There is no decode preemption.
//
// The soft-demote band only reorders Dynamo's own request queue, which
// this router does not run (the engines queue): it is left out.
const (
	ThunderPauseThreshold = 0.95
	ThunderPauseTarget    = 0.80
	ThunderHysteresis     = 0.10
	ThunderTick           = 5 * time.Second
	ThunderResumeTimeout  = 1800 * time.Second
	// ThunderIdleExpiry drops a program's bookkeeping after this long
	// without a turn (the doc asks for an idle expiry without naming one).
	ThunderIdleExpiry = 10 * time.Minute
)

// Thunder is the ThunderAgent program scheduler.
type Thunder struct {
	kv       *Dynamo
	capacity float64 // KV pool per worker, tokens
	programs map[string]*program
	lastTick time.Time
	// Paused counts the pauses, Resumed the resumes.
	Paused, Resumed int
}

type program struct {
	key      string
	worker   int
	tokens   int
	inFlight int
	paused   bool
	mark     bool // pause at the next tool boundary
	since    time.Time
	last     time.Time
}

// NewThunder returns the scheduler for c's replicas.
func NewThunder(c Config) *Thunder {
	return &Thunder{kv: NewDynamo(c), capacity: float64(c.BlockSize * c.NumGPUBlocks), programs: map[string]*program{}}
}

func (p *Thunder) Name() string { return ModeThunder }

// Pick implements Policy: nil while the request's program is paused.
func (p *Thunder) Pick(r Request) *Flight {
	p.tick(r.Now)
	if r.Key == "" {
		return p.kv.Pick(r)
	}
	pr, ok := p.programs[r.Key]
	if ok && pr.paused {
		return nil
	}
	var f *Flight
	if ok {
		f = p.kv.pin(r, pr.worker)
	} else {
		f = p.kv.Pick(Request{Tokens: r.Tokens, Now: r.Now}) // the KV router's cost places a new program
		pr = &program{key: r.Key, worker: f.Replica}
		p.programs[r.Key] = pr
	}
	f.key = r.Key
	pr.tokens, pr.last = len(r.Tokens), r.Now
	pr.inFlight++
	return f
}

// Done implements Policy: the program reaches a tool boundary.
func (p *Thunder) Done(f *Flight, now time.Time) {
	if f == nil || f.finished {
		return
	}
	p.kv.Done(f, now)
	if pr, ok := p.programs[f.key]; ok {
		pr.inFlight--
		if pr.mark && pr.inFlight == 0 {
			pr.mark, pr.paused, pr.since = false, true, now
			p.Paused++
		}
	}
}

func (p *Thunder) FirstToken(f *Flight, now time.Time) { p.kv.FirstToken(f, now) }

// Poll implements Policy: the scheduler ticks on the clock.
func (p *Thunder) Poll(_ []Load, now time.Time) { p.tick(now) }

// EndSession implements Policy: the program is over.
func (p *Thunder) EndSession(key string, _ time.Time) { delete(p.programs, key) }

// Utilisation returns each worker's unpaused working set over its pool.
func (p *Thunder) Utilisation() []float64 {
	u := make([]float64, len(p.kv.cache))
	for _, pr := range p.programs {
		if !pr.paused {
			u[pr.worker] += float64(pr.tokens)
		}
	}
	for i := range u {
		u[i] /= p.capacity
	}
	return u
}

// IsPaused tells whether the program is paused.
func (p *Thunder) IsPaused(key string) bool {
	pr, ok := p.programs[key]
	return ok && pr.paused
}

func (p *Thunder) tick(now time.Time) {
	if p.lastTick.IsZero() {
		p.lastTick = now
	}
	if now.Sub(p.lastTick) < ThunderTick {
		return
	}
	p.lastTick = now
	for k, pr := range p.programs {
		if pr.inFlight == 0 && !pr.paused && now.Sub(pr.last) > ThunderIdleExpiry {
			delete(p.programs, k)
		}
	}
	p.resume(now)
	p.pause(now)
}

func (p *Thunder) sorted(keep func(*program) bool) []*program {
	var out []*program
	for _, pr := range p.programs {
		if keep(pr) {
			out = append(out, pr)
		}
	}
	slices.SortFunc(out, func(a, b *program) int {
		if a.tokens != b.tokens {
			return a.tokens - b.tokens
		}
		if a.key < b.key {
			return -1
		}
		return 1
	})
	return out
}

func (p *Thunder) resume(now time.Time) {
	u := p.Utilisation()
	for _, pr := range p.sorted(func(pr *program) bool { return pr.paused }) {
		need := float64(pr.tokens) / p.capacity
		if now.Sub(pr.since) >= ThunderResumeTimeout {
			pr.paused = false
			u[pr.worker] += need
			p.Resumed++
			continue
		}
		fits := func(i int) bool {
			return u[i] <= ThunderPauseThreshold-ThunderHysteresis && u[i]+need < ThunderPauseThreshold
		}
		w := -1
		if fits(pr.worker) {
			w = pr.worker
		} else {
			for i := range u {
				if fits(i) && (w < 0 || u[i] > u[w]) { // best fit: the least room left
					w = i
				}
			}
		}
		if w < 0 {
			continue
		}
		pr.paused, pr.worker = false, w
		u[w] += need
		p.Resumed++
	}
}

func (p *Thunder) pause(now time.Time) {
	u := p.Utilisation()
	for w := range u {
		if u[w] < ThunderPauseThreshold {
			continue
		}
		on := func(pr *program) bool { return pr.worker == w && !pr.paused && !pr.mark }
		for _, pr := range p.sorted(func(pr *program) bool { return on(pr) && pr.inFlight == 0 }) {
			if u[w] <= ThunderPauseTarget {
				break
			}
			pr.paused, pr.since = true, now
			u[w] -= float64(pr.tokens) / p.capacity
			p.Paused++
		}
		if u[w] > ThunderPauseTarget {
			if rs := p.sorted(func(pr *program) bool { return on(pr) && pr.inFlight > 0 }); len(rs) > 0 {
				rs[0].mark = true
			}
		}
	}
}
