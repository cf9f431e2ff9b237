package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// Replaying a turn trace (the lm_warden handler's trace option, format in
// docs/trace.md) on the simulator's replicas, under every mode.
//
// Each mode replays the whole trace on fresh replicas, as Sim runs each
// mode. A turn keeps its conversation, its prompt and output sizes, the
// client's pause before it and its conversation's start time:
//
//   - a conversation's first turn is sent at its recorded start (from the
//     trace's first);
//   - a later turn that the trace shows starting after its conversation's
//     earlier turns ended (pause_ms ≥ 0) is sent pause_ms after they have
//     all ended in the replay: a slower router delays the conversation as
//     it would delay the person or the agent behind it;
//   - a turn that overlapped an earlier one (pause_ms < 0: a title request
//     beside the first turn) is sent as long after the previous turn's
//     replayed start as it was recorded after it.
//
// Prompts are built from sizes alone. A conversation's turn extends its
// conversation's last turn, prompt and output (the prefix), with new
// tokens up to its recorded prompt size; a prompt smaller than the prefix
// (the client trimmed its history) is the prefix's start. A side request
// is a line of its own: fresh tokens, a start of its own. A compacted turn
// continues the latest side request's line when it fits (Claude Code's
// first turn after /compact is a side request with the new start, the
// second one the restart), else starts afresh; the conversation then goes
// on from it. Every token is fresh unless TraceOptions.SharedTokens gives
// every line a common start (the system prompt and tools the client sends
// in every conversation), so two conversations share a cache only there.
//
// The trace's cached tokens are not used to build prompts: what is cached
// is what the replayed router's placement leaves in the replicas' caches.
// They are reported beside the replay (TraceSummary.HitPct) as the hit rate
// the recorded deployment had.

// TraceOptions tunes a replay.
type TraceOptions struct {
	// SharedTokens is the length of the start every conversation, side
	// request and compacted history shares (0: none; SharedAuto: the
	// trace's TraceSummary.SharedHint).
	SharedTokens int
	// Limit is the longest a mode's replay runs, engine time; turns not
	// done by then are cut off (aborted). Default: ten times the trace's
	// span plus an hour.
	Limit time.Duration
}

// SharedAuto as TraceOptions.SharedTokens takes the trace's SharedHint.
const SharedAuto = -1

