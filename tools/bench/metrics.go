package bench

import (
	"math"
	"sort"
	"time"
)

// TurnRecord is what the client saw of one turn. Times are offsets from the
// start of the run on the engine's clock.
type TurnRecord struct {
	Session  int // serial of the session
	Turn     int // 0-based
	LastTurn bool
	Start    time.Duration
	// Routed is when the router sent the request on, after it waited for
	// admission; 0 when it did not wait (Start).
	Routed     time.Duration
	FirstToken time.Duration // 0 when no content token arrived
	End        time.Duration
	Output     int    // output tokens received (usage when reported, else counted)
	Replica    string // replica that served, "" when unknown
	// Expect is the router's expected time to first token from Routed
	// (X-LM-Warden-Expect); 0 when it gave none.
	Expect  time.Duration
	Err     bool
	Aborted bool // cut off by the end of the stage: neither a request nor an error
}

// ReplicaCounters are one replica's numbers at one poll.
type ReplicaCounters struct {
	Running float64
	Hits    float64 // prefix_cache_hits(_total)
	Queries float64 // prefix_cache_queries(_total)
	// PrefixUnknown is true when the replica did not export both prefix
	// counters: Hits and Queries are then meaningless.
	PrefixUnknown bool
}

// Poll is one round of reading every reachable replica's counters. A replica
// that could not be read is absent.
type Poll struct {
	At       time.Duration
	Replicas map[string]ReplicaCounters
}

// Window is the measured part of a stage: [From, To) on the engine clock.
type Window struct {
	From, To time.Duration
}

// Seconds is the window's length in seconds.
func (w Window) Seconds() float64 { return (w.To - w.From).Seconds() }

func (w Window) contains(t time.Duration) bool { return t >= w.From && t < w.To }

// Stage is one row of the report: one number of concurrent sessions under
// one routing mode. The JSON names are the report's stable interface.
type Stage struct {
	Mode               string  `json:"mode"`
	Policy             string  `json:"policy"`
	Sessions           int     `json:"sessions"`
	DurationS          float64 `json:"duration_s"`
	SessionsPerHour    float64 `json:"sessions_per_hour"`
	OutputTokensPerMin float64 `json:"output_tokens_per_min"`
	TTFBP50S           float64 `json:"ttfb_p50_s"`
	TTFBP95S           float64 `json:"ttfb_p95_s"`
	ReplicasBusy       float64 `json:"replicas_busy"`
	PrefixHitPct       float64 `json:"prefix_hit_pct"`
	// PrefixHitUnknown is true when no replica read in the stage exported
	// its prefix counters: PrefixHitPct is then unknown, not 0.
	PrefixHitUnknown bool    `json:"prefix_hit_unknown,omitempty"`
	StayedPct        float64 `json:"stayed_pct"`
	Requests         int     `json:"requests"`
	Errors           int     `json:"errors"`
	// ErrorsBeforeFirstToken are the errors of turns that failed before
	// their first token (the others broke mid-stream).
	ErrorsBeforeFirstToken int `json:"errors_before_first_token"`

	// TTFB of sessions' first turns and of their later turns apart, the
	// time first turns waited at the router for admission, and the
	// sessions' completion time (first request sent to last answer) for
	// those that started and finished inside the run, ending in the window.
	TTFBFirstP50S   float64 `json:"ttfb_first_p50_s"`
	TTFBFirstP95S   float64 `json:"ttfb_first_p95_s"`
	TTFBLaterP50S   float64 `json:"ttfb_later_p50_s"`
	TTFBLaterP95S   float64 `json:"ttfb_later_p95_s"`
	WaitFirstP50S   float64 `json:"wait_first_p50_s"`
	WaitFirstP95S   float64 `json:"wait_first_p95_s"`
	CompletionP50S  float64 `json:"completion_p50_s"`
	CompletionP95S  float64 `json:"completion_p95_s"`
	CompletedCounts int     `json:"completed_sessions"`
	// IdleWhileHeldS is how many replica-seconds of the window an engine
	// sat idle (nothing running, nothing waiting) while some turn waited
	// at the router for admission: work admission held back that a
	// replica had room for. The simulator measures it; runs against real
	// replicas leave it 0.
	IdleWhileHeldS float64 `json:"idle_while_held_s,omitempty"`
	// WaitLaterP95S and WaitLaterMaxS: how long later turns waited at the
	// router (a conversation paused at a turn boundary waits its turn).
	WaitLaterP95S float64 `json:"wait_later_p95_s,omitempty"`
	WaitLaterMaxS float64 `json:"wait_later_max_s,omitempty"`
	// How far the router's expected time to first token (TurnRecord.
	// Expect) was from the time measured from routing, over the turns
	// that had one: the median and 95th percentile of the absolute error,
	// and the share of turns whose first token came later than expected.
	ExpectTurns   int     `json:"expect_turns,omitempty"`
	ExpectErrP50S float64 `json:"expect_err_p50_s,omitempty"`
	ExpectErrP95S float64 `json:"expect_err_p95_s,omitempty"`
	ExpectLatePct float64 `json:"expect_late_pct,omitempty"`
}

