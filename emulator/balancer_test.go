package emulator

import "testing"

func TestDPBalancer(t *testing.T) {
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
}