// TraceSummary is what a trace recorded, for the report beside the
// replay.
type TraceSummary struct {
	Turns         int `json:"turns"`
	Conversations int `json:"conversations"`
	SubAgents     int `json:"sub_agents"` // conversations whose turns are a sub-agent's
	Side          int `json:"side"`
	Compacted     int `json:"compacted"`
	// SpanS is from the first turn's start to the last turn's end.
	SpanS        float64 `json:"span_s"`
	PromptTokens int64   `json:"prompt_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	// HitPct is the cached share of the prompt tokens of the turns that
	// reported their cached tokens (CachedTurns of them); -1 when none did.
	HitPct             float64 `json:"hit_pct"`
	CachedTurns        int     `json:"cached_turns"`
	OutputTokensPerMin float64 `json:"output_tokens_per_min"`
	// SharedHint is the median of the cached tokens recorded for the
	// turns that start a line of their own (conversations' first turns
	// after the trace's first, side requests): what such turns found of
	// a start they share with others, the system prompt and tools. 0 when
	// none reported.
	SharedHint int `json:"shared_hint"`
	// SharedUsed is the shared start the replay gave new lines
	// (TraceOptions.SharedTokens).
	SharedUsed int `json:"shared_used"`
}

// ReadTraceFiles reads and merges trace files (a file and its rotated
// FILE.1 may be given together), ordered by start.
func ReadTraceFiles(paths ...string) ([]turntrace.Turn, error) {
	var rs []io.Reader
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		// a file ends with a newline; one that does not would join its
		// last line to the next file's first
		rs = append(rs, f, strings.NewReader("\n"))
	}
	turns, err := turntrace.Read(io.MultiReader(rs...))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", strings.Join(paths, ", "), err)
	}
	if len(turns) == 0 {
		return nil, fmt.Errorf("%s: no turns", strings.Join(paths, ", "))
	}
	return turns, nil
}

// SummarizeTrace returns what the trace recorded.
func SummarizeTrace(turns []turntrace.Turn) TraceSummary {
	s := TraceSummary{Turns: len(turns), HitPct: -1}
	convs, agents := map[string]bool{}, map[string]bool{}
	var first, last time.Time
	var cached, cachedOf int64
	for i := range turns {
		t := &turns[i]
		convs[t.Conv] = true
		if t.Agent {
			agents[t.Conv] = true
		}
		s.Side += b2int(t.Side)
		s.Compacted += b2int(t.Compacted)
		s.PromptTokens += t.Prompt
		s.OutputTokens += t.Output
		if t.Cached != nil {
			s.CachedTurns++
			cached += *t.Cached
			cachedOf += t.Prompt
		}
		end := t.At.Add(time.Duration(t.DurMS) * time.Millisecond)
		if first.IsZero() || t.At.Before(first) {
			first = t.At
		}
		if end.After(last) {
			last = end
		}
	}
	var starts []int64
	for i := range turns {
		if t := &turns[i]; i > 0 && (t.First || t.Side) && t.Cached != nil {
			starts = append(starts, *t.Cached)
		}
	}
	if len(starts) > 0 {
		slices.Sort(starts)
		s.SharedHint = int(starts[len(starts)/2])
	}
	s.Conversations, s.SubAgents = len(convs), len(agents)
	s.SpanS = last.Sub(first).Seconds()
	if cachedOf > 0 {
		s.HitPct = 100 * float64(cached) / float64(cachedOf)
	}
	if s.SpanS > 0 {
		s.OutputTokensPerMin = float64(s.OutputTokens) / s.SpanS * 60
	}
	return s
}

func b2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SimTrace replays turns under each of cfg.Modes (none: AllModes, the
// peer routers' policies included) on cfg's replicas
// (Replicas, Engine, Placement, PollInterval and the vllm-dp settings;
// the workload, stages and stage lengths are the trace's own). The report
// has one stage per mode, its Sessions the trace's conversations, its
// window from the first turn's start to the last turn's end in that
// mode's replay.
func SimTrace(cfg SimConfig, turns []turntrace.Turn, opt TraceOptions) (*Report, error) {
	cfg, opt, sum, err := traceSetup(cfg, turns, opt)
	if err != nil {
		return nil, err
	}
	rep := &Report{Kind: "sim", Trace: &sum}
	for _, m := range cfg.Modes {
		st, _, err := replayMode(cfg, turns, opt, m)
		if err != nil {
			return rep, err
		}
		rep.Stages = append(rep.Stages, st)
		if cfg.Progress != nil {
			cfg.Progress(st)
		}
	}
	return rep, nil
}

// traceSetup checks a replay's settings and fills their defaults.
func traceSetup(cfg SimConfig, turns []turntrace.Turn, opt TraceOptions) (SimConfig, TraceOptions, TraceSummary, error) {
	fail := func(err error) (SimConfig, TraceOptions, TraceSummary, error) {
		return cfg, opt, TraceSummary{}, err
	}
	if len(turns) == 0 {
		return fail(errors.New("sim: the trace has no turns"))
	}
	if cfg.Replicas < 1 {
		return fail(fmt.Errorf("sim: need at least one replica, got %d", cfg.Replicas))
	}
	if opt.SharedTokens < 0 && opt.SharedTokens != SharedAuto {
		return fail(fmt.Errorf("sim: shared tokens %d must not be negative", opt.SharedTokens))
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.DPStatsInterval <= 0 {
		cfg.DPStatsInterval = emulator.DefaultDPStatsInterval
	}
	if err := cfg.Engine.Validate(); err != nil {
		return fail(fmt.Errorf("sim: %w", err))
	}
	for _, m := range cfg.Modes {
		if !validMode(m) {
			return fail(fmt.Errorf("sim: unknown mode %q", m))
		}
	}
	for i := range turns {
		if err := turns[i].Validate(); err != nil {
			return fail(fmt.Errorf("sim: trace turn %d: %w", i, err))
		}
		if i > 0 && turns[i].At.Before(turns[i-1].At) {
			return fail(errors.New("sim: the trace's turns are not in start order (turntrace.Read orders them)"))
		}
	}
	sum := SummarizeTrace(turns)
	if opt.SharedTokens == SharedAuto {
		opt.SharedTokens = sum.SharedHint
	}
	sum.SharedUsed = opt.SharedTokens
	if opt.Limit <= 0 {
		opt.Limit = 10*time.Duration(sum.SpanS*float64(time.Second)) + time.Hour
	}
	cfg.RestartAt = 0 // a trace has its own course
	if len(cfg.Modes) == 0 {
		cfg.Modes = AllModes()
	}
	return cfg, opt, sum, nil
}

// replayedTurn is what a replay sent of one turn of the trace.
type replayedTurn struct {
	conv           string // the trace's conv
	serial, idx    int    // the conversation's order in the trace, the turn's in it
	prompt, output int
	cached         int // the prompt tokens the engine found cached
	sent, end      time.Duration
	routed         time.Duration // when the router let it go, if later than sent (0: at once)
	replica        string
	err, aborted   bool
}

// replayMode replays the trace under one mode on fresh replicas.
func replayMode(cfg SimConfig, turns []turntrace.Turn, opt TraceOptions, mode string) (Stage, []replayedTurn, error) {
	s, err := newSimulator(cfg)
	if err != nil {
		return Stage{}, nil, err
	}
	st, err := s.replay(mode, turns, opt)
	if err != nil {
		return Stage{}, nil, err
	}
	return st, s.replayed, nil
}

// traceReplay is one mode's replay of a trace.
type traceReplay struct {
	convs    []*traceConv
	origin   time.Time   // the trace's first start
	pending  itemHeap    // turns whose send time is known, not yet sent
	waiting  []*traceRun // turns held at the router for admission
	held     []*traceRun // turns a peer policy holds (ThunderAgent's paused programs)
	inflight map[*traceRun]bool
	left     int // turns not done
	seq      int // scheduling order: ties in send time go in it
	tok      uint32
	shared   []uint32
	starts   uint64
}

// traceConv is one conversation of the trace.
type traceConv struct {
	serial      int
	key, parent string
	items       []*traceItem // in start order
	next        int          // the first item not yet scheduled
	ended       int          // items done
	lastEnd     time.Duration
	main, side  []uint32 // the lines the next turns extend
	mainStart   uint64
	sideStart   uint64
	sideLen     int // the prompt of the side line
}

// sessionKey is the session a peer router sees the conversation's turns
// under: the session header's value, which a sub-agent shares with its
// parent (its own agent ID is a header the peers do not read).
func (c *traceConv) sessionKey() string {
	if c.parent != "" {
		return c.parent
	}
	return c.key
}

type traceItem struct {
	conv      *traceConv
	idx       int
	t         *turntrace.Turn
	sendAt    time.Duration
	sentAt    time.Duration // -1 until sent
	scheduled bool
	seq       int
}

// itemHeap orders scheduled turns by send time, then scheduling order.
type itemHeap []*traceItem

func (h itemHeap) Len() int { return len(h) }
func (h itemHeap) Less(i, j int) bool {
	if h[i].sendAt != h[j].sendAt {
		return h[i].sendAt < h[j].sendAt
	}
	return h[i].seq < h[j].seq
}
func (h itemHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *itemHeap) Push(x any)   { *h = append(*h, x.(*traceItem)) }
func (h *itemHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

// traceRun is a turn sent: the engine request's Data.
type traceRun struct {
	item    *traceItem
	req     *emulator.EngineRequest
	prompt  []uint32
	start   uint64 // the start fingerprint of its line
	rep     int
	release func(time.Time)
	dec     placement.Decision // the router's decision, zero for a peer's turn (see simTurn)
	ticket  *placement.Ticket
	flight  *peers.Flight // the turn in a peer policy's books
	sent    time.Duration
	rec     TurnRecord
}

func newTraceReplay(turns []turntrace.Turn, shared int) *traceReplay {
	r := &traceReplay{inflight: map[*traceRun]bool{}, origin: turns[0].At, left: len(turns)}
	byConv := map[string]*traceConv{}
	for i := range turns {
		t := &turns[i]
		c := byConv[t.Conv]
		if c == nil {
			c = &traceConv{serial: len(r.convs), key: "trace-" + t.Conv}
			byConv[t.Conv] = c
			r.convs = append(r.convs, c)
		}
		if t.Parent != "" && c.parent == "" {
			c.parent = "trace-" + t.Parent
		}
		c.items = append(c.items, &traceItem{conv: c, idx: len(c.items), t: t, sentAt: -1})
	}
	for range shared {
		r.shared = append(r.shared, r.fresh())
	}
	return r
}

// fresh returns a token no line has had.
func (r *traceReplay) fresh() uint32 {
	r.tok++
	return r.tok
}

func (r *traceReplay) newStart() uint64 {
	r.starts++
	return xxhash.Sum64String(fmt.Sprintf("trace-start-%d", r.starts))
}

// schedule gives the conversation's next turn its send time once that is
// known (see the rules at the top of this file).
func (r *traceReplay) schedule(c *traceConv, now time.Duration) {
	if c.next >= len(c.items) {
		return
	}
	it := c.items[c.next]
	var at time.Duration
	switch t := it.t; {
	case it.idx == 0:
		at = t.At.Sub(r.origin)
	case t.PauseMS >= 0 && !t.First:
		if c.ended < it.idx {
			return // sent once the earlier turns have ended
		}
		at = c.lastEnd + time.Duration(t.PauseMS)*time.Millisecond
	default:
		prev := c.items[it.idx-1]
		if prev.sentAt < 0 {
			return
		}
		at = prev.sentAt + t.At.Sub(prev.t.At)
	}
	it.sendAt, it.scheduled = max(at, now), true
	it.seq = r.seq
	r.seq++
	heap.Push(&r.pending, it)
	c.next++
}

// done counts a turn of c finished at now and schedules what it allowed.
func (r *traceReplay) done(c *traceConv, now time.Duration) {
	c.ended++
	c.lastEnd = max(c.lastEnd, now)
	r.left--
	if c.ended == len(c.items) {
		c.main, c.side = nil, nil // nothing extends them any more
		return
	}
	r.schedule(c, now)
}

// replay runs the trace under mode and measures it.
func (s *simulator) replay(mode string, turns []turntrace.Turn, opt TraceOptions) (Stage, error) {
	if err := s.setMode(mode); err != nil {
		return Stage{}, err
	}
	r := newTraceReplay(turns, opt.SharedTokens)
	s.trace = r
	defer func() { s.trace = nil }()
	start := s.now
	s.stageStart, s.stopped = start, false
	limit := start + opt.Limit
	s.win = Window{From: start, To: limit}
	s.detailStart(mode, len(r.convs))
	for _, c := range r.convs {
		r.schedule(c, s.now)
	}
	nextPoll := s.lastPoll() + s.cfg.PollInterval
	nextPublish := s.now
	for r.left > 0 {
		if mode == ModeVLLMDP && nextPublish <= s.now {
			s.dp.Publish(func(i int) (int, int) { return s.engines[i].e.Waiting(), s.engines[i].e.Running() })
			nextPublish = s.now + s.cfg.DPStatsInterval
		}
		s.kick()
		next, which := limit, -1
		for i, e := range s.engines {
			if e.stepping && e.stepEnd < next {
				next, which = e.stepEnd, i
			}
		}
		due := len(r.pending) > 0 && r.pending[0].sendAt <= next
		if mode == ModeVLLMDP && nextPublish < next {
			next, which = nextPublish, -2
		}
		if due && (which < 0 || r.pending[0].sendAt < next) {
			it := heap.Pop(&r.pending).(*traceItem)
			s.advanceTo(it.sendAt, nil)
			s.traceSend(it)
			s.traceAdmitted()
			continue
		}
		if nextPoll < next || (nextPoll == next && which < 0) {
			s.advanceTo(nextPoll, nil)
			s.poll()
			if Admits(mode) {
				s.router.AdmitWaiting(simEpoch.Add(s.now))
				s.traceAdmitted()
			}
			if s.peer != nil {
				s.traceRetryHeld()
			}
			s.detailPoll()
			nextPoll += s.cfg.PollInterval
			continue
		}
		s.advanceTo(next, nil)
		if which == -2 {
			continue
		}
		if which < 0 {
			break // the limit: what is left is cut off
		}
		s.finishStep(which)
		s.traceAdmitted()
	}
	s.stopped = true
	for _, run := range r.waiting {
		if !run.ticket.Cancel() {
			if d, err := run.ticket.Decision(); err == nil {
				d.Release()
			}
		}
	}
	r.waiting = nil
	r.held = nil // the clients leave the peer router's queue
	for run := range r.inflight {
		s.engines[run.rep].e.Abort(run.req)
		s.traceFinish(run)
	}
	if s.peer != nil {
		// the conversations end with the replay, as a stage's do
		for _, c := range r.convs {
			s.peer.EndSession(c.sessionKey(), simEpoch.Add(s.now))
		}
	}
	// the window ends with the last turn (a final poll reads the
	// counters up to it)
	s.poll()
	s.win.To = s.now + 1
	s.detailEnd()
	st := Measure(s.turns, s.polls, s.win)
	st.Mode, st.Sessions = mode, len(r.convs)
	st.Policy = "sim:" + PolicyOf(mode)
	return st, nil
}

// traceSend builds a turn's prompt and routes it.
func (s *simulator) traceSend(it *traceItem) {
	r, c, t := s.trace, it.conv, it.t
	n := int(t.Prompt)
	var prefix []uint32
	var start uint64
	switch {
	case t.Side && c.side != nil && c.sideLen == n:
		// the same size as the conversation's previous side request: a
		// retry of it (a permission check sent again), the same line
		prefix, start = c.side, c.sideStart
	case t.Side:
		prefix, start = r.shared, r.newStart()
	case t.Compacted && c.side != nil && len(c.side) <= n:
		prefix, start = c.side, c.sideStart
	case t.Compacted || c.main == nil:
		prefix, start = r.shared, r.newStart()
	default:
		prefix, start = c.main, c.mainStart
	}
	prompt := make([]uint32, 0, n)
	prompt = append(prompt, prefix[:min(len(prefix), n)]...)
	for len(prompt) < n {
		prompt = append(prompt, r.fresh())
	}
	it.sentAt = s.now
	run := &traceRun{item: it, prompt: prompt, start: start, sent: s.now}
	if s.peer != nil {
		s.traceSendPeer(run)
		r.schedule(c, s.now)
		return
	}
	s.parent = c.parent
	rep, d, tk := s.route(c.key, start, n)
	s.parent = ""
	if tk != nil {
		run.ticket = tk
		r.waiting = append(r.waiting, run)
	} else {
		s.traceDispatch(run, rep, d, d.ReleaseAt)
	}
	// a turn that overlapped this one in the trace may be due now
	r.schedule(c, s.now)
}

// traceSendPeer routes a turn with the peer policy, as sendPeer does a
// stage's, or holds it there when the policy does (a paused program). The
// policy sees the session header's value (sessionKey: a sub-agent's is its
// parent's), the prompt's tokens and, for the text of the conversation's
// first user message, the conversation's key and its line's start
// fingerprint: stable over a conversation's turns, new where the first
// message would change (a compaction, a side request), as the trace keeps
// no text.
func (s *simulator) traceSendPeer(run *traceRun) {
	c := run.item.conv
	f := s.peer.Pick(peers.Request{Key: c.sessionKey(), Tokens: run.prompt, FirstUser: fmt.Sprintf("%s/%016x", c.key, run.start), Now: simEpoch.Add(s.now)})
	if f == nil {
		s.trace.held = append(s.trace.held, run)
		return
	}
	run.flight = f
	s.traceDispatch(run, f.Replica, placement.Decision{}, func(at time.Time) { s.peer.Done(f, at) })
}

// traceRetryHeld asks the peer policy again for the turns it holds, in the
// order they were first held.
func (s *simulator) traceRetryHeld() {
	r := s.trace
	held := r.held
	r.held = nil
	for _, run := range held {
		s.traceSendPeer(run) // held again: back on r.held, in order
	}
}

// traceAdmitted sends the held turns the router admitted, in the order
// they queued.
func (s *simulator) traceAdmitted() {
	r := s.trace
	kept := r.waiting[:0]
	for _, run := range r.waiting {
		select {
		case <-run.ticket.Ready():
		default:
			kept = append(kept, run)
			continue
		}
		d, err := run.ticket.Decision()
		if err != nil {
			panic(fmt.Sprintf("sim: router has no replica: %v", err))
		}
		s.traceDispatch(run, s.byID[d.Replica], d, d.ReleaseAt)
	}
	clear(r.waiting[len(kept):])
	r.waiting = kept
}

// traceDispatch adds a routed turn to engine rep (d: the router's
// decision, zero from a peer; release frees its slot).
func (s *simulator) traceDispatch(run *traceRun, rep int, d placement.Decision, release func(time.Time)) {
	r, it := s.trace, run.item
	c := it.conv
	run.rep, run.release, run.dec = rep, release, d
	run.rec = TurnRecord{Session: c.serial, Turn: it.idx, LastTurn: it.idx == len(c.items)-1, Start: run.sent, Replica: s.engines[rep].id, Expect: d.Expect}
	if run.sent != s.now {
		run.rec.Routed = s.now
	}
	run.req = &emulator.EngineRequest{ID: fmt.Sprintf("%s-%d", c.key, it.idx), Prompt: run.prompt, MaxTokens: max(int(it.t.Output), 1), Data: run}
	s.engines[rep].inflight++
	r.inflight[run] = true
	e := s.engines[rep].e
	e.AdvanceTo(s.now)
	if err := e.Add(run.req); err != nil {
		// longer than the engine's context: an error, as vLLM's 400
		run.rec.End, run.rec.Err = s.now, true
		s.traceFinish(run)
	}
}

// traceFinish records a turn that ended (answered, failed or cut off) and
// releases its routing slot.
func (s *simulator) traceFinish(run *traceRun) {
	r := s.trace
	if !r.inflight[run] {
		return
	}
	delete(r.inflight, run)
	if run.rec.End == 0 {
		run.rec.End, run.rec.Aborted = s.now, true
	}
	s.turns = append(s.turns, run.rec)
	it := run.item
	s.replayed = append(s.replayed, replayedTurn{conv: it.t.Conv, serial: it.conv.serial, idx: it.idx,
		prompt: len(run.prompt), output: len(run.req.Output), cached: max(run.req.CachedTokens, 0),
		sent: run.sent, end: run.rec.End, routed: run.rec.Routed, replica: run.rec.Replica, err: run.rec.Err, aborted: run.rec.Aborted})
	run.release(simEpoch.Add(s.now))
	s.engines[run.rep].inflight--
	r.done(it.conv, s.now)
}

// traceEvent handles an engine event of a replayed turn (finishStep).
func (s *simulator) traceEvent(e *simEngine, run *traceRun, ev emulator.Event) {
	if ev.Req.Aborted || !s.trace.inflight[run] {
		return
	}
	switch ev.Kind {
	case emulator.EventToken:
		if ev.Index == 0 {
			run.rec.FirstToken = s.now
			run.dec.Succeeded()
			if run.flight != nil {
				s.peer.FirstToken(run.flight, simEpoch.Add(s.now))
			}
			s.detailTurn(&simTurn{req: run.req, rec: run.rec})
		}
	case emulator.EventRefused:
		// the engine refused it (PerRequestTiming.Refuse): an error, told
		// to the router as the Caddy module tells a 5xx
		run.rec.End, run.rec.Err = s.now, true
		run.dec.Failed(simEpoch.Add(s.now))
		s.traceFinish(run)
	case emulator.EventFinished:
		run.rec.End = s.now
		run.rec.Output = len(run.req.Output)
		c := run.item.conv
		line := append(run.prompt[:len(run.prompt):len(run.prompt)], run.req.Output...)
		if run.item.t.Side {
			c.side, c.sideStart, c.sideLen = line, run.start, len(run.prompt)
		} else {
			c.main, c.mainStart = line, run.start
		}
		s.traceFinish(run)
		if PolicyOf(s.mode) == "lm_warden" {
			// what the Caddy module reports of a finished turn
			routed := run.rec.Start
			if run.rec.Routed > 0 {
				routed = run.rec.Routed
			}
			s.router.Feedback(placement.Turn{Key: c.key, Replica: e.id, Reason: run.dec.Reason,
				Prompt: len(run.req.Prompt), Cached: run.req.CachedTokens, Completion: len(run.req.Output),
				FirstToken: run.rec.FirstToken - routed, Duration: s.now - routed})
		}
	}
}

// WriteTraceSummary prints what the replayed trace recorded and the
// replicas it was replayed on, before the report's table.
func WriteTraceSummary(w io.Writer, r *Report, cfg SimConfig) error {
	t := r.Trace
	if t == nil {
		return errors.New("the report has no trace")
	}
	hits := "not reported"
	if t.HitPct >= 0 {
		hits = fmt.Sprintf("%.1f %% of the prompt tokens of the %d turns that reported them", t.HitPct, t.CachedTurns)
	}
	_, err := fmt.Fprintf(w, "Trace: %d turns of %d conversations (%d sub-agents), %d side requests, %d compacted, over %s.\n"+
		"Recorded: %s prompt and %s output tokens (%s tok/min over the span); prefix hits %s.\n"+
		"New lines (first turns, side requests) found a median %s tokens cached: the start they share (--trace-shared auto); the replay gave them %s.\n"+
		"Replayed on %d replicas, %s KV blocks of %d tokens each, max_num_seqs %d; one row per mode below.\n",
		t.Turns, t.Conversations, t.SubAgents, t.Side, t.Compacted, time.Duration(t.SpanS*float64(time.Second)).Round(time.Millisecond),
		fnum(float64(t.PromptTokens), 0), fnum(float64(t.OutputTokens), 0), fnum(t.OutputTokensPerMin, 0), hits, fnum(float64(t.SharedHint), 0), fnum(float64(t.SharedUsed), 0),
		cfg.Replicas, fnum(float64(cfg.Engine.NumGPUBlocks), 0), cfg.Engine.BlockSize, cfg.Engine.MaxNumSeqs)
	return err
}

// WriteReport writes report.json and table.md into dir (a replay's report:
// one stage per mode, nothing to chart over session counts).
func (r *Report) WriteReport(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating output directory: %w", err)
	}
	var paths []string
	for _, f := range []struct {
		name string
		fn   func(io.Writer) error
	}{{"report.json", r.WriteJSON}, {"table.md", r.WriteTable}} {
		p := filepath.Join(dir, f.name)
		out, err := os.Create(p)
		if err != nil {
			return paths, fmt.Errorf("writing %s: %w", p, err)
		}
		err = f.fn(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return paths, fmt.Errorf("writing %s: %w", p, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
