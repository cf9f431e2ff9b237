package bench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// SimConfig is one simulated run: the emulator's engine model on a virtual
// clock, the real placement router (or a model of one of Caddy's own
// policies) and the workload, with no HTTP in between.
type SimConfig struct {
	Workload Workload
	Engine   emulator.EngineConfig
	Replicas int
	// Stages are the numbers of concurrent sessions, run in order; each
	// runs once per mode, all on the same engines (caches are kept, as
	// when switching affinity without restarting vLLM).
	Stages []int
	Modes  []string
	// StageLength is the measured part of a stage; Warmup precedes it and
	// is excluded. Both in engine time.
	StageLength, Warmup time.Duration
	// PollInterval is how often the replicas' counters are read, both for
	// the report and as the router's polled load (default 1 s).
	PollInterval time.Duration
	// Placement configures LM Warden's router; AffinityOff is set per mode.
	Placement placement.Config
	// DPStatsInterval is the publishing period of vLLM's data-parallel
	// coordinator in the vllm-dp mode (default
	// emulator.DefaultDPStatsInterval). DPRotate makes that mode's balancer
	// rotate its tie-break after every pick, as vLLM does from PR 47420 on;
	// by default ties go to the lowest engine, as in the reference
	// measurement's release.
	DPStatsInterval time.Duration
	DPRotate        bool
	// DPAPIServers is the number of vLLM API server processes, each
	// balancing on its own (default: one per replica, as `vllm serve
	// --data-parallel-size N` starts); a request lands on one at random.
	DPAPIServers int
	// RestartAt, when positive, restarts replica RestartReplica this long
	// after every stage's start (warm-up included): its engine is reset
	// (queues, prefix cache and counters emptied, as a restarted vLLM).
	// Turns inside are lost and their clients send them again.
	RestartAt      time.Duration
	RestartReplica int
	// Progress, when set, is called after every stage.
	Progress func(Stage)
	// Detail, when set, is called after every stage with what happened
	// inside the engines during its measured window.
	Detail func(SimDetail)
	// Prompts is how the engines turn a conversation into tokens:
	// PromptsEmulator (the default) or PromptsWords.
	Prompts string
	// BytesPerToken, when positive, makes the router estimate a turn's
	// prompt from the bytes of its text, as the Caddy module estimates it
	// from the body's size, instead of being told the engine's count: at
	// the bytes per token learned from the turns finished so far
	// (placement.SizeRate), and at BytesPerToken before the first. The module uses the estimate only until the engine
	// reports the conversation's first turn, so only first turns differ;
	// it matters where the engine counts tokens unlike the bench's
	// workload (PromptsWords).
	BytesPerToken float64
}

// The ways of SimConfig.Prompts to turn a conversation into tokens.
const (
	// PromptsEmulator is the emulator's chat template and tokenizer
	// (emulator.RenderMessage, emulator.Tokenize).
	PromptsEmulator = ""
	// PromptsWords is llm-d-inference-sim's rendering and simple
	// tokenizer (emulator.WordMessage, emulator.AppendWordTokens): a
	// word is a token, and the same text is about 0.73 of the emulator's
	// tokens.
	PromptsWords = "words"
)

// simChat is how the engines see a conversation: a prompt is the
// history followed by ask; an answer enters the history as ask,
// answerHead, its tokens and answerEnd.
type simChat struct {
	appendText func(dst []uint32, text string) []uint32
	message    func(role, text string) string
	ask        []uint32
	answerHead []uint32
	answerEnd  []uint32
}

func newSimChat(prompts string) (simChat, error) {
	switch prompts {
	case PromptsEmulator:
		return simChat{appendText: emulator.AppendTokens, message: emulator.RenderMessage,
			ask: emulator.Tokenize(emulator.GenerationPrompt), answerEnd: emulator.Tokenize(emulator.TurnEnd)}, nil
	case PromptsWords:
		// the answer is the next message, and a message's closing
		// newline joins its last token
		return simChat{appendText: emulator.AppendWordTokens, message: emulator.WordMessage,
			answerHead: emulator.AppendWordTokens(nil, "### assistant: ")}, nil
	}
	return simChat{}, fmt.Errorf("sim: unknown prompts %q (%q or %q)", prompts, PromptsEmulator, PromptsWords)
}

// appendMessage appends one rendered message's tokens to dst.
func (c simChat) appendMessage(dst []uint32, role, text string) []uint32 {
	return c.appendText(dst, c.message(role, text))
}

