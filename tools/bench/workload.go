package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Workload describes the Claude-Code-like sessions of the reference measurement. Sizes are in
// tokens as counted by the workload's TokenCounter.
type Workload struct {
	// Seed makes two runs send identical prompts.
	Seed uint64 `json:"seed"`
	// SystemTokens is the size of the system prompt shared by all sessions.
	SystemTokens int `json:"system_tokens"`
	// FirstTokens is the size of a session's first user message.
	FirstTokens int `json:"first_tokens"`
	// Turns is the number of turns per session, the first one included.
	Turns int `json:"turns"`
	// TurnTokens is the size of every later user message.
	TurnTokens int `json:"turn_tokens"`
	// OutputTokens is max_tokens of every turn.
	OutputTokens int `json:"output_tokens"`
	// Jitter varies the first message and the later messages uniformly by
	// ±Jitter (a fraction, e.g. 0.02) per session, so sessions are not all
	// the same length. Zero gives exact targets.
	Jitter float64 `json:"jitter"`
	// Model is the model name sent in requests.
	Model string `json:"model"`
	// Think is the mean pause between a turn's answer and the session's
	// next turn (the client running tools); each pause is drawn uniformly
	// from [Think/2, 3·Think/2]. Zero sends the next turn at once.
	Think time.Duration `json:"think_ns"`
	// CompactShare of the sessions compact after CompactAfter turns, as
	// Claude Code does near the context limit or on /compact: the same
	// session ID, but the history is replaced by a summary of
	// CompactTokens (system prompt kept, the summary as the new first user
	// message); the session then sends its remaining turns. Used by the sim.
	CompactShare  float64 `json:"compact_share,omitempty"`
	CompactAfter  int     `json:"compact_after,omitempty"`
	CompactTokens int     `json:"compact_tokens,omitempty"`
	// Waves, when positive, makes sessions start in waves: every stage
	// begins with all its sessions at their first turn, and a slot whose
	// session ended starts its next one at the next multiple of Waves
	// since the stage began. Bursts of new conversations (a team starting
	// work, a batch of agents launched together) exercise the spill rule.
	// Zero starts the slots' sessions staggered (StartTurn) and back to
	// back.
	Waves time.Duration `json:"waves_ns,omitempty"`
	// Interactive makes the pauses between turns those of a person at the
	// keyboard rather than an agent running tools (Think is then unused):
	// irregular, from seconds to minutes (log-uniform between
	// InteractiveMinPause and InteractiveMaxPause), and now and then
	// (InteractiveQuietShare of the pauses) a conversation goes quiet for
	// longer than admission's window (InteractiveQuietMin to
	// InteractiveQuietMax) without ending, then goes on.
	Interactive bool `json:"interactive,omitempty"`
}

// The pauses of an Interactive workload.
const (
	InteractiveMinPause   = 2 * time.Second
	InteractiveMaxPause   = 3 * time.Minute
	InteractiveQuietShare = 0.1
	InteractiveQuietMin   = 5 * time.Minute
	InteractiveQuietMax   = 15 * time.Minute
)

// pause draws the client's pause before a later turn from r.
func (w Workload) pause(r *rand.Rand) time.Duration {
	if !w.Interactive {
		return time.Duration(float64(w.Think) * (0.5 + r.Float64()))
	}
	if r.Float64() < InteractiveQuietShare {
		return InteractiveQuietMin + time.Duration(r.Float64()*float64(InteractiveQuietMax-InteractiveQuietMin))
	}
	lo, hi := math.Log(float64(InteractiveMinPause)), math.Log(float64(InteractiveMaxPause))
	return time.Duration(math.Exp(lo + r.Float64()*(hi-lo)))
}

// FirstTurn is the turn slot i of n starts its first session at: staggered
// (StartTurn) unless sessions start in waves, then the first.
func (w Workload) FirstTurn(i, n int) int {
	if w.Waves > 0 {
		return 0
	}
	return StartTurn(i, n, w.Turns)
}

// NextStart is when, since the stage began, a slot whose session ended at
// since starts its next session: at once, or at the next wave.
func (w Workload) NextStart(since time.Duration) time.Duration {
	if w.Waves <= 0 {
		return since
	}
	return (since/w.Waves + 1) * w.Waves
}

// DefaultWorkload is the reference measurement (4 × RTX A4000): a 3.5k system prompt,
// a 7.3k first message, five more turns of 400 tokens, 256 output tokens.
func DefaultWorkload() Workload {
	return Workload{
		Seed:         1,
		SystemTokens: 3500,
		FirstTokens:  7300,
		Turns:        6,
		TurnTokens:   400,
		OutputTokens: 256,
		Jitter:       0.02,
		Model:        "qwen3-4b",
	}
}

