package caddymodule

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

var responsesRuns int

// TestResponsesThroughCaddy sends growing Responses API conversations,
// streamed and not, through Caddy to four emulated replicas, keyed three
// ways: a session header (as Codex sends Session-Id), the body's
// prompt_cache_key alone, and nothing (the fingerprint of instructions and
// the first input items). Every conversation stays on one replica, none is
// a per-request pick, the card counts each request under its key's
// source (JSON and Prometheus), and its token counts equal the usage the
// responses carried, read client-side.
func TestResponsesThroughCaddy(t *testing.T) {
	_, ids := startEmulatorConfig(t, emulator.ServerConfig{Replicas: 4, Speed: 50, Model: "qwen3-4b"})
	responsesRuns++
	model := fmt.Sprintf("responses-%d", responsesRuns)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, strings.Join(ids, " "), policyBlock(model, "")))

	instructions := strings.Repeat("You are a coding agent running in a terminal. ", 30)
	type conv struct {
		name, source string
		hdr          map[string]string
		cacheKey     string
		input        []map[string]any
	}
	var convs []*conv
	for i := range 3 {
		for _, src := range []string{"header", "body", "fingerprint"} {
			c := &conv{name: fmt.Sprintf("%s-%d", src, i), source: src, hdr: map[string]string{}}
			switch src {
			case "header":
				c.hdr["Session-Id"] = c.name
				c.cacheKey = c.name
			case "body":
				c.cacheKey = c.name
			}
			c.input = []map[string]any{
				{"type": "message", "role": "developer", "content": []map[string]any{{"type": "input_text", "text": "<permissions instructions>sandboxed</permissions instructions>"}}},
				{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": "<environment_context><cwd>/work/" + c.name + "</cwd></environment_context>"}}},
				{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": "Task " + c.name + ": " + strings.Repeat("fix the failing test. ", 40)}}},
			}
			convs = append(convs, c)
		}
	}
	var want TokenCount
	where := map[string]string{}
	wantSources := map[string]uint64{}
	for turn := 1; turn <= 3; turn++ {
		for _, c := range convs {
			stream := turn != 2
			body := map[string]any{"model": "qwen3-4b", "instructions": instructions, "input": c.input,
				"tools":       []map[string]any{{"type": "function", "name": "shell", "parameters": map[string]any{"type": "object"}}},
				"tool_choice": "auto", "parallel_tool_calls": false, "store": false, "stream": stream,
				"include": []string{}, "max_output_tokens": 8}
			if c.cacheKey != "" {
				body["prompt_cache_key"] = c.cacheKey
			}
			b, _ := json.Marshal(body)
			res := sendTurn(t, "/v1/responses", string(b), c.hdr)
			if res.status != 200 {
				t.Fatalf("%s turn %d: %d %s", c.name, turn, res.status, res.body)
			}
			p := vllmstats.NewUsageParser(vllmstats.APIResponses, stream)
			_, _ = p.Write([]byte(res.body))
			u := p.Usage()
			if !u.Measured || !u.CachedMeasured {
				t.Fatalf("%s turn %d: no usage read from %.300s", c.name, turn, res.body)
			}
			want.Cached += uint64(u.CachedTokens)
			want.Computed += uint64(u.Computed())
			want.Generated += uint64(u.CompletionTokens)
			wantSources[res.replica+" "+c.source]++
			if res.reason == "no-key" {
				t.Errorf("%s turn %d: no-key", c.name, turn)
			}
			if prev, ok := where[c.name]; ok && (prev != res.replica || res.reason != "sticky") {
				t.Errorf("%s turn %d: %s; %s, was on %s", c.name, turn, res.replica, res.reason, prev)
			}
			where[c.name] = res.replica
			if turn > 1 && u.CachedTokens == 0 {
				t.Errorf("%s turn %d: nothing cached", c.name, turn)
			}
			// the reply and the next user message join the conversation
			var reply string
			if stream {
				reply = completedText(t, res.body)
			} else {
				var r emulator.ResponsesResponse
				if err := json.Unmarshal([]byte(res.body), &r); err != nil {
					t.Fatal(err)
				}
				reply = r.Output[0].Content[0].Text
			}
			c.input = append(c.input,
				map[string]any{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": reply}}},
				map[string]any{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": fmt.Sprintf("now step %d", turn+1)}}})
		}
	}
	var got TokenCount
	card := getCard(t, model)
	for _, r := range card.Replicas {
		got.Cached += r.Tokens.Cached
		got.Computed += r.Tokens.Computed
		got.Generated += r.Tokens.Generated
		if r.NoKey != 0 || r.KeyedBy.None != 0 {
			t.Errorf("%s: no_key %d, keyed by none %d", r.ID, r.NoKey, r.KeyedBy.None)
		}
		for src, n := range map[string]uint64{"header": r.KeyedBy.Header, "body": r.KeyedBy.Body, "fingerprint": r.KeyedBy.Fingerprint} {
			if n != wantSources[r.ID+" "+src] {
				t.Errorf("%s: keyed by %s %d, sent %d", r.ID, src, n, wantSources[r.ID+" "+src])
			}
			if m := modelCounter(t, "lm_warden_key_source_requests_total", model, r.ID, map[string]string{"source": src}); m != float64(n) {
				t.Errorf("%s: Prometheus keyed by %s %v, card %d", r.ID, src, m, n)
			}
		}
		if m := modelCounter(t, "lm_warden_unmeasured_requests_total", model, r.ID, nil); m != 0 {
			t.Errorf("%s: %v unmeasured requests", r.ID, m)
		}
	}
	if got != want || want.Cached == 0 {
		t.Errorf("card tokens %+v, responses carried %+v", got, want)
	}
}

// completedText returns the output text of a Responses stream's
// response.completed event.
func completedText(t *testing.T, stream string) string {
	t.Helper()
	for _, line := range strings.Split(stream, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.Contains(data, `"response.completed"`) {
			continue
		}
		var ev struct {
			Response emulator.ResponsesResponse `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		return ev.Response.Output[0].Content[0].Text
	}
	t.Fatalf("no response.completed in %.300s", stream)
	return ""
}
