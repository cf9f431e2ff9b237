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

	// Over the threshold, the turn spills and the conversation moves.
	r.UpdateLoad("gpu1", placement.Load{Running: 9, Reachable: true})
	d, _ = r.Route(placement.Request{Key: "session-a", Now: now.Add(2 * time.Second)})
	fmt.Println(d.Replica, d.Reason)
	d.Release()

	s := r.Snapshot()
	fmt.Printf("sticky share %.2f, in flight %d\n", s.StickyShare, s.InFlight)
	// Output:
	// gpu1 placed
	// gpu1 sticky
	// gpu0 spilled
	// sticky share 0.50, in flight 0
}
