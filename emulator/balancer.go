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
//
// `vllm serve --data-parallel-size N` starts N API server processes by
// default (vllm/entrypoints/cli/serve.py: api_server_count defaults to
// data_parallel_size with the internal balancer), each with its own
// DPLBAsyncMPClient: its own copy of the published counts, a scan start of
// engines×client_index/client_count, and client_count added to the picked
// engine's waiting count. The kernel spreads connections over the
// processes, so which one decides a request is random. NewDPBalancerClients
// models that; NewDPBalancer is one API server.
type DPBalancer struct {
	clients []dpClient
	// Rotate advances a client's scan start after every pick (vLLM PR 47420).
	Rotate bool
}

type dpClient struct {
	counts [][2]int // waiting, running
	start  int
}

// NewDPBalancer balances over n engines from one API server, all engines
// idle until the first Publish, with the fixed scan start of the releases
// before PR 47420 (ties to the lowest engine). Set Rotate for later
// releases.
func NewDPBalancer(n int) *DPBalancer { return NewDPBalancerClients(n, 1) }

// NewDPBalancerClients balances over n engines from the given number of
// API servers (at least 1).
func NewDPBalancerClients(n, clients int) *DPBalancer {
	clients = max(1, clients)
	b := &DPBalancer{clients: make([]dpClient, clients)}
	for k := range b.clients {
		b.clients[k] = dpClient{counts: make([][2]int, n), start: n * k / clients}
	}
	return b
}

// Clients is the number of API servers picking engines.
func (b *DPBalancer) Clients() int { return len(b.clients) }

// Publish replaces every API server's snapshot with the engines' live
// counts (the coordinator publishes to all front ends at once).
func (b *DPBalancer) Publish(load func(engine int) (waiting, running int)) {
	for i := range b.clients[0].counts {
		w, r := load(i)
		for k := range b.clients {
			b.clients[k].counts[i] = [2]int{w, r}
		}
	}
}

// Pick returns the engine for a request decided by the first API server.
func (b *DPBalancer) Pick() int { return b.PickBy(0) }

// PickBy returns the engine for a request decided by API server client
// (0 ≤ client < Clients()).
func (b *DPBalancer) PickBy(client int) int {
	c := &b.clients[client]
	n := len(c.counts)
	best, bestScore := c.start, int(^uint(0)>>1)
	for i := 0; i < n; i++ {
		idx := (c.start + i) % n
		if s := DPScore(c.counts[idx][0], c.counts[idx][1]); s < bestScore {
			best, bestScore = idx, s
		}
	}
	c.counts[best][0] += len(b.clients)
	if b.Rotate {
		c.start = (c.start + 1) % n
	}
	return best
}