// appendAnswer appends an answer, as tokens, to a history.
func (c simChat) appendAnswer(dst, answer []uint32) []uint32 {
	return append(append(append(append(dst, c.ask...), c.answerHead...), answer...), c.answerEnd...)
}

// DefaultSimConfig is the reference measurement's sweep: 4 replicas of the
// calibrated engine, stages 4–32, vLLM's balancer, LM Warden as shipped, affinity alone, 3-minute stages
// after a 30-second warm-up.
func DefaultSimConfig() SimConfig {
	return SimConfig{
		Workload:     DefaultWorkload(),
		Engine:       emulator.DefaultEngineConfig(),
		Replicas:     4,
		Stages:       []int{4, 8, 16, 24, 32},
		Modes:        []string{ModeVLLMDP, ModeDefault, ModeOn},
		StageLength:  3 * time.Minute,
		Warmup:       30 * time.Second,
		PollInterval: time.Second,
		Placement:    placement.Config{MaxNumSeqs: 32},
	}
}

// simEpoch is the wall-clock instant virtual time 0 maps to, for the
// router's idle and activity windows.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type simTurn struct {
	slot    *simSlot
	req     *emulator.EngineRequest
	rep     int
	release func(time.Time)
	// dec is the router's decision (zero, whose reports do nothing, for
	// a peer's turn): told Succeeded at the first token, as the Caddy
	// module does at the response's headers (llm-d-inference-sim sends a
	// stream's headers with it), and Failed when the engine refuses
	dec     placement.Decision
	histLen int // the slot's history before this turn's user message
	rec     TurnRecord
	flight  *peers.Flight // the turn in a peer policy's books
}

type simSlot struct {
	sendAt time.Duration // when the next turn is due (think time); -1 when none
	// waiting: its turn is queued for admission (the admit mode)
	waiting *simWait
	// held: its turn is held by a peer policy (a paused program)
	held  *simWait
	sess  *Session
	hist  []uint32 // prompt tokens of the turns so far, answers included
	cur   *simTurn
	start uint64 // fingerprint of the conversation's current start
	first string // the conversation's current first user message
	// compacted: the session already replaced its history by a summary
	compacted bool
	// renew: its session ended; at sendAt the next one starts (waves)
	renew bool
	// answered: the engines' output tokens in hist since its start
	answered int
	// textBytes and textAnswered: the bytes of the text and the answers'
	// tokens in the prompt of the turn last estimated (estimate)
	textBytes, textAnswered int
}

// simWait is a turn held at the router for admission.
type simWait struct {
	ticket  *placement.Ticket
	sent    time.Duration // when the client sent it
	histLen int
	prompt  []uint32
}

type simEngine struct {
	e        *emulator.Engine
	id       string
	stepping bool
	stepEnd  time.Duration
	pending  []emulator.Event
	inflight int // requests routed here and not finished (Caddy's count)
}

type simulator struct {
	cfg     SimConfig
	gen     *Generator
	chat    simChat
	sysTok  []uint32
	engines []*simEngine
	byID    map[string]int
	router  *placement.Router
	// sizes: the bytes per token learned from finished turns (estimate)
	sizes placement.SizeRate
	peer  peers.Policy // the peer router of a peer mode
	rng   *rand.Rand
	robin uint32
	dp    *emulator.DPBalancer
	now   time.Duration
	// stageStart is when the running stage began (waves count from it)
	stageStart time.Duration
	polls      []Poll
	turns      []TurnRecord
	mode       string
	stopped    bool
	win        Window
	detail     *simDetailAcc
	// parent: the parent conversation of the turn being routed (a
	// replayed trace's sub-agent), "" when none
	parent string
	// trace: the replay of a trace (trace.go), nil in a workload's stages
	trace    *traceReplay
	replayed []replayedTurn // the turns a replay sent, in the order they ended
	// idleHeld: replica-seconds in the window that an engine sat idle
	// (nothing running, nothing waiting) while a turn waited at the router
	idleHeld time.Duration
}

