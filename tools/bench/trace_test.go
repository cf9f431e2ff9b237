package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
)

var traceT0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func tturn(conv string, at time.Duration, pauseMS, prompt, output int64, mod func(*turntrace.Turn)) turntrace.Turn {
	t := turntrace.Turn{V: 1, Conv: conv, At: traceT0.Add(at), PauseMS: pauseMS, Prompt: prompt, Output: output, DurMS: 1000}
	if mod != nil {
		mod(&t)
	}
	return t
}

func first(t *turntrace.Turn) { t.First = true }
func side(t *turntrace.Turn)  { t.Side = true }

// TestTraceReplayRules checks the replay's rules on a small trace under
// affinity on: a conversation's first turn at its recorded start, a side
// request beside it at its recorded offset, a later turn its pause after
// both ended, the later turn extending the conversation (its cache found),
// a compacted turn continuing the side request's line, a retried side
// request repeating its line, and a turn over the engine's context an
// error that leaves its conversation going on.
func TestTraceReplayRules(t *testing.T) {
	turns := []turntrace.Turn{
		tturn("a", 0, 0, 4000, 100, first),
		tturn("a", 10*time.Millisecond, -500, 600, 10, side),
		tturn("b", 2*time.Second, 0, 3000, 50, first),
		tturn("a", 9*time.Second, 5000, 4500, 100, nil),
		// after /compact: the new start comes first as a side request,
		// then as the conversation (compacted), extending it
		tturn("a", 20*time.Second, 1000, 1200, 40, side),
		tturn("a", 30*time.Second, 2000, 1600, 40, func(t *turntrace.Turn) { t.Compacted = true }),
		// a side request retried: the same size
		tturn("b", 31*time.Second, 1000, 900, 1, side),
		tturn("b", 32*time.Second, 1000, 900, 1, side),
		// longer than the engine's context: refused
		tturn("b", 40*time.Second, 1000, 200000, 10, nil),
		tturn("b", 50*time.Second, 1000, 5000, 10, nil),
	}
	cfg := DefaultSimConfig()
	st, got := replayTrace(t, cfg, turns, TraceOptions{}, ModeOn)
	if len(got) != len(turns) {
		t.Fatalf("%d turns replayed, want %d", len(got), len(turns))
	}
	at := map[[2]int]replayedTurn{}
	for _, g := range got {
		at[[2]int{g.serial, g.idx}] = g
	}
	a := func(i int) replayedTurn { return at[[2]int{0, i}] }
	b := func(i int) replayedTurn { return at[[2]int{1, i}] }
	if a(0).sent != 0 || a(1).sent != 10*time.Millisecond || b(0).sent != 2*time.Second {
		t.Errorf("starts: a %v, a's side %v, b %v; want 0, 10ms, 2s", a(0).sent, a(1).sent, b(0).sent)
	}
	if want := max(a(0).end, a(1).end) + 5*time.Second; a(2).sent != want {
		t.Errorf("a's second turn sent at %v, want its pause (5 s) after the earlier turns ended: %v", a(2).sent, want)
	}
	// the second turn extends the first (4000 prompt + 100 output): its
	// cache, in whole 16-token blocks
	if a(2).cached < 4096 || a(2).replica != a(0).replica {
		t.Errorf("a's second turn: %d cached on %s, want ≥ 4096 on %s", a(2).cached, a(2).replica, a(0).replica)
	}
	// the compacted turn continues the side request's line (1200 + 40)
	if a(4).cached < 1232 {
		t.Errorf("compacted turn: %d cached, want the side request's line (≥ 1232)", a(4).cached)
	}
	// a retried side request finds its first sending's line
	if b(2).cached < 896 {
		t.Errorf("retried side request: %d cached, want ≥ 896", b(2).cached)
	}
	if !b(3).err || b(4).err || b(4).sent != b(3).end+time.Second {
		t.Errorf("refused turn: err %v; the next: err %v sent %v, want 1 s after %v", b(3).err, b(4).err, b(4).sent, b(3).end)
	}
	// nothing else shares: b's first turn found nothing
	if b(0).cached != 0 {
		t.Errorf("b's first turn found %d cached, want 0 without a shared start", b(0).cached)
	}
	if st.Sessions != 2 || st.Requests != len(turns) || st.Errors != 1 {
		t.Errorf("stage: %d sessions, %d requests, %d errors; want 2, %d, 1", st.Sessions, st.Requests, st.Errors, len(turns))
	}
	// with a shared start, b's first turn finds a's on the same replica
	_, shared := replayTrace(t, cfg, turns[:3], TraceOptions{SharedTokens: 2000}, ModeOn)
	for _, g := range shared {
		if g.serial == 1 && g.replica == shared[0].replica && g.cached < 1984 {
			t.Errorf("b's first turn with a shared start of 2000: %d cached", g.cached)
		}
	}
}

