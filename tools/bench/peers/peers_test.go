package peers

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func cfg(n int) Config {
	c := Config{BlockSize: 16, NumGPUBlocks: 2300, PrefillTokensPerSecond: 5000, Seed: 1}
	for i := range n {
		c.Replicas = append(c.Replicas, fmt.Sprintf("replica-%d", i))
	}
	return c
}

// prompt is a prompt of n tokens, the first shared of them the same for
// every seed (a system prompt), the rest drawn from seed.
func prompt(seed uint64, shared, n int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]uint32, n)
	for i := range out {
		if i < shared {
			out[i] = uint32(i + 1)
		} else {
			out[i] = r.Uint32()
		}
	}
	return out
}

// vllm-router's sticky_least_loaded: new sessions to the fewest active
// sessions, and a session never moves, however loaded its replica.
func TestStickyLeastLoadedNeverMoves(t *testing.T) {
	p := NewStickyLeastLoaded(cfg(4))
	home := map[string]int{}
	for i := range 8 {
		k := fmt.Sprintf("s%d", i)
		home[k] = p.Pick(Request{Key: k, Now: t0}).Replica
	}
	for i, n := range p.Active() {
		if n != 2 {
			t.Fatalf("replica %d holds %d sessions, want 2 each: %v", i, n, p.Active())
		}
	}
	// s0's replica gets 50 turns in flight, the others none; polled load
	// says it is swamped: s0 stays
	p.Poll([]Load{{Waiting: 40, Running: 32, KVUsage: 1}, {}, {}, {}}, t0)
	for j := range 50 {
		now := t0.Add(time.Duration(j) * time.Minute)
		if f := p.Pick(Request{Key: "s0", Now: now}); f.Replica != home["s0"] {
			t.Fatalf("turn %d of s0 moved to %d from %d", j, f.Replica, home["s0"])
		}
	}
	// a new session goes where the fewest sessions are: after s1 ends,
	// its replica
	p.EndSession("s1", t0)
	if got := p.Pick(Request{Key: "new", Now: t0}).Replica; got != home["s1"] {
		t.Errorf("new session went to %d, want %d (the replica with one session fewer)", got, home["s1"])
	}
	// unused for two hours, a session expires and its count is freed
	late := t0.Add(49*time.Minute + StickyExpiration + 2*StickySweepInterval)
	p.Pick(Request{Key: "probe", Now: late})
	sum := 0
	for _, n := range p.Active() {
		sum += n
	}
	if sum != 1 {
		t.Errorf("after expiry %d sessions active, want 1 (the probe): %v", sum, p.Active())
	}
}

