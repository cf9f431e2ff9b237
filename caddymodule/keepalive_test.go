package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestKeepAliveSet(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{``, false},
		{`{"protocol":"http"}`, false},
		{`{"protocol":"http","response_header_timeout":600000000000}`, false},
		{`{"protocol":"http","keep_alive":{"max_idle_conns_per_host":8}}`, false},
		{`{"protocol":"http","keep_alive":{"idle_timeout":60000000000}}`, true},
		{`{"protocol":"http","keep_alive":{"idle_timeout":"1m"}}`, true},
		{`{"protocol":"http","keep_alive":{"enabled":false}}`, true},
	} {
		if got := keepAliveSet(json.RawMessage(tc.raw)); got != tc.want {
			t.Errorf("keepAliveSet(%s) = %v, want %v", tc.raw, got, tc.want)
		}
	}
}

// connWatch is an upstream that answers every request with a small JSON
// body and reports when a connection that carried a request to path
// closes.
type connWatch struct {
	srv    *httptest.Server
	path   string
	mu     sync.Mutex
	used   map[net.Conn]bool
	closed chan struct{}
}

type connKey struct{}

func startConnWatch(t *testing.T, path string) *connWatch {
	t.Helper()
	cw := &connWatch{path: path, used: map[net.Conn]bool{}, closed: make(chan struct{}, 16)}
	cw.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == cw.path {
			cw.mu.Lock()
			cw.used[r.Context().Value(connKey{}).(net.Conn)] = true
			cw.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":10,"output_tokens":1}}`)
	}))
	cw.srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	cw.srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s != http.StateClosed {
			return
		}
		cw.mu.Lock()
		used := cw.used[c]
		cw.mu.Unlock()
		if used {
			cw.closed <- struct{}{}
		}
	}
	cw.srv.Start()
	t.Cleanup(cw.srv.Close)
	return cw
}

// TestProxyClosesIdleConnectionsBeforeTheEngine: with no keepalive in
// the transport (no transport block, or one without keepalive), the
// proxy's idle connection to a replica is closed by the proxy within
// seconds, where Caddy's own default keeps it 2 minutes, well past the 5 s
// after which the engines close it.
func TestProxyClosesIdleConnectionsBeforeTheEngine(t *testing.T) {
	for _, tc := range []struct{ name, transport string }{
		{"no transport", ""},
		{"transport without keepalive", "transport http {\n\t\t\tresponse_header_timeout 1m\n\t\t}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cw := startConnWatch(t, "/v1/messages")
			model := "keepalive-" + strings.ReplaceAll(tc.name, " ", "-")
			loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			poll_interval 1m
		}
		%s
	}`, strings.TrimPrefix(cw.srv.URL, "http://"), model, tc.transport))
			res := sendTurn(t, "/v1/messages", chatTurn("ka-1", 1, false), map[string]string{"X-Claude-Code-Session-Id": "ka-1"})
			if res.status != http.StatusOK {
				t.Fatalf("turn: %d %s", res.status, res.body)
			}
			start := time.Now()
			select {
			case <-cw.closed:
				t.Logf("the proxy's idle connection closed after %v", time.Since(start).Round(10*time.Millisecond))
			case <-time.After(30 * time.Second):
				t.Fatal("the proxy's idle connection to the replica was still open after 30s")
			}
		})
	}
}
