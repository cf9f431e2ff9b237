package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
)

// ccLive is one request interactive Claude Code sent, as
// testdata/claudecode-interactive holds it.
type ccLive struct {
	File    string            `json:"file"`
	Session string            `json:"session"` // the capture it belongs to
	Method  string            `json:"method"`
	Path    string            `json:"path"`
	Kind    string            `json:"kind"`    // main (a turn of the conversation), agent (a sub-agent's turn), side, probe
	Segment string            `json:"segment"` // the conversation: A, C after /compact, M after /model, B after /clear; S a sub-agent
	Step    string            `json:"step"`
	Headers map[string]string `json:"headers"`
	body    string
}

func loadInteractive(t *testing.T) []ccLive {
	t.Helper()
	dir := filepath.Join("testdata", "claudecode-interactive")
	b, err := os.ReadFile(filepath.Join(dir, "requests.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reqs []ccLive
	if err := json.Unmarshal(b, &reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if reqs[i].File == "" {
			continue
		}
		body, err := os.ReadFile(filepath.Join(dir, reqs[i].File))
		if err != nil {
			t.Fatal(err)
		}
		reqs[i].body = string(body)
	}
	return reqs
}

// TestClaudeCodeInteractiveStarts checks the start fingerprint on what an
// interactive Claude Code sent: the turns of one conversation share a
// start, the summarising requests of /compact keep it, the turns after
// /compact share a new one, as do the turns after /model switched to
// another served model name; a sub-agent's turns share a start of their
// own; title requests and auto mode's classifier calls have starts unlike
// any turn's and hold one message (lone), which no turn of a conversation
// or a sub-agent does.
func TestClaudeCodeInteractiveStarts(t *testing.T) {
	main := map[string]uint64{} // session/segment -> start of its turns
	side := map[uint64]string{}
	for _, r := range loadInteractive(t) {
		if r.Kind == "probe" {
			continue
		}
		fp, lone := convkey.SplitStart(convkey.StartFingerprint(r.body, DefaultFingerprintBytes))
		if fp == 0 {
			t.Fatalf("%s: no start", r.File)
		}
		if lone != (r.Kind == "side") {
			t.Errorf("%s (%s): lone %v; want lone exactly for side requests (one message)", r.File, r.Step, lone)
		}
		seg := r.Session + "/" + r.Segment
		switch r.Kind {
		case "main", "agent":
			if prev, ok := main[seg]; ok && prev != fp {
				t.Errorf("%s (%s): start %x, want %x as the conversation's earlier turns", r.File, r.Step, fp, prev)
			}
			main[seg] = fp
		case "side":
			// retries of a classifier call repeat its start
			side[fp] = r.File
		}
	}
	segOf := map[uint64]string{}
	for seg, fp := range main {
		if f, ok := side[fp]; ok {
			t.Errorf("conversation %s has the start of side request %s", seg, f)
		}
		if other, ok := segOf[fp]; ok && strings.SplitN(other, "/", 2)[0] == strings.SplitN(seg, "/", 2)[0] {
			t.Errorf("conversations %s and %s of one session share a start", other, seg)
		}
		segOf[fp] = seg
	}
	for _, seg := range []string{"s4/A", "s4/M", "s4/S", "s5/C", "s5/M", "s5/S"} {
		if _, ok := main[seg]; !ok {
			t.Errorf("no turns of %s: fixtures incomplete", seg)
		}
	}
	if len(side) == 0 || len(main) < 4 {
		t.Fatalf("%d side starts, %d conversations: fixtures incomplete", len(side), len(main))
	}
}

var interactiveRuns int

// TestClaudeCodeInteractiveReplayThroughCaddy sends what five
// interactive Claude Code sessions sent (one with its title requests, one
// with CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, one whose Agent call
// auto mode's classifier checked, retrying its calls, two with a sub-agent
// and a /model switch to another served model name, the second also with
// a /compact before the switch) through Caddy with
// four replicas, in order: every turn of a conversation lands on one
// replica, a /compact and a /model switch each cost exactly one restart and
// no move, a sub-agent (its own key: session and X-Claude-Code-Agent-Id) is
// placed on its parent's replica and stays there without a restart, title
// requests are counted as side requests, and the keyless HEAD /api/hello
// (404 from the emulator, as from vLLM) takes no replica out.
func TestClaudeCodeInteractiveReplayThroughCaddy(t *testing.T) {
	// KV caches as large as the captures' own set-up had (100,000 blocks):
	// the subject is where side requests, restarts and sub-agents go, and
	// with the reference card's 36,800 tokens a ≈35k-token conversation
	// fills its replica, so working-set admission would place its sub-agent
	// elsewhere on some runs, depending on when its turns ended
	engine := emulator.DefaultEngineConfig()
	engine.NumGPUBlocks = 100000
	engine.MaxModelLen = 400000
	_, ids := startEmulatorConfig(t, emulator.ServerConfig{Replicas: 4, Speed: 50, Model: "qwen3-4b", Engine: engine})
	// a model name of its own per run: a router outlives a reload, and the
	// bindings of an earlier run (-count) would name replicas now gone
	interactiveRuns++
	model := fmt.Sprintf("cc-interactive-%d", interactiveRuns)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			poll_interval 100ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
		}
		flush_interval -1
	}`, strings.Join(ids, " "), model))
	where := map[string]string{} // session/segment -> replica of its turns
	sessionOf := map[string]string{}
	reasons := map[string]int{}
	restarts := map[string]int{} // session/segment -> its requests counted restarted
	agents := map[string]bool{}  // sub-agent keys seen
	for _, r := range loadInteractive(t) {
		if r.Kind == "probe" {
			req, err := http.NewRequest(r.Method, siteURL+r.Path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			continue
		}
		body := maxTokens.ReplaceAllString(r.body, `"max_tokens":16`)
		hdr := map[string]string{
			"X-Claude-Code-Session-Id": r.Headers["X-Claude-Code-Session-Id"],
			"Anthropic-Version":        r.Headers["Anthropic-Version"],
		}
		agent := r.Headers["X-Claude-Code-Agent-Id"]
		if agent != "" {
			hdr["X-Claude-Code-Agent-Id"] = agent
		}
		if (agent != "") != (r.Kind == "agent") {
			t.Fatalf("%s (%s): agent header %q for a %s request", r.File, r.Step, agent, r.Kind)
		}
		res := sendTurn(t, r.Path, body, hdr)
		if res.status != http.StatusOK {
			t.Fatalf("%s (%s): %d %s", r.File, r.Step, res.status, res.body)
		}
		reasons[res.reason]++
		seg := r.Session + "/" + r.Segment
		if _, ok := restarts[seg]; !ok || res.reason == "restarted" {
			restarts[seg] += map[bool]int{true: 1}[res.reason == "restarted"]
		}
		sid := r.Headers["X-Claude-Code-Session-Id"]
		if r.Kind == "agent" {
			// a new key whose parent (the session's conversation) is
			// bound: placed on the parent's replica, where the system
			// prompt and tools it shares are cached; then sticky
			want := "sticky"
			if key := sid + "/" + agent; !agents[key] {
				agents[key], want = true, "placed"
			}
			if res.reason != want || res.replica != sessionOf[sid] {
				t.Errorf("%s (%s): %s on %s, want %s on the parent's replica %s", r.File, r.Step, res.reason, res.replica, want, sessionOf[sid])
			}
		}
		if prev, ok := sessionOf[sid]; !ok {
			sessionOf[sid] = res.replica
		} else if res.replica != prev {
			// nothing here is over the threshold: even side requests
			// stay with their session's conversation
			t.Errorf("%s (%s, %s): on %s, its session's requests on %s", r.File, r.Step, res.reason, res.replica, prev)
		}
		if _, seen := where[seg]; !seen && r.Kind == "main" && (r.Segment == "C" || r.Segment == "M") && res.reason != "side" {
			// its new start has not come before: a side request, on the
			// conversation's replica, until it recurs
			t.Errorf("%s (%s): %s, want side for the first turn with a new start", r.File, r.Step, res.reason)
		}
		if r.Kind == "main" || r.Kind == "agent" {
			if prev, ok := where[seg]; ok && prev != res.replica {
				t.Errorf("%s (%s): turn on %s, the conversation's earlier turns on %s", r.File, r.Step, res.replica, prev)
			}
			where[seg] = res.replica
		}
		if r.Kind == "side" && res.reason != "side" && res.reason != "placed" {
			t.Errorf("%s (%s): %s, want side (or placed, a session's first request)", r.File, r.Step, res.reason)
		}
		if res.reason == "spilled" || res.reason == "re-placed" || res.reason == "cold-replaced" {
			t.Errorf("%s (%s): %s", r.File, r.Step, res.reason)
		}
	}
	// the conversation goes on with a new start after /compact (C) and
	// after /model names another model (M): one restart each, on the turn
	// where the new start recurs; nothing else restarts
	want := 0
	for seg, n := range restarts {
		w := 0
		if strings.HasSuffix(seg, "/C") || strings.HasSuffix(seg, "/M") {
			w = 1
		}
		want += w
		if n != w {
			t.Errorf("%s: restarted %d, want %d", seg, n, w)
		}
	}
	if reasons["restarted"] != want || want != 5 || len(agents) != 2 {
		t.Errorf("restarted %d, want %d: one per /compact and /model switch; %d sub-agents (reasons %v)", reasons["restarted"], want, len(agents), reasons)
	}
	var side, restarted, fails uint64
	c := getCard(t, model)
	for _, row := range c.Replicas {
		side += row.Side
		restarted += row.Restarted
		fails += row.ProxyFailures
		if !row.Available {
			t.Errorf("%s out after the replay: %v", row.ID, row.Out)
		}
		if p := modelCounter(t, "lm_warden_requests_total", model, row.ID, map[string]string{"reason": "side"}); p != float64(row.Side) {
			t.Errorf("%s: Prometheus side %v, card %d", row.ID, p, row.Side)
		}
	}
	if side != uint64(reasons["side"]) || side == 0 || restarted != uint64(reasons["restarted"]) || fails != 0 {
		t.Errorf("card: side %d restarted %d proxy failures %d; responses said side %d restarted %d", side, restarted, fails, reasons["side"], reasons["restarted"])
	}
	t.Logf("reasons %v; conversations on %v", reasons, where)
}
