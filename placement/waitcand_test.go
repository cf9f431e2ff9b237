package placement

import (
	"testing"
	"time"
)

// TestWaitCandidate: where only the deviation of a replica's KV demand
// overflows (its conversations pause as long as their turns run), a new
// conversation waits while its wait is shorter than the recompute its
// coming in forces on the resident conversations, and comes in once it is
// longer; its decision carries both figures, and the snapshot keeps them.
func TestWaitCandidate(t *testing.T) {
	t.Parallel()
	r := admitRouter(1, 10000, Config{AdmitWindow: time.Minute})
	// a and b: 4.5k each, 2 s turns 2 s apart, a second out of step; the
	// replica prefills 20k tokens/s (a 4.5k prompt in 225 ms)
	turn := func(key string, d Decision, size, i int, end time.Time) {
		prompt, cached := size+10*i, 0
		if i > 0 {
			cached = prompt - 10
		}
		r.Feedback(Turn{Key: key, Replica: d.Replica, Reason: d.Reason, Prompt: prompt, Cached: cached, Completion: 10,
			Duration: 2 * time.Second, FirstToken: time.Duration(prompt-cached) * time.Second / 20000})
		d.ReleaseAt(end)
	}
	// z grew to 4.5k and ended: conversations are expected to grow that
	// far
	now := t0
	for i := range 2 {
		dz, _ := admitTurn(t, r, "z", 4500+10*i, now)
		now = now.Add(2 * time.Second)
		turn("z", dz, 4500, i, now)
		now = now.Add(2 * time.Second)
	}
	r.End("z", now)
	var db Decision
	for i := range 4 {
		if i > 0 {
			now = now.Add(2 * time.Second)
		}
		da, _ := admitTurn(t, r, "a", 3000+10*i, now)
		now = now.Add(time.Second)
		if i > 0 {
			turn("b", db, 3000, i-1, now)
		}
		db, _ = admitTurn(t, r, "b", 3000+10*i, now)
		now = now.Add(time.Second)
		turn("a", da, 3000, i, now)
	}
	// b is in flight, a has just paused: c comes
	d, tk := admitTurn(t, r, "c", 3000, now)
	if tk == nil {
		t.Fatalf("c came in at once (%s, %v): want it to wait", d.Replica, d.Reason)
	}
	enq := now
	// the recompute c's coming in forces on a and b, as admission
	// computes it
	evict := func() time.Duration {
		r.mu.Lock()
		defer r.mu.Unlock()
		p, n := r.reps[0], unixNanos(now)
		_, load, mean := r.adm.demand(p, 3000, r.adm.peak(), n, r.adm.projected)
		if mean > 10000 || load <= 10000 {
			t.Fatalf("mean %.0f, mean + deviation %.0f: want only the deviation over 10k", mean, load)
		}
		return time.Duration(r.adm.evictCost(p, load-10000) * 1e9)
	}
	for range 30 {
		now = now.Add(100 * time.Millisecond)
		cost := evict()
		r.AdmitWaiting(now)
		if waited := now.Sub(enq); !isReady(tk) {
			if waited > cost {
				t.Fatalf("c still waits after %v, longer than its coming in costs (%v)", waited, cost)
			}
			continue
		} else if waited <= cost {
			t.Fatalf("c came in after %v, less than its coming in costs (%v)", waited, cost)
		}
		d, err := tk.Decision()
		if err != nil || d.Replica != "r0" || d.Reason != ReasonPlaced {
			t.Fatalf("c: %s %v %v, want placed on r0", d.Replica, d.Reason, err)
		}
		if d.Wait != now.Sub(enq) || d.Evict <= 0 || d.Evict >= d.Wait {
			t.Fatalf("c's decision: wait %v, evicts %v; want %v and less", d.Wait, d.Evict, now.Sub(enq))
		}
		rec := r.Admission().Recent
		if len(rec) != 1 || rec[0].To != "r0" || rec[0].Wait != d.Wait || rec[0].Evict != d.Evict || !rec[0].At.Equal(now) {
			t.Fatalf("recent admissions %+v, want c's", rec)
		}
		return
	}
	t.Fatal("c never came in")
}

func TestAdmitCostString(t *testing.T) {
	t.Parallel()
	if got, want := (AdmitCost{Wait: 15 * time.Second, Evict: 3200 * time.Millisecond}).String(), "wait 15.00s, evicts 3.20s"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
