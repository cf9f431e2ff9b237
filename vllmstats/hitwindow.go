package vllmstats

import "time"

// hitWindow is the prefix-cache hit rate over a sliding span of time, from
// the cumulative query and hit counts sampled at every good poll. It keeps
// a fixed ring of samples, so its memory does not grow with time.
type hitWindow struct {
	span    time.Duration
	samples []hitSample
	next, n int
}

type hitSample struct {
	at            time.Time
	queries, hits float64
}

// newHitWindow returns a window over span for polls every interval: the
// ring holds a span's worth of samples and two more, at least 4 and at most
// 3,600.
func newHitWindow(span, interval time.Duration) *hitWindow {
	n := int(span/interval) + 2
	return &hitWindow{span: span, samples: make([]hitSample, min(max(n, 4), 3600))}
}

// add records the cumulative counts at a poll and returns the hit rate
// since the newest earlier sample at least span old (the oldest kept, early
// on): Δhits / Δqueries, and false when nothing was queried in between (an
// idle replica: its rate is unknown, not 0 %).
func (w *hitWindow) add(at time.Time, queries, hits float64) (float64, bool) {
	size := len(w.samples)
	w.samples[w.next] = hitSample{at, queries, hits}
	w.next = (w.next + 1) % size
	w.n = min(w.n+1, size)
	oldest := w.samples[(w.next-w.n+size)%size]
	for k := w.n - 1; k > 1; k-- {
		s := w.samples[(w.next-k+size)%size]
		if at.Sub(s.at) < w.span {
			break
		}
		oldest = s
	}
	if dq := queries - oldest.queries; dq > 0 {
		return (hits - oldest.hits) / dq, true
	}
	return 0, false
}
