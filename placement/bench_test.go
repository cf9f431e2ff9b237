package placement

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"
)

func sessionKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		// shaped like X-Claude-Code-Session-Id (a UUID)
		keys[i] = fmt.Sprintf("%08x-4a2b-4c3d-8e9f-%012x", i*2654435761, i)
	}
	return keys
}

func loaded(n int, cfg Config) *Router {
	r := newTestRouter(n, cfg)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, id := range ids(n) {
		r.UpdateLoad(id, Load{Running: rng.IntN(8), Waiting: rng.IntN(2), KVUsage: rng.Float64(), Reachable: true})
	}
	return r
}

func BenchmarkRouteSticky(b *testing.B) {
	b.Run("one-key", func(b *testing.B) {
		r := loaded(4, Config{})
		req := Request{Key: sessionKeys(1)[0], Now: t0, Start: 0x5eed}
		d, _ := r.Route(req)
		d.Release()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			d, err := r.Route(req)
			if err != nil || d.Reason != ReasonSticky {
				b.Fatal(d.Reason, err)
			}
			d.Release()
		}
	})
	b.Run("100k-keys", func(b *testing.B) {
		r := loaded(8, Config{})
		keys := sessionKeys(100000)
		for i, k := range keys {
			d, _ := r.Route(Request{Key: k, Now: t0, Start: uint64(i) + 1})
			d.Release()
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			d, err := r.Route(Request{Key: keys[i%len(keys)], Now: t0, Start: uint64(i%len(keys)) + 1})
			if err != nil || d.Reason != ReasonSticky {
				b.Fatal(d.Reason, err)
			}
			d.Release()
		}
	})
}

// BenchmarkPlace routes keys never seen before (older ones are evicted at
// MaxBindings), so every decision scores all replicas.
func BenchmarkPlace(b *testing.B) {
	keys := sessionKeys(1 << 16)
	for _, n := range []int{4, 8, 64, 256} {
		b.Run(fmt.Sprint("replicas=", n), func(b *testing.B) {
			r := loaded(n, Config{MaxBindings: 4096, MaxNumSeqs: 1 << 20})
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				d, err := r.Route(Request{Key: keys[i&(len(keys)-1)], Now: t0})
				if err != nil || d.Reason != ReasonPlaced {
					b.Fatal(d.Reason, err)
				}
				d.Release()
			}
		})
	}
	for _, n := range []int{4, 256} {
		b.Run(fmt.Sprint("no-key/replicas=", n), func(b *testing.B) {
			r := loaded(n, Config{})
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				d, _ := r.Route(Request{Now: t0})
				d.Release()
			}
		})
	}
}

func BenchmarkRouteParallel(b *testing.B) {
	r := loaded(8, Config{})
	keys := sessionKeys(10000)
	for _, k := range keys {
		d, _ := r.Route(Request{Key: k, Now: t0})
		d.Release()
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := rand.IntN(len(keys))
		for pb.Next() {
			d, err := r.Route(Request{Key: keys[i%len(keys)]})
			if err != nil {
				b.Error(err)
				return
			}
			d.Release()
			i++
		}
	})
}

