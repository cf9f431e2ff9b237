package emulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func startServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.Speed == 0 {
		cfg.Speed = 1000
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var client = &http.Client{Timeout: 30 * time.Second}

func post(t *testing.T, url string, body any, hdr ...string) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sseEvent is one server-sent event as a client reads it.
type sseEvent struct{ name, data string }

func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.data != "" || cur.name != "" {
				out = append(out, cur)
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Client-side shapes, as the OpenAI and Anthropic SDKs name the fields.
type oaChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

type anUsage struct {
	InputTokens              *int `json:"input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

type anEvent struct {
	Type    string `json:"type"`
	Index   *int   `json:"index"`
	Message *struct {
		ID         string          `json:"id"`
		Type       string          `json:"type"`
		Role       string          `json:"role"`
		Content    []any           `json:"content"`
		StopReason *string         `json:"stop_reason"`
		Usage      anUsage         `json:"usage"`
		Extra      json.RawMessage `json:"-"`
	} `json:"message"`
	ContentBlock *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type       string  `json:"type"`
		Text       string  `json:"text"`
		StopReason *string `json:"stop_reason"`
	} `json:"delta"`
	Usage *anUsage `json:"usage"`
}

func longText(tag string, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		fmt.Fprintf(&b, "%s%d ", tag, i)
		if i%40 == 39 {
			b.WriteString("\n")
		}
	}
	return b.String()
}

func chatBody(user string, maxTokens int, stream bool) map[string]any {
	return map[string]any{
		"model":          "qwen3-4b",
		"messages":       []map[string]any{{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": user}},
		"max_tokens":     maxTokens,
		"stream":         stream,
		"stream_options": map[string]any{"include_usage": true},
	}
}

func TestChatCompletionStream(t *testing.T) {
	s := startServer(t, ServerConfig{})
	resp := post(t, s.URLs()[0]+"/v1/chat/completions", chatBody("hello there", 5, true))
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp.Header.Get(EngineHeader) != "0" {
		t.Fatalf("engine header %q", resp.Header.Get(EngineHeader))
	}
	events := readSSE(t, resp.Body)
	if events[len(events)-1].data != "[DONE]" {
		t.Fatal("stream does not end with [DONE]")
	}
	var chunks []oaChunk
	for _, ev := range events[:len(events)-1] {
		var c oaChunk
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatal(err)
		}
		if c.Object != "chat.completion.chunk" {
			t.Fatalf("object %q", c.Object)
		}
		chunks = append(chunks, c)
	}
	if chunks[0].Choices[0].Delta.Role != "assistant" {
		t.Fatal("first chunk has no assistant role")
	}
	var text strings.Builder
	content := 0
	for _, c := range chunks[1 : len(chunks)-1] {
		text.WriteString(*c.Choices[0].Delta.Content)
		content++
	}
	if content != 5 {
		t.Fatalf("%d content chunks, want 5", content)
	}
	if fr := chunks[len(chunks)-2].Choices[0].FinishReason; fr == nil || *fr != "length" {
		t.Fatal("last content chunk lacks finish_reason length")
	}
	u := chunks[len(chunks)-1]
	if len(u.Choices) != 0 || u.Usage == nil || u.Usage.CompletionTokens != 5 || u.Usage.PromptTokensDetails == nil {
		t.Fatalf("bad usage chunk %+v", u)
	}
	if u.Usage.PromptTokens != len(Tokenize(text.String()))*0+u.Usage.PromptTokens || len(Tokenize(text.String())) != 5 {
		t.Fatal("generated text does not tokenize to the completion tokens")
	}
}

func TestSamePromptTwiceCachesOnOneReplicaOnly(t *testing.T) {
	s := startServer(t, ServerConfig{Replicas: 2})
	body := chatBody(longText("w", 3000), 8, false)
	usage := func(url string) (prompt, cached int) {
		resp := post(t, url+"/v1/chat/completions", body)
		var c oaChunk
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		if c.Object != "chat.completion" || c.Choices[0].Message.Role != "assistant" || *c.Choices[0].FinishReason != "length" {
			t.Fatalf("bad completion %+v", c)
		}
		return c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens
	}
	hits := func(url string) float64 {
		m := scrape(t, url)
		return sampleValue(t, m, "vllm:prefix_cache_hits_total", "0")
	}
	u0, u1 := s.URLs()[0], s.URLs()[1]
	p1, c1 := usage(u0)
	h1 := hits(u0)
	p2, c2 := usage(u0)
	h2 := hits(u0)
	if c1 != 0 || c2 == 0 || c2 != (p2-1)/16*16 || p1 != p2 {
		t.Fatalf("cached first %d second %d of %d", c1, c2, p2)
	}
	if h2-h1 != float64(c2) {
		t.Fatalf("hits counter moved by %v, usage says %d", h2-h1, c2)
	}
	if _, c3 := usage(u1); c3 != 0 {
		t.Fatalf("other replica reports %d cached tokens", c3)
	}
	if v := hits(u1); v != 0 {
		t.Fatalf("other replica's hits counter %v", v)
	}
}

func scrape(t *testing.T, url string) map[string]*dtoFamily {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("expfmt: %v", err)
	}
	return fams
}

func TestAnthropicMessagesStream(t *testing.T) {
	s := startServer(t, ServerConfig{})
	body := map[string]any{
		"model": "claude-sonnet-4-5", "max_tokens": 4, "stream": true,
		"system": []map[string]any{
			{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
			{"type": "text", "text": "You are Claude Code. " + longText("s", 200)},
		},
		"messages": []map[string]any{
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "fix the bug"}}},
			{"role": "assistant", "content": []map[string]any{{"type": "text", "text": "Looking."}, {"type": "tool_use", "id": "t1", "name": "Read", "input": map[string]any{"path": "a.go"}}}},
			{"role": "user", "content": []map[string]any{{"type": "tool_result", "tool_use_id": "t1", "content": "package a"}}},
		},
		"tools": []map[string]any{{"name": "Read", "input_schema": map[string]any{"type": "object"}}},
	}
	run := func() (events []sseEvent, start, delta anEvent) {
		resp := post(t, s.URLs()[0]+"/v1/messages?beta=true", body, "anthropic-version", "2023-06-01")
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		events = readSSE(t, resp.Body)
		want := []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}
		if len(events) != len(want) {
			t.Fatalf("%d events, want %d: %+v", len(events), len(want), events)
		}
		for i, ev := range events {
			var e anEvent
			if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
				t.Fatal(err)
			}
			if ev.name != want[i] || e.Type != want[i] {
				t.Fatalf("event %d is %q/%q, want %q", i, ev.name, e.Type, want[i])
			}
			switch e.Type {
			case "message_start":
				start = e
			case "content_block_start":
				if e.ContentBlock == nil || e.ContentBlock.Type != "text" || e.Index == nil || *e.Index != 0 {
					t.Fatalf("bad content_block_start %s", ev.data)
				}
			case "content_block_delta":
				if e.Delta == nil || e.Delta.Type != "text_delta" || e.Delta.Text == "" {
					t.Fatalf("bad delta %s", ev.data)
				}
			case "message_delta":
				delta = e
			}
		}
		return events, start, delta
	}
	_, s1, d1 := run()
	m := s1.Message
	if m == nil || m.Type != "message" || m.Role != "assistant" || m.Content == nil || len(m.Content) != 0 || m.StopReason != nil {
		t.Fatalf("bad message_start %+v", m)
	}
	u := m.Usage
	if u.InputTokens == nil || u.CacheReadInputTokens == nil || u.CacheCreationInputTokens == nil || u.OutputTokens == nil {
		t.Fatal("message_start usage lacks a field")
	}
	if *u.CacheReadInputTokens != 0 || *u.CacheCreationInputTokens != 0 || *u.InputTokens < 200 {
		t.Fatalf("first message_start usage %+v", u)
	}
	if d1.Delta.StopReason == nil || *d1.Delta.StopReason != "max_tokens" || d1.Usage == nil || *d1.Usage.OutputTokens != 4 {
		t.Fatalf("bad message_delta %+v", d1)
	}
	// Second time: the billing header is excluded, so the prompt hits.
	body["system"].([]map[string]any)[0]["text"] = "x-anthropic-billing-header: cc_version=1; cch=def;"
	_, s2, _ := run()
	u2 := s2.Message.Usage
	total := *u.InputTokens
	if *u2.CacheReadInputTokens != (total-1)/16*16 || *u2.InputTokens != total-*u2.CacheReadInputTokens {
		t.Fatalf("second usage %+v, prompt %d", u2, total)
	}
	// count_tokens agrees with the prompt size.
	resp := post(t, s.URLs()[0]+"/v1/messages/count_tokens", body)
	var ct struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ct); err != nil || ct.InputTokens != total {
		t.Fatalf("count_tokens %d, want %d (%v)", ct.InputTokens, total, err)
	}
}

func TestAnthropicMessagesJSON(t *testing.T) {
	s := startServer(t, ServerConfig{})
	resp := post(t, s.URLs()[0]+"/v1/messages", map[string]any{
		"model": "m", "max_tokens": 3, "messages": []map[string]any{{"role": "user", "content": "hi"}},
	})
	var m struct {
		ID         string `json:"id"`
		Type       string `json:"type"`
		Role       string `json:"role"`
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		Usage anUsage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.Type != "message" || m.Role != "assistant" || m.StopReason != "max_tokens" || len(m.Content) != 1 || m.Content[0].Type != "text" || *m.Usage.OutputTokens != 3 || !strings.HasPrefix(m.ID, "msg_") {
		t.Fatalf("bad message %+v", m)
	}
}

func TestCompletionsStream(t *testing.T) {
	s := startServer(t, ServerConfig{})
	resp := post(t, s.URLs()[0]+"/v1/completions", map[string]any{"model": "m", "prompt": "once upon", "max_tokens": 3, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	events := readSSE(t, resp.Body)
	if len(events) != 5 || events[4].data != "[DONE]" {
		t.Fatalf("events %+v", events)
	}
	var last oaChunk
	json.Unmarshal([]byte(events[3].data), &last)
	if last.Object != "text_completion" || last.Usage == nil || last.Usage.CompletionTokens != 3 {
		t.Fatalf("usage chunk %s", events[3].data)
	}
}

func TestErrors(t *testing.T) {
	cfg := DefaultEngineConfig()
	s := startServer(t, ServerConfig{Engine: cfg})
	u := s.URLs()[0]
	tests := []struct {
		name, path string
		body       any
		code       int
		anthropic  bool
	}{
		{"prompt over max_model_len", "/v1/chat/completions", chatBody(longText("x", 40000), 10, false), 400, false},
		{"max_tokens too large", "/v1/chat/completions", chatBody("hi", 32768, false), 400, false},
		{"anthropic over max_model_len", "/v1/messages", map[string]any{"model": "m", "max_tokens": 10, "messages": []map[string]any{{"role": "user", "content": longText("x", 40000)}}}, 400, true},
		{"anthropic without max_tokens", "/v1/messages", map[string]any{"model": "m", "messages": []map[string]any{{"role": "user", "content": "x"}}}, 400, true},
		{"bad json", "/v1/chat/completions", "not an object", 400, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, u+tt.path, tt.body)
			if resp.StatusCode != tt.code {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if tt.anthropic {
				var e struct {
					Type  string `json:"type"`
					Error struct {
						Type    string `json:"type"`
						Message string `json:"message"`
					} `json:"error"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
					t.Fatalf("bad error %+v %v", e, err)
				}
				return
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Error.Type != "BadRequestError" || e.Error.Code != 400 {
				t.Fatalf("bad error %+v %v", e, err)
			}
			if strings.Contains(tt.name, "max_model_len") && !strings.Contains(e.Error.Message, "maximum context length is 32768") {
				t.Fatalf("message %q", e.Error.Message)
			}
		})
	}
}

