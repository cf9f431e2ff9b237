package vllmstats

import (
	"sync"
	"testing"
	"time"
)

func TestAccountantTotalsAndSeries(t *testing.T) {
	t.Parallel()
	a := NewAccountant()
	t0 := time.Unix(1_800_000_000, 0)
	measured := Usage{PromptTokens: 1000, CachedTokens: 800, CompletionTokens: 50, Measured: true, CachedMeasured: true}
	noCached := Usage{PromptTokens: 300, CompletionTokens: 10, Measured: true}
	none := Usage{}

	a.Record("r1", measured, t0)
	a.Record("r1", noCached, t0.Add(500*time.Millisecond))
	a.Record("r2", measured, t0.Add(10*time.Second))
	a.Record("r2", none, t0.Add(10*time.Second))
	a.Record("r1", measured, t0.Add(-2*time.Hour)) // older than the ring: totals only

	tot := a.Totals()
	want1 := TokenTotals{Cached: 1600, Computed: 200 + 300 + 200, Generated: 110, Requests: 3, Unmeasured: 1}
	want2 := TokenTotals{Cached: 800, Computed: 200, Generated: 50, Requests: 2, Unmeasured: 1, NoUsage: 1}
	if tot["r1"] != want1 || tot["r2"] != want2 {
		t.Fatalf("totals r1 %+v want %+v; r2 %+v want %+v", tot["r1"], want1, tot["r2"], want2)
	}

	now := t0.Add(10*time.Second + 300*time.Millisecond)
	s := a.Series(now)
	if s.Step != time.Second || !s.Start.Equal(time.Unix(now.Unix()-SeriesLength+1, 0)) {
		t.Fatalf("start %v step %v", s.Start, s.Step)
	}
	last := SeriesLength - 1
	at0 := last - 10
	if got := s.Replicas["r1"]; got.Cached[at0] != 800 || got.Computed[at0] != 500 || got.Generated[at0] != 60 {
		t.Fatalf("r1 bucket at t0: %d %d %d", got.Cached[at0], got.Computed[at0], got.Generated[at0])
	}
	if got := s.Replicas["r2"]; got.Cached[last] != 800 || got.Computed[last] != 200 {
		t.Fatalf("r2 last bucket: %d %d", got.Cached[last], got.Computed[last])
	}
	if s.Sum.Cached[at0]+s.Sum.Cached[last] != 1600 || s.Sum.Computed[last] != 200 {
		t.Fatalf("sum wrong")
	}
	if want := 1600.0 / (1600 + 700); s.HourCachedShare != want {
		t.Fatalf("share %v want %v", s.HourCachedShare, want)
	}
	for id, b := range s.Replicas {
		if len(b.Cached) != SeriesLength || len(b.Computed) != SeriesLength || len(b.Generated) != SeriesLength {
			t.Fatalf("%s: bucket lengths", id)
		}
	}

	// An hour later the old buckets are gone from the series, the totals stay.
	later := a.Series(t0.Add(time.Hour + 11*time.Second))
	if later.HourCachedShare != 0 || later.Sum.Cached[last] != 0 {
		t.Fatalf("stale buckets in series: share %v", later.HourCachedShare)
	}
	// A second reusing a ring slot replaces the old bucket.
	a.Record("r1", noCached, t0.Add(time.Hour))
	s = a.Series(t0.Add(time.Hour))
	if got := s.Replicas["r1"]; got.Computed[last] != 300 || got.Cached[last] != 0 {
		t.Fatalf("reused slot: %d %d", got.Computed[last], got.Cached[last])
	}
	if got := a.Replicas(); len(got) != 2 || got[0] != "r1" {
		t.Fatalf("replicas %v", got)
	}
	a.Forget("r2")
	if _, ok := a.Totals()["r2"]; ok {
		t.Fatal("r2 not forgotten")
	}
}