// Sim runs the configured sweep and returns its report. The same
// configuration gives the same report.
func Sim(cfg SimConfig) (*Report, error) {
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("sim: need at least one replica, got %d", cfg.Replicas)
	}
	if cfg.StageLength <= 0 {
		return nil, fmt.Errorf("sim: stage length must be positive")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.RestartAt > 0 && (cfg.RestartReplica < 0 || cfg.RestartReplica >= cfg.Replicas) {
		return nil, fmt.Errorf("sim: restart replica %d out of range [0, %d)", cfg.RestartReplica, cfg.Replicas)
	}
	if cfg.DPStatsInterval <= 0 {
		cfg.DPStatsInterval = emulator.DefaultDPStatsInterval
	}
	if err := cfg.Engine.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	for _, m := range cfg.Modes {
		if !validMode(m) {
			return nil, fmt.Errorf("sim: unknown mode %q", m)
		}
	}
	// Each mode runs on replicas of its own, from the same start: what one
	// mode leaves in the engines' caches and queues at the end of a stage
	// would otherwise start the next mode's stage, so a mode's figures
	// would change with the modes listed before it (and with every change
	// to how those route).
	rep := simReport(cfg)
	byMode := make([][]Stage, len(cfg.Modes))
	for i, m := range cfg.Modes {
		one := cfg
		one.Modes = []string{m}
		r, err := simulate(one)
		if err != nil {
			if r != nil {
				rep.Stages = append(rep.Stages, r.Stages...)
			}
			return rep, err
		}
		byMode[i] = r.Stages
	}
	for j := range cfg.Stages {
		for i := range cfg.Modes {
			rep.Stages = append(rep.Stages, byMode[i][j])
		}
	}
	return rep, nil
}

// simReport is the empty report of a simulated sweep of cfg.
func simReport(cfg SimConfig) *Report { return &Report{Kind: "sim", Workload: cfg.Workload} }

// simulate runs cfg's stages, and in each every mode in turn, on one set of
// replicas.
func simulate(cfg SimConfig) (*Report, error) {
	s, err := newSimulator(cfg)
	if err != nil {
		return nil, err
	}
	rep := simReport(cfg)
	for _, n := range cfg.Stages {
		for _, m := range cfg.Modes {
			st, err := s.stage(m, n)
			if err != nil {
				return rep, err
			}
			rep.Stages = append(rep.Stages, st)
			if cfg.Progress != nil {
				cfg.Progress(st)
			}
		}
	}
	return rep, nil
}

// newSimulator builds cfg's replicas (fresh engines, the router knowing
// them all available) and polls them once.
func newSimulator(cfg SimConfig) (*simulator, error) {
	gen, err := NewGenerator(cfg.Workload, emulator.CountTokens)
	if err != nil {
		return nil, err
	}
	chat, err := newSimChat(cfg.Prompts)
	if err != nil {
		return nil, err
	}
	s := &simulator{
		cfg:    cfg,
		gen:    gen,
		chat:   chat,
		sysTok: chat.appendMessage(nil, "system", gen.System()),
		byID:   map[string]int{},
		rng:    rand.New(rand.NewPCG(cfg.Workload.Seed, 0xca11ab1e)),
	}
	ids := make([]string, cfg.Replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("replica-%d", i)
		s.byID[ids[i]] = i
		s.engines = append(s.engines, &simEngine{e: emulator.NewEngine(cfg.Engine), id: ids[i]})
	}
	pc := cfg.Placement
	if pc.MaxNumSeqs == 0 {
		pc.MaxNumSeqs = cfg.Engine.MaxNumSeqs
	}
	if cfg.DPAPIServers <= 0 {
		cfg.DPAPIServers = cfg.Replicas
	}
	s.cfg.DPAPIServers = cfg.DPAPIServers
	s.dp = emulator.NewDPBalancerClients(cfg.Replicas, cfg.DPAPIServers)
	s.dp.Rotate = cfg.DPRotate
	pc.AdmissionOff = true // on in the admit mode only
	s.router = placement.NewRouter(pc)
	s.router.SetReplicas(ids)
	for _, id := range ids {
		s.router.SetAvailable(id, true)
	}
	s.poll()
	return s, nil
}

func validMode(m string) bool {
	for _, x := range CompareModes {
		if m == x {
			return true
		}
	}
	return peers.Is(m)
}

