package bench

import "testing"

// sweep skips a long simulated sweep under the race detector: the
// simulator is single-threaded and deterministic, so the detector finds
// nothing in it and only makes it five times slower. scripts/test runs
// these tests again without it.
func sweep(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("a long simulated sweep")
	}
	if raceDetector {
		t.Skip("a single-threaded simulated sweep: run without -race (scripts/test does)")
	}
}