func TestModelsHealthAndMetrics(t *testing.T) {
	s := startServer(t, ServerConfig{DataParallel: 2, Model: "qwen3-4b"})
	u := s.URLs()[0]
	resp, err := client.Get(u + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "qwen3-4b" || models.Data[0].MaxModelLen != 32768 {
		t.Fatalf("models %+v", models)
	}
	resp, err = client.Get(u + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v %v", resp, err)
	}
	resp.Body.Close()
	post(t, u+"/v1/chat/completions", chatBody("hello", 2, false), RankHeader, "1")
	fams := scrape(t, u)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:cache_config_info", "vllm:prefix_cache_queries_created"} {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("missing %s", name)
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if labels["engine"] != "0" && labels["engine"] != "1" {
				t.Fatalf("%s engine label %q", name, labels["engine"])
			}
			if _, has := labels["model_name"]; has == (name == "vllm:cache_config_info") {
				t.Fatalf("%s model_name label presence wrong: %v", name, labels)
			}
		}
	}
	if v := sampleValue(t, fams, "vllm:generation_tokens_total", "1"); v != 2 {
		t.Fatalf("engine 1 generated %v, want 2", v)
	}
	if v := sampleValue(t, fams, "vllm:generation_tokens_total", "0"); v != 0 {
		t.Fatalf("engine 0 generated %v, want 0", v)
	}
	h := fams["vllm:time_to_first_token_seconds"].GetMetric()
	if len(h) != 2 || h[1].GetHistogram().GetSampleCount() != 1 {
		t.Fatal("TTFT histogram not observed on engine 1")
	}
	cc := fams["vllm:cache_config_info"].GetMetric()[0]
	want := map[string]string{"block_size": "16", "num_gpu_blocks": "2300", "kv_cache_size_tokens": "36800", "enable_prefix_caching": "True"}
	for _, lp := range cc.GetLabel() {
		if w, ok := want[lp.GetName()]; ok && w != lp.GetValue() {
			t.Fatalf("cache_config_info %s=%s", lp.GetName(), lp.GetValue())
		}
	}
}