// setMode readies the simulator's routing for mode, in a workload's
// stages and a trace's replay alike: LM Warden's router configured for an
// LM Warden mode; for a peer mode its policy, made once per simulator
// (stages of the same mode keep its books, as the router process would)
// and given the replicas' load at once.
func (s *simulator) setMode(mode string) error {
	if !validMode(mode) {
		return fmt.Errorf("sim: unknown mode %q", mode)
	}
	s.mode = mode
	if PolicyOf(mode) == "lm_warden" {
		c := s.router.Config()
		c.AffinityOff = mode == ModeOff
		c.AdmissionOff = !Admits(mode)
		s.router.Reconfigure(c)
	}
	if !peers.Is(mode) {
		s.peer = nil // routed by route()
		return nil
	}
	if s.peer == nil || s.peer.Name() != mode {
		p, err := peers.New(mode, s.peerConfig())
		if err != nil {
			return err
		}
		s.peer = p
		s.pollPeer()
	}
	return nil
}

func (s *simulator) stage(mode string, n int) (Stage, error) {
	if err := s.setMode(mode); err != nil {
		return Stage{}, err
	}
	first := len(s.turns)
	start := s.now
	s.stageStart = start
	w := Window{From: start + s.cfg.Warmup, To: start + s.cfg.Warmup + s.cfg.StageLength}
	s.win = w
	s.idleHeld = 0
	s.detailStart(mode, n)
	slots := make([]*simSlot, n)
	s.stopped = false
	for i := range slots {
		slots[i] = &simSlot{sendAt: -1}
		s.newSession(slots[i], s.cfg.Workload.FirstTurn(i, n))
	}
	nextPoll := s.lastPoll() + s.cfg.PollInterval
	// vLLM's coordinator publishes the engines' counts on its own period;
	// the vllm-dp balancer decides on the last publication.
	nextPublish := s.now
	restartAt := time.Duration(-1)
	if s.cfg.RestartAt > 0 {
		restartAt = start + s.cfg.RestartAt
	}
	for {
		if restartAt >= 0 && restartAt <= s.now {
			restartAt = -1
			s.restart(s.cfg.RestartReplica, slots)
		}
		if mode == ModeVLLMDP && nextPublish <= s.now {
			s.dp.Publish(func(i int) (int, int) { return s.engines[i].e.Waiting(), s.engines[i].e.Running() })
			nextPublish = s.now + s.cfg.DPStatsInterval
		}
		s.kick()
		next, which := w.To, -1
		for i, e := range s.engines {
			if e.stepping && e.stepEnd < next {
				next, which = e.stepEnd, i
			}
		}
		due := -1
		for i, sl := range slots {
			if sl.sendAt >= 0 && sl.sendAt <= next && (due < 0 || sl.sendAt < slots[due].sendAt) {
				due = i
			}
		}
		if mode == ModeVLLMDP && nextPublish < next {
			next, which = nextPublish, -2
		}
		if restartAt >= 0 && restartAt < next {
			next, which = restartAt, -2
		}
		if due >= 0 && (which < 0 || slots[due].sendAt < next) {
			s.advanceTo(slots[due].sendAt, slots)
			slots[due].sendAt = -1
			if sl := slots[due]; sl.renew {
				sl.renew = false
				s.newSession(sl, 0)
			} else {
				s.send(sl)
			}
			s.admitted(slots)
			continue
		}
		if nextPoll < next || (nextPoll == next && which < 0) {
			s.advanceTo(nextPoll, slots)
			s.poll()
			if Admits(mode) {
				s.router.AdmitWaiting(simEpoch.Add(s.now))
				s.admitted(slots)
			}
			if s.peer != nil {
				s.retryHeld(slots)
			}
			s.detailPoll()
			nextPoll += s.cfg.PollInterval
			continue
		}
		s.advanceTo(next, slots)
		if which == -2 {
			continue // a publication of the coordinator, or the restart
		}
		if which < 0 {
			break
		}
		s.finishStep(which)
		s.admitted(slots)
	}
	// Stage end: the clients go away; their requests are aborted.
	s.stopped = true
	for _, sl := range slots {
		if wt := sl.waiting; wt != nil {
			// the client leaves the queue
			if !wt.ticket.Cancel() {
				if d, err := wt.ticket.Decision(); err == nil {
					d.Release()
				}
			}
			sl.waiting = nil
		}
		sl.held = nil // the client leaves the peer router's queue
		if t := sl.cur; t != nil {
			s.engines[t.rep].e.Abort(t.req)
			s.done(t)
			sl.cur = nil
		}
		// The sessions end with their clients: the next stage's users
		// are new, and the router is told so (as by X-Session-End), so
		// these do not count as active conversations there.
		s.router.End(sl.sess.ID, simEpoch.Add(s.now))
		if s.peer != nil {
			s.peer.EndSession(sl.sess.ID, simEpoch.Add(s.now))
		}
	}
	s.detailEnd()
	st := Measure(s.turns[first:], s.polls, w)
	st.Mode, st.Sessions = mode, n
	st.Policy = "sim:" + PolicyOf(mode)
	st.IdleWhileHeldS = s.idleHeld.Seconds()
	return st, nil
}

