package emulator

import (
	"io"
	"net/http"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// The project's own metrics reader sees what the engines count.
func TestMetricsReadByVllmstats(t *testing.T) {
	s := startServer(t, ServerConfig{DataParallel: 2, Model: "qwen3-4b"})
	u := s.URLs()[0]
	body := chatBody(longText("v", 1500), 3, false)
	post(t, u+"/v1/chat/completions", body, RankHeader, "1")
	post(t, u+"/v1/chat/completions", body, RankHeader, "1")
	resp, err := http.Get(u + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := vllmstats.ParseMetrics(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("engines %v", got)
	}
	for _, eng := range []string{"0", "1"} {
		m := got[eng]
		idx := 0
		if eng == "1" {
			idx = 1
		}
		st, _ := s.EngineStats(idx)
		if m.ModelName != "qwen3-4b" || m.BlockSize != 16 || m.NumGPUBlocks != 2300 || m.KVCapacityTokens != 36800 {
			t.Fatalf("engine %s: %+v", eng, m)
		}
		if m.PrefixQueries != float64(st.PrefixQueries) || m.PrefixHits != float64(st.PrefixHits) ||
			m.PromptTokens != float64(st.PromptTokens) || m.GenerationTokens != float64(st.GenerationTokens) {
			t.Fatalf("engine %s: parsed %+v, engine %+v", eng, m, st)
		}
	}
	if got["1"].PrefixHits == 0 || got["0"].PrefixQueries != 0 {
		t.Fatalf("hits on the wrong engine: %+v %+v", got["0"], got["1"])
	}
}

// The project's usage reader gets prompt and cached tokens from every
// response shape the emulator writes.
func TestUsageReadByVllmstats(t *testing.T) {
	s := startServer(t, ServerConfig{})
	u := s.URLs()[0]
	user := longText("u", 1200)
	anth := func(stream bool) map[string]any {
		return map[string]any{"model": "m", "max_tokens": 5, "stream": stream, "system": "sys", "messages": []map[string]any{{"role": "user", "content": user}}}
	}
	tests := []struct {
		name   string
		path   string
		api    vllmstats.API
		stream bool
		body   map[string]any
	}{
		{"chat json", "/v1/chat/completions", vllmstats.APIOpenAI, false, chatBody(user, 5, false)},
		{"chat sse", "/v1/chat/completions", vllmstats.APIOpenAI, true, chatBody(user, 5, true)},
		{"messages json", "/v1/messages", vllmstats.APIAnthropic, false, anth(false)},
		{"messages sse", "/v1/messages", vllmstats.APIAnthropic, true, anth(true)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			post(t, u+tt.path, tt.body) // warm the cache
			resp := post(t, u+tt.path, tt.body)
			p := vllmstats.NewUsageParser(tt.api, tt.stream)
			if _, err := io.Copy(p, resp.Body); err != nil {
				t.Fatal(err)
			}
			got := p.Usage()
			if !got.Measured || !got.CachedMeasured || got.CompletionTokens != 5 || got.CachedTokens == 0 || got.CachedTokens != (got.PromptTokens-1)/16*16 {
				t.Fatalf("usage %+v", got)
			}
		})
	}
}

// The usage parser reads the Responses API's usage as the emulator writes
// it, streamed and not: the same figures as the response object's.
func TestResponsesUsageReadByVllmstats(t *testing.T) {
	s := startServer(t, ServerConfig{})
	u := s.URLs()[0] + "/v1/responses"
	body := map[string]any{"model": "m", "instructions": longText("i", 800), "input": "hello", "max_output_tokens": 40}
	for round, stream := range []bool{false, true, true} {
		body["stream"] = stream
		resp := post(t, u, body)
		p := vllmstats.NewUsageParser(vllmstats.APIResponses, stream)
		if _, err := io.Copy(p, resp.Body); err != nil {
			t.Fatal(err)
		}
		got := p.Usage()
		if !got.Measured || !got.CachedMeasured || got.CompletionTokens != 40 || got.PromptTokens < 800 {
			t.Fatalf("round %d (stream %v): %+v", round, stream, got)
		}
		if round > 0 && got.CachedTokens != (got.PromptTokens-1)/16*16 {
			t.Fatalf("round %d: cached %d of %d", round, got.CachedTokens, got.PromptTokens)
		}
	}
}
