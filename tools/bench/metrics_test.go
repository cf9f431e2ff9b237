package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

const sec = time.Second

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPercentile(t *testing.T) {
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		p    float64
		want float64
	}{{0.5, 5}, {0.95, 10}, {0.9, 9}, {0.1, 1}, {1, 10}} {
		if got := Percentile(xs, tc.p); got != tc.want {
			t.Errorf("p%.2f = %g, want %g", tc.p, got, tc.want)
		}
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("empty percentile not 0")
	}
}

func TestMeasureSyntheticTimeline(t *testing.T) {
	// Window [10s, 70s): one minute.
	w := Window{From: 10 * sec, To: 70 * sec}
	turns := []TurnRecord{
		// Session 0: turn 0 in warm-up on r1, turns 1 and 2 in the window.
		{Session: 0, Turn: 0, Start: 0, FirstToken: 2 * sec, End: 5 * sec, Output: 100, Replica: "r1"},
		{Session: 0, Turn: 1, Start: 12 * sec, FirstToken: 13 * sec, End: 15 * sec, Output: 200, Replica: "r1"},                 // stayed
		{Session: 0, Turn: 2, LastTurn: true, Start: 15 * sec, FirstToken: 18 * sec, End: 20 * sec, Output: 300, Replica: "r2"}, // moved
		// Session 1: two turns inside, stayed, finished.
		{Session: 1, Turn: 0, Start: 20 * sec, FirstToken: 24 * sec, End: 25 * sec, Output: 50, Replica: "r2"},
		{Session: 1, Turn: 1, LastTurn: true, Start: 25 * sec, FirstToken: 30 * sec, End: 31 * sec, Output: 50, Replica: "r2"},
		// An error inside the window.
		{Session: 2, Turn: 0, Start: 40 * sec, End: 41 * sec, Err: true},
		// Ends after the window: not counted, but its first token is.
		{Session: 3, Turn: 0, Start: 60 * sec, FirstToken: 66 * sec, End: 80 * sec, Output: 999, Replica: "r3"},
	}
	st := Measure(turns, nil, w)
	if st.DurationS != 60 {
		t.Errorf("duration %g", st.DurationS)
	}
	if st.Requests != 5 || st.Errors != 1 {
		t.Errorf("requests %d errors %d, want 5 and 1", st.Requests, st.Errors)
	}
	if !near(st.OutputTokensPerMin, 600) { // 200+300+50+50 over one minute
		t.Errorf("output tokens/min %g, want 600", st.OutputTokensPerMin)
	}
	if !near(st.SessionsPerHour, 120) { // two sessions finished in one minute
		t.Errorf("sessions/h %g, want 120", st.SessionsPerHour)
	}
	// TTFBs inside the window: 1, 3, 4, 5, 6 s.
	if st.TTFBP50S != 4 || st.TTFBP95S != 6 {
		t.Errorf("ttfb p50 %g p95 %g, want 4 and 6", st.TTFBP50S, st.TTFBP95S)
	}
	// Follow-up turns with a known previous replica: s0t1 (stay), s0t2 (move), s1t1 (stay).
	if !near(st.StayedPct, 200.0/3) {
		t.Errorf("stayed %g, want 66.7", st.StayedPct)
	}
}

// TestMeasureExpectError checks the router's estimate against the time to
// first token measured from routing: turns without an estimate, or outside
// the window, do not count.
func TestMeasureExpectError(t *testing.T) {
	w := Window{From: 10 * sec, To: 70 * sec}
	turns := []TurnRecord{
		// 2 s from its start, expected 1 s: 1 s late
		{Session: 0, Turn: 0, Start: 10 * sec, FirstToken: 12 * sec, End: 13 * sec, Expect: sec},
		// held 5 s, then 1 s from its routing, expected 3 s: 2 s early
		{Session: 1, Turn: 0, Start: 20 * sec, Routed: 25 * sec, FirstToken: 26 * sec, End: 27 * sec, Expect: 3 * sec},
		// 4 s, expected 4.5 s: 0.5 s early
		{Session: 2, Turn: 0, Start: 30 * sec, FirstToken: 34 * sec, End: 35 * sec, Expect: 4500 * time.Millisecond},
		// no estimate (a peer's turn)
		{Session: 3, Turn: 0, Start: 40 * sec, FirstToken: 49 * sec, End: 50 * sec},
		// before the window
		{Session: 4, Turn: 0, Start: 0, FirstToken: 9 * sec, End: 9 * sec, Expect: sec},
	}
	st := Measure(turns, nil, w)
	if st.ExpectTurns != 3 || st.ExpectErrP50S != 1 || st.ExpectErrP95S != 2 || !near(st.ExpectLatePct, 100.0/3) {
		t.Errorf("expect: %d turns, error p50 %g p95 %g, late %g %%; want 3, 1, 2, 33.3", st.ExpectTurns, st.ExpectErrP50S, st.ExpectErrP95S, st.ExpectLatePct)
	}
}

