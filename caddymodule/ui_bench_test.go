package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// uiLiveModel registers a live model with 4 replicas and an hour of usage
// recorded up to now (one response per replica per second), as the admin
// endpoint finds it; the test's cleanup removes it.
func uiLiveModel(b testing.TB, name string, now time.Time) *modelState {
	b.Helper()
	val, _, err := modelStates.LoadOrNew(name, func() (caddy.Destructor, error) {
		m := newModelState(name, placement.Config{MaxNumSeqs: 32})
		m.configure(placement.Config{MaxNumSeqs: 32}, pollSettings{Interval: time.Hour, Timeout: time.Second, FailAfter: 3, MetricsPath: "/metrics", Scheme: "http"}, nil)
		return m, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = modelStates.Delete(name) })
	m := val.(*modelState)
	ids := make([]string, 4)
	targets := make([]vllmstats.Target, 4)
	for i := range ids {
		ids[i] = fmt.Sprintf("127.0.0.1:%d", 8001+i)
		targets[i] = vllmstats.Target{ID: ids[i], BaseURL: "http://" + ids[i]}
	}
	m.setTargets(ids, targets)
	for s := int64(vllmstats.SeriesLength); s >= 0; s-- {
		at := now.Add(-time.Duration(s) * time.Second)
		for i, id := range ids {
			cached := 3000 + (s*7+int64(i))%500
			m.acct.Record(id, vllmstats.Usage{PromptTokens: cached + 500 + s%41, CachedTokens: cached,
				CompletionTokens: 20 + s%60, Measured: true, CachedMeasured: true}, at)
		}
	}
	return m
}

// benchUIRefresh measures one refresh of a view document the page polls,
// as a browser asks for it (gzip accepted), through the admin route.
func benchUIRefresh(b *testing.B, path string) {
	uiLiveModel(b, "bench-ui-model", time.Now())
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Accept-Encoding", "gzip, deflate, br")
	w := &benchWriter{h: http.Header{}}
	if err := serveUI(w, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		clear(w.h)
		if err := serveUI(w, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCardView is one refresh of the routing card's view document.
func BenchmarkCardView(b *testing.B) { benchUIRefresh(b, "/lm-warden/ui/bench-ui-model/view.json") }

// BenchmarkStatsView is one refresh of the chart's view document (all
// replicas, the last hour in 360 steps).
func BenchmarkStatsView(b *testing.B) { benchUIRefresh(b, "/lm-warden/ui/bench-ui-model/stats.json") }
