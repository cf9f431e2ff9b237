package placement

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// teach feeds a finished turn of key, bound to id, that computed prompt
// tokens in first before its first token and ended after total.
func teach(t *testing.T, r *Router, key, id string, prompt int, first, total time.Duration) {
	t.Helper()
	bindTo(t, r, key, id, t0)
	r.Feedback(Turn{Key: key, Replica: id, Reason: ReasonClientPinned, Prompt: prompt, FirstToken: first, Duration: total})
}

// queuedBesideFast binds k to r0, whose engine runs 3 and queues 6, and
// teaches fast that it prefills 20,000 tokens a second.
func queuedBesideFast(fast string) func(*testing.T, *Router) {
	return func(t *testing.T, r *Router) {
		bindTo(t, r, "k", "r0", t0)
		teach(t, r, "other", fast, 20000, time.Second, 5*time.Second)
		r.UpdateLoad("r0", queued(3, 6))
	}
}

func TestSpillCost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		n      int
		cfg    Config
		setup  func(t *testing.T, r *Router)
		req    Request
		want   string
		reason Reason
		// estimates the decision carries, when checked (> 0)
		stay, move time.Duration
	}{
		{
			// 3 running, 6 waiting: 7 turns of 10 s ahead in batches
			// of 3, 23.3 s; 60,000 tokens at 2,000 tok/s cost 30 s
			name: "a long history stays: recomputing it costs more than the queue",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 60000},
			want: "r0", reason: ReasonSpillDeclined,
			stay: 23333333333, move: 30 * time.Second,
		},
		{
			name: "the same history moves to a replica that prefills fast",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: queuedBesideFast("r1"),
			req:   Request{Key: "k", Tokens: 60000},
			want:  "r1", reason: ReasonSpilled,
			move: 3 * time.Second,
		},
		{
			// r1 is the better by placement score (no conversation
			// there), r2 the cheaper to move to
			name: "the move goes where it costs least, not where the score points",
			n:    3, cfg: Config{SpillThreshold: 2},
			setup: queuedBesideFast("r2"),
			req:   Request{Key: "k", Tokens: 60000},
			want:  "r2", reason: ReasonSpilled,
			move: 3 * time.Second,
		},
		{
			name: "the engine's count of the context wins over the request's estimate",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonClientPinned, Prompt: 4000})
				r.UpdateLoad("r0", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 60000},
			want: "r1", reason: ReasonSpilled,
			move: 2 * time.Second,
		},
		{
			name: "over the threshold without a queue: nothing to gain",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", running(5))
			},
			req:  Request{Key: "k"},
			want: "r0", reason: ReasonSpillDeclined,
		},
		{
			name: "short turns free places sooner: the queue is cheaper than the move",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				teach(t, r, "other", "r0", 100, 0, time.Second)
				r.UpdateLoad("r0", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 6000},
			want: "r0", reason: ReasonSpillDeclined,
			stay: 2333333333, move: 3 * time.Second,
		},
		{
			name: "every other replica over the threshold: moves where no queue is",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 6))
				r.UpdateLoad("r1", running(4))
			},
			req:  Request{Key: "k", Tokens: 2000},
			want: "r1", reason: ReasonSpilled,
		},
		{
			name: "every other replica over the threshold and queueing as deep: stays",
			n:    2, cfg: Config{SpillThreshold: 2},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 6))
				r.UpdateLoad("r1", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 2000},
			want: "r0", reason: ReasonStayedOverloaded,
		},
		{
			// 3 running, 2 waiting: 3 turns of 10 s ahead in batches of
			// 3, 10 s; the move's 4 s of recompute and a turn time (10
			// s) waiting for blocks
			name: "no room in the target's KV cache for the history: it would wait for blocks, and stays",
			n:    2, cfg: Config{SpillThreshold: 2, KVTokens: 40000, AdmissionOff: true},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 2))
				r.UpdateLoad("r1", Load{Running: 1, KVUsage: 0.9, Reachable: true})
			},
			req:  Request{Key: "k", Tokens: 8000},
			want: "r0", reason: ReasonSpillDeclined,
			stay: 10 * time.Second, move: 14 * time.Second,
		},
		{
			name: "the same history moves where the target's KV cache has room",
			n:    2, cfg: Config{SpillThreshold: 2, KVTokens: 40000, AdmissionOff: true},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 2))
				r.UpdateLoad("r1", Load{Running: 1, KVUsage: 0.5, Reachable: true})
			},
			req:  Request{Key: "k", Tokens: 8000},
			want: "r1", reason: ReasonSpilled,
			stay: 10 * time.Second, move: 4 * time.Second,
		},
		{
			name: "a wider margin keeps the turn",
			n:    2, cfg: Config{SpillThreshold: 2, SpillMargin: time.Minute},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.UpdateLoad("r0", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 2000},
			want: "r0", reason: ReasonSpillDeclined,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(tc.n, tc.cfg)
			tc.setup(t, r)
			req := tc.req
			req.Now = t0
			d, err := r.Route(req)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			if d.Replica != tc.want || d.Reason != tc.reason {
				t.Fatalf("got %s (%s; stay %v, move %v), want %s (%s)", d.Replica, d.Reason, d.Stay, d.Move, tc.want, tc.reason)
			}
			if tc.stay > 0 && d.Stay != tc.stay {
				t.Errorf("stay %v, want %v", d.Stay, tc.stay)
			}
			if tc.move > 0 && d.Move != tc.move {
				t.Errorf("move %v, want %v", d.Move, tc.move)
			}
			// the turn is expected where it went as its estimate there
			// said: a moved turn its move, a kept one at least its stay
			if tc.reason == ReasonSpilled && d.Expect != d.Move || tc.reason != ReasonSpilled && d.Expect < d.Stay {
				t.Errorf("expect %v, with stay %v and move %v (%s)", d.Expect, d.Stay, d.Move, d.Reason)
			}
			s := r.Snapshot()
			if len(s.RecentSpills) != 1 {
				t.Fatalf("recent spills %+v, want one", s.RecentSpills)
			}
			c := s.RecentSpills[0]
			if c.Moved != (tc.reason == ReasonSpilled) || c.From != "r0" || c.Stay != d.Stay || c.Move != d.Move {
				t.Errorf("recorded %+v for %+v", c, d)
			}
			var declined uint64
			for _, rs := range s.Replicas {
				declined += rs.SpillDeclined
			}
			if want := map[bool]uint64{true: 1}[tc.reason == ReasonSpillDeclined]; declined != want {
				t.Errorf("declined %d, want %d", declined, want)
			}
		})
	}
}