func TestAccountantConcurrent(t *testing.T) {
	t.Parallel()
	a := NewAccountant()
	t0 := time.Unix(1_800_000_000, 0)
	u := Usage{PromptTokens: 10, CachedTokens: 4, CompletionTokens: 1, Measured: true, CachedMeasured: true}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				a.Record([]string{"a", "b"}[g%2], u, t0.Add(time.Duration(i)*time.Millisecond))
				if i%250 == 0 {
					a.Series(t0)
				}
			}
		}()
	}
	wg.Wait()
	tot := a.Totals()
	if tot["a"].Requests != 2000 || tot["b"].Cached != 8000 || tot["a"].Computed != 12000 {
		t.Fatalf("totals %+v", tot)
	}
	if s := a.Series(t0.Add(time.Second)); s.HourCachedShare != 0.4 {
		t.Fatalf("share %v", s.HourCachedShare)
	}
}

// TestAccountantForgetIdle churns through 1,000 replica IDs, one new every
// 10 s as rotating DNS upstreams would: with ForgetIdle run as the model's
// poll does, at most an hour's worth of departed replicas is kept, and a
// kept or recently used replica is never dropped.
func TestAccountantForgetIdle(t *testing.T) {
	t.Parallel()
	a := NewAccountant()
	t0 := time.Unix(1_800_000_000, 0)
	u := Usage{PromptTokens: 100, CachedTokens: 60, CompletionTokens: 5, Measured: true, CachedMeasured: true}
	id := func(i int) string {
		return "10.0.0." + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))
	}
	current := map[string]bool{}
	most := 0
	now := t0
	for i := range 1000 {
		clear(current)
		for k := range 4 {
			current[id(i+k)] = true
		}
		a.Record(id(i), u, now)
		a.ForgetIdle(now, func(r string) bool { return current[r] })
		most = max(most, len(a.Replicas()))
		now = now.Add(10 * time.Second)
	}
	if limit := SeriesLength/10 + 2; most > limit {
		t.Fatalf("accountant held %d replicas during churn, want at most %d", most, limit)
	}

	b := NewAccountant()
	b.Record("gone-long", u, t0)
	b.Record("gone-recent", u, t0.Add(time.Hour))
	b.Record("kept", u, t0)
	at := t0.Add(time.Hour) // gone-long's second is just out of the hour
	if n := b.ForgetIdle(at, func(r string) bool { return r == "kept" }); n != 1 {
		t.Fatalf("dropped %d, want 1", n)
	}
	if got := b.Replicas(); len(got) != 2 || got[0] != "gone-recent" || got[1] != "kept" {
		t.Fatalf("after ForgetIdle: %v", got)
	}
	if b.Series(at).Replicas["gone-recent"].Cached[SeriesLength-1] != 60 {
		t.Fatal("recent replica's bucket lost")
	}
	if n := b.ForgetIdle(at.Add(time.Hour), nil); n != 2 {
		t.Fatalf("nil keep dropped %d, want 2", n)
	}
}

// TestHourCachedShareMatchesSeries checks the allocation-free share against
// the one Series computes, inside, at the edge of and past the hour.
func TestHourCachedShareMatchesSeries(t *testing.T) {
	t.Parallel()
	a := NewAccountant()
	t0 := time.Unix(1_800_000_000, 0)
	a.Record("r1", Usage{PromptTokens: 1000, CachedTokens: 800, Measured: true, CachedMeasured: true}, t0)
	a.Record("r2", Usage{PromptTokens: 300, Measured: true}, t0.Add(30*time.Minute))
	a.Record("r1", Usage{PromptTokens: 500, CachedTokens: 100, Measured: true, CachedMeasured: true}, t0.Add(-time.Hour))
	for _, at := range []time.Duration{-time.Hour, -time.Second, 0, time.Minute, time.Hour - time.Second, time.Hour, 90 * time.Minute, 3 * time.Hour} {
		now := t0.Add(at)
		if got, want := a.HourCachedShare(now), a.Series(now).HourCachedShare; got != want {
			t.Errorf("at %v: share %v, Series says %v", at, got, want)
		}
	}
	if got := a.HourCachedShare(t0); got != 800.0/1000 {
		t.Errorf("share at t0 %v, want 0.8", got)
	}
}