// PolicyOf names the router behind a mode in reports: lm_warden for affinity
// off and on, vllm_dp for vLLM's own balancer, else the Caddy policy.
func PolicyOf(mode string) string {
	if mode == ModeOff || mode == ModeOn || mode == ModeLifecycle || mode == ModeAdmit || mode == ModeDefault {
		return "lm_warden"
	}
	if mode == ModeVLLMDP {
		return "vllm_dp"
	}
	return mode
}

// advanceTo moves the clock to t, first counting the replica-seconds of
// [now, t) inside the window during which an engine had nothing to do
// while a turn waited at the router for admission.
func (s *simulator) advanceTo(t time.Duration, slots []*simSlot) {
	from, to := max(s.now, s.win.From), min(t, s.win.To)
	if to > from && slices.ContainsFunc(slots, func(sl *simSlot) bool { return sl.waiting != nil || sl.held != nil }) {
		for _, e := range s.engines {
			if !e.stepping && e.e.Running() == 0 && e.e.Waiting() == 0 {
				s.idleHeld += to - from
			}
		}
	}
	s.now = t
}

func (s *simulator) lastPoll() time.Duration {
	if len(s.polls) == 0 {
		return 0
	}
	return s.polls[len(s.polls)-1].At
}

// kick starts a step on every idle engine that has work.
func (s *simulator) kick() {
	for _, e := range s.engines {
		if e.stepping || e.e.Idle() {
			continue
		}
		e.e.AdvanceTo(s.now)
		d, evs := e.e.Step()
		e.pending = append(e.pending[:0], evs...)
		if d <= 0 {
			d = time.Millisecond
		}
		e.stepping, e.stepEnd = true, s.now+d
	}
}

func (s *simulator) finishStep(i int) {
	e := s.engines[i]
	e.stepping = false
	for _, ev := range e.pending {
		if tr, ok := ev.Req.Data.(*traceRun); ok {
			s.traceEvent(e, tr, ev) // a replayed trace's turn (trace.go)
			continue
		}
		t, ok := ev.Req.Data.(*simTurn)
		if !ok || ev.Req.Aborted || t.slot.cur != t {
			continue
		}
		switch ev.Kind {
		case emulator.EventToken:
			if ev.Index == 0 {
				t.rec.FirstToken = s.now
				t.dec.Succeeded()
				if t.flight != nil {
					s.peer.FirstToken(t.flight, simEpoch.Add(s.now))
				}
				s.detailTurn(t)
			}
		case emulator.EventRefused:
			// The engine refused the turn (llm-d-inference-sim's 500 for
			// a KV cache without room): the Caddy module reports the
			// failure to the router before it frees the turn's slot, and
			// the bench's client gives up on the session and starts a new
			// one 100 ms later (httpRun.client).
			t.rec.End, t.rec.Err = s.now, true
			t.dec.Failed(simEpoch.Add(s.now))
			s.done(t)
			sl := t.slot
			sl.cur = nil
			if !s.stopped {
				sl.sendAt, sl.renew = s.now+100*time.Millisecond, true
			}
		case emulator.EventFinished:
			t.rec.End = s.now
			t.rec.Output = len(t.req.Output)
			s.done(t)
			if PolicyOf(s.mode) == "lm_warden" {
				// What the Caddy module does with the usage and timing
				// of every finished turn, after it released the turn's
				// slot.
				routed := t.rec.Start
				if t.rec.Routed > 0 {
					routed = t.rec.Routed
				}
				s.router.Feedback(placement.Turn{Key: t.slot.sess.ID, Replica: e.id, Reason: t.dec.Reason,
					Prompt: len(t.req.Prompt), Cached: t.req.CachedTokens, Completion: len(t.req.Output),
					FirstToken: t.rec.FirstToken - routed, Duration: s.now - routed, Expect: t.rec.Expect})
				if s.cfg.BytesPerToken > 0 {
					sl := t.slot
					s.sizes.Observe(int64(sl.textBytes), int64(len(t.req.Prompt)-sl.textAnswered))
				}
			}
			sl := t.slot
			sl.cur = nil
			sl.hist = s.chat.appendAnswer(sl.hist, t.req.Output)
			sl.answered += len(t.req.Output)
			sl.sess.Answers = append(sl.sess.Answers, "")
			if s.stopped {
				continue
			}
			if sl.sess.Done() {
				if at := s.stageStart + s.cfg.Workload.NextStart(s.now-s.stageStart); at > s.now {
					sl.sendAt, sl.renew = at, true
				} else {
					s.newSession(sl, 0)
				}
			} else if think := sl.sess.Think[sl.sess.Turn()]; think > 0 {
				sl.sendAt = s.now + think
			} else {
				s.send(sl)
			}
		}
	}
	e.pending = e.pending[:0]
}