// TestSimTraceFixture replays the recorded Claude Code fixture with every
// mode, the peer routers' included: one stage per mode, in AllModes'
// order, each with every turn answered and a row of the report's table.
func TestSimTraceFixture(t *testing.T) {
	turns, err := ReadTraceFiles(traceFixture)
	if err != nil {
		t.Fatal(err)
	}
	sum := SummarizeTrace(turns)
	if sum.Turns != len(turns) || sum.Conversations < 7 || sum.SubAgents < 1 || sum.Side < 1 || sum.Compacted < 1 || sum.HitPct <= 0 {
		t.Fatalf("fixture summary %+v: want Claude Code's conversations, sub-agents, side requests and compactions", sum)
	}
	cfg := traceSimConfig()
	cfg.Modes = nil // every mode, the peers' included
	rep, err := SimTrace(cfg, turns, TraceOptions{SharedTokens: SharedAuto})
	if err != nil {
		t.Fatal(err)
	}
	all := AllModes()
	if len(rep.Stages) != len(all) {
		t.Fatalf("%d stages for %d modes", len(rep.Stages), len(all))
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for i, st := range rep.Stages {
		if st.Mode != all[i] || st.Requests != len(turns) || st.Errors != 0 || st.Sessions != sum.Conversations || st.OutputTokensPerMin <= 0 {
			t.Errorf("stage %d: %s, %d requests (%d errors), %d sessions, %.0f tok/min", i, st.Mode, st.Requests, st.Errors, st.Sessions, st.OutputTokensPerMin)
		}
		if !strings.Contains(table.String(), "| "+st.Mode+" | "+st.Policy+" |") {
			t.Errorf("no table row for %s", st.Mode)
		}
	}
	if rep.Trace == nil || rep.Trace.SharedUsed != sum.SharedHint {
		t.Errorf("report's trace %+v: want the shared start used, %d", rep.Trace, sum.SharedHint)
	}
	var head bytes.Buffer
	if err := WriteTraceSummary(&head, rep, cfg); err != nil || !strings.Contains(head.String(), "prefix hits") {
		t.Errorf("summary %q, %v", head.String(), err)
	}
	// the same replay twice gives the same report
	again, err := SimTrace(cfg, turns, TraceOptions{SharedTokens: SharedAuto})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rep.Stages {
		if rep.Stages[i] != again.Stages[i] {
			t.Errorf("%s: replays differ:\n%+v\n%+v", rep.Stages[i].Mode, rep.Stages[i], again.Stages[i])
		}
	}
}

// TestSimTraceRefusedTurns replays the fixture on one replica of an
// engine that refuses what its KV cache cannot hold beside the running
// requests (llm-d-inference-sim's behaviour), with room for the largest
// prompt alone: the turns that arrive beside others are refused, each is
// recorded as an error, and the replay still ends with every turn of the
// trace accounted for.
func TestSimTraceRefusedTurns(t *testing.T) {
	turns, err := ReadTraceFiles(traceFixture)
	if err != nil {
		t.Fatal(err)
	}
	var most int64
	for _, tt := range turns {
		most = max(most, tt.Prompt+tt.Output)
	}
	cfg := traceSimConfig()
	cfg.Replicas = 1
	cfg.Modes = []string{ModeDefault}
	cfg.Engine = LLMDSimEngineConfig()
	cfg.Engine.NumGPUBlocks = int(most/16) + 2
	cfg.Engine.MaxModelLen = 131072
	rep, err := SimTrace(cfg, turns, TraceOptions{SharedTokens: SharedAuto})
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Stages[0]
	t.Logf("%d requests, %d refused, on %d blocks", st.Requests, st.Errors, cfg.Engine.NumGPUBlocks)
	if st.Requests != len(turns) || st.Errors == 0 || st.Errors == st.Requests {
		t.Errorf("%d requests (%d errors) for %d turns: want every turn, some refused", st.Requests, st.Errors, len(turns))
	}
}

func TestSimTraceErrors(t *testing.T) {
	good := []turntrace.Turn{tturn("a", 0, 0, 100, 1, first)}
	cfg := DefaultSimConfig()
	bad := cfg
	bad.Modes = []string{"nonesuch"}
	for _, c := range []struct {
		name  string
		cfg   SimConfig
		turns []turntrace.Turn
		opt   TraceOptions
		want  string
	}{
		{"no turns", cfg, nil, TraceOptions{}, "no turns"},
		{"unknown mode", bad, good, TraceOptions{}, "unknown mode"},
		{"negative shared", cfg, good, TraceOptions{SharedTokens: -5}, "shared tokens"},
		{"invalid turn", cfg, []turntrace.Turn{tturn("a", 0, 0, 0, 1, nil)}, TraceOptions{}, "prompt 0"},
		{"out of order", cfg, []turntrace.Turn{good[0], tturn("b", -time.Second, 0, 10, 1, first)}, TraceOptions{}, "start order"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := SimTrace(c.cfg, c.turns, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTraceFiles(empty); err == nil || !strings.Contains(err.Error(), "no turns") {
		t.Errorf("empty file: %v", err)
	}
	if _, err := ReadTraceFiles(filepath.Join(dir, "missing.jsonl")); err == nil {
		t.Error("a missing file read")
	}
}

// TestReadTraceFilesMerges: a rotated file and the current one read
// together, in start order, whether the first ends with a newline or not.
func TestReadTraceFilesMerges(t *testing.T) {
	dir := t.TempDir()
	l1 := `{"v":1,"conv":"a","at":"2026-12-05T12:00:05Z","pause_ms":0,"prompt":10,"output":1,"dur_ms":5}`
	l2 := `{"v":1,"conv":"a","at":"2026-12-05T12:00:01Z","first":true,"pause_ms":0,"prompt":9,"output":1,"dur_ms":5}`
	old, cur := filepath.Join(dir, "t.jsonl.1"), filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(old, []byte(l2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cur, []byte(l1+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	turns, err := ReadTraceFiles(cur, old)
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 2 || turns[0].Prompt != 9 || turns[1].Prompt != 10 {
		t.Fatalf("%+v", turns)
	}
}
