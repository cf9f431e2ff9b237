package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
)

// ccRequest is one request Claude Code sent, as testdata/claudecode holds
// it: the body as sent (tool descriptions trimmed) and the headers that
// matter for routing.
type ccRequest struct {
	File         string            `json:"file"`
	Conversation string            `json:"conversation"`
	Step         string            `json:"step"`
	Headers      map[string]string `json:"headers"`
	Path         string            `json:"path"`
	body         string
}

func loadClaudeCode(t *testing.T) []ccRequest {
	t.Helper()
	dir := filepath.Join("testdata", "claudecode")
	b, err := os.ReadFile(filepath.Join(dir, "requests.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reqs []ccRequest
	if err := json.Unmarshal(b, &reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		body, err := os.ReadFile(filepath.Join(dir, reqs[i].File))
		if err != nil {
			t.Fatal(err)
		}
		reqs[i].body = string(body)
	}
	return reqs
}

// TestClaudeCodeStartIsStable checks the start fingerprint on requests a
// real Claude Code sent: it stays the same over the turns of a
// conversation, over a second process continuing it (--continue) and for
// the summarising request of /compact, so restart detection never restarts
// such a turn; it changes on the first turn after /compact (same session
// ID, history replaced by the summary) and when the model is switched
// (another system prompt: nothing of the conversation's cache past the
// shared first block matches). /clear starts a new session ID.
func TestClaudeCodeStartIsStable(t *testing.T) {
	reqs := loadClaudeCode(t)
	// the start each request should have: requests with the same letter
	// have the same start
	want := map[string]string{
		"01-conv-a.json": "A", "02-conv-a.json": "A", "03-conv-a.json": "A",
		"04-conv-a.json": "A", "05-conv-a.json": "A", "06-conv-a.json": "B",
		"07-conv-b.json": "C", "08-conv-b.json": "C", "09-conv-b.json": "D",
	}
	if len(reqs) != len(want) {
		t.Fatalf("%d captured requests, want %d", len(reqs), len(want))
	}
	seen := map[string]uint64{} // letter -> fingerprint
	byFP := map[uint64]string{}
	for _, r := range reqs {
		t.Run(r.File, func(t *testing.T) {
			sid := r.Headers["X-Claude-Code-Session-Id"]
			if sid == "" {
				t.Fatalf("no session header (%s)", r.Step)
			}
			hdr := http.Header{}
			for k, v := range r.Headers {
				hdr.Set(k, v)
			}
			if key, _ := convkey.DefaultExtractor.FromHeaders(hdr); key != sid {
				t.Errorf("key from headers %q, want %q", key, sid)
			}
			if got := convkey.SessionFromBody(r.body); got != sid {
				t.Errorf("key from metadata %q, want the header's %q", got, sid)
			}
			fp, _ := convkey.SplitStart(convkey.StartFingerprint(r.body, DefaultFingerprintBytes))
			if fp == 0 {
				t.Fatal("no start fingerprint")
			}
			letter := want[r.File]
			if prev, ok := seen[letter]; ok && prev != fp {
				t.Errorf("%s: start %x, want %x as the conversation's earlier turns", r.Step, fp, prev)
			}
			if other, ok := byFP[fp]; ok && other != letter {
				t.Errorf("%s: start %x equals that of start %s", r.Step, fp, other)
			}
			seen[letter], byFP[fp] = fp, letter
		})
	}
}

// TestClaudeCodeFirstMessageInBudget: the fingerprint reaches the first
// user message of Claude Code's requests within the default budget (its
// system prompt is about 26 KB); were the budget spent on the system
// prompt, a compacted conversation would keep its start.
func TestClaudeCodeFirstMessageInBudget(t *testing.T) {
	for _, r := range loadClaudeCode(t) {
		if convkey.BudgetLeft(r.body, DefaultFingerprintBytes) <= 0 {
			t.Errorf("%s (%s): budget spent before the first user message", r.File, r.Step)
		}
	}
}

var maxTokens = regexp.MustCompile(`"max_tokens":[0-9]+`)

// TestClaudeCodeReplayThroughCaddy sends the captured requests through
// Caddy with the handler's default settings, in order: restart detection
// is on by default, so the conversation sticks over its turns and the
// summarising request; the one turn after /compact and the one after the
// model switch carry a new start that does not come again in these
// captures: side requests, on the conversation's replica.
func TestClaudeCodeReplayThroughCaddy(t *testing.T) {
	_, ids := startEmulator(t, 2, 50)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model cc-replay
			poll_interval 100ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
		}
		flush_interval -1
	}`, strings.Join(ids, " ")))
	want := []string{"placed", "sticky", "sticky", "sticky", "sticky", "side", "placed", "sticky", "side"}
	for i, r := range loadClaudeCode(t) {
		// the emulated model's context is 32K tokens: ask for few
		body := maxTokens.ReplaceAllString(r.body, `"max_tokens":16`)
		res := sendTurn(t, "/v1/messages", body, map[string]string{
			"X-Claude-Code-Session-Id": r.Headers["X-Claude-Code-Session-Id"],
			"Anthropic-Version":        r.Headers["Anthropic-Version"],
		})
		if res.status != http.StatusOK {
			t.Fatalf("%s: %d %s", r.File, res.status, res.body)
		}
		if res.reason != want[i] {
			t.Errorf("%s (%s): %s, want %s", r.File, r.Step, res.reason, want[i])
		}
	}
}

// TestStartFromPrefix: the start read from a body's first bytes is the
// start of the whole body whenever those bytes hold it, and is refused
// (the whole body is then read) when they end before the first user
// message does, wherever the cut falls: in captured Claude Code requests
// (model and messages come first) and in the emulated workload's shape.
func TestStartFromPrefix(t *testing.T) {
	bodies := map[string]string{}
	for _, r := range loadClaudeCode(t) {
		bodies[r.File] = r.body
	}
	bodies["system first"] = claudeBody("fix the bug in main.go", 3, "aaa")
	for name, body := range bodies {
		full := convkey.StartFingerprint(body, DefaultFingerprintBytes)
		if full == 0 {
			t.Fatalf("%s: no start", name)
		}
		var firstOK int
		for cut := 1; cut <= len(body); cut += 97 {
			fp, ok := convkey.StartFromPrefix(body[:cut], DefaultFingerprintBytes)
			if ok && fp != full {
				t.Fatalf("%s cut at %d: start %x, whole body's %x", name, cut, fp, full)
			}
			if ok && firstOK == 0 {
				firstOK = cut
			}
			if !ok && firstOK > 0 {
				t.Fatalf("%s: start read at a cut of %d bytes but refused at %d", name, firstOK, cut)
			}
		}
		if firstOK == 0 || firstOK > peekStartSize {
			t.Errorf("%s (%d bytes): start first readable from %d bytes, want within %d", name, len(body), firstOK, peekStartSize)
		}
		t.Logf("%s: %d bytes, start readable from the first %d", name, len(body), firstOK)
	}
}

// conversation renders an Anthropic request body of a conversation after n
// turns, as Claude Code does: a billing block that changes every request,
// cache_control on the last message only.
func claudeBody(first string, n int, billing string) string {
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-4b","max_tokens":256,"stream":true,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=` + billing + `;"},{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[`)
	msgs := []string{`{"role":"user","content":[{"type":"text","text":"` + first + `"}]}`}
	for i := 1; i < n; i++ {
		msgs = append(msgs, `{"role":"assistant","content":[{"type":"text","text":"answer"}]}`,
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}`)
	}
	last := msgs[len(msgs)-1]
	msgs[len(msgs)-1] = strings.Replace(last, `}]}`, `,"cache_control":{"type":"ephemeral"}}]}`, 1)
	b.WriteString(strings.Join(msgs, ","))
	b.WriteString(`]}`)
	return b.String()
}