// TestAccountantChart checks that Chart sums exactly what Series holds, step
// by step, for one replica and for all, leaving out the second in progress
// and the oldest seconds that do not fill a step.
func TestAccountantChart(t *testing.T) {
	t.Parallel()
	a := NewAccountant()
	now := time.Unix(1_800_000_000, 0)
	for i := range 5000 { // more than an hour: the oldest fall out of the ring
		sec := now.Add(-time.Duration(i) * time.Second)
		u := Usage{Measured: true, CachedMeasured: true, PromptTokens: int64(10 + i%7), CachedTokens: int64(i % 5), CompletionTokens: int64(i % 3)}
		a.Record([]string{"a", "b"}[i%2], u, sec)
	}
	ser := a.Series(now)
	for _, c := range []struct {
		replica string
		points  int
	}{{"", 360}, {"a", 360}, {"b", 100}, {"", 1}, {"a", 5000}} {
		ch, ok := a.Chart(now, c.points, c.replica)
		if !ok {
			t.Fatalf("%q: not found", c.replica)
		}
		per := int(ch.Step / time.Second)
		n := len(ch.Cached)
		if n > c.points || n*per > SeriesLength-1 || (n+1)*per <= SeriesLength-1 && n < c.points {
			t.Fatalf("%q/%d: %d steps of %d s", c.replica, c.points, n, per)
		}
		want := ser.Sum
		if c.replica != "" {
			want = ser.Replicas[c.replica]
		}
		off := SeriesLength - 1 - n*per // per-second index of the first step
		var cached, computed uint64
		for k := range n {
			var wc, wp, wg uint64
			for j := off + k*per; j < off+(k+1)*per; j++ {
				wc, wp, wg = wc+want.Cached[j], wp+want.Computed[j], wg+want.Generated[j]
			}
			if ch.Cached[k] != wc || ch.Computed[k] != wp || ch.Generated[k] != wg {
				t.Fatalf("%q/%d step %d: %d/%d/%d, series sums %d/%d/%d", c.replica, c.points, k,
					ch.Cached[k], ch.Computed[k], ch.Generated[k], wc, wp, wg)
			}
			cached, computed = cached+wc, computed+wp
		}
		if want := float64(cached) / float64(cached+computed); ch.CachedShare != want {
			t.Fatalf("%q/%d: share %v, want %v", c.replica, c.points, ch.CachedShare, want)
		}
		if !ch.End.Equal(now) {
			t.Fatalf("end %v, want %v", ch.End, now)
		}
	}
	if _, ok := a.Chart(now, 360, "nope"); ok {
		t.Fatal("a replica without usage has a chart")
	}
}

