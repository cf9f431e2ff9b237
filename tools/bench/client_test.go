package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeServer answers like vLLM would, recording what it was sent.
type fakeServer struct {
	t       *testing.T
	path    string
	header  http.Header
	body    map[string]any
	status  int
	stream  string
	headers map[string]string
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.path = r.URL.RequestURI()
	f.header = r.Header.Clone()
	b, _ := io.ReadAll(r.Body)
	f.body = nil
	if err := json.Unmarshal(b, &f.body); err != nil {
		f.t.Errorf("request body is not JSON: %v", err)
	}
	for k, v := range f.headers {
		w.Header().Set(k, v)
	}
	if f.status != 0 {
		w.WriteHeader(f.status)
		io.WriteString(w, `{"error":{"message":"overloaded"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	io.WriteString(w, f.stream)
}

const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":120,"cache_read_input_tokens":3584,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type":"ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" the"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" code"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":2}}

event: message_stop
data: {"type":"message_stop"}

`

const openAIStream = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" map"}}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" key"}}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":400,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":384}}}

data: [DONE]

`

func testSession(t *testing.T) *Session {
	w := DefaultWorkload()
	w.SystemTokens, w.FirstTokens, w.TurnTokens = 200, 300, 50
	g, err := NewGenerator(w, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := g.Next()
	s.Answer("first answer")
	return s
}

func TestClientAnthropic(t *testing.T) {
	f := &fakeServer{t: t, stream: anthropicStream, headers: map[string]string{EngineHeader: "2", RouteHeader: "127.0.0.1:8002; sticky", ExpectHeader: "0.420"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := testSession(t)
	c := &Client{BaseURL: srv.URL + "/", API: APIAnthropic, Token: "tok"}
	res, err := c.Send(context.Background(), s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if f.path != "/v1/messages?beta=true" {
		t.Errorf("path %q", f.path)
	}
	for h, want := range map[string]string{
		"X-Claude-Code-Session-Id": s.ID, "Authorization": "Bearer tok", "Anthropic-Version": "2023-06-01",
	} {
		if got := f.header.Get(h); got != want {
			t.Errorf("header %s = %q, want %q", h, got, want)
		}
	}
	if f.header.Get("Anthropic-Beta") == "" || !strings.HasPrefix(f.header.Get("User-Agent"), "claude-cli/") {
		t.Errorf("missing Claude Code headers: %v", f.header)
	}
	if f.body["stream"] != true || f.body["model"] != s.Model || f.body["max_tokens"] != float64(s.OutputTokens) {
		t.Errorf("body fields: %v %v %v", f.body["stream"], f.body["model"], f.body["max_tokens"])
	}
	if uid := f.body["metadata"].(map[string]any)["user_id"]; uid != s.UserID {
		t.Errorf("metadata.user_id %v", uid)
	}
	msgs := f.body["messages"].([]any)
	if len(msgs) != 3 || msgs[1].(map[string]any)["role"] != "assistant" {
		t.Errorf("messages %v", msgs)
	}
	if sys := f.body["system"].([]any)[0].(map[string]any)["text"]; sys != s.System {
		t.Error("system prompt not sent")
	}
	if res.Text != " the code" || res.OutputTokens != 2 || res.CachedTokens != 3584 {
		t.Errorf("result %+v", res)
	}
	if res.Replica != "2" || res.Route != "127.0.0.1:8002; sticky" || res.Expect != 420*time.Millisecond {
		t.Errorf("replica %q route %q expect %v", res.Replica, res.Route, res.Expect)
	}
	if res.FirstToken.IsZero() || res.FirstToken.Before(res.Sent) || res.Done.Before(res.FirstToken) {
		t.Errorf("times sent %v first %v done %v", res.Sent, res.FirstToken, res.Done)
	}
}

func TestClientOpenAI(t *testing.T) {
	f := &fakeServer{t: t, stream: openAIStream, headers: map[string]string{RouteHeader: "10.0.0.5:8001; placed"}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	s := testSession(t)
	c := &Client{BaseURL: srv.URL, API: APIOpenAI, SessionHeader: "x-session-id"}
	res, err := c.Send(context.Background(), s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if f.path != "/v1/chat/completions" || f.header.Get("x-session-id") != s.ID {
		t.Errorf("path %q session header %q", f.path, f.header.Get("x-session-id"))
	}
	if so := f.body["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Error("stream_options.include_usage not set")
	}
	msgs := f.body["messages"].([]any)
	if len(msgs) != 4 || msgs[0].(map[string]any)["role"] != "system" {
		t.Errorf("messages %v", msgs)
	}
	if res.Text != " map key" || res.OutputTokens != 2 || res.CachedTokens != 384 || res.Replica != "10.0.0.5:8001" {
		t.Errorf("result %+v", res)
	}
}

func TestClientErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    *fakeServer
		want string
	}{
		{"status", &fakeServer{status: http.StatusServiceUnavailable}, "status 503"},
		{"stream error", &fakeServer{stream: "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n"}, "busy"},
		{"no content", &fakeServer{stream: "data: {\"type\":\"message_stop\"}\n\n"}, "without content"},
		{"bad json", &fakeServer{stream: "data: {oops\n\n"}, "bad stream event"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.f.t = t
			srv := httptest.NewServer(tc.f)
			defer srv.Close()
			_, err := (&Client{BaseURL: srv.URL}).Send(context.Background(), testSession(t), 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRunHTTPTimeline drives RunHTTP against a fake replica whose answers
// and metrics are scripted, and checks the stage's arithmetic end to end.
func TestRunHTTPTimeline(t *testing.T) {
	var queries, hits float64
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/messages", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		queries += 100
		hits += 75
		w.Header().Set(EngineHeader, "0")
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, anthropicStream)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\nvllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %g\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} %g\n", queries, hits)
	})
	srv := httptest.NewServer(serialized(mux))
	defer srv.Close()
	w := DefaultWorkload()
	w.SystemTokens, w.FirstTokens, w.TurnTokens, w.Think = 100, 200, 50, 0
	rep, err := RunHTTP(context.Background(), HTTPConfig{
		Client: Client{BaseURL: srv.URL}, Workload: w, Stages: []int{2}, Modes: []string{"direct"},
		StageLength: 600 * time.Millisecond, Warmup: 200 * time.Millisecond, Speed: 1,
		Metrics: []string{srv.URL + "/metrics"}, PollInterval: 50 * time.Millisecond, Drain: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	st := rep.Stages[0]
	if st.Requests == 0 || st.Errors != 0 {
		t.Fatalf("stage %+v", st)
	}
	if st.PrefixHitPct != 75 || st.ReplicasBusy != 1 || st.StayedPct != 100 {
		t.Errorf("prefix hits %g%%, busy %g, stayed %g%%; want 75, 1, 100", st.PrefixHitPct, st.ReplicasBusy, st.StayedPct)
	}
	// Every turn returns 2 output tokens.
	if got := st.OutputTokensPerMin * st.DurationS / 60; int(got+0.5) != 2*st.Requests {
		t.Errorf("output tokens %g for %d requests", got, st.Requests)
	}
}

// serialized runs one handler call at a time (the fake's counters are
// plain floats).
func serialized(h http.Handler) http.Handler {
	ch := make(chan struct{}, 1)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ch <- struct{}{}
		defer func() { <-ch }()
		h.ServeHTTP(w, r)
	})
}

func TestClientTargets(t *testing.T) {
	tests := []struct {
		name   string
		c      Client
		serial int
		want   []string // turns 0..len-1
	}{
		{"one base URL", Client{BaseURL: "http://a"}, 3, []string{"http://a", "http://a", "http://a"}},
		{"two front-ends, even session", Client{BaseURL: "http://x", Targets: []string{"http://a", "http://b"}}, 0, []string{"http://a", "http://b", "http://a", "http://b"}},
		{"two front-ends, odd session", Client{Targets: []string{"http://a", "http://b"}}, 1, []string{"http://b", "http://a", "http://b"}},
		{"three front-ends", Client{Targets: []string{"http://a", "http://b", "http://c"}}, 2, []string{"http://c", "http://a", "http://b", "http://c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Session{Serial: tc.serial}
			for turn, w := range tc.want {
				if got := tc.c.Target(s, turn); got != w {
					t.Errorf("turn %d → %s, want %s", turn, got, w)
				}
			}
		})
	}
}