// A spill leaves its recompute ahead on the target: the next conversation
// that would move there expects to wait for it and stays.
func TestSpillBacklog(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{SpillThreshold: 2})
	bindTo(t, r, "a", "r0", t0)
	bindTo(t, r, "b", "r0", t0)
	r.UpdateLoad("r0", queued(3, 6)) // 23.3 s ahead
	a, _ := r.Route(Request{Key: "a", Tokens: 20000, Now: t0})
	if a.Reason != ReasonSpilled || a.Move != 10*time.Second {
		t.Fatalf("first: %s, move %v", a.Reason, a.Move)
	}
	// b: 10 s of a's prefill ahead, then its own 12.5 s, and the margin:
	// more than the 23.3 s it waits where it is
	d, _ := r.Route(Request{Key: "b", Tokens: 25000, Now: t0})
	if d.Reason != ReasonSpillDeclined || d.Move != 22500*time.Millisecond {
		t.Fatalf("second: %s, move %v", d.Reason, d.Move)
	}
	d.Release()
	// five seconds later half of a's prefill is left
	d, _ = r.Route(Request{Key: "b", Tokens: 25000, Now: t0.Add(5 * time.Second)})
	if d.Reason != ReasonSpilled || d.Move != 17500*time.Millisecond {
		t.Fatalf("later: %s, move %v", d.Reason, d.Move)
	}
	d.Release()
}

