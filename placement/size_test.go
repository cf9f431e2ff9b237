package placement

import (
	"sync"
	"testing"
)

func TestSizeRate(t *testing.T) {
	t.Parallel()
	var s SizeRate
	if got := s.Rate(4); got != 4 {
		t.Fatalf("before any turn: %g, want the prior 4", got)
	}
	s.Observe(0, 100) // no size: ignored
	s.Observe(500, 0) // not counted: ignored
	if got := s.Rate(4); got != 4 {
		t.Fatalf("after turns missing a figure: %g, want the prior 4", got)
	}
	// a word-counting engine: 5.5 bytes per token, then a turn at 6.5
	s.Observe(55000, 10000)
	if got := s.Rate(4); got != 5.5 {
		t.Fatalf("after one turn of 55,000 bytes and 10,000 tokens: %g, want 5.5", got)
	}
	s.Observe(65000, 10000)
	if got := s.Rate(4); got != 6 {
		t.Fatalf("the ratio of the sums: %g, want 6", got)
	}
}

// TestSizeRateConcurrent: observations from many requests at once all
// count, and readers never see a torn rate (go test -race).
func TestSizeRateConcurrent(t *testing.T) {
	t.Parallel()
	var s SizeRate
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				s.Observe(400, 100)
				if r := s.Rate(1); r != 4 {
					t.Errorf("rate %g, want 4", r)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s.tokens != 800000 {
		t.Fatalf("tokens %g, want 800,000", s.tokens)
	}
}