// routed is when the router sent the turn on.
func (t TurnRecord) routed() time.Duration {
	if t.Routed > 0 {
		return t.Routed
	}
	return t.Start
}

// waited is how long the turn waited at the router.
func (t TurnRecord) waited() time.Duration {
	if t.Routed <= t.Start {
		return 0
	}
	return t.Routed - t.Start
}

// Measure computes a stage's numbers from the turns and polls of a run,
// counting only what falls inside w. turns may hold the whole run (the
// previous turn of a session is looked up across the window's start).
func Measure(turns []TurnRecord, polls []Poll, w Window) Stage {
	st := Stage{DurationS: w.Seconds()}
	if st.DurationS <= 0 {
		return st
	}
	ordered := append([]TurnRecord(nil), turns...)
	sort.SliceStable(ordered, func(i, j int) bool {
		if ordered[i].Session != ordered[j].Session {
			return ordered[i].Session < ordered[j].Session
		}
		return ordered[i].Turn < ordered[j].Turn
	})
	var (
		ttfb, first, later, wait []float64
		waitLater                []float64
		expectErr                []float64
		late                     int
		completion               []float64
		outTokens, finished      int
		stayedN, stayedOf        int
		sessStart                = map[int]time.Duration{} // sessions whose first turn was seen, without errors
	)
	for i, t := range ordered {
		// a session's first request in the run (a session the run started
		// part-way through its turns begins at a later turn)
		firstReq := i == 0 || ordered[i-1].Session != t.Session
		if t.FirstToken > 0 && !t.Err && w.contains(t.FirstToken) {
			v := (t.FirstToken - t.Start).Seconds()
			ttfb = append(ttfb, v)
			if firstReq {
				first = append(first, v)
				wait = append(wait, t.waited().Seconds())
			} else {
				later = append(later, v)
				waitLater = append(waitLater, t.waited().Seconds())
			}
			if t.Expect > 0 {
				d := (t.FirstToken - t.routed() - t.Expect).Seconds()
				if d > 0 {
					late++
				}
				expectErr = append(expectErr, math.Abs(d))
			}
		}
		if t.Turn == 0 && !t.Err && !t.Aborted {
			sessStart[t.Session] = t.Start
		}
		if t.Err {
			delete(sessStart, t.Session)
		}
		if t.Aborted || !w.contains(t.End) {
			continue
		}
		st.Requests++
		if t.Err {
			st.Errors++
			if t.FirstToken == 0 {
				st.ErrorsBeforeFirstToken++
			}
			continue
		}
		outTokens += t.Output
		if t.LastTurn {
			finished++
			if s0, ok := sessStart[t.Session]; ok {
				completion = append(completion, (t.End - s0).Seconds())
			}
		}
		if t.Turn > 0 && t.Replica != "" && i > 0 {
			prev := ordered[i-1]
			if prev.Session == t.Session && prev.Turn == t.Turn-1 && !prev.Err && prev.Replica != "" {
				stayedOf++
				if prev.Replica == t.Replica {
					stayedN++
				}
			}
		}
	}
	st.SessionsPerHour = float64(finished) * 3600 / st.DurationS
	st.OutputTokensPerMin = float64(outTokens) * 60 / st.DurationS
	sort.Float64s(ttfb)
	st.TTFBP50S = Percentile(ttfb, 0.50)
	st.TTFBP95S = Percentile(ttfb, 0.95)
	for _, v := range [][]float64{first, later, wait, waitLater, completion, expectErr} {
		sort.Float64s(v)
	}
	st.WaitLaterP95S = Percentile(waitLater, 0.95)
	if n := len(expectErr); n > 0 {
		st.ExpectTurns = n
		st.ExpectErrP50S, st.ExpectErrP95S = Percentile(expectErr, 0.50), Percentile(expectErr, 0.95)
		st.ExpectLatePct = 100 * float64(late) / float64(n)
	}
	if n := len(waitLater); n > 0 {
		st.WaitLaterMaxS = waitLater[n-1]
	}
	st.TTFBFirstP50S, st.TTFBFirstP95S = Percentile(first, 0.50), Percentile(first, 0.95)
	st.TTFBLaterP50S, st.TTFBLaterP95S = Percentile(later, 0.50), Percentile(later, 0.95)
	st.WaitFirstP50S, st.WaitFirstP95S = Percentile(wait, 0.50), Percentile(wait, 0.95)
	st.CompletionP50S, st.CompletionP95S = Percentile(completion, 0.50), Percentile(completion, 0.95)
	st.CompletedCounts = len(completion)
	if stayedOf > 0 {
		st.StayedPct = 100 * float64(stayedN) / float64(stayedOf)
	}
	st.ReplicasBusy = ReplicasBusy(polls, w)
	var hitKnown bool
	st.PrefixHitPct, hitKnown = PrefixHitPct(polls, w)
	st.PrefixHitUnknown = !hitKnown
	return st
}

