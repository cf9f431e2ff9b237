package caddymodule

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// agentRequest is one request a coding agent sent, as testdata/codex and
// testdata/opencode hold it: the body (prose replaced by filler of the
// same length), the headers it sent, and the route the live run's card
// gave it (replica; reason).
type agentRequest struct {
	File         string            `json:"file"`
	Conversation string            `json:"conversation"`
	Step         string            `json:"step"`
	Path         string            `json:"path"`
	Headers      map[string]string `json:"headers"`
	LiveRoute    string            `json:"live_route"`
	body         string
}

func loadAgent(t *testing.T, agent string) []agentRequest {
	t.Helper()
	dir := filepath.Join("testdata", agent)
	b, err := os.ReadFile(filepath.Join(dir, "requests.json"))
	if err != nil {
		t.Fatal(err)
	}
	var reqs []agentRequest
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
	if len(reqs) == 0 {
		t.Fatalf("no requests in %s", dir)
	}
	return reqs
}

// codexSessionHeaders are the headers in which Codex sends its thread ID
// (X-Codex-Turn-Metadata and the window ID carry it too).
var codexSessionHeaders = []string{"Session-Id", "Thread-Id", "X-Client-Request-Id", "X-Codex-Window-Id", "X-Codex-Turn-Metadata"}

var agentRuns int

// TestAgentReplayThroughCaddy sends what Codex 0.171.0 and OpenCode
// 1.18.33 sent through Caddy to four emulated replicas, in order: Codex
// as captured (keyed by Session-Id), Codex without any header carrying
// its thread ID (keyed by the body's prompt_cache_key), and OpenCode
// (keyed by X-Session-Affinity). Every conversation's requests land on
// one replica, none is a per-request pick, each gets the reason the live
// run's card gave it (Codex's compaction request sticky, the turn after it
// a side request, the next restarted; OpenCode's title request placing
// the conversation, its first turn a side request), the card counts each
// request under its key's source, and the card's token counts equal the
// usage the engine reported in the responses.
func TestAgentReplayThroughCaddy(t *testing.T) {
	for _, tc := range []struct {
		name, agent, source string
		strip               []string
	}{
		{"codex", "codex", "header", nil},
		{"codex without session headers", "codex", "body", codexSessionHeaders},
		{"opencode", "opencode", "header", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ids := startEmulatorConfig(t, emulator.ServerConfig{Replicas: 4, Speed: 50, Model: "qwen3-4b", DefaultMaxTokens: 16})
			agentRuns++
			model := fmt.Sprintf("agent-%d", agentRuns)
			loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, strings.Join(ids, " "), policyBlock(model, "")))
			where := map[string]string{}
			var want TokenCount
			var requests uint64
			for _, r := range loadAgent(t, tc.agent) {
				hdr := map[string]string{}
				for k, v := range r.Headers {
					hdr[k] = v
				}
				for _, k := range tc.strip {
					delete(hdr, k)
				}
				body := maxTokens.ReplaceAllString(r.body, `"max_tokens":16`)
				res := sendTurn(t, r.Path, body, hdr)
				if res.status != 200 {
					t.Fatalf("%s (%s): %d %s", r.File, r.Step, res.status, res.body)
				}
				requests++
				_, liveReason, _ := strings.Cut(r.LiveRoute, "; ")
				if res.reason != liveReason {
					t.Errorf("%s (%s): %s, the live run's card said %s", r.File, r.Step, res.reason, liveReason)
				}
				if prev, ok := where[r.Conversation]; ok && prev != res.replica {
					t.Errorf("%s (%s): on %s, its conversation's earlier requests on %s", r.File, r.Step, res.replica, prev)
				}
				where[r.Conversation] = res.replica
				api := apiOf(r.Path)
				p := vllmstats.NewUsageParser(api, true)
				_, _ = p.Write([]byte(res.body))
				u := p.Usage()
				if !u.Measured || !u.CachedMeasured {
					t.Fatalf("%s: no usage in the response %.200s", r.File, res.body)
				}
				want.Cached += uint64(u.CachedTokens)
				want.Computed += uint64(u.Computed())
				want.Generated += uint64(u.CompletionTokens)
			}
			replicas := map[string]bool{}
			for _, id := range where {
				replicas[id] = true
			}
			if len(where) != 2 || len(replicas) != 2 {
				t.Errorf("conversations on %v: want two, each on a replica of its own", where)
			}
			var got TokenCount
			var keyed uint64
			for _, row := range getCard(t, model).Replicas {
				got.Cached += row.Tokens.Cached
				got.Computed += row.Tokens.Computed
				got.Generated += row.Tokens.Generated
				if row.NoKey != 0 || row.KeyedBy.None != 0 || row.KeyedBy.Fingerprint != 0 {
					t.Errorf("%s: no_key %d, keyed by %+v", row.ID, row.NoKey, row.KeyedBy)
				}
				switch tc.source {
				case "header":
					keyed += row.KeyedBy.Header
				case "body":
					keyed += row.KeyedBy.Body
				}
			}
			if keyed != requests {
				t.Errorf("%d requests keyed by %s, want all %d", keyed, tc.source, requests)
			}
			if got != want || want.Cached == 0 {
				t.Errorf("card tokens %+v, the engine reported %+v", got, want)
			}
		})
	}
}

// TestCodexStarts: in Codex's requests the conversation's start (its
// developer messages and its first user message, the environment) is the
// same over its turns and its compaction request, and changes with the
// compacted history that follows; prompt_cache_key is the thread ID of
// Session-Id on every request.
func TestCodexStarts(t *testing.T) {
	reqs := loadAgent(t, "codex")
	starts := map[string]uint64{}
	for _, r := range reqs {
		if got, want := convkey.PromptCacheKey(r.body), r.Headers["Session-Id"]; got != want || got == "" {
			t.Errorf("%s: prompt_cache_key %q, Session-Id %q", r.File, got, want)
		}
		st, _ := convkey.SplitStart(convkey.StartFingerprintOf(r.body, DefaultFingerprintBytes, convkey.ShapeResponses))
		if st == 0 {
			t.Fatalf("%s: no start", r.File)
		}
		first, ok := starts[r.Conversation]
		if !ok {
			starts[r.Conversation] = st
			continue
		}
		// 08 and 09 follow the compaction: the history is the summary's
		compacted := r.File == "08-conv-b.json" || r.File == "09-conv-b.json"
		if (st == first) == compacted {
			t.Errorf("%s (%s): start %x, the conversation's first %x", r.File, r.Step, st, first)
		}
	}
}