// A turn that ended (answered, refused or failed) has had its prefill, and
// so has every prefill routed to its replica before it: the backlog keeps
// only what was routed there since, however slow the rate it drains at.
func TestSpillBacklogEndsWithTheTurn(t *testing.T) {
	t.Parallel()
	r := newTestRouter(2, Config{SpillThreshold: 2})
	r.UpdateLoad("r0", queued(3, 6)) // over the threshold: new ones go to r1
	// three new conversations on r1: 30,000 tokens at the prior's 2,000
	// tokens/s
	var ds []Decision
	for i := range 3 {
		d, err := r.Route(Request{Key: fmt.Sprintf("new-%d", i), Tokens: 10000, Now: t0})
		if err != nil || d.Replica != "r1" || d.Reason != ReasonPlaced {
			t.Fatalf("new-%d: %s (%s), %v", i, d.Replica, d.Reason, err)
		}
		ds = append(ds, d)
	}
	// a probe pinned to r1 a second later, held in flight (one that
	// ended would say every prefill before it was done): its expected
	// time to first token, less its own 1 s of prefill
	probes := 0
	ahead := func() time.Duration {
		t.Helper()
		probes++
		d, _ := r.Route(Request{Key: fmt.Sprintf("probe-%d", probes), Tokens: 2000, Pin: "r1", Now: t0.Add(time.Second)})
		t.Cleanup(d.Release)
		return d.Expect - time.Second
	}
	if got := ahead(); got != 14*time.Second {
		t.Fatalf("r1's backlog after a second: %v, want 14s", got)
	}
	// the second ends: the first and second prefills are done
	ds[1].ReleaseAt(t0.Add(time.Second))
	if got := ahead(); got != 5*time.Second {
		t.Errorf("after the second ended: %v, want 5s (the third's prefill)", got)
	}
	ds[0].ReleaseAt(t0.Add(time.Second))
	ds[2].ReleaseAt(t0.Add(time.Second))
	if got := ahead(); got != 0 {
		t.Errorf("after all ended: %v, want 0", got)
	}
}

func TestLearnPrefillRate(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{})
	rate := func() float64 { return r.Snapshot().Replicas[0].PrefillRate }
	teach(t, r, "b", "r0", 10000, time.Second, 2*time.Second)
	if got := rate(); got != 10000 {
		t.Fatalf("rate %g, want 10000", got)
	}
	// a slower turn pulls the rate meanWeight of the way times the share
	// of its time its prefill at the present rate explains: a short turn,
	// mostly the engine's step overhead (100 tokens in 50 ms, 10 ms of it
	// prefill at 10,000/s), a fifth of that
	teach(t, r, "a", "r0", 100, 50*time.Millisecond, time.Second)
	if got, want := rate(), 10000-8000*meanWeight*0.2; math.Abs(got-want) > 1e-6 {
		t.Fatalf("rate %g after a short turn, want %g", got, want)
	}
	// a queued turn looks slower too: 10,000 tokens in 10 s, a tenth of
	// which its prefill explains
	prev := rate()
	teach(t, r, "c", "r0", 10000, 10*time.Second, 12*time.Second)
	if got, want := rate(), prev+(1000-prev)*meanWeight*1000/prev; math.Abs(got-want) > 1e-6 {
		t.Fatalf("rate %g after a slow turn, want %g", got, want)
	}
	// a faster one sets it
	teach(t, r, "d", "r0", 30000, time.Second, 2*time.Second)
	if got := rate(); got != 30000 {
		t.Fatalf("rate %g after a fast turn", got)
	}
	// cached tokens are not computed
	r2 := newTestRouter(1, Config{})
	bindTo(t, r2, "e", "r0", t0)
	r2.Feedback(Turn{Key: "e", Replica: "r0", Reason: ReasonClientPinned, Prompt: 10000, Cached: 9000, FirstToken: time.Second})
	if got := r2.Snapshot().Replicas[0].PrefillRate; got != 1000 {
		t.Fatalf("rate %g, want 1000 (computed tokens only)", got)
	}
	if tt := r.Snapshot().Replicas[0].TurnTime; tt <= time.Second || tt > 12*time.Second {
		t.Fatalf("turn time %v", tt)
	}
}