// SMG cache_aware: the best-matching worker while the in-flight counts
// are balanced; the shortest queue once max−min > 32 and max > 1.1 × min.
func TestCacheAwareSwitchesToShortestQueue(t *testing.T) {
	p := NewCacheAware(cfg(4))
	conv := prompt(1, 0, 4000)
	home := p.Pick(Request{Key: "a", Tokens: conv[:3000], Now: t0})
	p.Done(home, t0)
	// the next turn extends the prompt: 3000 of 4000 tokens match (0.75 >
	// 0.5), and loads are balanced: it goes home
	if f := p.Pick(Request{Key: "a", Tokens: conv, Now: t0}); f.Replica != home.Replica {
		t.Fatalf("balanced: went to %d, want the matching worker %d", f.Replica, home.Replica)
	} else {
		p.Done(f, t0)
	}
	// a prompt that matches less than half goes to the least loaded
	other := append(append([]uint32(nil), conv[:1000]...), prompt(2, 0, 3000)...)
	if f := p.Pick(Request{Tokens: other, Now: t0}); f.Replica == home.Replica {
		t.Fatalf("match ratio 0.25 went to the matching worker %d", f.Replica)
	} else {
		p.Done(f, t0)
	}
	// load home with exactly 32 more in flight than the others: not past
	// the absolute threshold, the turn stays
	var load []*Flight
	for len(load) < SMGBalanceAbs {
		p.inflight[home.Replica]++
		load = append(load, &Flight{Replica: home.Replica, prefill: true})
	}
	base := p.inflight[(home.Replica+1)%4]
	for i := range p.inflight {
		if i != home.Replica && p.inflight[i] != base {
			t.Fatalf("uneven base loads %v", p.inflight)
		}
	}
	conv2 := append(conv, prompt(3, 0, 200)...)
	f := p.Pick(Request{Key: "a", Tokens: conv2, Now: t0})
	if p.inflight[home.Replica]-1-base > SMGBalanceAbs {
		t.Fatalf("setup: spread %d", p.inflight[home.Replica]-1-base)
	}
	if f.Replica != home.Replica {
		t.Fatalf("spread %d (not past %d): went to %d, want %d", p.inflight[home.Replica]-1-base, SMGBalanceAbs, f.Replica, home.Replica)
	}
	// one more in flight there: 33 > 32 and 33+base > 1.1 × base: the
	// next turn goes to the shortest queue although its prefix is home
	if !p.Imbalanced() {
		t.Fatalf("in flight %v: want imbalanced", p.inflight)
	}
	conv3 := append(conv2, prompt(4, 0, 200)...)
	g := p.Pick(Request{Key: "a", Tokens: conv3, Now: t0})
	if g.Replica == home.Replica {
		t.Fatalf("imbalanced (%v): stayed on %d", p.inflight, home.Replica)
	}
	for i, n := range p.inflight {
		if i != g.Replica && n < p.inflight[g.Replica]-1 {
			t.Errorf("imbalanced: went to %d with %d in flight, replica %d had %d", g.Replica, p.inflight[g.Replica]-1, i, n)
		}
	}
	// eviction: every 30 s a worker's tree is cut back to 10,000 tokens
	p.Pick(Request{Tokens: prompt(5, 0, 30000), Now: t0.Add(SMGEvictionInterval)})
	p.Pick(Request{Tokens: prompt(6, 0, 16), Now: t0.Add(2 * SMGEvictionInterval)})
	for i, n := range p.TreeTokens() {
		if n > SMGMaxTreeSize+16 {
			t.Errorf("worker %d's tree holds %d tokens after eviction, cap %d", i, n, SMGMaxTreeSize)
		}
	}
}

// llm-d: the prefix-cache affinity filter keeps a conversation on the pod
// that holds its prefix however loaded that pod is, until the pod's
// estimated TTFT is more than 18 s worse than the best other pod's; then
// the scorers decide among all pods and the turn moves.
func TestLLMDDropsStickinessPast18s(t *testing.T) {
	c := cfg(4)
	conv := prompt(1, 0, 6400) // 100 blocks of 64
	for _, tc := range []struct {
		gap   time.Duration // home's estimated TTFT over the others'
		moves bool
	}{
		{0, false},
		{17 * time.Second, false},
		{LLMDMaxTTFTPenalty, false},
		{19 * time.Second, true},
		{60 * time.Second, true},
	} {
		p := NewLLMD(c)
		first := p.Pick(Request{Key: "a", Tokens: conv[:85*64], Now: t0})
		p.Done(first, t0)
		home := first.Replica
		// home is swamped by the polled signals: a long queue, a full
		// cache; its prefix score for the next turn is 85/100
		loads := []Load{{KVUsage: 0.1}, {KVUsage: 0.1}, {KVUsage: 0.1}, {KVUsage: 0.1}}
		loads[home] = Load{Waiting: 10, Running: 32, KVUsage: 0.95}
		p.Poll(loads, t0)
		p.tokens[home] = int(tc.gap.Seconds() * c.PrefillTokensPerSecond)
		f := p.Pick(Request{Key: "a", Tokens: conv, Now: t0.Add(time.Second)})
		if moved := f.Replica != home; moved != tc.moves {
			t.Errorf("TTFT gap %v: moved %v (to %d from %d), want %v", tc.gap, moved, f.Replica, home, tc.moves)
		}
		if opened := p.BrokeStickiness > 0; opened != tc.moves {
			t.Errorf("TTFT gap %v: filter opened %v, want %v", tc.gap, opened, tc.moves)
		}
	}
	// the session-affinity scorer: with nothing else to tell the pods
	// apart, a session's turns follow its binding while it is fresh
	p := NewLLMD(c)
	bound := p.Pick(Request{Key: "b", Tokens: prompt(9, 0, 640), Now: t0}).Replica
	for j := range 20 {
		now := t0.Add(time.Duration(j) * (LLMDSessionTTL - time.Second))
		if f := p.Pick(Request{Key: "b", Tokens: prompt(uint64(20+j), 0, 640), Now: now}); f.Replica != bound {
			t.Fatalf("turn %d left the bound pod %d for %d", j, bound, f.Replica)
		}
	}
}

