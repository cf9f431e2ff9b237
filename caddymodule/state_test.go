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

// TestModelOwnedOnce loads configurations in which two reverse proxies use
// one model: they share its router, so they load only when they agree on
// every setting and on the upstreams; otherwise the load fails with a
// message that says why, and the running configuration keeps serving.
func TestModelOwnedOnce(t *testing.T) {
	fakes := startFakes(t, 2)
	ups := dialList(fakes)
	site := func(second string) string {
		return fmt.Sprintf(`
	lm_warden
	@a path /a/*
	handle @a {
		uri strip_prefix /a
		reverse_proxy %s {
			lb_policy lm_warden {
				model owned
				max_num_seqs 32
			}
		}
	}
	handle {
		reverse_proxy %s
	}`, ups, second)
	}
	cases := []struct {
		name, second string
		wantErr      string // "" loads
	}{
		{"same settings and upstreams", ups + " {\n lb_policy lm_warden {\n model owned\n max_num_seqs 32\n }\n }", ""},
		{"different settings", ups + " {\n lb_policy lm_warden {\n model owned\n max_num_seqs 64\n }\n }",
			"model owned is configured twice with different settings (Router.MaxNumSeqs 32 ≠ 64)"},
		{"different upstreams", fakes[0].addr + " {\n lb_policy lm_warden {\n model owned\n max_num_seqs 32\n }\n }",
			"model owned is used by reverse proxies with different upstreams"},
		{"other upstream order", fakes[1].addr + " " + fakes[0].addr + " {\n lb_policy lm_warden {\n model owned\n max_num_seqs 32\n }\n }",
			"different upstreams"},
	}
	admin := robustAdminPort(t)
	port := freeLoopbackPort(t)
	if err := loadCaddyfile(robustConfig(admin, port, site(cases[0].second))); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	// both proxies share the model's router: a conversation started through
	// one continues on the same replica through the other
	turn := func(path string) string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(chatTurn("owned conversation", 1, false)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", "owned-1")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		return resp.Header.Get(RouteHeader)
	}
	first, second := turn("/a/v1/chat/completions"), turn("/v1/chat/completions")
	if r1, r2 := strings.SplitN(first, ";", 2)[0], strings.SplitN(second, ";", 2)[0]; r1 != r2 || !strings.Contains(second, "sticky") {
		t.Fatalf("turns through the two proxies went to %q then %q, want one replica, sticky", first, second)
	}
	for _, c := range cases[1:] {
		t.Run(c.name, func(t *testing.T) {
			err := loadCaddyfile(robustConfig(admin, freeLoopbackPort(t), site(c.second)))
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("load error %v, want one containing %q", err, c.wantErr)
			}
			// the running configuration still serves, with its settings
			if got := turn("/v1/chat/completions"); !strings.Contains(got, "sticky") {
				t.Fatalf("after the refused load: route %q, want sticky", got)
			}
			m, ok := lookupModel("owned")
			if !ok {
				t.Fatal("model owned is gone after a refused load")
			}
			if n := m.router.Config().MaxNumSeqs; n != 32 {
				t.Fatalf("max_num_seqs %d after a refused load, want 32", n)
			}
		})
	}
}
