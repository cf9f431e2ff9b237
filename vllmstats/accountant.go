package vllmstats

import (
	"sort"
	"sync"
	"time"
)

// SeriesLength is the number of one-second buckets an Accountant keeps: one hour.
const SeriesLength = 3600

// TokenTotals are one replica's token counts since the Accountant started.
type TokenTotals struct {
	// Cached are prompt tokens the engine read from its prefix cache.
	Cached uint64
	// Computed are prompt tokens the engine computed, including every prompt
	// token of responses that did not report a cached count.
	Computed uint64
	// Generated are output tokens.
	Generated uint64
	// Requests counts recorded responses.
	Requests uint64
	// Unmeasured counts responses without a cached count (their prompt
	// counted as computed), NoUsage those without any usage at all.
	Unmeasured, NoUsage uint64
	// Predicted are the cached tokens the router predicted for the
	// sticky turns it checked (RecordDelivery), Delivered what the engine
	// delivered of them.
	Predicted, Delivered uint64
}

// Buckets are per-second token counts, oldest first.
type Buckets struct {
	Cached, Computed, Generated []uint64
	// Predicted and Delivered: the cached tokens predicted for the sticky
	// turns checked, and those delivered (RecordDelivery).
	Predicted, Delivered []uint64
}

// Series is the last hour of token counts in one-second steps.
type Series struct {
	// Start is the second of the first bucket; Step is one second.
	Start time.Time
	Step  time.Duration
	// Replicas maps replica IDs to their buckets; Sum adds them all.
	Replicas map[string]Buckets
	Sum      Buckets
	// HourCachedShare is cached / (cached + computed) over the hour, 0 when
	// there were no prompt tokens.
	HourCachedShare float64
	// HourDeliveredShare is delivered / predicted over the hour, nil when
	// nothing was predicted.
	HourDeliveredShare *float64
}

type bucket struct {
	sec                         int64 // Unix second this bucket holds; 0 = empty
	cached, computed, generated uint64
	predicted, delivered        uint64 // RecordDelivery
}

type replicaAccount struct {
	totals TokenTotals
	last   int64 // latest Unix second recorded
	ring   [SeriesLength]bucket
}

// Accountant sums response usage per replica: totals since start and a
// one-hour ring of one-second buckets (fixed memory per replica). It is safe
// for concurrent use.
type Accountant struct {
	mu       sync.Mutex
	replicas map[string]*replicaAccount
}

// NewAccountant returns an empty Accountant.
func NewAccountant() *Accountant {
	return &Accountant{replicas: make(map[string]*replicaAccount)}
}

// Record adds one response's usage for replica at time now. Unmeasured usage
// counts as a request whose prompt (possibly 0) was all computed.
func (a *Accountant) Record(replica string, u Usage, now time.Time) {
	var cached uint64
	if u.CachedMeasured && u.CachedTokens > 0 {
		cached = uint64(min(u.CachedTokens, max(u.PromptTokens, 0)))
	}
	computed := uint64(max(u.Computed(), 0))
	generated := uint64(max(u.CompletionTokens, 0))
	sec := now.Unix()

	a.mu.Lock()
	defer a.mu.Unlock()
	r, b := a.at(replica, sec)
	t := &r.totals
	t.Requests++
	t.Cached += cached
	t.Computed += computed
	t.Generated += generated
	if !u.CachedMeasured {
		t.Unmeasured++
	}
	if !u.Measured {
		t.NoUsage++
	}
	if b == nil {
		return
	}
	b.cached += cached
	b.computed += computed
	b.generated += generated
}

// RecordDelivery adds a sticky turn's check for replica at time now: the
// cached tokens its binding predicted and those the engine delivered of
// them (at most predicted). Turns without a prediction are not recorded.
func (a *Accountant) RecordDelivery(replica string, predicted, delivered int, now time.Time) {
	if predicted <= 0 {
		return
	}
	p := uint64(predicted)
	d := uint64(min(max(delivered, 0), predicted))
	sec := now.Unix()
	a.mu.Lock()
	defer a.mu.Unlock()
	r, b := a.at(replica, sec)
	r.totals.Predicted += p
	r.totals.Delivered += d
	if b == nil {
		return
	}
	b.predicted += p
	b.delivered += d
}

// at returns replica's account, created when missing and marked used at
// sec, and its bucket for sec, emptied when it held an older second; the
// bucket is nil when sec is older than the hour the ring holds. a.mu held.
func (a *Accountant) at(replica string, sec int64) (*replicaAccount, *bucket) {
	r := a.replicas[replica]
	if r == nil {
		r = &replicaAccount{}
		a.replicas[replica] = r
	}
	r.last = max(r.last, sec)
	b := &r.ring[ringIndex(sec)]
	if b.sec != sec {
		if b.sec > sec {
			return r, nil
		}
		*b = bucket{sec: sec}
	}
	return r, b
}

func ringIndex(sec int64) int {
	i := sec % SeriesLength
	if i < 0 {
		i += SeriesLength
	}
	return int(i)
}

// Totals returns every replica's totals since start.
func (a *Accountant) Totals() map[string]TokenTotals {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]TokenTotals, len(a.replicas))
	for id, r := range a.replicas {
		out[id] = r.totals
	}
	return out
}

// Replicas returns the IDs of the replicas that have recorded usage, sorted.
func (a *Accountant) Replicas() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.replicas))
	for id := range a.replicas {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Forget drops a replica's totals and buckets.
func (a *Accountant) Forget(replica string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.replicas, replica)
}

