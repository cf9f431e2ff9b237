package bench

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
)

// compactingGenerator draws sessions of 5 turns that all compact after 2.
func compactingGenerator(t *testing.T, count TokenCounter) *Generator {
	t.Helper()
	w := DefaultWorkload()
	w.SystemTokens, w.FirstTokens, w.TurnTokens, w.OutputTokens, w.Turns = 400, 600, 60, 16, 5
	w.CompactShare, w.CompactAfter, w.CompactTokens = 1, 2, 120
	g, err := NewGenerator(w, count)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestClientCompaction: a compacting session sends, from its compaction
// turn on, the summary as its first message followed by the turns since,
// under the same session ID and system prompt, in both APIs; a session
// started past the compaction turn never compacts, as in the sim.
func TestClientCompaction(t *testing.T) {
	for _, api := range []API{APIAnthropic, APIOpenAI} {
		t.Run(string(api), func(t *testing.T) {
			stream := anthropicStream
			if api == APIOpenAI {
				stream = openAIStream
			}
			f := &fakeServer{t: t, stream: stream}
			srv := httptest.NewServer(f)
			defer srv.Close()
			g := compactingGenerator(t, nil)
			s := g.NextAt(0)
			if s.CompactAt != 2 || s.Summary != g.Summary(s) {
				t.Fatalf("compact at %d, summary set %v", s.CompactAt, s.Summary != "")
			}
			c := &Client{BaseURL: srv.URL, API: api}
			for turn := range s.Turns() {
				if _, err := c.Send(context.Background(), s, turn); err != nil {
					t.Fatal(err)
				}
				header := "X-Claude-Code-Session-Id"
				if api == APIOpenAI {
					header = "X-Session-Affinity"
				}
				if got := f.header.Get(header); got != s.ID {
					t.Errorf("turn %d: session %q, want %q", turn, got, s.ID)
				}
				var want []string // user and assistant texts in order
				from := 0
				if turn >= s.CompactAt {
					want, from = append(want, s.Summary), s.CompactAt
				}
				for i := from; i < turn; i++ {
					want = append(want, s.Messages[i], s.Answers[i])
				}
				want = append(want, s.Messages[turn])
				got := sentTexts(t, f.body, api)
				if api == APIOpenAI {
					if got[0] != s.System {
						t.Fatalf("turn %d: first message is not the system prompt", turn)
					}
					got = got[1:]
				}
				if len(got) != len(want) {
					t.Fatalf("turn %d: %d messages, want %d", turn, len(got), len(want))
				}
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("turn %d message %d: %.40q, want %.40q", turn, i, got[i], want[i])
					}
				}
				s.Answer(" the code")
			}
			// a session started past its compaction turn has compacted:
			// the summary, then the turns since
			if late := g.NextAt(3); late.CompactAt != 2 || late.History(4)[0].Text != late.Summary || late.History(4)[1].Text != late.Messages[2] {
				t.Errorf("a session started past the compaction turn: compact at %d, history starts %.40q", late.CompactAt, late.History(4)[0].Text)
			}
		})
	}
}

// sentTexts returns the text of every message of a recorded request body.
func sentTexts(t *testing.T, body map[string]any, api API) []string {
	t.Helper()
	var out []string
	for _, m := range body["messages"].([]any) {
		c := m.(map[string]any)["content"]
		if api == APIOpenAI {
			out = append(out, c.(string))
			continue
		}
		out = append(out, c.([]any)[0].(map[string]any)["text"].(string))
	}
	return out
}

// TestClientCompactionOnEmulator sends a compacting session to one
// emulated replica: its turns before the compaction find the previous
// turn cached; the compaction turn finds only the system prompt (the
// history it extends was replaced); the turn after finds the compacted
// history cached again.
func TestClientCompactionOnEmulator(t *testing.T) {
	srv, err := emulator.NewServer(emulator.ServerConfig{Replicas: 1, Speed: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	g := compactingGenerator(t, emulator.CountTokens)
	s := g.NextAt(0)
	c := &Client{BaseURL: srv.URLs()[0], API: APIAnthropic}
	cached := make([]int, s.Turns())
	for turn := range s.Turns() {
		res, err := c.Send(context.Background(), s, turn)
		if err != nil {
			t.Fatal(err)
		}
		cached[turn] = res.CachedTokens
		s.Answer(res.Text)
	}
	sys := emulator.CountTokens(s.System)
	first := emulator.CountTokens(s.Messages[0])
	switch {
	case cached[1] < sys+first: // turn 1 extends turn 0's prompt
		t.Errorf("turn 1 cached %d, want at least system %d + first message %d", cached[1], sys, first)
	case cached[2] >= sys+first || cached[2] < sys-emulatorBlock:
		t.Errorf("compaction turn cached %d, want about the system prompt's %d", cached[2], sys)
	case cached[3] < sys+emulator.CountTokens(s.Summary):
		t.Errorf("turn after the compaction cached %d, want at least system + summary %d", cached[3], sys+emulator.CountTokens(s.Summary))
	}
}

// emulatorBlock is the emulator's KV block: a cached prefix is counted in
// whole blocks.
const emulatorBlock = 16

// TestCompactTurn: Claude Code's own compaction threshold (window less the
// 20,000-token output reserve and the 13,000-token buffer) and the turn at
// which the fleet preset's agents reach it.
func TestCompactTurn(t *testing.T) {
	if got := ClaudeCodeCompactLimit(131072); got != 98072 {
		t.Errorf("limit for a 131,072-token window: %d, want 98,072", got)
	}
	w := FleetSimConfig().Workload
	for _, c := range []struct {
		limit, want int
	}{
		{98072, 50},       // 3,500 + 8,000 + 50 × 1,756 = 99,300 is the first over
		{11500, 1},        // the first turn's prompt is the limit: the second passes it
		{11499 + 1756, 1}, // just under the second turn's prompt
		{1 << 30, w.Turns},
	} {
		if got := w.CompactTurn(c.limit); got != c.want {
			t.Errorf("CompactTurn(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	if w.CompactShare != 1 || w.CompactAfter != 50 || w.CompactTokens != FleetSummaryTokens {
		t.Errorf("fleet preset compacts %v of its agents at turn %d into %d tokens", w.CompactShare, w.CompactAfter, w.CompactTokens)
	}
}
