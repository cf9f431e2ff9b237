package vllmstats

import (
	"testing"
	"time"
)

func TestHitWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_800_000_000, 0)
	type poll struct {
		at            time.Duration // since t0
		queries, hits float64
		want          float64 // -1: unknown (nothing queried in the window)
	}
	cases := []struct {
		name     string
		span     time.Duration
		interval time.Duration
		polls    []poll
	}{
		{"first sample has no history", time.Minute, time.Second, []poll{{0, 100, 50, -1}}},
		{"early on, since the oldest", time.Minute, time.Second, []poll{
			{0, 100, 50, -1}, {time.Second, 200, 130, 0.8}, {2 * time.Second, 300, 230, 0.9}}},
		{"slides past the span", 2 * time.Second, time.Second, []poll{
			{0, 0, 0, -1}, {time.Second, 100, 0, 0}, {2 * time.Second, 100, 0, 0},
			{3 * time.Second, 200, 100, 1}, // since t0+1s: 100 queries, 100 hits
		}},
		{"idle: no queries in the span is unknown, not 0 %", time.Second, time.Second, []poll{
			{0, 100, 50, -1}, {time.Second, 100, 50, -1}, {2 * time.Second, 100, 50, -1}}},
		{"busy, then idle", time.Second, time.Second, []poll{
			{0, 100, 50, -1}, {time.Second, 200, 50, 0}, {2 * time.Second, 200, 50, -1}}},
		{"a small ring keeps sliding", 10 * time.Second, time.Second, func() []poll {
			var ps []poll
			for i := range 40 { // 12 slots: the window is the last 10 s
				ps = append(ps, poll{time.Duration(i) * time.Second, float64(i * 10), float64(i * 10 / 2), 0})
			}
			ps[0].want = -1
			for i := 1; i < len(ps); i++ {
				ps[i].want = 0.5
			}
			return ps
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newHitWindow(c.span, c.interval)
			for i, p := range c.polls {
				got, known := w.add(t0.Add(p.at), p.queries, p.hits)
				if !known {
					got = -1
				}
				if got != p.want {
					t.Fatalf("poll %d: rate %v (known %v), want %v", i, got, known, p.want)
				}
			}
		})
	}
	if n := len(newHitWindow(time.Hour, time.Millisecond).samples); n != 3600 {
		t.Fatalf("ring of %d samples, want the 3,600 cap", n)
	}
	if n := len(newHitWindow(time.Second, time.Minute).samples); n != 4 {
		t.Fatalf("ring of %d samples, want the minimum 4", n)
	}
}
