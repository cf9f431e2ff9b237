package bench

import (
	"math"
	"regexp"
	"testing"
)

func within(got, want int, frac float64) bool {
	return math.Abs(float64(got-want)) <= frac*float64(want)
}

func TestWorkloadTokenTargets(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    Workload
	}{
		{"reference", DefaultWorkload()},
		{"seven-gpu", SevenGPUWorkload()},
		{"exact", func() Workload {
			w := DefaultWorkload()
			w.Jitter = 0
			w.FirstTokens = 2000
			w.TurnTokens = 100
			return w
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := NewGenerator(tc.w, ApproxTokens)
			if err != nil {
				t.Fatal(err)
			}
			if n := ApproxTokens(g.System()); !within(n, tc.w.SystemTokens, 0.05) {
				t.Errorf("system prompt %d tokens, want %d ±5%%", n, tc.w.SystemTokens)
			}
			for k := range 3 {
				s := g.Next()
				if s.Turns() != tc.w.Turns {
					t.Fatalf("session %d has %d turns, want %d", k, s.Turns(), tc.w.Turns)
				}
				for i, m := range s.Messages {
					want := tc.w.TurnTokens
					if i == 0 {
						want = tc.w.FirstTokens
					}
					if n := ApproxTokens(m); !within(n, want, 0.05) {
						t.Errorf("session %d turn %d: %d tokens, want %d ±5%%", k, i, n, want)
					}
				}
			}
		})
	}
}

func TestWorkloadCustomCounter(t *testing.T) {
	// A counter with a different ratio (one token per word) still lands on target.
	words := func(s string) int { return len(regexp.MustCompile(`\S+`).FindAllStringIndex(s, -1)) }
	w := DefaultWorkload()
	w.FirstTokens, w.SystemTokens = 1500, 800
	g, err := NewGenerator(w, words)
	if err != nil {
		t.Fatal(err)
	}
	if n := words(g.System()); !within(n, 800, 0.05) {
		t.Errorf("system %d words, want 800 ±5%%", n)
	}
	s := g.Next()
	for i, m := range s.Messages {
		want := w.TurnTokens
		if i == 0 {
			want = w.FirstTokens
		}
		if n := words(m); !within(n, want, 0.05) {
			t.Errorf("turn %d: %d words, want %d ±5%%", i, n, want)
		}
	}
}

func TestWorkloadDeterministic(t *testing.T) {
	a, _ := NewGenerator(DefaultWorkload(), nil)
	b, _ := NewGenerator(DefaultWorkload(), nil)
	if a.System() != b.System() {
		t.Fatal("system prompts differ for one seed")
	}
	for range 4 {
		x, y := a.Next(), b.Next()
		if x.ID != y.ID || x.UserID != y.UserID {
			t.Fatalf("ids differ: %s %s", x.ID, y.ID)
		}
		for i := range x.Messages {
			if x.Messages[i] != y.Messages[i] {
				t.Fatalf("session %d turn %d differs", x.Serial, i)
			}
		}
	}
	w := DefaultWorkload()
	w.Seed = 2
	c, _ := NewGenerator(w, nil)
	if c.System() == a.System() || c.Session(0).Messages[0] == a.Session(0).Messages[0] {
		t.Error("another seed gives the same prompts")
	}
	if a.Session(1).Messages[0] == a.Session(2).Messages[0] {
		t.Error("two sessions share a first message")
	}
}

func TestSessionIdentity(t *testing.T) {
	g, _ := NewGenerator(DefaultWorkload(), nil)
	s := g.Next()
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	if !uuid.MatchString(s.ID) {
		t.Errorf("session id %q is not a v4 UUID", s.ID)
	}
	userID := regexp.MustCompile(`^user_[0-9a-f]{64}_account_[0-9a-f-]{36}_session_(.+)$`)
	m := userID.FindStringSubmatch(s.UserID)
	if m == nil || m[1] != s.ID {
		t.Errorf("user_id %q does not carry the session id", s.UserID)
	}
}

