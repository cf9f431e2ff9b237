package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// checkInvariants verifies the binding structures against each other.
func checkInvariants(t *testing.T, r *Router) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.b.n != len(r.b.idx) {
		t.Fatalf("n %d, map %d", r.b.n, len(r.b.idx))
	}
	if r.b.n > r.cfg.MaxBindings {
		t.Fatalf("%d bindings over MaxBindings %d", r.b.n, r.cfg.MaxBindings)
	}
	n, prev := 0, nilIdx
	for e := r.b.ghead; e != nilIdx; e = r.b.ents[e].gnext {
		en := r.b.ents[e]
		if en.gprev != prev || r.b.idx[en.hash] != e {
			t.Fatalf("global list broken at %d", e)
		}
		if prev != nilIdx && r.b.ents[prev].last < en.last {
			t.Fatalf("global list out of order at %d", e)
		}
		prev = e
		n++
	}
	if n != r.b.n || prev != r.b.gtail {
		t.Fatalf("global list has %d, want %d", n, r.b.n)
	}
	total := 0
	for i, p := range r.reps {
		if p == nil {
			continue // forgotten
		}
		if r.byID[p.id] != int32(i) || p.idx != int32(i) {
			t.Fatalf("replica %s: index %d, byID %d", p.id, i, r.byID[p.id])
		}
		cnt, act, paused, prev, inactiveSeen := 0, 0, 0, nilIdx, false
		for e := p.head; e != nilIdx; e = r.b.ents[e].rnext {
			en := r.b.ents[e]
			if en.flags&flagPaused != 0 {
				paused++
			}
			if en.rprev != prev || en.rep != p.idx {
				t.Fatalf("replica %s list broken at %d", p.id, e)
			}
			if en.flags&flagActive != 0 {
				if inactiveSeen {
					t.Fatalf("replica %s: active entry after inactive", p.id)
				}
				act++
				if e == p.activeTail && en.rnext != nilIdx && r.b.ents[en.rnext].flags&flagActive != 0 {
					t.Fatalf("replica %s: activeTail not last active", p.id)
				}
			} else {
				inactiveSeen = true
			}
			prev = e
			cnt++
		}
		if cnt != p.bindings || act != p.active || prev != p.tail {
			t.Fatalf("replica %s: list %d/%d active, counters %d/%d", p.id, cnt, act, p.bindings, p.active)
		}
		if paused != p.paused {
			t.Fatalf("replica %s: %d paused in its list, counter %d", p.id, paused, p.paused)
		}
		if (act == 0) != (p.activeTail == nilIdx) {
			t.Fatalf("replica %s: activeTail %d with %d active", p.id, p.activeTail, act)
		}
		total += cnt
	}
	if total != r.b.n {
		t.Fatalf("replica lists hold %d, want %d", total, r.b.n)
	}
}

func TestRandomized(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { randomRun(t, seed, 20000) })
	}
}

