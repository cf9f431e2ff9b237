package emulator

import (
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
