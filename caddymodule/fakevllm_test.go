package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
)

// fakeVLLM is a loopback server speaking enough of vLLM's API for the
// integration tests: /v1/messages and /v1/chat/completions (JSON and SSE)
// with usage that includes cached tokens, /metrics with settable gauges (one
// series per engine in data-parallel mode), /v1/models and /health. Its
// "prefix cache" remembers the longest prompt it served per conversation, so
// cached tokens appear exactly when a conversation comes back to it.
type fakeVLLM struct {
	srv     *httptest.Server
	addr    string // host:port
	engines int

	mu       sync.Mutex
	running  []int
	waiting  []int
	cache    map[string]int // engine/conversation → prompt tokens cached
	served   []servedReq
	sum      struct{ prompt, cached, generated int64 }
	hold     chan struct{} // when non-nil, generation waits for it to close
	inflight int
	step     chan struct{} // when non-nil, an SSE stream waits on it after its first event
	// exposition, when set, writes /metrics instead of vLLM's series (another
	// engine's names, or none the module knows); f.mu is held.
	exposition func(f *fakeVLLM) string
	last       string // the last API request's body
}

func (f *fakeVLLM) lastBody() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

type servedReq struct {
	key    string
	rank   string
	path   string
	engine int
}

func newFakeVLLM(t *testing.T, engines int) *fakeVLLM {
	t.Helper()
	f := &fakeVLLM{engines: max(1, engines), cache: make(map[string]int)}
	f.running = make([]int, f.engines)
	f.waiting = make([]int, f.engines)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Listener = l
	f.srv.Start()
	f.addr = l.Addr().String()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeVLLM) setLoad(engine, running, waiting int) {
	f.mu.Lock()
	f.running[engine], f.waiting[engine] = running, waiting
	f.mu.Unlock()
}

func (f *fakeVLLM) requests() []servedReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]servedReq(nil), f.served...)
}

func (f *fakeVLLM) totals() (prompt, cached, generated int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sum.prompt, f.sum.cached, f.sum.generated
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake","max_model_len":32768}]}`)
		return
	case "/metrics":
		f.writeMetrics(w)
		return
	case "/v1/messages", "/v1/chat/completions":
	default:
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	engine := 0
	rank := r.Header.Get("X-Data-Parallel-Rank")
	if rank != "" {
		k, err := strconv.Atoi(rank)
		if err != nil || k < 0 || k >= f.engines {
			http.Error(w, `{"error":"bad rank"}`, http.StatusBadRequest)
			return
		}
		engine = k
	}
	key := r.Header.Get("X-Claude-Code-Session-Id")
	if key == "" {
		key = convkey.SessionFromBody(string(body))
	}
	// prompt tokens: a quarter of the body's bytes, as a tokenizer would
	prompt := int64(len(body)/4 + 1)
	gen := int64(5)
	f.mu.Lock()
	ck := strconv.Itoa(engine) + "/" + key
	cached := int64(0)
	if key != "" {
		cached = min(int64(f.cache[ck]), prompt-1)
		f.cache[ck] = int(prompt)
	}
	f.last = string(body)
	f.served = append(f.served, servedReq{key: key, rank: rank, path: r.URL.Path, engine: engine})
	f.sum.prompt += prompt
	f.sum.cached += cached
	f.sum.generated += gen
	f.inflight++
	hold, step := f.hold, f.step
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inflight--
		f.mu.Unlock()
	}()
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Fake-Engine", strconv.Itoa(engine))
	stream := gjson.GetBytes(body, "stream").Bool()
	anthropic := r.URL.Path == "/v1/messages"
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		if anthropic {
			fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":%d}}`, prompt-cached, cached, gen)
		} else {
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, gen, cached)
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(ev string) {
		_, _ = io.WriteString(w, ev)
		fl.Flush()
	}
	if anthropic {
		send(fmt.Sprintf("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":%d,\"cache_read_input_tokens\":%d,\"output_tokens\":1}}}\n\n", prompt-cached, cached))
	} else {
		send("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n")
	}
	if step != nil {
		select {
		case <-step:
		case <-r.Context().Done():
			return
		}
	}
	for i := int64(0); i < gen; i++ {
		if anthropic {
			send("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"t\"}}\n\n")
		} else {
			send("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t\"}}]}\n\n")
		}
	}
	if anthropic {
		send(fmt.Sprintf("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":%d}}\n\n", gen))
		send("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	} else {
		send(fmt.Sprintf("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", prompt, gen, cached))
		send("data: [DONE]\n\n")
	}
}

func (f *fakeVLLM) writeMetrics(w http.ResponseWriter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	if f.exposition != nil {
		_, _ = io.WriteString(w, f.exposition(f))
		return
	}
	var b strings.Builder
	series := func(name, typ string, val func(e int) float64) {
		fmt.Fprintf(&b, "# HELP %s fake\n# TYPE %s %s\n", name, name, typ)
		for e := 0; e < f.engines; e++ {
			fmt.Fprintf(&b, "%s{engine=\"%d\",model_name=\"fake\"} %g\n", name, e, val(e))
		}
	}
	series("vllm:num_requests_running", "gauge", func(e int) float64 { return float64(f.running[e]) })
	series("vllm:num_requests_waiting", "gauge", func(e int) float64 { return float64(f.waiting[e]) })
	series("vllm:kv_cache_usage_perc", "gauge", func(e int) float64 { return 0.25 })
	series("vllm:prefix_cache_queries_total", "counter", func(e int) float64 { return float64(f.sum.prompt) })
	series("vllm:prefix_cache_hits_total", "counter", func(e int) float64 { return float64(f.sum.cached) })
	_, _ = io.WriteString(w, b.String())
}

// chatTurn renders turn n (1-based) of conversation c as an Anthropic
// request body that grows every turn. With userID set, the body carries it
// as metadata.user_id, the way older Claude Code versions identify a session.
func chatTurn(c string, n int, stream bool, userID ...string) string {
	msgs := []map[string]any{{"role": "user", "content": "start of " + c}}
	for i := 1; i < n; i++ {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": strings.Repeat("answer ", 20)},
			map[string]any{"role": "user", "content": fmt.Sprintf("turn %d of %s", i+1, c)})
	}
	req := map[string]any{
		"model": "qwen3-4b", "max_tokens": 256, "stream": stream,
		"system":   []map[string]any{{"type": "text", "text": "You are a coding agent."}},
		"messages": msgs,
	}
	if len(userID) > 0 {
		req["metadata"] = map[string]any{"user_id": userID[0]}
	}
	b, _ := json.Marshal(req)
	return string(b)
}