// Dynamo: every pick is the argmin of prefill blocks not predicted cached
// plus active decode blocks; a bound session stays.
func TestDynamoPicksArgminCost(t *testing.T) {
	p := NewDynamo(cfg(4))
	r := rand.New(rand.NewPCG(3, 3))
	var open []*Flight
	convs := make([][]uint32, 6)
	for i := range convs {
		convs[i] = prompt(uint64(i), 512, 2048)
	}
	for step := range 300 {
		now := t0.Add(time.Duration(step) * time.Second)
		c := r.IntN(len(convs))
		convs[c] = append(convs[c], prompt(uint64(step+100), 0, 64+r.IntN(512))...)
		req := Request{Tokens: convs[c], Now: now} // no session ID: cost decides
		costs := p.Costs(req)
		f := p.Pick(req)
		for i, x := range costs {
			if x < costs[f.Replica] {
				t.Fatalf("step %d: picked %d at cost %.0f, worker %d costs %.0f (%v)", step, f.Replica, costs[f.Replica], i, x, costs)
			}
		}
		open = append(open, f)
		// some turns get their first token, some finish
		for k := 0; k < len(open); k++ {
			switch r.IntN(4) {
			case 0:
				p.FirstToken(open[k], now)
			case 1:
				p.Done(open[k], now)
				open = append(open[:k], open[k+1:]...)
				k--
			}
		}
	}
	// a cached prompt wins over an idle worker, and loses once the
	// worker's decode load passes the prefill it saves
	q := NewDynamo(cfg(2))
	conv := prompt(50, 0, 3200) // 200 blocks
	f := q.Pick(Request{Tokens: conv, Now: t0})
	q.Done(f, t0)
	home := f.Replica
	if g := q.Pick(Request{Tokens: conv, Now: t0}); g.Replica != home {
		t.Fatalf("cached prompt went to %d, want %d (%v)", g.Replica, home, q.Costs(Request{Tokens: conv, Now: t0}))
	} else {
		q.Done(g, t0)
	}
	q.sessions["pin"] = &dynamoBinding{worker: home}
	busy := q.Pick(Request{Key: "pin", Tokens: prompt(51, 0, 4000), Now: t0}) // 250 blocks
	q.FirstToken(busy, t0)
	// home: 0 prefill + 250 decode + 200 incoming = 450; other: 200 + 200
	if c := q.Costs(Request{Tokens: conv, Now: t0}); c[home] != 450 || c[1-home] != 400 {
		t.Fatalf("costs %v, want home 450 and other 400", c)
	}
	if g := q.Pick(Request{Tokens: conv, Now: t0}); g.Replica == home {
		t.Errorf("home carries 250 decode blocks against 200 cached: went home")
	}
	// the predicted cache expires 120 s after the last routing there
	hashes := chainHashes(conv, 16, 0)
	if n := q.overlap(home, hashes, t0.Add(time.Second)); n != 200 {
		t.Fatalf("overlap at home %d blocks, want 200", n)
	}
	if n := q.overlap(home, hashes, t0.Add(DynamoBlockTTL)); n != 0 {
		t.Errorf("overlap after 120 s: %d blocks, want 0", n)
	}
	// session affinity: a bound session stays whatever the costs
	s := q.Pick(Request{Key: "sess", Tokens: prompt(60, 0, 320), Now: t0})
	q.Done(s, t0)
	q.sessions["pin2"] = &dynamoBinding{worker: s.Replica}
	for range 5 {
		q.Pick(Request{Key: "pin2", Tokens: prompt(61, 0, 4000), Now: t0})
	}
	for j := range 5 {
		req := Request{Key: "sess", Tokens: prompt(60, 0, 320+j*64), Now: t0.Add(time.Duration(j) * time.Second)}
		c := q.Costs(req)
		if g := q.Pick(req); g.Replica != s.Replica {
			t.Fatalf("bound session moved from %d to %d", s.Replica, g.Replica)
		} else if c[s.Replica] <= c[1-s.Replica] {
			t.Fatalf("setup: the bound worker is not the costlier (%v)", c)
		}
	}
}