// TestAccountantDelivery checks the delivered share of predicted cached
// tokens: per step of the chart, over the hour, per replica and summed, and
// the totals; a turn without a prediction records nothing, delivery beyond
// the prediction counts as the prediction, and turns older than the hour or
// in the second in progress stay out of the chart.
func TestAccountantDelivery(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	at := func(ago int) time.Time { return now.Add(-time.Duration(ago) * time.Second) }
	type rec struct {
		replica              string
		predicted, delivered int
		ago                  int // seconds before now
	}
	tests := []struct {
		name    string
		recs    []rec
		replica string
		points  int
		// want: per chart step (index from the end: 0 = the last step)
		// predicted/delivered; share nil when nothing was predicted
		wantP, wantD map[int]uint64
		share        *float64
	}{
		{"none", nil, "", 60, nil, nil, nil},
		{"no prediction records nothing", []rec{{"a", 0, 50, 10}, {"a", -3, 0, 10}}, "", 60, nil, nil, nil},
		{"one replica, per minute", []rec{{"a", 1000, 900, 30}, {"a", 1000, 100, 90}, {"b", 500, 500, 30}},
			"a", 60, map[int]uint64{0: 1000, 1: 1000}, map[int]uint64{0: 900, 1: 100}, ptrF(0.5)},
		{"all replicas", []rec{{"a", 1000, 900, 30}, {"a", 1000, 100, 90}, {"b", 500, 500, 30}},
			"", 60, map[int]uint64{0: 1500, 1: 1000}, map[int]uint64{0: 1400, 1: 100}, ptrF(1500.0 / 2500)},
		{"delivered beyond the prediction counts as predicted", []rec{{"a", 100, 250, 5}, {"a", 100, -1, 5}},
			"", 60, map[int]uint64{0: 200}, map[int]uint64{0: 100}, ptrF(0.5)},
		{"outside the hour and the second in progress", []rec{{"a", 100, 100, 0}, {"a", 100, 0, 3600}, {"a", 100, 0, 5000}, {"a", 100, 50, 1}},
			"", 60, map[int]uint64{0: 100}, map[int]uint64{0: 50}, ptrF(0.5)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAccountant()
			a.Record("a", Usage{Measured: true, CachedMeasured: true, PromptTokens: 10}, at(1))
			var totP, totD uint64
			for _, r := range tc.recs {
				a.RecordDelivery(r.replica, r.predicted, r.delivered, at(r.ago))
				if r.predicted > 0 && r.replica == "a" {
					totP += uint64(r.predicted)
					totD += uint64(min(max(r.delivered, 0), r.predicted))
				}
			}
			ch, ok := a.Chart(now, tc.points, tc.replica)
			if !ok {
				t.Fatal("no chart")
			}
			n := len(ch.Predicted)
			if n != len(ch.Cached) || len(ch.Delivered) != n {
				t.Fatalf("%d predicted, %d delivered, %d cached steps", n, len(ch.Delivered), len(ch.Cached))
			}
			for k := range n {
				back := n - 1 - k
				if ch.Predicted[k] != tc.wantP[back] || ch.Delivered[k] != tc.wantD[back] {
					t.Errorf("step -%d: %d of %d delivered, want %d of %d", back, ch.Delivered[k], ch.Predicted[k], tc.wantD[back], tc.wantP[back])
				}
			}
			switch {
			case tc.share == nil && ch.DeliveredShare != nil:
				t.Errorf("share %v, want none", *ch.DeliveredShare)
			case tc.share != nil && (ch.DeliveredShare == nil || *ch.DeliveredShare != *tc.share):
				t.Errorf("share %v, want %v", ch.DeliveredShare, *tc.share)
			}
			if got := a.Totals()["a"]; got.Predicted != totP || got.Delivered != totD {
				t.Errorf("totals %d of %d, want %d of %d", got.Delivered, got.Predicted, totD, totP)
			}
		})
	}
}

func ptrF(f float64) *float64 { return &f }

// TestSeriesCarriesDelivery: the per-second series has the predicted and
// delivered cached tokens per second, per replica and summed, and the
// hour's delivered share (nil when nothing was predicted).
func TestSeriesCarriesDelivery(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	a := NewAccountant()
	if s := a.Series(now); s.HourDeliveredShare != nil {
		t.Fatalf("delivered share %v before any prediction", *s.HourDeliveredShare)
	}
	a.RecordDelivery("a", 1000, 900, now.Add(-10*time.Second))
	a.RecordDelivery("b", 1000, 100, now.Add(-10*time.Second))
	a.RecordDelivery("a", 500, 500, now.Add(-2*time.Hour)) // outside the hour
	s := a.Series(now)
	last := SeriesLength - 1 - 10
	if got := s.Replicas["a"].Predicted[last]; got != 1000 {
		t.Errorf("a predicted %d at -10 s, want 1000", got)
	}
	if p, d := s.Sum.Predicted[last], s.Sum.Delivered[last]; p != 2000 || d != 1000 {
		t.Errorf("sum predicted/delivered %d/%d at -10 s, want 2000/1000", p, d)
	}
	if s.HourDeliveredShare == nil || *s.HourDeliveredShare != 0.5 {
		t.Errorf("hour delivered share %v, want 0.5", s.HourDeliveredShare)
	}
}