// ForgetIdle drops the replicas keep rejects (nil keeps none) whose latest
// recorded second is at least an hour before now, so nothing of theirs is
// left in the hour Series shows: a replica that left the pool is forgotten
// once its hour has passed, and replicas that come and go (dynamic
// upstreams) do not grow the Accountant. It returns how many it dropped.
func (a *Accountant) ForgetIdle(now time.Time, keep func(replica string) bool) int {
	cut := now.Unix() - SeriesLength
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for id, r := range a.replicas {
		if r.last <= cut && (keep == nil || !keep(id)) {
			delete(a.replicas, id)
			n++
		}
	}
	return n
}

// HourCachedShare returns Series(now).HourCachedShare without building the
// series: cached / (cached + computed) over the hour ending with the second
// of now, 0 when there were no prompt tokens.
func (a *Accountant) HourCachedShare(now time.Time) float64 {
	start := now.Unix() - SeriesLength + 1
	var cached, computed uint64
	a.mu.Lock()
	for _, r := range a.replicas {
		for i := range r.ring {
			if b := &r.ring[i]; b.sec >= start && b.sec <= now.Unix() {
				cached += b.cached
				computed += b.computed
			}
		}
	}
	a.mu.Unlock()
	if cached+computed == 0 {
		return 0
	}
	return float64(cached) / float64(cached+computed)
}

func newBuckets() Buckets {
	return Buckets{
		Cached:    make([]uint64, SeriesLength),
		Computed:  make([]uint64, SeriesLength),
		Generated: make([]uint64, SeriesLength),
		Predicted: make([]uint64, SeriesLength),
		Delivered: make([]uint64, SeriesLength),
	}
}

// Series returns the hour ending with the second of now: SeriesLength buckets
// per replica and summed, oldest first.
func (a *Accountant) Series(now time.Time) Series {
	end := now.Unix()
	start := end - SeriesLength + 1
	s := Series{
		Start:    time.Unix(start, 0).In(now.Location()),
		Step:     time.Second,
		Replicas: make(map[string]Buckets),
		Sum:      newBuckets(),
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var cached, computed, predicted, delivered uint64
	for id, r := range a.replicas {
		bs := newBuckets()
		for i := range SeriesLength {
			sec := start + int64(i)
			b := &r.ring[ringIndex(sec)]
			if b.sec != sec {
				continue
			}
			bs.Cached[i], bs.Computed[i], bs.Generated[i] = b.cached, b.computed, b.generated
			bs.Predicted[i], bs.Delivered[i] = b.predicted, b.delivered
			s.Sum.Cached[i] += b.cached
			s.Sum.Computed[i] += b.computed
			s.Sum.Generated[i] += b.generated
			s.Sum.Predicted[i] += b.predicted
			s.Sum.Delivered[i] += b.delivered
			cached += b.cached
			computed += b.computed
			predicted += b.predicted
			delivered += b.delivered
		}
		s.Replicas[id] = bs
	}
	if cached+computed > 0 {
		s.HourCachedShare = float64(cached) / float64(cached+computed)
	}
	if predicted > 0 {
		share := float64(delivered) / float64(predicted)
		s.HourDeliveredShare = &share
	}
	return s
}

// Chart is part of the hour summed into equal steps, for drawing.
type Chart struct {
	// End is the end of the last step: the start of the second in
	// progress, which is left out so a chart's right edge does not dip.
	End time.Time
	// Step is the length of one step, a whole number of seconds.
	Step time.Duration
	// Tokens per step, oldest first.
	Cached, Computed, Generated []uint64
	// Predicted and Delivered per step: the cached tokens predicted for
	// the sticky turns checked, and those delivered (RecordDelivery).
	Predicted, Delivered []uint64
	// CachedShare is cached / (cached + computed) over the steps, 0 when
	// there were no prompt tokens.
	CachedShare float64
	// DeliveredShare is delivered / predicted over the steps, nil when
	// nothing was predicted.
	DeliveredShare *float64
}

// Chart sums the whole seconds of the hour before now's second into at most
// points equal steps of one replica, or of all replicas when replica is "",
// without building the per-second series; the oldest seconds that do not
// fill a step are left out. ok is false for a replica without usage.
func (a *Accountant) Chart(now time.Time, points int, replica string) (c Chart, ok bool) {
	const whole = SeriesLength - 1 // the second in progress is left out
	points = max(1, min(points, whole))
	per := (whole + points - 1) / points
	n := whole / per
	end := now.Unix() // exclusive: the second in progress
	first := end - int64(n*per)
	c = Chart{
		End:       time.Unix(end, 0).In(now.Location()),
		Step:      time.Duration(per) * time.Second,
		Cached:    make([]uint64, n),
		Computed:  make([]uint64, n),
		Generated: make([]uint64, n),
		Predicted: make([]uint64, n),
		Delivered: make([]uint64, n),
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	add := func(r *replicaAccount) {
		for i := range r.ring {
			b := &r.ring[i]
			if b.sec < first || b.sec >= end {
				continue
			}
			k := int(b.sec-first) / per
			c.Cached[k] += b.cached
			c.Computed[k] += b.computed
			c.Generated[k] += b.generated
			c.Predicted[k] += b.predicted
			c.Delivered[k] += b.delivered
		}
	}
	if replica != "" {
		r := a.replicas[replica]
		if r == nil {
			return Chart{}, false
		}
		add(r)
	} else {
		for _, r := range a.replicas {
			add(r)
		}
	}
	var cached, computed, predicted, delivered uint64
	for k := range n {
		cached += c.Cached[k]
		computed += c.Computed[k]
		predicted += c.Predicted[k]
		delivered += c.Delivered[k]
	}
	if cached+computed > 0 {
		c.CachedShare = float64(cached) / float64(cached+computed)
	}
	if predicted > 0 {
		share := float64(delivered) / float64(predicted)
		c.DeliveredShare = &share
	}
	return c, true
}
