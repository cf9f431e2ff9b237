package bindstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lmwarden/caddy-lmwarden/internal/redisserver"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// benchStore connects a router with replicas r0..r3 to a fresh
// redis-server; skipped without one.
func benchStore(tb testing.TB) (*Store, *redisserver.Server) {
	tb.Helper()
	rds := redisserver.ForTest(tb)
	r := placement.NewRouter(placement.Config{MaxNumSeqs: 1 << 20})
	r.SetReplicas([]string{"r0", "r1", "r2", "r3"})
	s, err := New("bench", Config{Type: "redis", Address: rds.Addr, Prefix: "lmwbench:", Timeout: caddy100ms}, r, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	deadline := time.Now().Add(10 * time.Second)
	for !s.up.Load() {
		if time.Now().After(deadline) {
			tb.Fatal("store did not connect")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s, rds
}

// caddy100ms is the deadline of the benchmarks (a caddy.Duration): one slow
// answer on a shared machine must not turn a read into a fallback.
const caddy100ms = 100 * 1000 * 1000

// BenchmarkStoreRoute measures what the shared store adds to a turn: a
// sticky turn on a confirmed binding (the local cache hit: no command),
// a turn whose binding is only in the store (one pipelined round trip to
// loopback Redis, then adopted), and the router alone for comparison.
// commands/turn is read from the server (INFO stats).
func BenchmarkStoreRoute(b *testing.B) {
	b.Run("router-alone", func(b *testing.B) {
		s, _ := benchStore(b)
		req := placement.Request{Key: "conversation-0001", Start: 0x5eed}
		d, _ := s.router.Route(req)
		d.Release()
		b.ReportAllocs()
		for b.Loop() {
			d, err := s.router.Route(req)
			if err != nil || d.Reason != placement.ReasonSticky {
				b.Fatal(d.Reason, err)
			}
			d.Release()
		}
	})
	b.Run("local-hit", func(b *testing.B) {
		s, rds := benchStore(b)
		req := placement.Request{Key: "conversation-0001", Start: 0x5eed}
		d, _, err := s.Route(req)
		if err != nil {
			b.Fatal(err)
		}
		d.Release()
		before, _ := rds.Commands()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			d, _, err := s.Route(req)
			if err != nil || d.Reason != placement.ReasonSticky {
				b.Fatal(d.Reason, err)
			}
			d.Release()
			n++
		}
		after, _ := rds.Commands()
		b.ReportMetric(float64(after-before-1)/float64(n), "commands/turn")
	})
	b.Run("store-read", func(b *testing.B) {
		s, rds := benchStore(b)
		key := "conversation-0002"
		h := storeHash(key)
		if err := s.rdb.Set(context.Background(), s.key(h), storeValue{replica: "r2", start: 0x5eed}.String(), time.Hour).Err(); err != nil {
			b.Fatal(err)
		}
		req := placement.Request{Key: key, Start: 0x5eed}
		before, _ := rds.Commands()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			s.router.Unbind(key)
			s.confirmed.del(h)
			d, _, err := s.Route(req)
			if err != nil || d.Replica != "r2" || d.Reason != placement.ReasonSticky {
				b.Fatal(d.Replica, d.Reason, err)
			}
			d.Release()
			n++
		}
		after, _ := rds.Commands()
		b.ReportMetric(float64(after-before-1)/float64(n), "commands/turn")
		if s.fallbacks.Load() > 0 {
			b.Logf("%d of %d reads passed the deadline", s.fallbacks.Load(), n)
		}
	})
}

// TestStoreMemoryPerBinding measures the store's memory per binding: INFO
// memory's used_memory before and after writing bindings as the store
// writes them (key, value, TTL).
func TestStoreMemoryPerBinding(t *testing.T) {
	s, rds := benchStore(t)
	const n = 20000
	used := func() int64 {
		v, err := rds.Info("memory", "used_memory")
		if err != nil {
			t.Fatal(err)
		}
		x, _ := strconv.ParseInt(v, 10, 64)
		return x
	}
	before := used()
	ctx := context.Background()
	for i := 0; i < n; i += 1000 {
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for j := i; j < i+1000; j++ {
				v := storeValue{replica: fmt.Sprintf("10.0.0.%d:8000", j%8), start: storeHash(fmt.Sprint("start", j))}
				p.Set(ctx, s.key(storeHash(fmt.Sprint("session-", j))), v.String(), time.Hour)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	after := used()
	per := float64(after-before) / n
	t.Logf("used_memory %d → %d bytes for %d bindings: %.0f bytes per binding (key %q)", before, after, n, per, s.key(1))
	if per <= 0 || per > 1024 {
		t.Errorf("%.0f bytes per binding: the measurement is off", per)
	}
}