// SevenGPUWorkload is the 7-GPU story: headless agents whose
// sessions grow to about 58k tokens (3.5k system, 24k first message, eight
// more turns of 3.5k, 256 output tokens per turn).
func SevenGPUWorkload() Workload {
	return Workload{
		Seed:         1,
		SystemTokens: 3500,
		FirstTokens:  24000,
		Turns:        9,
		TurnTokens:   3500,
		OutputTokens: 256,
		Jitter:       0.02,
		Model:        "gemma-27b",
		Think:        3 * time.Second,
	}
}

// Claude Code compacts a conversation on its own once the prompt reaches
// its context window less an output reserve of min(max output tokens,
// 20,000) and a 13,000-token buffer (2.1.197: the compaction threshold
// beside CLAUDE_AUTOCOMPACT_PCT_OVERRIDE); ClaudeCodeCompactLimit is that
// threshold for a model's window with the full reserve.
const (
	claudeCodeOutputReserve = 20000
	claudeCodeCompactBuffer = 13000
)

// ClaudeCodeCompactLimit is the prompt size, in tokens, at which Claude
// Code compacts a conversation on a model with a context window of window
// tokens.
func ClaudeCodeCompactLimit(window int) int {
	return window - claudeCodeOutputReserve - claudeCodeCompactBuffer
}

// CompactTurn is the first turn (0-based) whose prompt would pass limit
// tokens at the workload's nominal sizes: the turn at which a session that
// compacts at limit sends its summary instead of its history. It is Turns
// when no turn does.
func (w Workload) CompactTurn(limit int) int {
	for t := 1; t < w.Turns; t++ {
		if w.SystemTokens+w.FirstTokens+t*(w.TurnTokens+w.OutputTokens) > limit {
			return t
		}
	}
	return w.Turns
}

// SessionTokens is the nominal size of a session's last prompt plus its last
// answer: the KV a session holds when it ends.
func (w Workload) SessionTokens() int {
	return w.SystemTokens + w.FirstTokens + (w.Turns-1)*w.TurnTokens + w.Turns*w.OutputTokens
}

// Validate reports a workload that cannot run.
func (w Workload) Validate() error {
	switch {
	case w.SystemTokens < 0, w.FirstTokens <= 0, w.TurnTokens < 0:
		return fmt.Errorf("workload: sizes must be positive (system %d, first %d, turn %d)", w.SystemTokens, w.FirstTokens, w.TurnTokens)
	case w.Turns < 1:
		return fmt.Errorf("workload: turns must be at least 1, got %d", w.Turns)
	case w.OutputTokens < 1:
		return fmt.Errorf("workload: output tokens must be at least 1, got %d", w.OutputTokens)
	case w.Think < 0:
		return fmt.Errorf("workload: think time must not be negative, got %v", w.Think)
	case w.Waves < 0:
		return fmt.Errorf("workload: the wave period must not be negative, got %v", w.Waves)
	case w.CompactShare < 0 || w.CompactShare > 1:
		return fmt.Errorf("workload: compact share must be in [0, 1], got %g", w.CompactShare)
	case w.CompactShare > 0 && (w.CompactAfter < 1 || w.CompactTokens < 1):
		return fmt.Errorf("workload: compacting sessions need --compact-after ≥ 1 and --compact-tokens ≥ 1 (got %d, %d)", w.CompactAfter, w.CompactTokens)
	case w.Jitter < 0 || w.Jitter >= 0.5:
		return fmt.Errorf("workload: jitter must be in [0, 0.5), got %g", w.Jitter)
	}
	return nil
}

// TokenCounter counts the tokens of a text.
type TokenCounter func(string) int

// ApproxTokens counts about four bytes of English per token, the ratio of
// real tokenizers and of the emulator's.
func ApproxTokens(s string) int { return (len(s) + 3) / 4 }

// Generator makes sessions of a workload. Session n of a generator is the
// same for the same seed, sizes and counter. A Generator is not safe for
// concurrent use; Session is cheap to call under a lock.
type Generator struct {
	w      Workload
	count  TokenCounter
	system string
	next   int
}

// NewGenerator returns a generator of w's sessions. count nil means
// ApproxTokens.
func NewGenerator(w Workload, count TokenCounter) (*Generator, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	if count == nil {
		count = ApproxTokens
	}
	g := &Generator{w: w, count: count}
	r := rand.New(rand.NewPCG(w.Seed, 0x5157e3))
	g.system = systemPreamble + textOfTokens(r, w.SystemTokens-count(systemPreamble), count)
	return g, nil
}

