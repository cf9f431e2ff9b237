package caddymodule

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// BenchmarkTraceTurn is what the trace adds to a request's end with the
// trace on: the figures copied into the writer's queue. The queue is
// emptied (timer stopped) before it fills, so every turn is queued, none
// dropped: the cost of the path a live proxy takes.
func BenchmarkTraceTurn(b *testing.B) {
	h := &Handler{TraceFile: filepath.Join(b.TempDir(), "turns.jsonl")}
	if err := h.Provision(benchCtx()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Cleanup() })
	now := time.Now()
	st := &routeState{key: "42eaa708-cbc4-4714-bf36-9ce29ce6f84d", routed: true,
		dec: placement.Decision{Replica: "10.0.0.5:8000", Reason: placement.ReasonSticky}}
	rw := &responseWatcher{st: st, status: 200, arrived: now.Add(-time.Second)}
	u := vllmstats.Usage{PromptTokens: 18000, CachedTokens: 17900, CompletionTokens: 200, Measured: true, CachedMeasured: true}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%1024 == 1023 {
			b.StopTimer()
			h.trace.Flush()
			b.StartTimer()
		}
		h.traceTurn(rw, &u, now)
	}
	b.StopTimer()
	h.trace.Flush()
	s := h.trace.Stats()
	b.ReportMetric(float64(s.Dropped)/float64(s.Dropped+s.Written), "dropped/turn")
}