// done records the turn and releases its routing slot.
func (s *simulator) done(t *simTurn) {
	if t.rec.End == 0 {
		t.rec.End, t.rec.Aborted = s.now, true // the stage ended first
	}
	s.turns = append(s.turns, t.rec)
	t.release(simEpoch.Add(s.now))
	s.engines[t.rep].inflight--
}

// newSession starts the slot's next session at turn start (its earlier
// turns and answers already in the history).
func (s *simulator) newSession(sl *simSlot, start int) {
	sl.sess = s.gen.NextAt(start)
	sl.hist = append(sl.hist[:0], s.sysTok...)
	sl.answered = 0
	// the turns before start as the session's History has them: from its
	// summary when it started at or past its compaction (NextAt)
	msgs := sl.sess.History(sl.sess.Turn())
	sl.compacted = sl.sess.Compacted(sl.sess.Turn())
	sl.start = xxhash.Sum64String(msgs[0].Text)
	sl.first = msgs[0].Text
	for _, m := range msgs[:len(msgs)-1] {
		if m.Role == "user" {
			sl.hist = s.chat.appendMessage(sl.hist, "user", m.Text)
			continue
		}
		sl.hist = s.chat.appendAnswer(sl.hist, s.chat.appendText(nil, m.Text))
	}
	s.send(sl)
}

// send routes the slot's next turn and adds it to the chosen engine.
func (s *simulator) send(sl *simSlot) {
	sess := sl.sess
	turn := sess.Turn()
	if !sl.compacted && turn == s.cfg.Workload.CompactAfter && s.gen.Compacts(sess) {
		// The session compacts: the system prompt stays, the summary
		// becomes the first user message, the remaining turns follow it.
		sl.compacted = true
		sum := s.gen.Summary(sess)
		sl.start, sl.first = xxhash.Sum64String(sum), sum
		sl.hist = s.chat.appendMessage(append(sl.hist[:0], s.sysTok...), "user", sum)
		sl.answered = 0
	}
	histLen := len(sl.hist)
	sl.hist = s.chat.appendMessage(sl.hist, "user", sess.Messages[turn])
	prompt := append(append(make([]uint32, 0, len(sl.hist)+len(s.chat.ask)), sl.hist...), s.chat.ask...)
	if s.peer != nil {
		s.sendPeer(sl, &simWait{sent: s.now, histLen: histLen, prompt: prompt})
		return
	}
	rep, d, tk := s.route(sess.ID, sl.start, s.estimate(sl, len(prompt)))
	if tk != nil {
		sl.waiting = &simWait{ticket: tk, sent: s.now, histLen: histLen, prompt: prompt}
		return
	}
	s.dispatch(sl, prompt, histLen, s.now, rep, d, d.ReleaseAt)
}

// sendPeer routes the turn with the peer policy, or holds it there when
// the policy does (a paused program).
func (s *simulator) sendPeer(sl *simSlot, wt *simWait) {
	f := s.peer.Pick(peers.Request{Key: sl.sess.ID, Tokens: wt.prompt, FirstUser: sl.first, Now: simEpoch.Add(s.now)})
	if f == nil {
		sl.held = wt
		return
	}
	sl.held = nil
	release := func(at time.Time) { s.peer.Done(f, at) }
	s.dispatch(sl, wt.prompt, wt.histLen, wt.sent, f.Replica, placement.Decision{}, release)
	if sl.cur != nil {
		sl.cur.flight = f
	}
}