// KubeAI CHWBL: a key's requests go to its ring endpoint while that one's
// in-flight count is ≤ 125 % of the mean (counting the new request), then
// walk on along the ring.
func TestCHWBLWalksOnPast125Percent(t *testing.T) {
	p := NewCHWBL(cfg(4))
	req := Request{FirstUser: "Fix the failing test in internal/parser: the fuzz corpus found a panic on an empty header line, and the stack points at readKeys", Now: t0}
	if got := p.Key(req); len([]rune(got)) != KubeAIPrefixChars {
		t.Fatalf("key has %d characters, want %d", len([]rune(got)), KubeAIPrefixChars)
	}
	home := p.Home(req)
	walked := 0
	for range 40 {
		total := 0
		for _, n := range p.inflight {
			total += n
		}
		within := total == 0 || float64(p.inflight[home]) <= 1.25*float64(total+1)/4
		f := p.Pick(req)
		if within != (f.Replica == home) {
			t.Fatalf("home in flight %d of %d: within bound %v, but went to %d (home %d)", p.inflight[home]-btoi(f.Replica == home), total, within, f.Replica, home)
		}
		if !within {
			walked++
			// the endpoint taken is the first within bound clockwise
			if float64(p.inflight[f.Replica]-1) > 1.25*float64(total+1)/4 {
				t.Fatalf("walked to %d, itself over the bound", f.Replica)
			}
		}
	}
	if walked == 0 || p.Walked != walked {
		t.Fatalf("walked %d times (counter %d), want some", walked, p.Walked)
	}
	// the load drains: the key is home again
	for i := range p.inflight {
		p.inflight[i] = 0
	}
	if f := p.Pick(req); f.Replica != home {
		t.Errorf("idle pool: went to %d, want home %d", f.Replica, home)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// production-stack session: the ring's owner for a key, always, whatever
// the load; the same on a fresh router; keys spread over the endpoints.
func TestSessionRingStableAndLoadBlind(t *testing.T) {
	p := NewSessionRing(cfg(4))
	fresh := NewSessionRing(cfg(4))
	seen := map[int]int{}
	for i := range 200 {
		k := fmt.Sprintf("session-%d", i)
		want := fresh.Owner(k)
		seen[want]++
		for j := range 3 {
			p.Poll([]Load{{Waiting: 50, KVUsage: 1}, {}, {}, {}}, t0)
			if f := p.Pick(Request{Key: k, Now: t0.Add(time.Duration(j) * time.Second)}); f.Replica != want {
				t.Fatalf("%s went to %d, the ring owner is %d", k, f.Replica, want)
			}
		}
	}
	if len(seen) != 4 {
		t.Errorf("200 keys landed on %d endpoints: %v", len(seen), seen)
	}
	// no key: the endpoint with the fewest requests in the last minute
	q := NewSessionRing(cfg(3))
	q.Pick(Request{Key: "x", Now: t0})
	q.Pick(Request{Key: "y", Now: t0})
	got := q.Pick(Request{Now: t0}).Replica
	if q.recent[got] == nil || len(q.recent[got]) != 1 {
		t.Errorf("keyless request went to %d with %d recent requests", got, len(q.recent[got])-1)
	}
}

// ThunderAgent: at a tick, a worker whose programs' working set reaches
// 0.95 of its KV pool pauses its smallest programs between turns until it
// is down to 0.80; a paused program's turn is held; it resumes once the
// worker is 0.10 below the threshold and it fits again. A program in the
// middle of a turn is only marked, and paused at its tool boundary.
func TestThunderPausesAndResumes(t *testing.T) {
	c := Config{Replicas: []string{"r0"}, BlockSize: 16, NumGPUBlocks: 100, Seed: 1} // 1,600 tokens
	p := NewThunder(c)
	now := t0
	for _, pr := range []struct {
		key string
		n   int
	}{{"a", 608}, {"b", 512}, {"c", 432}} { // 1,552 tokens: 0.97
		f := p.Pick(Request{Key: pr.key, Tokens: prompt(uint64(pr.n), 0, pr.n), Now: now})
		if f == nil {
			t.Fatalf("%s held on an idle pool", pr.key)
		}
		p.Done(f, now)
	}
	if u := p.Utilisation()[0]; u < ThunderPauseThreshold {
		t.Fatalf("setup: utilisation %.2f", u)
	}
	now = now.Add(ThunderTick)
	p.Poll(nil, now)
	if !p.IsPaused("c") || p.IsPaused("a") || p.IsPaused("b") {
		t.Fatalf("after the tick: paused a %v b %v c %v, want c only (the smallest, 0.97 → 0.70)", p.IsPaused("a"), p.IsPaused("b"), p.IsPaused("c"))
	}
	if u := p.Utilisation()[0]; u > ThunderPauseTarget {
		t.Errorf("utilisation %.2f after pausing, want ≤ %.2f", u, ThunderPauseTarget)
	}
	if f := p.Pick(Request{Key: "c", Tokens: prompt(432, 0, 500), Now: now}); f != nil {
		t.Fatal("a paused program's turn was routed")
	}
	// 0.70 is ≤ 0.85, but c does not fit under 0.95 (0.70 + 0.27): it
	// stays paused; once a ends (0.32) it resumes at the next tick
	now = now.Add(ThunderTick)
	p.Poll(nil, now)
	if !p.IsPaused("c") {
		t.Fatal("c resumed into a worker it does not fit")
	}
	p.EndSession("a", now)
	now = now.Add(ThunderTick)
	p.Poll(nil, now)
	if p.IsPaused("c") {
		t.Fatalf("c still paused at utilisation %.2f", p.Utilisation()[0])
	}
	fc := p.Pick(Request{Key: "c", Tokens: prompt(432, 0, 500), Now: now})
	if fc == nil {
		t.Fatal("a resumed program's turn was held")
	}
	// b and c mid-turn, d arrives and fills the pool: nobody is between
	// turns, so the smallest in flight is marked and paused when its turn
	// ends
	fb := p.Pick(Request{Key: "b", Tokens: prompt(512, 0, 600), Now: now})
	fd := p.Pick(Request{Key: "d", Tokens: prompt(7, 0, 560), Now: now})
	if fb == nil || fd == nil {
		t.Fatal("held a program that is not paused")
	}
	now = now.Add(ThunderTick)
	p.Poll(nil, now)
	if p.IsPaused("c") || p.IsPaused("b") || p.IsPaused("d") {
		t.Fatal("paused a program in the middle of a turn")
	}
	for _, f := range []*Flight{fb, fd} {
		p.Done(f, now)
	}
	if p.IsPaused("b") || p.IsPaused("d") || p.IsPaused("c") {
		t.Fatal("paused a program that was not marked, or before its tool boundary")
	}
	p.Done(fc, now) // c, the smallest in flight at the tick (500 tokens), reaches its boundary
	if !p.IsPaused("c") {
		t.Fatalf("c not paused at its tool boundary (utilisation %.2f)", p.Utilisation()[0])
	}
	if p.Paused < 2 || p.Resumed != 1 {
		t.Errorf("paused %d times, resumed %d, want ≥ 2 and 1", p.Paused, p.Resumed)
	}
}