func TestMeasureEmptyWindow(t *testing.T) {
	st := Measure(nil, nil, Window{From: 5 * sec, To: 5 * sec})
	if st.Requests != 0 || st.SessionsPerHour != 0 || st.PrefixHitPct != 0 {
		t.Errorf("empty window gives %+v", st)
	}
}

func TestReplicasBusy(t *testing.T) {
	polls := []Poll{
		{At: 0, Replicas: map[string]ReplicaCounters{"a": {Running: 5}, "b": {Running: 5}}}, // before window
		{At: 10 * sec, Replicas: map[string]ReplicaCounters{"a": {Running: 1}, "b": {Running: 0}, "c": {Running: 3}}},
		{At: 11 * sec, Replicas: map[string]ReplicaCounters{"a": {Running: 2}, "b": {Running: 1}, "c": {Running: 3}}},
		{At: 12 * sec, Replicas: map[string]ReplicaCounters{"a": {Running: 0}, "c": {Running: 0}}}, // b unreachable
		{At: 20 * sec, Replicas: map[string]ReplicaCounters{"a": {Running: 9}}},                    // after window
	}
	got := ReplicasBusy(polls, Window{From: 10 * sec, To: 20 * sec})
	if !near(got, (2+3+0)/3.0) {
		t.Errorf("busy %g, want %g", got, 5/3.0)
	}
	if ReplicasBusy(polls, Window{From: 30 * sec, To: 40 * sec}) != 0 {
		t.Error("no polls should give 0")
	}
}

func TestPrefixHitPct(t *testing.T) {
	polls := []Poll{
		{At: 5 * sec, Replicas: map[string]ReplicaCounters{"a": {Hits: 100, Queries: 1000}, "b": {Hits: 0, Queries: 0}}},
		{At: 10 * sec, Replicas: map[string]ReplicaCounters{"a": {Hits: 200, Queries: 1200}, "b": {Hits: 50, Queries: 100}}},
		// b restarts: counters reset to 30/40 (delta 30/40).
		{At: 15 * sec, Replicas: map[string]ReplicaCounters{"a": {Hits: 400, Queries: 1400}, "b": {Hits: 30, Queries: 40}}},
		// a is unreachable at this poll, c appears (no baseline: ignored).
		{At: 18 * sec, Replicas: map[string]ReplicaCounters{"b": {Hits: 40, Queries: 60}, "c": {Hits: 10, Queries: 10}}},
		{At: 25 * sec, Replicas: map[string]ReplicaCounters{"a": {Hits: 9000, Queries: 9000}}},
	}
	// Window [10s, 20s): baseline at 5s.
	// a: 100/200 + 200/200 ; b: 50/100 + 30/40 + 10/20 ; c: 0 (first sight).
	hits := 100.0 + 200 + 50 + 30 + 10
	queries := 200.0 + 200 + 100 + 40 + 20
	got, known := PrefixHitPct(polls, Window{From: 10 * sec, To: 20 * sec})
	if !near(got, 100*hits/queries) || !known {
		t.Errorf("prefix hits %g%% (known %v), want %g%%", got, known, 100*hits/queries)
	}
	if got, known := PrefixHitPct(polls[:1], Window{From: 0, To: 10 * sec}); got != 0 || !known {
		t.Error("a single poll has no delta")
	}
}

// TestPrefixHitPctUnknown: replicas that do not export the prefix counters
// add nothing; when none of them does, the figure is unknown, not 0 %.
func TestPrefixHitPctUnknown(t *testing.T) {
	none := ReplicaCounters{Running: 1, PrefixUnknown: true}
	polls := []Poll{
		{At: 5 * sec, Replicas: map[string]ReplicaCounters{"a": none, "b": {Hits: 0, Queries: 0}}},
		{At: 12 * sec, Replicas: map[string]ReplicaCounters{"a": none, "b": {Hits: 80, Queries: 100}}},
		// b loses its counters: no delta from or to a poll without them
		{At: 14 * sec, Replicas: map[string]ReplicaCounters{"a": none, "b": none}},
		{At: 16 * sec, Replicas: map[string]ReplicaCounters{"a": none, "b": {Hits: 500, Queries: 500}}},
	}
	if got, known := PrefixHitPct(polls, Window{From: 10 * sec, To: 20 * sec}); got != 80 || !known {
		t.Errorf("with b: %g%% known %v, want 80", got, known)
	}
	onlyA := []Poll{{At: 5 * sec, Replicas: map[string]ReplicaCounters{"a": none}}, {At: 12 * sec, Replicas: map[string]ReplicaCounters{"a": none}}}
	if got, known := PrefixHitPct(onlyA, Window{From: 10 * sec, To: 20 * sec}); known || got != 0 {
		t.Errorf("no counters anywhere: %g%% known %v, want unknown", got, known)
	}
	rep := Report{Stages: []Stage{{Sessions: 4, Mode: ModeOff, PrefixHitUnknown: true}, {Sessions: 4, Mode: ModeOn, PrefixHitPct: 80}}}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "| unknown → 80.0 |") {
		t.Errorf("report table does not show the unknown figure:\n%s", b.String())
	}
}