// BenchmarkMemoryPerBinding binds 1,000,000 conversations and reports the
// heap the Router holds per binding (the keys themselves are the caller's).
func BenchmarkMemoryPerBinding(b *testing.B) {
	const n = 1000000
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		r := newTestRouter(8, Config{MaxBindings: n, IdleTTL: 24 * time.Hour})
		buf := make([]byte, 0, 64)
		for i := range n {
			buf = strconv.AppendInt(append(buf[:0], "session-"...), int64(i), 10)
			d, err := r.Route(Request{Key: string(buf), Now: t0})
			if err != nil {
				b.Fatal(err)
			}
			d.Release()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := r.Len(); got != n {
			b.Fatalf("%d bindings, want %d", got, n)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/binding")
		runtime.KeepAlive(r)
	}
}

// BenchmarkFeedback is the cost of reporting a finished sticky turn.
func BenchmarkFeedback(b *testing.B) {
	r := loaded(8, Config{})
	keys := sessionKeys(100000)
	for _, k := range keys {
		d, _ := r.Route(Request{Key: k, Now: t0})
		d.Release()
	}
	reps := make([]string, len(keys))
	for i, k := range keys {
		reps[i], _ = r.Bound(k)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		j := i % len(keys)
		r.Feedback(Turn{Key: keys[j], Replica: reps[j], Reason: ReasonSticky, Prompt: 1000 + i%500, Cached: 1000})
	}
}

// admitLoaded is loaded with admission in force: every replica's capacity
// known (1M tokens, so new conversations fit), and perReplica
// conversations resident on each, their last turns measured.
func admitLoaded(n, perReplica int) (*Router, []string) {
	r := newTestRouter(n, Config{MaxNumSeqs: 1 << 20})
	rng := rand.New(rand.NewPCG(3, 4))
	for _, id := range ids(n) {
		// nothing waits in the engines: a queue there would pause the
		// conversations (time-slicing) and the sticky turns would wait
		r.UpdateLoad(id, Load{Running: rng.IntN(8), KVUsage: rng.Float64(), Reachable: true, KVTokens: 1 << 20})
	}
	keys := sessionKeys(n * perReplica)
	for _, k := range keys {
		d, _, _ := r.Admit(Request{Key: k, Tokens: 12000, Now: t0})
		d.ReleaseAt(t0)
		r.Feedback(Turn{Key: k, Replica: d.Replica, Reason: d.Reason, Prompt: 12000, Cached: 3500, Completion: 256})
	}
	return r, keys
}

// BenchmarkAdmission: a sticky turn with admission in force (routing and
// releasing, which then takes the lock to end the turn's hold), the same
// with time-slicing's check at the turn's end computed afresh, and the
// decision for a new conversation, which sums every replica's resident
// working set (8 conversations each), with the release and unbinding that
// keep the next decision's state the same.
func BenchmarkAdmission(b *testing.B) {
	b.Run("sticky", func(b *testing.B) {
		r, keys := admitLoaded(4, 8)
		req := Request{Key: keys[0], Tokens: 12500, Now: t0}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			d, tk, err := r.Admit(req)
			if err != nil || tk != nil || d.Reason != ReasonSticky {
				b.Fatal(d.Reason, tk, err)
			}
			d.Release()
		}
	})
	// a turn under time-slicing: routed sticky and ended, when its
	// replica's demand is computed to rule a pause out, over every
	// replica's conversations in turn
	for _, n := range []int{7, 64, 256} {
		b.Run(fmt.Sprint("turn/replicas=", n), func(b *testing.B) {
			r, keys := admitLoaded(n, 8)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				at := t0
				d, tk, err := r.Admit(Request{Key: keys[i%len(keys)], Tokens: 12500, Now: at})
				if err != nil || tk != nil || d.Reason != ReasonSticky {
					b.Fatal(d.Reason, tk, err)
				}
				d.ReleaseAt(at)
			}
			if a := r.Admission(); a.PausedTotal != 0 {
				b.Fatalf("%d conversations paused", a.PausedTotal)
			}
		})
	}
	fresh := sessionKeys(1 << 16)
	for i := range fresh {
		fresh[i] = "new-" + fresh[i]
	}
	for _, n := range []int{4, 64, 256} {
		b.Run(fmt.Sprint("new/replicas=", n), func(b *testing.B) {
			r, _ := admitLoaded(n, 8)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				// the same instant: the resident conversations stay resident
				d, tk, err := r.Admit(Request{Key: fresh[i&(len(fresh)-1)], Tokens: 12000, Now: t0})
				if err != nil || tk != nil {
					b.Fatal(tk, err)
				}
				d.Release()
				// forgotten again (timed: a stopped timer costs more than
				// this), so every decision sees the same resident sets
				r.Unbind(fresh[i&(len(fresh)-1)])
			}
		})
	}
}