// retryHeld asks the peer policy again for the turns it holds, in slot
// order.
func (s *simulator) retryHeld(slots []*simSlot) {
	for _, sl := range slots {
		if sl.held != nil {
			s.sendPeer(sl, sl.held)
		}
	}
}

// admitted sends the turns the router admitted since the last event, in
// the order they queued.
func (s *simulator) admitted(slots []*simSlot) {
	for _, sl := range slots {
		wt := sl.waiting
		if wt == nil {
			continue
		}
		select {
		case <-wt.ticket.Ready():
		default:
			continue
		}
		sl.waiting = nil
		d, err := wt.ticket.Decision()
		if err != nil {
			panic(fmt.Sprintf("sim: router has no replica: %v", err))
		}
		s.dispatch(sl, wt.prompt, wt.histLen, wt.sent, s.byID[d.Replica], d, d.ReleaseAt)
	}
}

// dispatch adds the slot's turn, sent by the client at sent, to engine rep
// (d: the router's decision, zero from a peer; release frees its slot).
func (s *simulator) dispatch(sl *simSlot, prompt []uint32, histLen int, sent time.Duration, rep int, d placement.Decision, release func(time.Time)) {
	sess := sl.sess
	turn := sess.Turn()
	t := &simTurn{slot: sl, rep: rep, release: release, dec: d, histLen: histLen}
	t.rec = TurnRecord{Session: sess.Serial, Turn: turn, LastTurn: turn == sess.Turns()-1, Start: sent, Replica: s.engines[rep].id, Expect: d.Expect}
	if sent != s.now {
		t.rec.Routed = s.now
	}
	t.req = &emulator.EngineRequest{ID: fmt.Sprintf("%s-%d", sess.ID, turn), Prompt: prompt, MaxTokens: sess.OutputTokens, Data: t}
	s.engines[rep].inflight++
	e := s.engines[rep].e
	e.AdvanceTo(s.now) // a no-op while the engine is inside a step
	if err := e.Add(t.req); err != nil {
		// The engine refused the turn (too long): an error, and the
		// session is replaced.
		t.rec.End, t.rec.Err = s.now, true
		s.turns = append(s.turns, t.rec)
		release(simEpoch.Add(s.now))
		s.engines[rep].inflight--
		if !s.stopped {
			s.newSession(sl, 0)
		}
		return
	}
	sl.cur = t
}

// estimate is the prompt size the router is told for the slot's next
// turn: the engine's count, or under BytesPerToken the bytes of the
// turn's text over the bytes per token learned from the turns finished so
// far (BytesPerToken before any), as the Caddy module sizes a request
// (placement.SizeRate); the engines' answers are counted at their tokens.
// It keeps the text's bytes and the answers' tokens on the slot, for the
// observation when the turn ends.
func (s *simulator) estimate(sl *simSlot, tokens int) int {
	if s.cfg.BytesPerToken <= 0 {
		return tokens
	}
	msgs := sl.sess.History(sl.sess.Turn())
	n := len(sl.sess.System)
	if sl.compacted && !sl.sess.Compacted(sl.sess.Turn()) {
		// compacted here: the summary and the turns since
		msgs = msgs[2*s.cfg.Workload.CompactAfter:]
		n += len(s.gen.Summary(sl.sess))
	}
	for _, m := range msgs {
		n += len(m.Text)
	}
	sl.textBytes, sl.textAnswered = n, sl.answered
	return int(float64(n)/s.sizes.Rate(s.cfg.BytesPerToken)) + sl.answered
}

