package placement

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// waitScene builds, on a router of len(rates) replicas of 10k KV tokens
// each, the shape where a new conversation's coming in costs something:
// on replica k two conversations of 3k tokens, 2 s turns 2 s apart and a
// second out of step, prefilled at rates[k] thousand tokens/s, after one
// on the first replica that grew to 4.5k and ended (conversations are
// expected to grow that far). It returns the time when, on every replica,
// the second is in flight and the first has just paused.
func waitScene(t *testing.T, rates ...int) (*Router, time.Time) {
	t.Helper()
	r := admitRouter(len(rates), 10000, Config{AdmitWindow: time.Minute})
	turn := func(key, pin string, size, i int, now time.Time) Decision {
		req := Request{Key: key, Tokens: size + 10*i, Now: now}
		if i == 0 {
			req.Pin = pin // binds it; its later turns follow as any does
		}
		d, tk, err := r.Admit(req)
		if err != nil || tk != nil || d.Replica != pin {
			t.Fatalf("%s's turn %d: %s, %v; want %s", key, i, d.Replica, err, pin)
		}
		return d
	}
	done := func(key string, d Decision, size, i int, end time.Time) {
		rate := rates[0]
		if d.Replica != "r0" {
			rate = rates[1]
		}
		prompt, cached := size+10*i, 0
		if i > 0 {
			cached = prompt - 10
		}
		r.Feedback(Turn{Key: key, Replica: d.Replica, Reason: d.Reason, Prompt: prompt, Cached: cached, Completion: 10,
			Duration: 2 * time.Second, FirstToken: time.Duration(prompt-cached) * time.Second / time.Duration(rate*1000)})
		d.ReleaseAt(end)
	}
	now := t0
	for i := range 2 {
		d := turn("z", "r0", 4500, i, now)
		now = now.Add(2 * time.Second)
		done("z", d, 4500, i, now)
		now = now.Add(2 * time.Second)
	}
	r.End("z", now)
	n := len(rates)
	da := make([]Decision, n)
	db := make([]Decision, n)
	for i := range 4 {
		if i > 0 {
			now = now.Add(2 * time.Second)
		}
		for k := range n {
			da[k] = turn(fmt.Sprint("a", k), ids(n)[k], 3000, i, now)
		}
		now = now.Add(time.Second)
		for k := range n {
			if i > 0 {
				done(fmt.Sprint("b", k), db[k], 3000, i-1, now)
			}
			db[k] = turn(fmt.Sprint("b", k), ids(n)[k], 3000, i, now)
		}
		now = now.Add(time.Second)
		for k := range n {
			done(fmt.Sprint("a", k), da[k], 3000, i, now)
		}
	}
	return r, now
}

// enterCosts is what a new conversation of est tokens that has waited
// waited costs each replica's residents by coming in (enterCost).
func enterCosts(r *Router, est int64, now time.Time, waited time.Duration) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, i := range r.order {
		c := r.adm.enterCost(r.reps[i], est, unixNanos(now), int64(waited))
		if math.IsInf(c, 1) {
			c = 1e9 // never
		}
		out = append(out, time.Duration(c*1e9))
	}
	return out
}

// TestWaitCandidate: where only the deviation of every replica's KV demand
// overflows (its conversations pause as long as their turns run), a new
// conversation waits while its wait is shorter than the recompute its
// coming in forces on the resident conversations of the cheapest replica,
// and comes in there once it is longer, whichever replica the placement
// score prefers; its decision carries both figures, and the snapshot
// keeps them.
func TestWaitCandidate(t *testing.T) {
	t.Parallel()
	for _, rates := range [][]int{{20}, {20, 10}, {10, 20}} {
		t.Run(fmt.Sprint(rates), func(t *testing.T) {
			r, now := waitScene(t, rates...)
			d, tk := admitTurn(t, r, "c", 3000, now)
			if tk == nil {
				t.Fatalf("c came in at once (%s, %v): want it to wait", d.Replica, d.Reason)
			}
			enq := now
			for range 30 {
				now = now.Add(100 * time.Millisecond)
				waited := now.Sub(enq)
				costs := enterCosts(r, 3000, now, time.Hour) // each in full
				least := 0
				for k, c := range costs {
					if c <= 0 {
						t.Fatalf("costs %v: want every replica's residents to pay", costs)
					}
					if c < costs[least] {
						least = k
					}
				}
				cost := costs[least]
				r.AdmitWaiting(now)
				if !isReady(tk) {
					if waited >= cost {
						t.Fatalf("c still waits after %v, as long as its coming in costs (%v)", waited, costs)
					}
					continue
				} else if waited < cost {
					t.Fatalf("c came in after %v, less than its coming in costs (%v)", waited, costs)
				}
				d, err := tk.Decision()
				if want := ids(len(rates))[least]; err != nil || d.Replica != want || d.Reason != ReasonPlaced {
					t.Fatalf("c: %s %v %v, want placed on %s, the cheapest (%v)", d.Replica, d.Reason, err, want, costs)
				}
				if d.Wait != waited || d.Evict != cost {
					t.Fatalf("c's decision: wait %v, evicts %v; want %v, %v", d.Wait, d.Evict, waited, cost)
				}
				rec := r.Admission().Recent
				if len(rec) != 1 || rec[0].To != d.Replica || rec[0].Wait != d.Wait || rec[0].Evict != d.Evict || !rec[0].At.Equal(now) {
					t.Fatalf("recent admissions %+v, want c's", rec)
				}
				return
			}
			t.Fatal("c never came in")
		})
	}
}

// TestWaitCandidateCheapest: a new conversation whose wait outgrew what
// its coming in costs on either of two replicas comes in where that costs
// least, whichever the placement score prefers.
func TestWaitCandidateCheapest(t *testing.T) {
	t.Parallel()
	for _, rates := range [][]int{{20, 10}, {10, 20}} {
		t.Run(fmt.Sprint(rates), func(t *testing.T) {
			r, now := waitScene(t, rates...)
			if _, tk := admitTurn(t, r, "c", 3000, now); tk == nil {
				t.Fatal("c came in at once: want it to wait")
			}
			// nothing looks at the queue until its wait (1 s) exceeds both costs
			now = now.Add(time.Second)
			costs := enterCosts(r, 3000, now, time.Hour)
			least := 0
			if costs[1] < costs[0] {
				least = 1
			}
			if costs[0] == costs[1] || max(costs[0], costs[1]) >= time.Second {
				t.Fatalf("costs %v: want two, both under 1 s", costs)
			}
			if n := r.AdmitWaiting(now); n != 1 {
				t.Fatalf("%d admitted after 1 s, want c", n)
			}
			d, _ := admitTurn(t, r, "c", 3010, now)
			if want := ids(2)[least]; d.Replica != want {
				t.Fatalf("c on %s, want %s, the cheaper (%v)", d.Replica, want, costs)
			}
		})
	}
}

func TestAdmitCostString(t *testing.T) {
	t.Parallel()
	if got, want := (AdmitCost{Wait: 15 * time.Second, Evict: 3200 * time.Millisecond}).String(), "wait 15.00s, evicts 3.20s"; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
}
