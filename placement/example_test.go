package placement_test

import (
	"fmt"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

func Example() {
	r := placement.NewRouter(placement.Config{MaxNumSeqs: 32}) // spill threshold auto: 8
	r.SetReplicas([]string{"gpu0", "gpu1"})
	r.UpdateLoad("gpu0", placement.Load{Running: 3, Reachable: true})
	now := time.Now()

	// A new conversation goes to the least-loaded replica.
	d, _ := r.Route(placement.Request{Key: "session-a", Now: now})
	fmt.Println(d.Replica, d.Reason)
	d.Release()

	// Its next turn stays there while gpu1 is not over the threshold.
	d, _ = r.Route(placement.Request{Key: "session-a", Now: now.Add(time.Second)})
	fmt.Println(d.Replica, d.Reason)
	d.Release()

	// Over the threshold with nothing queued, a turn of 6,000 tokens
	// stays: recomputing them on gpu0 would cost 3 s at the default
	// prefill rate, and it waits for nothing on gpu1.
	r.UpdateLoad("gpu1", placement.Load{Running: 9, Reachable: true})
	d, _ = r.Route(placement.Request{Key: "session-a", Tokens: 6000, Now: now.Add(2 * time.Second)})
	fmt.Println(d.Replica, d.Reason, d.Stay, d.Move)
	d.Release()

	// With a queue as long as the batch, the turn would wait about a turn
	// time (10 s by default) on gpu1: it spills and the conversation moves.
	r.UpdateLoad("gpu1", placement.Load{Running: 9, Waiting: 9, Reachable: true})
	d, _ = r.Route(placement.Request{Key: "session-a", Tokens: 6000, Now: now.Add(3 * time.Second)})
	fmt.Println(d.Replica, d.Reason, d.Stay, d.Move)
	d.Release()

	s := r.Snapshot()
	fmt.Printf("sticky share %.2f, in flight %d\n", s.StickyShare, s.InFlight)
	// Output:
	// gpu1 placed
	// gpu1 sticky
	// gpu1 spill-declined 0s 3s
	// gpu0 spilled 11.111111111s 3s
	// sticky share 0.67, in flight 0
}