// route picks the replica for one turn under the current mode, or, in the
// admit mode, returns the ticket of a new conversation that waits for room.
func (s *simulator) route(key string, start uint64, tokens int) (int, placement.Decision, *placement.Ticket) {
	switch s.mode {
	case ModeVLLMDP:
		return s.dp.PickBy(s.rng.IntN(s.dp.Clients())), placement.Decision{}, nil
	case ModeLeastConn:
		best, n := -1, 0
		for i, e := range s.engines {
			switch {
			case best < 0 || e.inflight < s.engines[best].inflight:
				best, n = i, 1
			case e.inflight == s.engines[best].inflight:
				n++
				if s.rng.IntN(n) == 0 { // uniform among ties, as Caddy does
					best = i
				}
			}
		}
		return best, placement.Decision{}, nil
	case ModeRoundRobin:
		s.robin++
		return int(s.robin % uint32(len(s.engines))), placement.Decision{}, nil
	case ModeHeader:
		best, hi := 0, uint64(0)
		for i, e := range s.engines {
			if h := xxhash.Sum64String(e.id + key); h > hi {
				best, hi = i, h
			}
		}
		return best, placement.Decision{}, nil
	}
	if PolicyOf(s.mode) != "lm_warden" {
		// a mode route does not know (a peer's goes through its policy):
		// never answered with LM Warden's pick under its name
		panic(fmt.Sprintf("sim: route has no policy for mode %q", s.mode))
	}
	if !ChecksLifecycle(s.mode) {
		start = 0 // LM Warden without the lifecycle checks
	}
	// Admit routes as Route does unless admission is on (the admit mode)
	d, tk, err := s.router.Admit(placement.Request{Key: key, Parent: s.parent, Start: start, Tokens: tokens, Now: simEpoch.Add(s.now)})
	switch {
	case err != nil:
		// every replica is always available here, and the queue limit
		// is above any stage's sessions
		panic(fmt.Sprintf("sim: the router refused a turn: %v", err))
	case tk != nil:
		return 0, placement.Decision{}, tk
	}
	return s.byID[d.Replica], d, nil
}

// restart resets replica i's engine, as a vLLM restart: its queues, prefix
// cache and counters are emptied. The turns it was serving are lost (an
// error for their clients, recorded as such) and sent again at once.
func (s *simulator) restart(i int, slots []*simSlot) {
	s.engines[i].e.Reset()
	for _, sl := range slots {
		t := sl.cur
		if t == nil || t.rep != i {
			continue
		}
		t.rec.End, t.rec.Err = s.now, true
		s.done(t)
		sl.cur = nil
		sl.hist = sl.hist[:t.histLen]
		if !s.stopped {
			s.send(sl)
		}
	}
}

// poll reads every engine's counters, records them and feeds the router.
func (s *simulator) poll() {
	p := Poll{At: s.now, Replicas: make(map[string]ReplicaCounters, len(s.engines))}
	var last *Poll
	if len(s.polls) > 0 {
		last = &s.polls[len(s.polls)-1]
	}
	for _, e := range s.engines {
		st := e.e.Stats()
		if last != nil && ChecksLifecycle(s.mode) && float64(st.PrefixQueries) < last.Replicas[e.id].Queries {
			// The counters went back: the replica restarted, as the
			// poller sees it; its bindings are cold.
			s.router.ColdReplicaSince(e.id, simEpoch.Add(last.At))
		}
		p.Replicas[e.id] = ReplicaCounters{Running: float64(e.e.Running()), Hits: float64(st.PrefixHits), Queries: float64(st.PrefixQueries)}
		s.router.UpdateLoad(e.id, placement.Load{Running: e.e.Running(), Waiting: e.e.Waiting(), KVUsage: e.e.KVUsage(), Reachable: true, Seen: simEpoch.Add(s.now),
			KVTokens: s.cfg.Engine.NumGPUBlocks * s.cfg.Engine.BlockSize})
	}
	s.polls = append(s.polls, p)
	s.pollPeer()
}

// pollPeer gives a peer policy the replicas' polled queue and KV usage.
func (s *simulator) pollPeer() {
	if s.peer == nil {
		return
	}
	loads := make([]peers.Load, len(s.engines))
	for i, e := range s.engines {
		loads[i] = peers.Load{Waiting: e.e.Waiting(), Running: e.e.Running(), KVUsage: e.e.KVUsage()}
	}
	s.peer.Poll(loads, simEpoch.Add(s.now))
}

// peerConfig sizes a peer policy to the simulated replicas.
func (s *simulator) peerConfig() peers.Config {
	names := make([]string, len(s.engines))
	for i, e := range s.engines {
		names[i] = e.id
	}
	return peers.Config{Replicas: names, BlockSize: s.cfg.Engine.BlockSize, NumGPUBlocks: s.cfg.Engine.NumGPUBlocks,
		PrefillTokensPerSecond: PrefillRate(s.cfg.Engine), Seed: s.cfg.Workload.Seed}
}

// PrefillRate is a replica's prefill throughput on one unloaded chunk of
// max_num_batched_tokens, the engine model's answer to how llm-d's
// peakPrefillThroughput is calibrated (tokens/s).
func PrefillRate(c emulator.EngineConfig) float64 {
	n := c.MaxNumBatchedTokens
	d := c.Timing.StepTime(n, float64(n)*float64(n+1)/2, 0)
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
