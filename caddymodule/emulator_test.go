package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// TestEmulatedDataParallelServer runs Claude-Code-like conversations through
// Caddy to the emulated vLLM server with two data-parallel engines: every
// conversation stays on its engine (the engine that answered is the one the
// route header names), later turns hit the prefix cache, the card's token
// counts equal the usage the responses carried, summed client-side, and
// each engine's row shows the router's expected time to first token beside
// the measured one.
func TestEmulatedDataParallelServer(t *testing.T) {
	emu, err := emulator.NewServer(emulator.ServerConfig{DataParallel: 2, Speed: 50, Model: "qwen3-4b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	upstream := strings.TrimPrefix(emu.URLs()[0], "http://")
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, upstream, policyBlock("emu", "data_parallel_size 2\n max_num_seqs 32")))

	system := strings.Repeat("You are a careful coding agent. Follow the repository's conventions. ", 40)
	var want TokenCount
	where := map[string]string{}
	for turn := 1; turn <= 3; turn++ {
		for c := 0; c < 4; c++ {
			name := fmt.Sprintf("emu-%d", c)
			msgs := []map[string]any{{"role": "user", "content": fmt.Sprintf("Task %d: %s", c, strings.Repeat("read the code and fix the failing test. ", 30))}}
			for i := 1; i < turn; i++ {
				msgs = append(msgs, map[string]any{"role": "assistant", "content": "done step " + fmt.Sprint(i)},
					map[string]any{"role": "user", "content": "continue with step " + fmt.Sprint(i+1)})
			}
			body, _ := json.Marshal(map[string]any{
				"model": "qwen3-4b", "max_tokens": 8, "stream": true,
				"system": []map[string]any{{"type": "text", "text": system}}, "messages": msgs,
			})
			req, _ := http.NewRequest(http.MethodPost, siteURL+"/v1/messages?beta=true", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", name)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			p := vllmstats.NewUsageParser(vllmstats.APIAnthropic, true)
			_, _ = io.Copy(p, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s turn %d: %d", name, turn, resp.StatusCode)
			}
			replica, reason, _ := strings.Cut(resp.Header.Get(RouteHeader), "; ")
			if engine := upstream + "#" + resp.Header.Get(emulator.EngineHeader); engine != replica {
				t.Errorf("%s turn %d: routed to %s, answered by %s", name, turn, replica, engine)
			}
			if prev, ok := where[name]; ok && (prev != replica || reason != "sticky") {
				t.Errorf("%s turn %d: %s; %s, was on %s", name, turn, replica, reason, prev)
			}
			where[name] = replica
			u := p.Usage()
			if !u.Measured {
				t.Fatalf("%s turn %d: response carried no usage", name, turn)
			}
			want.Cached += uint64(u.CachedTokens)
			want.Computed += uint64(u.Computed())
			want.Generated += uint64(u.CompletionTokens)
		}
	}
	if want.Cached == 0 {
		t.Error("no prefix cache hits on later turns")
	}
	var got TokenCount
	for _, r := range getCard(t, "emu").Replicas {
		got.Cached += r.Tokens.Cached
		got.Computed += r.Tokens.Computed
		got.Generated += r.Tokens.Generated
	}
	if got != want {
		t.Errorf("card tokens %+v, responses carried %+v", got, want)
	}
	// every engine's turns checked the router's expected time to first
	// token against the time they met (recorded at each turn's end)
	waitFor(t, "the engines' expected and measured TTFT", func() bool {
		for _, r := range getCard(t, "emu").Replicas {
			if r.ExpectedTTFTS == nil || r.MeasuredTTFTS == nil || *r.MeasuredTTFTS <= 0 {
				return false
			}
		}
		return true
	})
}