// TestExpect checks a decision's expected time to first token: the wait on
// the replica chosen, then the prefill of what the turn finds uncached
// there, at that replica's rate (the prior's 2,000 tokens/s here).
func TestExpect(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		setup func(t *testing.T, r *Router)
		req   Request
		at    time.Duration // after t0
		want  time.Duration
		why   Reason
	}{
		{
			name: "a new conversation on an idle replica: its whole prompt",
			req:  Request{Key: "new", Tokens: 10000},
			want: 5 * time.Second, why: ReasonPlaced,
		},
		{
			name: "a new conversation behind another's prefill, in flight",
			setup: func(t *testing.T, r *Router) {
				d, _ := r.Route(Request{Key: "first", Tokens: 4000, Now: t0})
				t.Cleanup(d.Release)
			},
			req:  Request{Key: "new", Tokens: 10000},
			want: 7 * time.Second, why: ReasonPlaced,
		},
		{
			name: "a returning turn: what its last turn left uncached",
			setup: func(t *testing.T, r *Router) {
				d, _ := r.Route(Request{Key: "k", Tokens: 10000, Now: t0})
				d.Release()
				r.Feedback(Turn{Key: "k", Replica: d.Replica, Reason: d.Reason, Prompt: 10000})
			},
			req: Request{Key: "k", Tokens: 12000}, at: 10 * time.Second,
			want: time.Second, why: ReasonSticky,
		},
		{
			// two turns in flight fill a batch of two: the new one
			// waits one turn time for one of them (10 s ÷ 2 places),
			// then its own 1 s prefill; it is not counted ahead of
			// itself
			name: "a new conversation behind a full batch",
			cfg:  Config{MaxNumSeqs: 2},
			setup: func(t *testing.T, r *Router) {
				hold(t, r, "r0", 2)
			},
			req:  Request{Key: "new", Tokens: 2000},
			want: 6 * time.Second, why: ReasonPlaced,
		},
		{
			// the start recurs after a compaction: the conversation goes
			// on from the new start on its replica, none of it cached
			name: "a conversation restarted on its replica: its whole new prompt",
			setup: func(t *testing.T, r *Router) {
				for _, start := range []uint64{0xa, 0xa, 0xc} {
					d, _ := r.Route(Request{Key: "k", Start: start, Tokens: 10000, Now: t0})
					d.Release()
					r.Feedback(Turn{Key: "k", Replica: d.Replica, Reason: d.Reason, Prompt: 10000})
				}
			},
			req: Request{Key: "k", Start: 0xc, Tokens: 4000}, at: 10 * time.Second,
			want: 2 * time.Second, why: ReasonRestarted,
		},
		{
			// 3 running, 6 waiting: 7 turns of 10 s ahead in batches
			// of 3
			name: "a returning turn behind the engine's queue",
			cfg:  Config{SpillThreshold: 100},
			setup: func(t *testing.T, r *Router) {
				bindTo(t, r, "k", "r0", t0)
				r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonClientPinned, Prompt: 10000})
				r.UpdateLoad("r0", queued(3, 6))
			},
			req:  Request{Key: "k", Tokens: 10000},
			want: 23333333333, why: ReasonSticky,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRouter(1, tc.cfg)
			if tc.setup != nil {
				tc.setup(t, r)
			}
			req := tc.req
			req.Now = t0.Add(tc.at)
			d, err := r.Route(req)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			if d.Reason != tc.why || d.Expect != tc.want {
				t.Errorf("%s, expect %v; want %s, %v", d.Reason, d.Expect, tc.why, tc.want)
			}
		})
	}
}