// Percentile is the nearest-rank p-quantile (0 < p ≤ 1) of sorted values,
// 0 for none.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

// ReplicasBusy averages, over the polls inside w, the number of replicas
// running at least one request.
func ReplicasBusy(polls []Poll, w Window) float64 {
	n, sum := 0, 0
	for _, p := range polls {
		if !w.contains(p.At) {
			continue
		}
		n++
		for _, c := range p.Replicas {
			if c.Running >= 1 {
				sum++
			}
		}
	}
	if n == 0 {
		return 0
	}
	return float64(sum) / float64(n)
}

// PrefixHitPct is 100 × Δhits / Δqueries summed over replicas across the
// polls inside w (the last poll before w included as the baseline). A
// counter that drops has been reset: its new value is the delta. Replicas
// without prefix counters (ReplicaCounters.PrefixUnknown) add nothing; known
// is false when replicas were read in w but none of them had the counters.
func PrefixHitPct(polls []Poll, w Window) (pct float64, known bool) {
	var hits, queries float64
	var read, withCounters bool
	last := map[string]ReplicaCounters{}
	for _, p := range polls {
		if p.At >= w.To {
			break
		}
		if p.At >= w.From {
			for id, c := range p.Replicas {
				read = true
				withCounters = withCounters || !c.PrefixUnknown
				prev, ok := last[id]
				if !ok || prev.PrefixUnknown || c.PrefixUnknown {
					continue
				}
				hits += counterDelta(prev.Hits, c.Hits)
				queries += counterDelta(prev.Queries, c.Queries)
			}
		}
		for id, c := range p.Replicas {
			last[id] = c
		}
	}
	if read && !withCounters {
		return 0, false
	}
	if queries <= 0 {
		return 0, true
	}
	return 100 * hits / queries, true
}

func counterDelta(prev, cur float64) float64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}
