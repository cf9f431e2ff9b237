package emulator

import "testing"

// TestDPLBAsyncMPClientFixedScanStart pins vLLM's get_core_engine_for_request
// before PR 47420: lowest waiting×4+running over the published snapshot,
// local waiting+1 per pick, ties to the first engine scanned from 0.
func TestDPLBAsyncMPClientFixedScanStart(t *testing.T) {
	live := [][2]int{{0, 1}, {0, 1}, {0, 0}, {0, 1}}
	load := func(i int) (int, int) { return live[i][0], live[i][1] }
	b := NewDPBalancer(4)
	b.Publish(load)
	// The idle engine 2 wins; its local waiting+1 steers the rest of the
	// burst elsewhere, the first minimum winning ties.
	for i, want := range []int{2, 0, 1, 3} {
		if got := b.Pick(); got != want {
			t.Fatalf("pick %d: engine %d, want %d", i, got, want)
		}
	}
	// Engine 3 goes idle; until the next publish the balancer cannot know.
	live = [][2]int{{0, 2}, {0, 2}, {0, 1}, {0, 0}}
	if got := b.Pick(); got != 2 {
		t.Fatalf("pick on the stale snapshot: engine %d, want 2", got)
	}
	b.Publish(load)
	if got := b.Pick(); got != 3 {
		t.Fatalf("pick after publish: engine %d, want the idle engine 3", got)
	}
	// Tied snapshots always go to engine 0 without rotation.
	live = [][2]int{{0, 1}, {0, 1}, {0, 1}, {0, 1}}
	for i := 0; i < 3; i++ {
		b.Publish(load)
		if got := b.Pick(); got != 0 {
			t.Fatalf("tied pick %d: engine %d, want 0", i, got)
		}
	}
}

// TestDPLBAsyncMPClientRotatingTieBreak pins vLLM's get_core_engine_for_request
// from PR 47420 on: the scan start advances after every decision, so tied
// snapshots walk round the engines while a lower score still wins.
func TestDPLBAsyncMPClientRotatingTieBreak(t *testing.T) {
	live := [][2]int{{0, 1}, {0, 1}, {0, 1}, {0, 1}}
	load := func(i int) (int, int) { return live[i][0], live[i][1] }
	b := NewDPBalancer(4)
	b.Rotate = true
	for i, want := range []int{0, 1, 2, 3, 0} {
		b.Publish(load)
		if got := b.Pick(); got != want {
			t.Fatalf("tied pick %d: engine %d, want %d", i, got, want)
		}
	}
	// Start is now 1; engine 0 is idle and wins on score despite the start.
	live = [][2]int{{0, 0}, {0, 1}, {0, 1}, {0, 1}}
	b.Publish(load)
	if got := b.Pick(); got != 0 {
		t.Fatalf("lower score must win over the scan start: engine %d, want 0", got)
	}
	// Local increments still spread a burst between publishes: start 2.
	live = [][2]int{{0, 0}, {0, 0}, {0, 0}, {0, 0}}
	b.Publish(load)
	for i, want := range []int{2, 3, 0, 1} {
		if got := b.Pick(); got != want {
			t.Fatalf("burst pick %d: engine %d, want %d", i, got, want)
		}
	}
}

// TestDPLBAsyncMPClientPerAPIServer pins the balancer of `vllm serve
// --data-parallel-size N` with its default N API servers: each has its own
// copy of the published counts, starts its scan at
// engines×client_index/client_count, and adds client_count to the engine it
// picks; the coordinator's publication resets all copies.
func TestDPLBAsyncMPClientPerAPIServer(t *testing.T) {
	live := [][2]int{{0, 1}, {0, 1}, {0, 1}, {0, 1}}
	load := func(i int) (int, int) { return live[i][0], live[i][1] }
	b := NewDPBalancerClients(4, 4)
	if b.Clients() != 4 {
		t.Fatalf("%d clients, want 4", b.Clients())
	}
	b.Publish(load)
	// Tied: each API server picks its own scan start.
	for k := 0; k < 4; k++ {
		if got := b.PickBy(k); got != k {
			t.Fatalf("API server %d on a tie: engine %d, want %d", k, got, k)
		}
	}
	// API server 2 has added 4 to engine 2's waiting (score 17): it moves on.
	if got := b.PickBy(2); got != 3 {
		t.Fatalf("API server 2 after its own pick: engine %d, want 3", got)
	}
	// API server 0 did not see server 2's local additions.
	b.Publish(load)
	if got := b.PickBy(0); got != 0 {
		t.Fatalf("API server 0 after a publication: engine %d, want 0", got)
	}
	// Two servers of eight engines start at 0 and 4.
	b2 := NewDPBalancerClients(8, 2)
	if got := b2.PickBy(1); got != 4 {
		t.Fatalf("second of two API servers over 8 idle engines: engine %d, want 4", got)
	}
}
