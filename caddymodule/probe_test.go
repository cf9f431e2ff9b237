package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
)

// probeFront stands in front of an emulated replica as a server that does
// not implement some methods: it answers HEAD with 501, as Python's
// http.server does for a method it has no handler for, and, while fail is
// set, POSTs with 500; everything else goes to the replica.
func probeFront(t *testing.T, target string, fail *atomic.Bool) string {
	t.Helper()
	u, err := url.Parse("http://" + target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodHead:
			w.WriteHeader(http.StatusNotImplemented)
		case r.Method == http.MethodPost && fail.Load():
			http.Error(w, `{"detail":"engine error"}`, http.StatusInternalServerError)
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return l.Addr().String()
}

// TestProbeErrorsKeepReplica: a 501 to Claude Code's keyless HEAD
// /api/hello, and 4xx/5xx answers to other requests that are not inference
// calls (GET /v1/models, an unknown path), say nothing about the engine and
// leave the replica in placement; a 500 to an inference request still
// takes it out.
func TestProbeErrorsKeepReplica(t *testing.T) {
	_, ids := startEmulator(t, 1, 50)
	var fail atomic.Bool
	front := probeFront(t, ids[0], &fail)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model probe-errors
			poll_interval 100ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
		}
		flush_interval -1
	}`, front))
	probes := []struct {
		method, path string
		status       int
	}{
		{http.MethodHead, "/api/hello", http.StatusNotImplemented},
		{http.MethodHead, "/api/hello", http.StatusNotImplemented},
		{http.MethodHead, "/", http.StatusNotImplemented},
		{http.MethodGet, "/api/hello", http.StatusNotFound},
		{http.MethodGet, "/v1/models/none", http.StatusNotFound},
		{http.MethodGet, "/v1/messages", http.StatusMethodNotAllowed},
	}
	for _, p := range probes {
		req, err := http.NewRequest(p.method, siteURL+p.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", p.method, p.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != p.status {
			t.Fatalf("%s %s: %d, want %d from the upstream", p.method, p.path, resp.StatusCode, p.status)
		}
	}
	row := cardRow(getCard(t, "probe-errors"), front)
	if !row.Available || row.ProxyFailures != 0 {
		t.Fatalf("after probes answered 501/404/405: available %v, proxy failures %d, out %v; want available, none", row.Available, row.ProxyFailures, row.Out)
	}
	const body = `{"model":"qwen3-4b","max_tokens":8,"messages":[{"role":"user","content":"hello"}]}`
	hdr := map[string]string{"X-Claude-Code-Session-Id": "probe-1", "Anthropic-Version": "2023-06-01"}
	if res := sendTurn(t, "/v1/messages", body, hdr); res.status != http.StatusOK || res.replica != front {
		t.Fatalf("inference after the probes: %d on %q, want 200 on %s", res.status, res.replica, front)
	}
	// the same upstream failing an inference request is out
	fail.Store(true)
	if res := sendTurn(t, "/v1/messages", body, hdr); res.status != http.StatusInternalServerError {
		t.Fatalf("failing inference: %d, want the upstream's 500", res.status)
	}
	row = cardRow(getCard(t, "probe-errors"), front)
	if row.Available || row.ProxyFailures != 1 {
		t.Fatalf("after a 500 to an inference request: available %v, proxy failures %d; want out, 1", row.Available, row.ProxyFailures)
	}
}
