package emulator

import "time"

// DefaultDPStatsInterval is how often vLLM's data-parallel coordinator
// publishes the engines' waiting and running counts to the front end
// (min_stats_update_interval_ms, 100 ms).
const DefaultDPStatsInterval = 100 * time.Millisecond

// DPBalancer picks a data-parallel engine for a request the way vLLM V1's
// front end does (DPLBAsyncMPClient): the lowest DPScore (waiting×4 +
// running) over the counts the coordinator last published, the first
// minimum winning ties (the scan starts at engine 0 with one API server).
// Every pick adds one to its engine's waiting count locally; the next
// Publish replaces those local additions wholesale.
//
// The coordinator publishes every DefaultDPStatsInterval, so a
// conversation's next turn, sent right after its last one finished, sees
// its engine still busy and, on a tie, goes to the lowest-numbered engine:
// the staleness is part of why vLLM's balancer scatters conversations.
// Call Publish on that period (the Server does, in engine time) and Pick
// per request. Not safe for concurrent use.
type DPBalancer struct {
	counts [][2]int // waiting, running
}

// NewDPBalancer balances over n engines, all idle until the first Publish.
func NewDPBalancer(n int) *DPBalancer {
	return &DPBalancer{counts: make([][2]int, n)}
}

// Publish replaces the snapshot with the engines' live counts.
func (b *DPBalancer) Publish(load func(engine int) (waiting, running int)) {
	for i := range b.counts {
		w, r := load(i)
		b.counts[i] = [2]int{w, r}
	}
}

// Pick returns the engine for a request.
func (b *DPBalancer) Pick() int {
	best, bestScore := 0, int(^uint(0)>>1)
	for i, c := range b.counts {
		if s := DPScore(c[0], c[1]); s < bestScore {
			best, bestScore = i, s
		}
	}
	b.counts[best][0]++
	return best
}
