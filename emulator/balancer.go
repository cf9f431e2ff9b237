package emulator

import "time"

// DefaultDPStatsInterval is how often vLLM's data-parallel coordinator
// publishes the engines' waiting and running counts to the front end
// (vllm/v1/engine/coordinator.py: min_stats_update_interval_ms = 100; the
// coordinator publishes at most that often while the counts change, and
// every 4 s otherwise).
const DefaultDPStatsInterval = 100 * time.Millisecond

// DPBalancer picks a data-parallel engine for a request the way vLLM V1's
// front end does (vllm/v1/engine/core_client.py,
// DPLBAsyncMPClient.get_core_engine_for_request): the lowest DPScore
// (waiting×4 + running) over the counts the coordinator last published,
// scanning from a start index and keeping the first strict minimum, so a
// tie goes to the first engine scanned. Every pick adds one to its
// engine's waiting count locally ("current_counts[eng_index][0] +=
// self.client_count", one API server); the next Publish replaces those
// local additions wholesale.
//
// Where the scan starts differs between releases. Before vLLM PR 47420
// (merged July 2026) the start index was fixed (0 with one API server), so
// ties went to the lowest-numbered engine. From PR 47420 on, the start
// index advances by one after every decision, so a run of tied decisions
// walks round the engines (Rotate). A conversation's next turn, sent right
// after its last one finished, usually meets a tie (its engine still looks
// busy for up to a publishing period), so rotation moves most turns of a
// conversation off the engine holding its prefix (vLLM issue 52463).
//
// Call Publish on the coordinator's period (the Server does, in engine
// time) and Pick per request. Not safe for concurrent use.
type DPBalancer struct {
	counts [][2]int // waiting, running
	// Rotate advances the scan start after every pick (vLLM PR 47420).
	Rotate bool
	start  int
}

// NewDPBalancer balances over n engines, all idle until the first
// Publish, with the fixed scan start of the releases before PR 47420: the
// one the reference measurement (4 × RTX A4000, Qwen3-4B, vLLM
// data-parallel 4) matches (its "off" column shows 2.71 of 4 replicas busy
// at 4 sessions, the lowest engines taking the ties; a rotating start
// spreads them to 4.0). Set Rotate for current releases.
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
	n := len(b.counts)
	best, bestScore := b.start, int(^uint(0)>>1)
	for i := 0; i < n; i++ {
		idx := (b.start + i) % n
		c := b.counts[idx]
		if s := DPScore(c[0], c[1]); s < bestScore {
			best, bestScore = idx, s
		}
	}
	b.counts[best][0]++
	if b.Rotate {
		b.start = (b.start + 1) % n
	}
	return best
}
