package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// TestReplicaChurnKeepsStateBounded sends requests through a pool whose
// addresses rotate through 1,000 replicas, as dynamic upstreams can: what
// the model keeps per replica (bindings, token accounting, poll errors)
// must go once the replicas have been gone for longer than idle_ttl and the
// hour of token counts.
func TestReplicaChurnKeepsStateBounded(t *testing.T) {
	h := &Handler{}
	if err := h.Provision(caddy.Context{Context: context.Background()}); err != nil {
		t.Fatal(err)
	}
	p := &Policy{Model: "churn-test", routeHeader: true}
	rcfg := placement.Config{MaxNumSeqs: 32}
	p.m = newModelState(p.Model, rcfg)
	p.m.configure(rcfg, p.pollSettings(), nil)
	t.Cleanup(func() { _ = p.m.Destruct() })

	dial := func(i int) string { return fmt.Sprintf("10.%d.%d.1:8000", i/250, i%250) }
	var pool reverseproxy.UpstreamPool
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if p.Select(pool, r, w) == nil {
			return fmt.Errorf("no upstream")
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, benchAnswer)
		return nil
	})
	const gens = 1000
	for gen := range gens {
		pool = make(reverseproxy.UpstreamPool, 4)
		for i := range pool {
			pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: dial(gen + i)}
		}
		ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://gw/v1/messages",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		r.Header.Set("X-Claude-Code-Session-Id", fmt.Sprint("conv-", gen))
		if err := h.ServeHTTP(httptest.NewRecorder(), r, next); err != nil {
			t.Fatalf("gen %d: %v", gen, err)
		}
		p.m.onSnapshot(&vllmstats.Snapshot{Taken: time.Unix(int64(gen), 0), Replicas: []vllmstats.ReplicaStats{
			{ID: dial(gen), LastError: "connection refused", Failures: 1},
		}})
	}
	if n := len(p.m.pollErrors()); n > 4 {
		t.Fatalf("poll errors kept for %d replicas, want the pool's 4 at most", n)
	}
	if n := len(p.m.acct.Replicas()); n != gens {
		// within the hour, the stats page still shows every replica's counts
		t.Fatalf("accountant holds %d replicas within the hour, want %d", n, gens)
	}

	// Two hours later, past idle_ttl and the stats hour.
	p.m.forgetGone(time.Now().Add(2 * time.Hour))
	if n := len(p.m.acct.Replicas()); n > 4 {
		t.Fatalf("accountant holds %d replicas after churn, want the pool's 4 at most", n)
	}
	if n := p.m.router.Len(); n != 0 {
		t.Fatalf("router holds %d bindings after idle_ttl", n)
	}
	if s := p.m.router.Snapshot(); len(s.Replicas) != 4 || s.Requests != gens {
		t.Fatalf("router after churn: %d replicas, %d requests", len(s.Replicas), s.Requests)
	}
	if rs := p.set.Load(); len(rs.where) != 4 {
		t.Fatalf("policy keeps %d replicas' picks", len(rs.where))
	}
}