func TestSessionHistory(t *testing.T) {
	w := DefaultWorkload()
	w.FirstTokens, w.SystemTokens, w.Turns = 100, 100, 3
	g, _ := NewGenerator(w, nil)
	s := g.Next()
	if h := s.History(0); len(h) != 1 || h[0].Text != s.Messages[0] {
		t.Fatalf("turn 0 history %+v", h)
	}
	s.Answer("first answer")
	s.Answer("second answer")
	h := s.History(2)
	want := []Message{{"user", s.Messages[0]}, {"assistant", "first answer"}, {"user", s.Messages[1]}, {"assistant", "second answer"}, {"user", s.Messages[2]}}
	if len(h) != len(want) {
		t.Fatalf("history has %d messages, want %d", len(h), len(want))
	}
	for i := range want {
		if h[i] != want[i] {
			t.Errorf("message %d = %v, want %v", i, h[i].Role, want[i].Role)
		}
	}
	if s.Done() {
		t.Error("session done before its last answer")
	}
	s.Answer("third")
	if !s.Done() {
		t.Error("session not done after its last answer")
	}
}

func TestWorkloadValidate(t *testing.T) {
	bad := []func(*Workload){
		func(w *Workload) { w.Turns = 0 },
		func(w *Workload) { w.FirstTokens = 0 },
		func(w *Workload) { w.OutputTokens = 0 },
		func(w *Workload) { w.Jitter = 0.7 },
	}
	for i, f := range bad {
		w := DefaultWorkload()
		f(&w)
		if _, err := NewGenerator(w, nil); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
	if n := DefaultWorkload().SessionTokens(); n < 13000 || n > 15000 {
		t.Errorf("default session of %d tokens, want about 14k", n)
	}
	if n := SevenGPUWorkload().SessionTokens(); !within(n, 58000, 0.05) {
		t.Errorf("seven-GPU session of %d tokens, want about 58k", n)
	}
}

func TestStartTurnsAndPreparedSessions(t *testing.T) {
	for _, tc := range []struct{ n, turns int }{{4, 6}, {1, 6}, {32, 6}, {3, 9}} {
		seen := map[int]bool{}
		for i := range tc.n {
			st := StartTurn(i, tc.n, tc.turns)
			if st < 0 || st >= tc.turns {
				t.Fatalf("slot %d of %d starts at turn %d of %d", i, tc.n, st, tc.turns)
			}
			seen[st] = true
		}
		if want := min(tc.n, tc.turns); len(seen) != want {
			t.Errorf("%d slots over %d turns use %d start turns, want %d", tc.n, tc.turns, len(seen), want)
		}
	}
	g, _ := NewGenerator(DefaultWorkload(), nil)
	s := g.NextAt(3)
	if s.Turn() != 3 || len(s.History(3)) != 7 {
		t.Fatalf("prepared session at turn %d with %d messages", s.Turn(), len(s.History(3)))
	}
	for i, a := range s.Answers {
		if n := ApproxTokens(a); !within(n, s.OutputTokens, 0.05) {
			t.Errorf("prepared answer %d has %d tokens, want %d ±5%%", i, n, s.OutputTokens)
		}
	}
	if g.NextAt(99).Turn() != s.Turns()-1 {
		t.Error("a start past the last turn is not clamped")
	}
	h, _ := NewGenerator(DefaultWorkload(), nil)
	if h.NextAt(3).Answers[2] != s.Answers[2] {
		t.Error("prepared answers differ for one seed")
	}
}

func TestCompaction(t *testing.T) {
	w := DefaultWorkload()
	w.CompactShare, w.CompactAfter, w.CompactTokens = 0.2, 3, 800
	g, err := NewGenerator(w, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, compacting := 2000, 0
	for i := 0; i < n; i++ {
		s := g.Session(i)
		if g.Compacts(s) {
			compacting++
			if g.Compacts(s) != g.Compacts(g.Session(i)) {
				t.Fatalf("session %d: compaction choice not stable", i)
			}
		}
	}
	if share := float64(compacting) / float64(n); share < 0.17 || share > 0.23 {
		t.Errorf("%d of %d sessions compact (%.3f), want about 0.2", compacting, n, share)
	}
	a, b := g.Summary(g.Session(1)), g.Summary(g.Session(2))
	if a == b || a != g.Summary(g.Session(1)) {
		t.Error("summaries must be the session's own and stable")
	}
	if got := ApproxTokens(a); got < 780 || got > 830 {
		t.Errorf("summary of %d tokens, want about 800", got)
	}
	w.CompactAfter = w.Turns
	if g2, _ := NewGenerator(w, nil); g2.Compacts(g2.Session(0)) {
		t.Error("a session cannot compact after its last turn")
	}
	for _, bad := range []Workload{
		func() Workload { x := w; x.CompactShare = 1.5; return x }(),
		func() Workload { x := w; x.CompactAfter = 0; return x }(),
		func() Workload { x := w; x.CompactTokens = 0; return x }(),
	} {
		if bad.Validate() == nil {
			t.Errorf("workload %+v: no error", bad)
		}
	}
}