// Workload returns the generator's workload.
func (g *Generator) Workload() Workload { return g.w }

// System returns the system prompt shared by all sessions.
func (g *Generator) System() string { return g.system }

// Next returns the next session, numbered from 0 in the order of calls.
func (g *Generator) Next() *Session {
	s := g.Session(g.next)
	g.next++
	return s
}

// NextAt returns the next session already advanced to turn start: the
// earlier turns carry answers of the workload's output length, as if they
// had been served. A stage starts its slots at spread-out turns so that
// sessions end at a steady rate from the start, as in a long closed loop.
func (g *Generator) NextAt(start int) *Session {
	s := g.Next()
	start = max(0, min(start, s.Turns()-1))
	r := rand.New(rand.NewPCG(g.w.Seed^0xa5a5, uint64(s.Serial)+1))
	for range start {
		s.Answer(textOfTokens(r, s.OutputTokens, g.count))
	}
	if g.Compacts(s) {
		// as the sim: a session compacts when it sends its CompactAfter
		// turn; one started past it has compacted already, so its history
		// starts with the summary (an agent that ran this long has)
		s.CompactAt, s.Summary = g.w.CompactAfter, g.Summary(s)
	}
	return s
}

// StartTurn is the turn slot i of n starts its first session at, spreading
// the slots evenly over a session's turns.
func StartTurn(i, n, turns int) int {
	if n <= 0 {
		return 0
	}
	return i * turns / n
}

// Session returns session n.
func (g *Generator) Session(n int) *Session {
	r := rand.New(rand.NewPCG(g.w.Seed, uint64(n)+1))
	s := &Session{
		Serial: n,
		ID:     uuidFrom(r),
		System: g.system,
		Model:  g.w.Model,
	}
	account := uuidFrom(r)
	device := sha256.Sum256([]byte(fmt.Sprintf("device-%d-%d", g.w.Seed, n)))
	s.UserID = "user_" + hex.EncodeToString(device[:]) + "_account_" + account + "_session_" + s.ID
	s.Messages = make([]string, g.w.Turns)
	for i := range s.Messages {
		target := g.w.TurnTokens
		if i == 0 {
			target = g.w.FirstTokens
		}
		if g.w.Jitter > 0 {
			target = int(float64(target) * (1 + g.w.Jitter*(2*r.Float64()-1)))
		}
		head := fmt.Sprintf("[turn %d of %s] ", i+1, s.ID[:8])
		s.Messages[i] = head + textOfTokens(r, target-g.count(head), g.count)
	}
	s.OutputTokens = g.w.OutputTokens
	s.Think = make([]time.Duration, g.w.Turns)
	for i := 1; i < len(s.Think); i++ {
		s.Think[i] = g.w.pause(r)
	}
	return s
}

// Session is one conversation: a session ID as Claude Code sends it, the
// shared system prompt and the user message of every turn. The answers are
// filled in as the turns complete.
type Session struct {
	Serial       int
	ID           string // X-Claude-Code-Session-Id, a UUID
	UserID       string // metadata.user_id: user_<sha256>_account_<uuid>_session_<uuid>
	Model        string
	System       string
	Messages     []string // user message of every turn
	Answers      []string // assistant answer of every completed turn
	OutputTokens int      // max_tokens per turn
	// Think is the client's pause before each turn (0 before the first).
	Think []time.Duration
	// CompactAt, when positive, is the turn at which the session compacts
	// (NextAt sets it for the sessions Compacts chooses): from that turn
	// on, History starts with Summary, as Claude Code's /compact replaces
	// the history under the same session ID, followed by the turns since.
	CompactAt int
	Summary   string
}

// Turns is the number of turns of the session.
func (s *Session) Turns() int { return len(s.Messages) }

// Done reports whether every turn has been answered.
func (s *Session) Done() bool { return len(s.Answers) >= len(s.Messages) }

// Turn is the 0-based index of the next turn.
func (s *Session) Turn() int { return len(s.Answers) }

// Answer records the answer of the current turn.
func (s *Session) Answer(text string) { s.Answers = append(s.Answers, text) }

// Message is one chat message of a turn's history.
type Message struct {
	Role string // "user" or "assistant"
	Text string
}

// Compacted reports whether turn t's history starts from the session's
// Summary: it compacts, and t is at or past its compaction turn.
func (s *Session) Compacted(t int) bool { return s.CompactAt > 0 && t >= s.CompactAt }

