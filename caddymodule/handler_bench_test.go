package caddymodule

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// benchWriter is a reusable ResponseWriter that drops the body.
type benchWriter struct{ h http.Header }

func (w *benchWriter) Header() http.Header         { return w.h }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *benchWriter) WriteHeader(int)             {}

const benchAnswer = `{"id":"msg_1","type":"message","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":12,"cache_read_input_tokens":4000,"output_tokens":5}}`

func benchPool(n int) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, n)
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: fmt.Sprintf("10.0.0.5:%d", 8000+i)}
	}
	return pool
}

// benchPolicy is a provisioned-equivalent policy without a Caddy context,
// its model live as a loaded configuration's is (the handler looks for a
// binding there before reading a header-keyed body for its start).
func benchPolicy(b *testing.B, model string) *Policy {
	p := &Policy{Model: model, routeHeader: true}
	val, _, err := modelStates.LoadOrNew(model, func() (caddy.Destructor, error) {
		m := newModelState(model, placement.Config{MaxNumSeqs: 32})
		m.configure(placement.Config{MaxNumSeqs: 32}, p.pollSettings(), nil)
		return m, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	p.m = val.(*modelState)
	b.Cleanup(func() { _, _ = modelStates.Delete(model) })
	return p
}

// bigBody is a Claude-Code-like request of about size bytes whose only
// session key is metadata.user_id, at the end of the body.
func bigBody(size int, session string) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3-4b","max_tokens":256,"stream":true,"system":[{"type":"text","text":"You are Claude Code."}],"messages":[`)
	chunk := `{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("lorem ipsum ", 80) + `"}]},`
	for sb.Len() < size-200 {
		sb.WriteString(chunk)
	}
	sb.WriteString(`{"role":"user","content":"go on"}],"metadata":{"user_id":"user_0123456789abcdef_account_9f1c_session_` + session + `"}}`)
	return []byte(sb.String())
}

// bigResponsesBody is a Codex-like Responses API request of about size
// bytes: developer and environment messages, then function calls and their
// outputs, tools, and prompt_cache_key (its only body key) at the end.
func bigResponsesBody(size int, session string) []byte {
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3-4b","stream":true,"input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are a coding agent."}]},` +
		`{"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context><cwd>/work</cwd></environment_context>"}]},` +
		`{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the failing test"}]}`)
	chunk := `,{"type":"function_call","name":"shell","arguments":"{\"command\":[\"cat\",\"main.go\"]}","call_id":"call_1"},{"type":"function_call_output","call_id":"call_1","output":"` + strings.Repeat("lorem ipsum ", 80) + `"}`
	for sb.Len() < size-300 {
		sb.WriteString(chunk)
	}
	sb.WriteString(`],"tools":[{"type":"function","name":"shell"}],"tool_choice":"auto","parallel_tool_calls":true,"store":false,"include":[],"prompt_cache_key":"` + session + `"}`)
	return []byte(sb.String())
}

type benchCase struct {
	name    string
	header  bool
	body    []byte
	handler bool // lm_warden handler + policy; false: Caddy's least_conn alone
	policy  bool // without handler: the lm_warden policy alone (header keys)
	path    string
}

func BenchmarkRouteRequest(b *testing.B) {
	small := []byte(`{"model":"qwen3-4b","max_tokens":256,"messages":[{"role":"user","content":"hi"}]}`)
	big := bigBody(256<<10, "2b1e7f3a-0c4d-4f7e-9a1b-5c6d7e8f9a0b")
	bigResponses := bigResponsesBody(256<<10, "019b2d7e-0c4d-7f7e-9a1b-5c6d7e8f9a0b")
	cases := []benchCase{
		{"lm_warden/session-header", true, small, true, false, ""},
		{"lm_warden/body-user_id-256KB", false, big, true, false, ""},
		{"lm_warden/session-header-256KB", true, big, true, false, ""},
		{"lm_warden-policy-only/session-header", true, small, false, true, ""},
		{"least_conn/session-header", true, small, false, false, ""},
		{"least_conn/body-256KB", false, big, false, false, ""},
		{"lm_warden/session-header-no-model-var", true, small, true, false, ""},
		{"lm_warden/responses-prompt_cache_key-256KB", false, bigResponses, true, false, "/v1/responses"},
		{"lm_warden/responses-session-header-256KB", true, bigResponses, true, false, "/v1/responses"},
		{"least_conn/responses-256KB", false, bigResponses, false, false, "/v1/responses"},
		{"lm_warden/session-header-trace", true, small, true, false, ""},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			pool := benchPool(4)
			var lc reverseproxy.LeastConnSelection
			h := &Handler{ModelVar: ptr(!strings.HasSuffix(bc.name, "no-model-var"))}
			if strings.HasSuffix(bc.name, "-trace") {
				// the turn trace on (trace.go): each turn's figures are
				// queued for the writer's goroutine
				h.TraceFile = filepath.Join(b.TempDir(), "turns.jsonl")
			}
			if err := h.Provision(benchCtx()); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = h.Cleanup() })
			p := benchPolicy(b, "bench-"+strings.ReplaceAll(bc.name, "/", "-"))
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				var up *reverseproxy.Upstream
				if bc.handler || bc.policy {
					up = p.Select(pool, r, w)
				} else {
					up = lc.Select(pool, r, w)
				}
				if up == nil {
					return fmt.Errorf("no upstream")
				}
				// what the proxy does with the body: send it upstream
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, benchAnswer)
				return nil
			})
			w := &benchWriter{h: make(http.Header)}
			sessions := make([]string, 64)
			for i := range sessions {
				sessions[i] = fmt.Sprintf("session-%02d", i)
			}
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				vars := make(map[string]any, 8)
				ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, vars))
				path := bc.path
				if path == "" {
					path = "/v1/messages"
				}
				r, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://gw"+path, bytes.NewReader(bc.body))
				r.Header.Set("Content-Type", "application/json")
				if bc.header {
					r.Header.Set("X-Claude-Code-Session-Id", sessions[i%len(sessions)])
				}
				clear(w.h)
				var err error
				if bc.handler {
					err = h.ServeHTTP(w, r, next)
				} else {
					err = next.ServeHTTP(w, r)
				}
				cancel() // the request ends
				if err != nil {
					b.Fatal(err)
				}
			}
			if h.trace != nil {
				b.StopTimer()
				h.trace.Flush()
				st := h.trace.Stats()
				b.ReportMetric(float64(st.Dropped)/float64(b.N), "dropped/op")
			}
		})
	}
}

func benchCtx() caddy.Context { return caddy.Context{Context: context.Background()} }