// TestExpectChecked checks the replica's means of the turns' expected and
// measured time to first token: the plain mean over the first turns.
func TestExpectChecked(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{})
	bindTo(t, r, "k", "r0", t0)
	s := r.Snapshot().Replicas[0]
	if s.TTFTTurns != 0 || s.ExpectedTTFT != 0 || s.MeasuredTTFT != 0 {
		t.Fatalf("before a turn: %d turns, %v / %v", s.TTFTTurns, s.ExpectedTTFT, s.MeasuredTTFT)
	}
	// a turn without an estimate (a side request, a peer) is not checked
	r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonClientPinned, Prompt: 100, FirstToken: time.Second})
	r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonClientPinned, Prompt: 100, FirstToken: 2 * time.Second, Expect: time.Second})
	r.Feedback(Turn{Key: "k", Replica: "r0", Reason: ReasonClientPinned, Prompt: 100, FirstToken: 4 * time.Second, Expect: 3 * time.Second})
	s = r.Snapshot().Replicas[0]
	if s.TTFTTurns != 2 || s.ExpectedTTFT != 2*time.Second || s.MeasuredTTFT != 3*time.Second {
		t.Errorf("after two turns: %d turns, expected %v, measured %v; want 2, 2s, 3s", s.TTFTTurns, s.ExpectedTTFT, s.MeasuredTTFT)
	}
}

// With affinity off no conversation is bound, and the replica still learns
// its rate and turn time from the turns it answered.
func TestLearnWithoutBinding(t *testing.T) {
	t.Parallel()
	r := newTestRouter(1, Config{AffinityOff: true})
	d, err := r.Route(Request{Key: "k", Tokens: 10000, Now: t0})
	if err != nil || d.Reason != ReasonAffinityOff {
		t.Fatalf("%s, %v", d.Reason, err)
	}
	d.Release()
	r.Feedback(Turn{Key: "k", Replica: d.Replica, Reason: d.Reason, Prompt: 10000, FirstToken: time.Second, Duration: 3 * time.Second, Expect: 5 * time.Second})
	s := r.Snapshot().Replicas[0]
	if s.PrefillRate != 10000 || s.TurnTime != 3*time.Second || s.TTFTTurns != 1 {
		t.Errorf("rate %g, turn time %v, checked turns %d; want 10000, 3s, 1", s.PrefillRate, s.TurnTime, s.TTFTTurns)
	}
}

// A move's cost counts the recompute it forces on the target's resident
// conversations: the part of their context that no longer fits beside the
// moved history, at the target's rate.
func TestSpillEvicts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		resident int // tokens of the conversation resident on r1
		want     string
		evict    time.Duration
	}{
		// 3 running, 1 waiting on r0: 2 turns of 10 s ahead in batches
		// of 3, 6.7 s; the move recomputes 8,000 tokens at 2,000 tok/s,
		// 4 s
		{"room beside the residents: moves", 30000, "r1", 0},
		// 38,000 + 8,000 over 40,000: 6,000 tokens pushed out, 3 s
		{"the residents' caches pushed out cost more than the queue: stays", 38000, "r0", 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := admitRouter(2, 40000, Config{SpillThreshold: 2})
			bindTo(t, r, "a", "r1", t0)
			r.Feedback(Turn{Key: "a", Replica: "r1", Reason: ReasonClientPinned, Prompt: tc.resident})
			bindTo(t, r, "k", "r0", t0)
			r.UpdateLoad("r0", queued(3, 1))
			d, err := r.Route(Request{Key: "k", Tokens: 8000, Now: t0.Add(time.Second)})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Release()
			s := r.Snapshot()
			c := s.RecentSpills[len(s.RecentSpills)-1]
			if d.Replica != tc.want || c.Evict != tc.evict || c.Move != 4*time.Second+tc.evict {
				t.Fatalf("went to %s (%s), evict %v, move %v; want %s, evict %v", d.Replica, d.Reason, c.Evict, c.Move, tc.want, tc.evict)
			}
			if d.Evict != c.Evict || d.Move != c.Move {
				t.Errorf("decision carries move %v, evict %v; recorded %v, %v", d.Move, d.Evict, c.Move, c.Evict)
			}
		})
	}
}

func TestSpillCostString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    SpillCost
		want string
	}{
		{SpillCost{Stay: 4100 * time.Millisecond, Move: 2050 * time.Millisecond}, "stay 4.10s, move 2.05s"},
		{SpillCost{Stay: 4100 * time.Millisecond, Move: 3050 * time.Millisecond, Evict: time.Second}, "stay 4.10s, move 3.05s (evicts 1.00s)"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.c, got, tc.want)
		}
	}
}