// History returns the messages of turn t (0-based): every earlier user
// message followed by its answer, then turn t's user message. A session
// that compacted at turn CompactAt <= t sends its Summary as the first
// message instead of the turns before CompactAt.
func (s *Session) History(t int) []Message {
	msgs := make([]Message, 0, 2*t+1)
	from := 0
	if s.Compacted(t) {
		// compacted: the summary replaces the turns before CompactAt
		msgs = append(msgs, Message{Role: "user", Text: s.Summary})
		from = s.CompactAt
	}
	for i := from; i < t; i++ {
		msgs = append(msgs, Message{Role: "user", Text: s.Messages[i]})
		if i < len(s.Answers) {
			msgs = append(msgs, Message{Role: "assistant", Text: s.Answers[i]})
		}
	}
	return append(msgs, Message{Role: "user", Text: s.Messages[t]})
}

const systemPreamble = "You are Claude Code, Anthropic's official CLI for Claude. You are an interactive CLI tool that helps users with software engineering tasks. "

// uuidFrom draws a version-4 UUID from r.
func uuidFrom(r *rand.Rand) string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], r.Uint64())
	binary.LittleEndian.PutUint64(b[8:], r.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// textOfTokens draws English-like code-review prose of about target tokens
// as counted by count. It estimates the byte length from a sample, then
// corrects twice, so the result lands within a word of the target.
// Summary is the text that replaces session s's history when it compacts:
// CompactTokens of text of its own (the same for the same seed and session).
func (g *Generator) Summary(s *Session) string {
	r := rand.New(rand.NewPCG(g.w.Seed^0x5c0ffee, uint64(s.Serial)))
	return "Summary of the conversation so far: " + textOfTokens(r, g.w.CompactTokens, g.count)
}

// Compacts reports whether session s compacts after CompactAfter turns:
// a fixed CompactShare of the sessions, chosen by serial.
func (g *Generator) Compacts(s *Session) bool {
	if g.w.CompactShare <= 0 || g.w.CompactAfter >= s.Turns() {
		return false
	}
	r := rand.New(rand.NewPCG(g.w.Seed^0xc0ac7, uint64(s.Serial)))
	return r.Float64() < g.w.CompactShare
}

func textOfTokens(r *rand.Rand, target int, count TokenCounter) string {
	if target <= 0 {
		return ""
	}
	var b strings.Builder
	ratio := 4.0 // bytes per token, corrected below
	n := 0
	for range 6 {
		missing := target - n
		if missing <= 0 {
			break
		}
		grow := int(float64(missing) * ratio)
		if grow < 1 {
			grow = 1
		}
		for stop := b.Len() + grow; b.Len() < stop; {
			writeSentence(r, &b)
		}
		n = count(b.String())
		if n > 0 {
			ratio = float64(b.Len()) / float64(n)
		}
	}
	s := b.String()
	// Trim whole words while clearly over the target.
	for n > target+target/100+1 {
		cut := len(s) - int(float64(n-target)*ratio)
		if cut <= 0 {
			break
		}
		if i := strings.LastIndexByte(s[:cut], ' '); i > 0 {
			cut = i
		}
		s = s[:cut]
		n = count(s)
	}
	return s
}

func writeSentence(r *rand.Rand, b *strings.Builder) {
	words := 6 + r.IntN(12)
	for i := range words {
		w := vocabulary[r.IntN(len(vocabulary))]
		if i == 0 {
			b.WriteString(strings.ToUpper(w[:1]))
			b.WriteString(w[1:])
		} else {
			b.WriteString(w)
		}
		if i < words-1 {
			b.WriteByte(' ')
		}
	}
	switch r.IntN(8) {
	case 0:
		b.WriteString("? ")
	case 1:
		fmt.Fprintf(b, " (see line %d). ", 1+r.IntN(900))
	default:
		b.WriteString(". ")
	}
}

var vocabulary = strings.Fields(`the a function returns error value handler request response router replica
cache prefix token session conversation turn model engine scheduler block queue running waiting
test case table field struct method interface package module import build config reload upstream
proxy stream event chunk usage counter gauge histogram poll interval threshold spill sticky placed
load balance least busy idle timeout deadline context cancel retry backoff header body json parse
decode encode buffer writer reader flush close open file path directory commit branch merge diff
review refactor rename extract inline move delete add update fix bug regression benchmark profile
memory allocation pointer slice map channel goroutine mutex lock atomic wait group select case
default break continue return defer panic recover string byte rune integer float boolean nil true
false when while because therefore however although which that this those these then than also
only every each some many more most less least first last next previous before after during under
over into onto from with without between across through should would could must might will can
we you they it is are was were be been being have has had do does did not no yes so if else`)