func randomRun(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 99))
	all := ids(6)
	cfg := Config{MaxNumSeqs: 8 + rng.IntN(16), IdleTTL: time.Minute, ActiveWindow: 20 * time.Second, MaxBindings: 50 + rng.IntN(50)}
	r := NewRouter(cfg)
	r.SetReplicas(all)
	threshold, _ := r.SpillThreshold()
	var held []Decision
	reasons := map[Reason]int{}
	now := t0
	for step := range steps {
		now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		switch op := rng.IntN(100); {
		case op < 55:
			req := Request{Now: now}
			if rng.IntN(10) > 0 {
				req.Key = fmt.Sprint("k", rng.IntN(150))
			}
			if rng.IntN(20) == 0 {
				req.Pin = all[rng.IntN(len(all))]
			}
			if rng.IntN(10) == 0 {
				req.Parent = fmt.Sprint("k", rng.IntN(150))
			}
			if rng.IntN(10) == 0 {
				req.Exclude = []string{all[rng.IntN(len(all))]}
			}
			before := r.Snapshot()
			doneBefore := map[string]int64{}
			for _, id := range all {
				if i, ok := r.byID[id]; ok {
					doneBefore[id] = r.reps[i].doneSincePoll.Load()
				}
			}
			d, err := r.Route(req)
			if err != nil {
				continue
			}
			var target ReplicaSnapshot
			for _, rs := range before.Replicas {
				if rs.ID == d.Replica {
					target = rs
				}
			}
			// what the router counted running there when it decided:
			// its own in-flight turns, or the polled count less the
			// turns that ended since that poll
			run := target.InFlight
			if target.Load.Reachable {
				run = max(run, target.Load.Running-int(doneBefore[d.Replica]))
			}
			switch d.Reason {
			case ReasonSticky:
				if run > threshold {
					t.Fatalf("step %d: %s to %s with running %d over threshold %d", step, d.Reason, d.Replica, run, threshold)
				}
			case ReasonSpilled:
				// onto a replica over the threshold only when every
				// other one that could take it was over it too
				if run <= threshold {
					break
				}
				for _, rs := range before.Replicas {
					if rs.ID == d.Replica || rs.ID == d.Previous || !rs.Available || slices.Contains(req.Exclude, rs.ID) {
						continue
					}
					if q := max(rs.InFlight, rs.Load.Running); q <= threshold {
						t.Fatalf("step %d: spilled to %s with running %d over threshold %d while %s ran %d", step, d.Replica, run, threshold, rs.ID, q)
					}
				}
			}
			for _, x := range req.Exclude {
				if x == d.Replica {
					t.Fatalf("step %d: routed to excluded %s", step, x)
				}
			}
			if !target.Available || target.ID == "" {
				t.Fatalf("step %d: routed to unavailable or removed %s", step, d.Replica)
			}
			reasons[d.Reason]++
			held = append(held, d)
			if rng.IntN(4) == 0 {
				held = append(held, d) // a copy: releasing both must count once
			}
		case op < 85:
			if len(held) > 0 {
				i := rng.IntN(len(held))
				held[i].Release()
				held[i] = held[len(held)-1]
				held = held[:len(held)-1]
			}
		case op < 93:
			id := all[rng.IntN(len(all))]
			r.UpdateLoad(id, Load{Running: rng.IntN(2 * threshold), Waiting: rng.IntN(3), KVUsage: rng.Float64(), Reachable: rng.IntN(5) > 0, Seen: now})
		case op < 96:
			r.SetAvailable(all[rng.IntN(len(all))], rng.IntN(3) > 0)
		case op < 97:
			sub := make([]string, 0, len(all))
			for _, id := range all {
				if rng.IntN(4) > 0 {
					sub = append(sub, id)
				}
			}
			r.SetReplicas(sub)
		case op < 98:
			now = now.Add(time.Duration(rng.IntN(90)) * time.Second)
			r.Sweep(now)
		case op < 99:
			cfg.MaxBindings = 20 + rng.IntN(80)
			r.Reconfigure(cfg)
		default:
			r.SetAffinity(rng.IntN(4) > 0)
		}
		if step%97 == 0 {
			checkInvariants(t, r)
		}
	}
	checkInvariants(t, r)
	for reason := ReasonAffinityOff; reason <= ReasonClientPinned; reason++ {
		if reasons[reason] == 0 {
			t.Errorf("no decision with reason %s in %d steps: %v", reason, steps, reasons)
		}
	}
	for _, d := range held {
		d.Release()
	}
	r.SetReplicas(all)
	s := r.Snapshot()
	if s.InFlight != 0 {
		t.Fatalf("in flight %d after releasing everything", s.InFlight)
	}
	for _, rs := range s.Replicas {
		if rs.InFlight != 0 {
			t.Fatalf("%s in flight %d after releasing everything", rs.ID, rs.InFlight)
		}
	}
}

func TestConcurrentRouting(t *testing.T) {
	t.Parallel()
	const workers, perWorker = 300, 150
	r := newTestRouter(8, Config{MaxNumSeqs: 16, MaxBindings: 500, IdleTTL: time.Second})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var ctl sync.WaitGroup
	ctl.Add(1)
	go func() { // load updates, availability flips, snapshots and sweeps meanwhile
		defer ctl.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprint("r", rng.IntN(8))
			r.UpdateLoad(id, Load{Running: rng.IntN(8), Reachable: true})
			if i%10 == 0 {
				r.SetAvailable(id, rng.IntN(2) == 0)
			}
			if i%50 == 0 {
				r.SetReplicas(ids(8))
				r.Sweep(time.Now())
				_ = r.Snapshot()
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []Decision
			for i := range perWorker {
				d, err := r.Route(Request{Key: fmt.Sprint("k", rng.IntN(1000)), Parent: "k1"})
				if err != nil {
					continue
				}
				mine = append(mine, d)
				if i%3 == 0 {
					go d.Release() // a copy released concurrently with the original below
				}
				if len(mine) > 4 {
					mine[0].Release()
					mine = mine[1:]
				}
			}
			for _, d := range mine {
				d.Release()
			}
		}()
	}
	wg.Wait()
	close(stop)
	ctl.Wait()
	// Concurrently released copies may still be running; wait for them.
	deadline := time.Now().Add(5 * time.Second)
	for r.Snapshot().InFlight != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	s := r.Snapshot()
	if s.InFlight != 0 {
		t.Fatalf("in flight %d after all releases", s.InFlight)
	}
	if s.Bindings > 500 {
		t.Fatalf("%d bindings over the cap", s.Bindings)
	}
	checkInvariants(t, r)
}