func sampleValue(t *testing.T, fams map[string]*dtoFamily, name, engine string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("missing %s", name)
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == "engine" && lp.GetValue() == engine {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("%s has no engine %s", name, engine)
	return 0
}

func TestDataParallelRouting(t *testing.T) {
	s := startServer(t, ServerConfig{DataParallel: 3, Speed: 50})
	u := s.URLs()[0]
	for _, tt := range []struct {
		rank string
		code int
	}{{"2", 200}, {"0", 200}, {"3", 400}, {"-1", 400}, {"x", 400}} {
		resp := post(t, u+"/v1/chat/completions", chatBody("hi", 1, false), "x-data-parallel-rank", tt.rank)
		if resp.StatusCode != tt.code {
			t.Fatalf("rank %s: status %d", tt.rank, resp.StatusCode)
		}
		if tt.code == 200 && resp.Header.Get(EngineHeader) != tt.rank {
			t.Fatalf("rank %s served by %s", tt.rank, resp.Header.Get(EngineHeader))
		}
	}
	// Without a rank, concurrent requests spread over idle engines.
	type res struct {
		engine string
		err    error
	}
	ch := make(chan res, 3)
	for i := 0; i < 3; i++ {
		go func() {
			b, _ := json.Marshal(chatBody("long answer please", 400, false))
			resp, err := client.Post(u+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				ch <- res{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			ch <- res{engine: resp.Header.Get(EngineHeader)}
		}()
		time.Sleep(20 * time.Millisecond)
	}
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		seen[r.engine] = true
	}
	if len(seen) != 3 {
		t.Fatalf("balancer used engines %v, want all three", seen)
	}
}

func TestFaults(t *testing.T) {
	s := startServer(t, ServerConfig{Replicas: 2})
	u0, u1 := s.URLs()[0], s.URLs()[1]
	post(t, u0+"/v1/chat/completions", chatBody(longText("f", 500), 4, false))

	// Errors.
	s.SetErrors(1, true)
	if resp := post(t, u1+"/v1/chat/completions", chatBody("x", 1, false)); resp.StatusCode != 500 {
		t.Fatalf("errors fault: status %d", resp.StatusCode)
	}
	s.SetErrors(1, false)
	if resp := post(t, u1+"/v1/chat/completions", chatBody("x", 1, false)); resp.StatusCode != 200 {
		t.Fatalf("after errors fault: status %d", resp.StatusCode)
	}

	// Metrics hang: a client with a deadline gives up.
	s.SetMetricsHang(1, true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u1+"/metrics", nil)
	if _, err := client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging metrics returned %v", err)
	}
	cancel()
	s.SetMetricsHang(1, false)
	scrape(t, u1)

	// Requests hang: the request gets nothing until its client gives up,
	// while /metrics answers; cleared, held requests get 503 and new ones
	// are served.
	if err := s.SetRequestsHang(1, true); err != nil {
		t.Fatal(err)
	}
	if st := s.Status()[1]; !st.RequestsHang {
		t.Fatalf("status: %+v", st)
	}
	b, _ := json.Marshal(chatBody("x", 1, false))
	ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, u1+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if _, err := client.Do(req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging requests returned %v", err)
	}
	cancel()
	scrape(t, u1)
	held := make(chan int, 1)
	go func() {
		resp, err := client.Post(u1+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			held <- -1
			return
		}
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	time.Sleep(50 * time.Millisecond)
	s.SetRequestsHang(1, false)
	if code := <-held; code != http.StatusServiceUnavailable {
		t.Fatalf("held request after the fault cleared: %d", code)
	}
	if resp := post(t, u1+"/v1/chat/completions", chatBody("x", 1, false)); resp.StatusCode != 200 {
		t.Fatalf("after requests-hang fault: status %d", resp.StatusCode)
	}

	// Stop: connections refused; restart: empty cache, counters reset.
	if err := s.Stop(0); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(u0 + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("stopped replica: %v", err)
	}
	if err := s.Restart(0); err != nil {
		t.Fatal(err)
	}
	if v := sampleValue(t, scrape(t, u0), "vllm:prompt_tokens_total", "0"); v != 0 {
		t.Fatalf("counters after restart %v", v)
	}
	resp := post(t, u0+"/v1/chat/completions", chatBody(longText("f", 500), 4, false))
	var c oaChunk
	json.NewDecoder(resp.Body).Decode(&c)
	if c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatal("cache survived a restart")
	}

	// Slow: engine time per step grows by the factor (engine-time TTFT).
	ttftOf := func(tag string) float64 {
		sum := func() float64 {
			return scrape(t, u1)["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleSum()
		}
		before := sum()
		post(t, u1+"/v1/chat/completions", chatBody(longText(tag, 2000), 1, false))
		return sum() - before
	}
	normal := ttftOf("g")
	s.SetSlow(1, 5)
	if slow := ttftOf("h"); slow < normal*4 || slow > normal*6 {
		t.Fatalf("slow fault: TTFT %.3f s → %.3f s, want about 5×", normal, slow)
	}
}

func TestStopFailsOpenRequests(t *testing.T) {
	s := startServer(t, ServerConfig{Speed: 1})
	done := make(chan error, 1)
	go func() {
		b, _ := json.Marshal(chatBody("x", 1000, true))
		resp, err := client.Post(s.URLs()[0]+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	s.Stop(0)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("open stream did not end when the replica stopped")
	}
}

// TestRefusedRequestAnswers500 runs an engine that refuses as
// llm-d-inference-sim does: while a long answer's prompt holds 365 of its
// 380 blocks, a request needing 27 more is answered 500 with the
// simulator's message, streamed or not (a stream's headers wait for its
// first token, so the refusal comes before them), and a small request
// still gets its answer.
func TestRefusedRequestAnswers500(t *testing.T) {
	cfg := perRequestConfig(380, 8)
	cfg.PerRequest.Refuse = true
	cfg.PerRequest.InterTokenLatency = 250 * time.Millisecond
	s := startServer(t, ServerConfig{Speed: 1, Engine: cfg})
	url := s.URLs()[0] + "/v1/chat/completions"
	// the long answer: 5,848 prompt tokens, 100 output tokens at 250 ms (25 s)
	long := post(t, url, chatBody(strings.Repeat("alpha beta ", 2900), 100, true))
	if long.StatusCode != 200 {
		b, _ := io.ReadAll(long.Body)
		t.Fatalf("first request: status %d: %s", long.StatusCode, b)
	}
	if _, err := bufio.NewReader(long.Body).ReadString('\n'); err != nil {
		t.Fatalf("first request's stream: %v", err)
	}
	for _, stream := range []bool{false, true} {
		resp := post(t, url, chatBody(strings.Repeat("gamma delta ", 200), 5, stream))
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 500 || !strings.Contains(string(body), "the kv cache does not have sufficient capacity to store this request") {
			t.Errorf("stream %v: status %d, body %s; want 500 and the capacity error", stream, resp.StatusCode, body)
		}
	}
	resp := post(t, url, chatBody("hi", 5, true))
	events := readSSE(t, resp.Body)
	if resp.StatusCode != 200 || len(events) == 0 || events[len(events)-1].data != "[DONE]" {
		t.Errorf("small request: status %d, %d events", resp.StatusCode, len(events))
	}
	long.Body.Close() // the client goes: the engine aborts the long answer
}

func TestPyFloat(t *testing.T) {
	for in, want := range map[float64]string{12: "12.0", 0.4137: "0.4137", 1845120: "1.84512e+06", 1.7544e9: "1.7544e+09", 0: "0.0", 2560: "2560.0"} {
		if got := pyFloat(in); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", in, got, want)
		}
	}
	_ = strconv.Itoa
}

func TestControlHandler(t *testing.T) {
	s := startServer(t, ServerConfig{Replicas: 2})
	h := s.ControlHandler()
	do := func(method, path string) int {
		req, _ := http.NewRequest(method, path, nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	if c := do("POST", "/replicas/1/errors?on=true"); c != 200 || !s.Status()[1].Errors {
		t.Fatalf("errors on: %d %+v", c, s.Status())
	}
	if c := do("POST", "/replicas/0/stop"); c != 200 || !s.Stopped(0) {
		t.Fatalf("stop: %d", c)
	}
	if c := do("POST", "/replicas/0/restart"); c != 200 || s.Stopped(0) {
		t.Fatalf("restart: %d %v", c, s.Restart(0))
	}
	if c := do("POST", "/engines/1/slow?factor=3"); c != 200 {
		t.Fatalf("slow: %d", c)
	}
	if c := do("POST", "/replicas/9/stop"); c != 400 {
		t.Fatalf("unknown replica: %d", c)
	}
}

// A conversation's next turn hits the previous prompt and the reply.
func TestMultiTurnHitsReply(t *testing.T) {
	s := startServer(t, ServerConfig{})
	u := s.URLs()[0]
	msgs := []map[string]any{{"role": "user", "content": longText("m", 2000)}}
	type result struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Usage anUsage `json:"usage"`
	}
	turn := func() result {
		resp := post(t, u+"/v1/messages", map[string]any{"model": "m", "max_tokens": 100, "system": "You are helpful.", "messages": msgs})
		var r result
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r1 := turn()
	prompt1 := *r1.Usage.InputTokens
	msgs = append(msgs, map[string]any{"role": "assistant", "content": r1.Content[0].Text}, map[string]any{"role": "user", "content": "next question"})
	r2 := turn()
	want := (prompt1 + 100 - 1) / 16 * 16
	if got := *r2.Usage.CacheReadInputTokens; got != want {
		t.Fatalf("second turn cached %d, want %d (prompt %d + 100 output, whole blocks)", got, want, prompt1)
	}
	// The exported renderer gives the same token count as the server.
	text := RenderMessage("system", "You are helpful.") + RenderMessage("user", msgs[0]["content"].(string)) + GenerationPrompt
	if CountTokens(text) != prompt1 {
		t.Fatalf("RenderMessage gives %d tokens, server counted %d", CountTokens(text), prompt1)
	}
}
