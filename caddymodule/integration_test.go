package caddymodule

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

func dialList(fs []*fakeVLLM) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.addr)
	}
	return strings.Join(out, " ")
}

func startFakes(t *testing.T, n int) []*fakeVLLM {
	out := make([]*fakeVLLM, n)
	for i := range out {
		out[i] = newFakeVLLM(t, 1)
	}
	return out
}

type turnResult struct {
	status  int
	body    string
	replica string
	reason  string
	costs   string // the spill estimates, for a turn over the threshold
	expect  string // the expected time to first token (ExpectHeader), e.g. "0.420"
	header  http.Header
}

func sendTurn(t *testing.T, path, body string, hdr map[string]string) turnResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, siteURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	res := turnResult{status: resp.StatusCode, body: string(b), header: resp.Header}
	res.expect = resp.Header.Get(ExpectHeader)
	res.replica, res.reason, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
	res.reason, res.costs, _ = strings.Cut(res.reason, "; ")
	return res
}

func adminJSON(t *testing.T, path string, into any) {
	t.Helper()
	resp, err := testClient.Get(fmt.Sprintf("http://localhost:%d%s", testAdminPort, path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	if s, ok := into.(*string); ok {
		*s = string(b)
		return
	}
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

func getCard(t *testing.T, model string) Card {
	var c Card
	adminJSON(t, "/lm-warden/models/"+model, &c)
	return c
}

func cardRow(c Card, id string) ReplicaRow {
	for _, r := range c.Replicas {
		if r.ID == id {
			return r
		}
	}
	return ReplicaRow{}
}

// waitFor polls cond every 20 ms for at most 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func policyBlock(model, extra string) string {
	return fmt.Sprintf(`lb_policy lm_warden {
			model %s
			poll_interval 100ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
			%s
		}`, model, extra)
}

func TestConversationsStayOnTheirReplica(t *testing.T) {
	fs := startFakes(t, 4)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("stay", "max_num_seqs 64")))

	const convs, turns = 8, 6
	where := map[string]map[string]bool{}
	for turn := 1; turn <= turns; turn++ {
		for c := 0; c < convs; c++ {
			name := fmt.Sprintf("conv-%d", c)
			var res turnResult
			if c%2 == 0 {
				res = sendTurn(t, "/v1/messages", chatTurn(name, turn, true), map[string]string{"X-Claude-Code-Session-Id": name})
			} else {
				// older clients: the session is in the body only
				res = sendTurn(t, "/v1/messages", chatTurn(name, turn, turn%2 == 0, "user_ab12_account_cd34_session_"+name), nil)
			}
			if res.status != http.StatusOK {
				t.Fatalf("%s turn %d: %d %s", name, turn, res.status, res.body)
			}
			want := "placed"
			if turn > 1 {
				want = "sticky"
			}
			if res.reason != want {
				t.Errorf("%s turn %d: reason %q, want %q", name, turn, res.reason, want)
			}
			if v, err := strconv.ParseFloat(res.expect, 64); err != nil || v < 0 {
				t.Errorf("%s turn %d: %s %q: no expected time to first token", name, turn, ExpectHeader, res.expect)
			}
			if where[name] == nil {
				where[name] = map[string]bool{}
			}
			where[name][res.replica] = true
		}
	}
	perReplica := map[string]int{}
	for name, reps := range where {
		if len(reps) != 1 {
			t.Errorf("%s was served by %d replicas: %v", name, len(reps), reps)
		}
		for r := range reps {
			perReplica[r]++
		}
	}
	// the upstreams agree: each conversation reached exactly one of them
	for _, f := range fs {
		for _, rq := range f.requests() {
			if !where[rq.key][f.addr] {
				t.Errorf("conversation %q reached %s, not the replica the route header named", rq.key, f.addr)
			}
		}
	}
	// new conversations spread by load: 8 over 4 idle replicas, 2 each
	for _, f := range fs {
		if perReplica[f.addr] != convs/len(fs) {
			t.Errorf("replica %s holds %d conversations, want %d (spread %v)", f.addr, perReplica[f.addr], convs/len(fs), perReplica)
		}
	}

	// the card: routed numbers, and what the upstreams reported
	for i, f := range fs {
		f.setLoad(0, i, 2*i)
	}
	waitFor(t, "polled load on the card", func() bool {
		c := getCard(t, "stay")
		for i, f := range fs {
			r := cardRow(c, f.addr)
			if !r.Reachable || r.Running == nil || *r.Running != i || r.Waiting == nil || *r.Waiting != 2*i {
				return false
			}
		}
		return true
	})
	c := getCard(t, "stay")
	if c.Requests != convs*turns || c.Bindings != convs || c.StickyPct != 100 || c.InFlight != 0 || !c.Affinity {
		t.Errorf("card header: requests %d bindings %d sticky %.1f%% in flight %d affinity %v", c.Requests, c.Bindings, c.StickyPct, c.InFlight, c.Affinity)
	}
	if c.SpillThreshold != 16 || !c.SpillAuto || c.MaxNumSeqs != 64 {
		t.Errorf("threshold %d auto %v max_num_seqs %d, want 16 auto 64", c.SpillThreshold, c.SpillAuto, c.MaxNumSeqs)
	}
	var sum TokenCount
	for _, f := range fs {
		r := cardRow(c, f.addr)
		prompt, cached, gen := f.totals()
		want := TokenCount{Cached: uint64(cached), Computed: uint64(prompt - cached), Generated: uint64(gen)}
		if r.Tokens != want {
			t.Errorf("replica %s tokens %+v, upstream reported %+v", f.addr, r.Tokens, want)
		}
		if r.Sticky != uint64(perReplica[f.addr]*(turns-1)) || r.Placed != uint64(perReplica[f.addr]) || r.Bindings != perReplica[f.addr] {
			t.Errorf("replica %s: sticky %d placed %d bindings %d", f.addr, r.Sticky, r.Placed, r.Bindings)
		}
		sum.Cached += want.Cached
		sum.Computed += want.Computed
		sum.Generated += want.Generated
	}
	if sum.Cached == 0 {
		t.Error("no cached tokens reported: the fake's prefix cache never hit")
	}
	var st Stats
	adminJSON(t, "/lm-warden/models/stay/stats", &st)
	if st.Totals != sum {
		t.Errorf("stats totals %+v, upstreams reported %+v", st.Totals, sum)
	}
	if len(st.Sum.Cached) != 3600 || st.StepS != 1 {
		t.Errorf("stats series: %d buckets, step %v", len(st.Sum.Cached), st.StepS)
	}
	var bucketSum uint64
	for _, v := range st.Sum.Cached {
		bucketSum += v
	}
	if bucketSum != sum.Cached {
		t.Errorf("cached tokens in the hour's buckets %d, want %d", bucketSum, sum.Cached)
	}
	var list struct{ Models []ModelSummary }
	adminJSON(t, "/lm-warden/models", &list)
	if len(list.Models) != 1 || list.Models[0].Model != "stay" || list.Models[0].Replicas != 4 || list.Models[0].Reachable != 4 {
		t.Errorf("models list: %+v", list.Models)
	}

	// Prometheus at the admin endpoint
	var metrics string
	adminJSON(t, "/metrics", &metrics)
	for _, want := range []string{
		fmt.Sprintf(`lm_warden_requests_total{model="stay",reason="sticky",replica=%q} %d`, fs[0].addr, perReplica[fs[0].addr]*(turns-1)),
		fmt.Sprintf(`lm_warden_prompt_tokens_total{model="stay",replica=%q,source="cached"}`, fs[1].addr),
		fmt.Sprintf(`lm_warden_replica_running{model="stay",replica=%q} 3`, fs[3].addr),
		`lm_warden_bindings{model="stay"} 8`,
		`lm_warden_generation_tokens_total{model="stay"`,
		`lm_warden_in_flight{model="stay"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// unpin one conversation: its next turn is placed anew
	if code, _ := adminDo(t, testAdminPort, http.MethodDelete, "/lm-warden/models/stay/sessions/conv-0", ""); code != http.StatusOK {
		t.Fatalf("unbind: %d", code)
	}
	if res := sendTurn(t, "/v1/messages", chatTurn("conv-0", 7, false), map[string]string{"X-Claude-Code-Session-Id": "conv-0"}); res.reason != "placed" {
		t.Errorf("after unbind: reason %q, want placed", res.reason)
	}
	// an unknown key is a 404 with a JSON error
	if code, b := adminDo(t, testAdminPort, http.MethodDelete, "/lm-warden/models/stay/sessions/nope", ""); code != http.StatusNotFound || !strings.Contains(b, `"error"`) {
		t.Errorf("unknown key: %d %s", code, b)
	}
}

func TestSpillOverThresholdAndRebind(t *testing.T) {
	fs := startFakes(t, 2)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("spill", "spill_threshold 2")))

	h := map[string]string{"X-Claude-Code-Session-Id": "s"}
	first := sendTurn(t, "/v1/messages", chatTurn("s", 1, false), h)
	if first.reason != "placed" {
		t.Fatalf("first turn: %q", first.reason)
	}
	var hot, cold *fakeVLLM
	for _, f := range fs {
		if f.addr == first.replica {
			hot = f
		} else {
			cold = f
		}
	}
	// over the threshold without a queue: moving gains nothing
	hot.setLoad(0, 5, 0)
	waitFor(t, "the hot replica's load", func() bool { r := cardRow(getCard(t, "spill"), hot.addr).Running; return r != nil && *r == 5 })
	declined := sendTurn(t, "/v1/messages", chatTurn("s", 2, false), h)
	if declined.reason != "spill-declined" || declined.replica != hot.addr || !strings.HasPrefix(declined.costs, "stay 0.00s, move ") {
		t.Fatalf("over the threshold, no queue: %s; %s; %s, want %s; spill-declined; stay 0.00s, move …", declined.replica, declined.reason, declined.costs, hot.addr)
	}
	// with a million waiting behind 5 running, the turn waits for
	// 200,000 batches of the turns this replica answered (each well
	// over a microsecond): it moves
	hot.setLoad(0, 5, 1000000)
	waitFor(t, "the hot replica's queue", func() bool { r := cardRow(getCard(t, "spill"), hot.addr).Waiting; return r != nil && *r == 1000000 })
	second := sendTurn(t, "/v1/messages", chatTurn("s", 2, false), h)
	if second.reason != "spilled" || second.replica != cold.addr || !strings.HasPrefix(second.costs, "stay ") {
		t.Fatalf("over the threshold with a queue: %s; %s; %s, want %s; spilled; stay …", second.replica, second.reason, second.costs, cold.addr)
	}
	// a moved turn is expected to get its first token when its move
	// estimate said
	_, move, _ := strings.Cut(second.costs, ", move ")
	mv, err1 := strconv.ParseFloat(strings.TrimSuffix(move, "s"), 64)
	ex, err2 := strconv.ParseFloat(second.expect, 64)
	// the route header rounds to 10 ms, the expect header to 1 ms
	if err1 != nil || err2 != nil || math.Abs(mv-ex) > 0.0055 {
		t.Errorf("spilled: estimates %q, %s %q; want the move's estimate", second.costs, ExpectHeader, second.expect)
	}
	card := getCard(t, "spill")
	if r := cardRow(card, hot.addr); r.SpillDeclined != 1 {
		t.Errorf("card: spill_declined %d, want 1", r.SpillDeclined)
	}
	if n := len(card.RecentSpills); n != 2 || card.RecentSpills[0].Moved || !card.RecentSpills[1].Moved ||
		card.RecentSpills[1].From != hot.addr || card.RecentSpills[1].To != cold.addr || card.RecentSpills[1].StayS <= card.RecentSpills[1].MoveS {
		t.Errorf("card: recent spills %+v", card.RecentSpills)
	}
	declinedSample := false
	for _, m := range adminMetrics(t)["lm_warden_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model"] == "spill" && labels["replica"] == hot.addr && labels["reason"] == "spill-declined" {
			declinedSample = m.GetCounter().GetValue() == 1
		}
	}
	if !declinedSample {
		t.Error(`metrics: no lm_warden_requests_total{reason="spill-declined"} 1 for the hot replica`)
	}
	hot.setLoad(0, 0, 0)
	waitFor(t, "the load to drop", func() bool { r := cardRow(getCard(t, "spill"), hot.addr).Running; return r != nil && *r == 0 })
	third := sendTurn(t, "/v1/messages", chatTurn("s", 3, false), h)
	if third.reason != "sticky" || third.replica != cold.addr {
		t.Fatalf("after the spill: %s; %s, want %s; sticky (re-bound)", third.replica, third.reason, cold.addr)
	}
	if r := cardRow(getCard(t, "spill"), cold.addr); r.SpillAccepted != 1 || r.Sticky != 1 {
		t.Errorf("card: spill_accepted %d sticky %d", r.SpillAccepted, r.Sticky)
	}
}

// inFlightSpread sends n concurrent turns of one conversation while the
// upstreams hold every answer, and returns how many replicas got one.
func inFlightSpread(t *testing.T, fs []*fakeVLLM, n int) int {
	hold := make(chan struct{})
	for _, f := range fs {
		f.mu.Lock()
		f.hold = hold
		f.mu.Unlock()
	}
	var wg sync.WaitGroup
	results := make([]turnResult, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = sendTurn(t, "/v1/messages", chatTurn("same", 1, false), map[string]string{"X-Claude-Code-Session-Id": "same"})
		}()
		// one at a time, so each sees the previous one in flight
		waitFor(t, "the request to reach an upstream", func() bool {
			total := 0
			for _, f := range fs {
				f.mu.Lock()
				total += f.inflight
				f.mu.Unlock()
			}
			return total == i+1
		})
	}
	close(hold)
	wg.Wait()
	for _, f := range fs {
		f.mu.Lock()
		f.hold = nil
		f.mu.Unlock()
	}
	reps := map[string]bool{}
	for _, r := range results {
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		reps[r.replica] = true
	}
	return len(reps)
}

func TestAffinityOffSpreadsPerRequest(t *testing.T) {
	for _, tc := range []struct {
		affinity string
		want     int
	}{{"off", 4}, {"on", 1}} {
		t.Run("affinity_"+tc.affinity, func(t *testing.T) {
			fs := startFakes(t, 4)
			model := "aff-" + tc.affinity
			loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock(model, "affinity "+tc.affinity+"\n spill_threshold 10")))
			if got := inFlightSpread(t, fs, 4); got != tc.want {
				t.Errorf("4 concurrent turns of one conversation went to %d replicas, want %d", got, tc.want)
			}
			c := getCard(t, model)
			if c.Affinity != (tc.affinity == "on") {
				t.Errorf("card affinity %v", c.Affinity)
			}
			if c.InFlight != 0 {
				t.Errorf("in flight %d after all answers", c.InFlight)
			}
		})
	}
}

func TestAffinitySwitchAtRunTime(t *testing.T) {
	fs := startFakes(t, 2)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("toggle", "")))
	put := func(on bool) {
		code, b := adminDo(t, testAdminPort, http.MethodPut, "/lm-warden/models/toggle/affinity", fmt.Sprintf(`{"affinity":%v}`, on))
		if code != http.StatusOK || !strings.Contains(b, fmt.Sprintf(`"affinity":%v`, on)) {
			t.Fatalf("PUT affinity: %d %s", code, b)
		}
	}
	put(false)
	if res := sendTurn(t, "/v1/messages", chatTurn("x", 1, false), map[string]string{"X-Claude-Code-Session-Id": "x"}); res.reason != "affinity-off" {
		t.Errorf("affinity off: reason %q", res.reason)
	}
	put(true)
	if res := sendTurn(t, "/v1/messages", chatTurn("x", 1, false), map[string]string{"X-Claude-Code-Session-Id": "x"}); res.reason != "placed" {
		t.Errorf("affinity on: reason %q", res.reason)
	}
}

func TestDataParallelRank(t *testing.T) {
	f := newFakeVLLM(t, 4)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, f.addr, policyBlock("dp", "data_parallel_size 4\n client_pin_header X-LM-Warden-Replica")))
	where := map[string]string{}
	for turn := 1; turn <= 3; turn++ {
		for c := 0; c < 4; c++ {
			name := fmt.Sprintf("dp-%d", c)
			res := sendTurn(t, "/v1/chat/completions", chatTurn(name, turn, true), map[string]string{"X-Claude-Code-Session-Id": name})
			if res.status != http.StatusOK {
				t.Fatalf("%d %s", res.status, res.body)
			}
			if prev, ok := where[name]; ok && prev != res.replica {
				t.Errorf("%s moved from %s to %s", name, prev, res.replica)
			}
			where[name] = res.replica
			if want := f.addr + "#" + res.header.Get("X-Fake-Engine"); res.replica != want {
				t.Errorf("route header names %s, the engine that served is %s", res.replica, want)
			}
		}
	}
	engines := map[string]bool{}
	for _, r := range where {
		engines[r] = true
	}
	if len(engines) != 4 {
		t.Errorf("4 conversations on %d engines: %v", len(engines), where)
	}
	for _, rq := range f.requests() {
		if rq.rank == "" {
			t.Errorf("request of %s reached the server without X-data-parallel-rank", rq.key)
		}
	}
	// pin by rank
	res := sendTurn(t, "/v1/chat/completions", chatTurn("pinned", 1, false), map[string]string{"X-LM-Warden-Replica": "2"})
	if res.replica != f.addr+"#2" || res.reason != "client-pinned" || res.header.Get("X-Fake-Engine") != "2" {
		t.Errorf("pinned to rank 2: %s; %s (engine %s)", res.replica, res.reason, res.header.Get("X-Fake-Engine"))
	}
	f.setLoad(2, 3, 1)
	waitFor(t, "engine 2's load on the card", func() bool {
		r := cardRow(getCard(t, "dp"), f.addr+"#2")
		return r.Running != nil && *r.Running == 3 && r.Waiting != nil && *r.Waiting == 1
	})
	c := getCard(t, "dp")
	if len(c.Replicas) != 4 {
		t.Errorf("card has %d rows, want one per engine", len(c.Replicas))
	}
	var tokens TokenCount
	for _, r := range c.Replicas {
		tokens.Cached += r.Tokens.Cached
		tokens.Computed += r.Tokens.Computed
		tokens.Generated += r.Tokens.Generated
	}
	prompt, cached, gen := f.totals()
	if tokens != (TokenCount{Cached: uint64(cached), Computed: uint64(prompt - cached), Generated: uint64(gen)}) {
		t.Errorf("card tokens %+v, upstream reported prompt %d cached %d generated %d", tokens, prompt, cached, gen)
	}
}

func TestSubAgentPlacedNextToItsParent(t *testing.T) {
	fs := startFakes(t, 4)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("sub", "spill_threshold 4")))
	main := sendTurn(t, "/v1/messages", chatTurn("main", 1, false), map[string]string{"X-Claude-Code-Session-Id": "s"})
	for _, agent := range []string{"a1", "a2", "a3"} {
		res := sendTurn(t, "/v1/messages", chatTurn(agent, 1, false), map[string]string{"X-Claude-Code-Session-Id": "s", "X-Claude-Code-Agent-Id": agent})
		if res.replica != main.replica || res.reason != "placed" {
			t.Errorf("sub-agent %s: %s; %s, want its parent's replica %s", agent, res.replica, res.reason, main.replica)
		}
	}
	if c := getCard(t, "sub"); c.Bindings != 4 {
		t.Errorf("%d bindings, want the main conversation and three sub-agents", c.Bindings)
	}
}

func TestClientPin(t *testing.T) {
	fs := startFakes(t, 3)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("pin", "client_pin_header X-LM-Warden-Replica")))
	// the static upstreams are known (and polled) before the first request
	if c := getCard(t, "pin"); len(c.Replicas) != 3 {
		t.Fatalf("card before traffic has %d replicas, want 3", len(c.Replicas))
	}
	for i := 0; i < 3; i++ {
		res := sendTurn(t, "/v1/messages", chatTurn("p", 1, false), map[string]string{"X-LM-Warden-Replica": fs[2].addr, "X-Claude-Code-Session-Id": "p"})
		if res.replica != fs[2].addr || res.reason != "client-pinned" {
			t.Fatalf("pinned request: %s; %s", res.replica, res.reason)
		}
	}
	if n := len(fs[2].requests()); n != 3 {
		t.Errorf("pinned replica served %d requests, want 3", n)
	}
	if r := cardRow(getCard(t, "pin"), fs[2].addr); r.ClientPinned != 3 {
		t.Errorf("client_pinned %d", r.ClientPinned)
	}
}

func TestDeadUpstreamSkippedAndConversationsReplaced(t *testing.T) {
	fs := startFakes(t, 3)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		lb_retries 2
	}`, dialList(fs), policyBlock("dead", "")))
	where := map[string]string{}
	for c := 0; c < 6; c++ {
		name := fmt.Sprintf("d-%d", c)
		where[name] = sendTurn(t, "/v1/messages", chatTurn(name, 1, false), map[string]string{"X-Claude-Code-Session-Id": name}).replica
	}
	dead := fs[0]
	dead.srv.Close()
	moved := 0
	for name, was := range where {
		res := sendTurn(t, "/v1/messages", chatTurn(name, 2, false), map[string]string{"X-Claude-Code-Session-Id": name})
		if res.status != http.StatusOK {
			t.Fatalf("%s after the replica died: %d %s", name, res.status, res.body)
		}
		if was == dead.addr {
			moved++
			if res.replica == dead.addr || res.reason != "re-placed" {
				t.Errorf("%s: %s; %s, want another replica, re-placed", name, res.replica, res.reason)
			}
			next := sendTurn(t, "/v1/messages", chatTurn(name, 3, false), map[string]string{"X-Claude-Code-Session-Id": name})
			if next.replica != res.replica || next.reason != "sticky" {
				t.Errorf("%s turn 3: %s; %s, want %s; sticky", name, next.replica, next.reason, res.replica)
			}
		} else if res.replica != was || res.reason != "sticky" {
			t.Errorf("%s (alive replica) moved: %s; %s", name, res.replica, res.reason)
		}
	}
	if moved == 0 {
		t.Fatal("no conversation was on the replica that died")
	}
	waitFor(t, "the dead replica to show unreachable", func() bool {
		r := cardRow(getCard(t, "dead"), dead.addr)
		return !r.Reachable && r.LastError != ""
	})
	var metrics string
	adminJSON(t, "/metrics", &metrics)
	if !strings.Contains(metrics, fmt.Sprintf(`lm_warden_poll_errors_total{model="dead",replica=%q}`, dead.addr)) {
		t.Error("no poll errors counted for the dead replica")
	}
}

func TestReloadKeepsBindingsAndCounters(t *testing.T) {
	fs := startFakes(t, 3)
	site := func(extra string) string {
		return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("reload", extra))
	}
	loadSite(t, site("max_num_seqs 32"))
	where := map[string]string{}
	for c := 0; c < 5; c++ {
		name := fmt.Sprintf("r-%d", c)
		for turn := 1; turn <= 2; turn++ {
			where[name] = sendTurn(t, "/v1/messages", chatTurn(name, turn, false), map[string]string{"X-Claude-Code-Session-Id": name}).replica
		}
	}
	before := getCard(t, "reload")
	loadSite(t, site("max_num_seqs 32\n spill_threshold 3\n idle_ttl 2h"))
	after := getCard(t, "reload")
	if after.SpillThreshold != 3 || after.SpillAuto {
		t.Errorf("new settings not applied: threshold %d auto %v", after.SpillThreshold, after.SpillAuto)
	}
	if after.Bindings != before.Bindings || after.Requests != before.Requests || !after.Since.Equal(before.Since) {
		t.Errorf("reload lost state: bindings %d→%d requests %d→%d since %v→%v",
			before.Bindings, after.Bindings, before.Requests, after.Requests, before.Since, after.Since)
	}
	for _, f := range fs {
		if cardRow(after, f.addr).Tokens != cardRow(before, f.addr).Tokens {
			t.Errorf("reload changed token totals of %s", f.addr)
		}
	}
	for name, was := range where {
		res := sendTurn(t, "/v1/messages", chatTurn(name, 3, false), map[string]string{"X-Claude-Code-Session-Id": name})
		if res.replica != was || res.reason != "sticky" {
			t.Errorf("%s after reload: %s; %s, want %s; sticky", name, res.replica, res.reason, was)
		}
	}
	// a model gone from the configuration is cleaned up
	loadSite(t, fmt.Sprintf(`
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("reload-2", "")))
	if _, ok := lookupModel("reload"); ok {
		t.Error("model removed from the config is still registered")
	}
}

func TestOversizedBodyGets413InTheAPIsFormat(t *testing.T) {
	fs := startFakes(t, 1)
	loadSite(t, fmt.Sprintf(`
	lm_warden {
		max_body 1KiB
	}
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("big", "")))
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2048) + `"}]}`
	res := sendTurn(t, "/v1/messages?beta=true", big, nil)
	if res.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", res.status)
	}
	var ae anthropicError
	if err := json.Unmarshal([]byte(res.body), &ae); err != nil || ae.Type != "error" || ae.Error.Type != "request_too_large" || ae.Error.Message == "" {
		t.Errorf("Anthropic error body %s", res.body)
	}
	res = sendTurn(t, "/v1/chat/completions", big, nil)
	var oe openAIError
	if err := json.Unmarshal([]byte(res.body), &oe); err != nil || res.status != 413 || oe.Error.Code != 413 || oe.Error.Message == "" {
		t.Errorf("OpenAI error: %d %s", res.status, res.body)
	}
	if len(fs[0].requests()) != 0 {
		t.Error("an oversized request reached the upstream")
	}
	if res := sendTurn(t, "/v1/messages", chatTurn("small", 1, false), nil); res.status != http.StatusOK {
		t.Errorf("small body: %d %s", res.status, res.body)
	}
}

// TestModelTwiceGets400: a body naming its model twice (an engine's JSON
// parser keeps the last, the module's the first) is refused in the API's
// format before any replica sees it, whether its key comes from a header
// (the body's start read) or from its metadata (read in full), and however
// the second name is spelled.
func TestModelTwiceGets400(t *testing.T) {
	fs := startFakes(t, 1)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("twice", "")))
	pad := strings.Repeat("x", 3*peekSize)
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
	}{
		{"header key, small", "/v1/messages", `{"model":"qwen3-4b","model":"other","messages":[{"role":"user","content":"hi"}]}`, session("twice-1")},
		{"header key, large", "/v1/messages", `{"model":"qwen3-4b","max_tokens":9,"mod\u0065l":"other","messages":[{"role":"user","content":"` + pad + `"}]}`, session("twice-2")},
		{"metadata key", "/v1/messages", `{"model":"qwen3-4b","model":"other","messages":[{"role":"user","content":"` + pad + `"}],"metadata":{"user_id":"user_x_account__session_twice-3"}}`, nil},
		{"OpenAI", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + pad + `"}],"model":"qwen3-4b","model":"other"}`, session("twice-4")},
	} {
		res := sendTurn(t, tc.path, tc.body, tc.hdr)
		if res.status != http.StatusBadRequest || !strings.Contains(res.body, `two \"model\" members`) {
			t.Errorf("%s: %d %s, want 400 naming the two members", tc.name, res.status, res.body)
		}
		if strings.HasPrefix(tc.path, "/v1/messages") {
			var ae anthropicError
			if err := json.Unmarshal([]byte(res.body), &ae); err != nil || ae.Error.Type != "invalid_request_error" {
				t.Errorf("%s: Anthropic error body %s", tc.name, res.body)
			}
		}
	}
	if n := len(fs[0].requests()); n != 0 {
		t.Errorf("%d refused requests reached the upstream", n)
	}
	if res := sendTurn(t, "/v1/messages", chatTurn("once", 1, false), nil); res.status != http.StatusOK {
		t.Errorf("one model: %d %s", res.status, res.body)
	}
}

func TestNoReplicaJSONErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, closed, policyBlock("none", "")))
	res := sendTurn(t, "/v1/messages", chatTurn("n", 1, false), nil)
	var ae anthropicError
	if res.status != http.StatusBadGateway || json.Unmarshal([]byte(res.body), &ae) != nil || ae.Error.Message == "" {
		t.Errorf("dead upstream: %d %s", res.status, res.body)
	}

	// the only upstream is full (max_requests 1 and busy): 503
	fs := startFakes(t, 1)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy {
		to %s
		unhealthy_request_count 1
		%s
	}`, fs[0].addr, policyBlock("full", "")))
	hold := make(chan struct{})
	fs[0].mu.Lock()
	fs[0].hold = hold
	fs[0].mu.Unlock()
	done := make(chan turnResult)
	go func() { done <- sendTurn(t, "/v1/chat/completions", chatTurn("a", 1, false), nil) }()
	waitFor(t, "the first request to reach the upstream", func() bool {
		fs[0].mu.Lock()
		defer fs[0].mu.Unlock()
		return fs[0].inflight == 1
	})
	res = sendTurn(t, "/v1/chat/completions", chatTurn("b", 1, false), nil)
	var oe openAIError
	if res.status != http.StatusServiceUnavailable || json.Unmarshal([]byte(res.body), &oe) != nil || oe.Error.Code != 503 {
		t.Errorf("full upstream: %d %s", res.status, res.body)
	}
	close(hold)
	if r := <-done; r.status != http.StatusOK {
		t.Errorf("held request: %d", r.status)
	}
}

func TestStreamingOverHTTP2(t *testing.T) {
	fs := startFakes(t, 1)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, dialList(fs), policyBlock("h2", "")))
	step := make(chan struct{})
	fs[0].mu.Lock()
	fs[0].step = step
	fs[0].mu.Unlock()

	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, siteURL+"/v1/messages", strings.NewReader(chatTurn("h", 1, true)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", "h")
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("protocol %s, want HTTP/2", resp.Proto)
	}
	if resp.Header.Get(RouteHeader) == "" {
		t.Error("no route header")
	}
	br := bufio.NewReader(resp.Body)
	// the first event arrives while the upstream still waits: flushed at once
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "event: message_start") {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(step)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "message_stop") {
		t.Errorf("stream ended without message_stop: %s", rest)
	}
	prompt, cached, gen := fs[0].totals()
	waitFor(t, "usage recorded", func() bool {
		r := cardRow(getCard(t, "h2"), fs[0].addr)
		return r.Tokens == TokenCount{Cached: uint64(cached), Computed: uint64(prompt - cached), Generated: uint64(gen)}
	})
}

func TestPolicyWithoutHandler(t *testing.T) {
	fs := startFakes(t, 3)
	loadSite(t, fmt.Sprintf(`
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("bare", "")))
	var first string
	for turn := 1; turn <= 4; turn++ {
		res := sendTurn(t, "/v1/messages", chatTurn("b", turn, false), map[string]string{"X-Claude-Code-Session-Id": "b"})
		if turn == 1 {
			first = res.replica
		} else if res.replica != first || res.reason != "sticky" {
			t.Errorf("turn %d: %s; %s", turn, res.replica, res.reason)
		}
	}
	waitFor(t, "slots freed with the requests", func() bool { return getCard(t, "bare").InFlight == 0 })
	c := getCard(t, "bare")
	for _, r := range c.Replicas {
		if r.Tokens != (TokenCount{}) {
			t.Errorf("tokens counted without the handler: %+v", r.Tokens)
		}
	}
}

func TestCaddyfileExampleAdaptsAndValidates(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	cfgJSON, warnings, err := adapter.Adapt(raw, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warnings {
		t.Logf("warning: %s", w)
	}
	for _, want := range []string{`"handler":"lm_warden"`, `"policy":"lm_warden"`, `"model":"qwen3-4b"`, `"data_parallel_size":4`, `"affinity":false`} {
		if !strings.Contains(string(cfgJSON), want) {
			t.Errorf("adapted config lacks %s", want)
		}
	}
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	if err := caddy.Validate(&cfg); err != nil {
		t.Fatalf("validating: %v", err)
	}
}

// TestCaddyfileExampleTokenCheck loads the example's token_auth snippet in
// front of a plain response: without LM_WARDEN_TOKEN the configuration
// loads and every request is refused with a message naming the variable
// (an empty token is never accepted); with it, only the token passes.
func TestCaddyfileExampleTokenCheck(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(raw), "(token_auth) {")
	end := strings.Index(string(raw[start:]), "\n}\n")
	if start < 0 || end < 0 {
		t.Fatal("Caddyfile.example has no token_auth snippet")
	}
	snippet := string(raw[start : start+end+3])

	admin, port := robustAdminPort(t), freeLoopbackPort(t)
	cfg := robustConfig(admin, port, "\timport token_auth\n\trespond \"through\" 200")
	cfg = strings.Replace(cfg, "\nhttp://", "\n"+snippet+"\nhttp://", 1)
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/messages", port)
	get := func(header, value string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if header != "" {
			req.Header.Set(header, value)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Setenv("LM_WARDEN_TOKEN", "")
	if err := loadCaddyfile(cfg); err != nil {
		t.Fatalf("the example's token check does not load without LM_WARDEN_TOKEN: %v", err)
	}
	for _, h := range [][2]string{{"", ""}, {"Authorization", "Bearer "}, {"X-Api-Key", ""}, {"Authorization", "Bearer x"}} {
		if code, body := get(h[0], h[1]); code != http.StatusInternalServerError || !strings.Contains(body, "set LM_WARDEN_TOKEN") {
			t.Errorf("no token set, %s %q: %d %s, want 500 naming LM_WARDEN_TOKEN", h[0], h[1], code, body)
		}
	}

	t.Setenv("LM_WARDEN_TOKEN", "s3cret")
	for _, c := range []struct {
		header, value string
		want          int
	}{
		{"", "", http.StatusUnauthorized},
		{"Authorization", "Bearer ", http.StatusUnauthorized},
		{"Authorization", "Bearer wrong", http.StatusUnauthorized},
		{"X-Api-Key", "", http.StatusUnauthorized},
		{"Authorization", "Bearer s3cret", http.StatusOK},
		{"X-Api-Key", "s3cret", http.StatusOK},
	} {
		if code, body := get(c.header, c.value); code != c.want {
			t.Errorf("%s %q: %d %s, want %d", c.header, c.value, code, body, c.want)
		}
	}
}

func TestFailedReloadChangesNothing(t *testing.T) {
	fs := startFakes(t, 2)
	site := func(threshold int, extra string) string {
		return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}
	%s`, dialList(fs), policyBlock("keep", fmt.Sprintf("spill_threshold %d", threshold)), extra)
	}
	loadSite(t, site(3, ""))
	// a configuration whose second model is invalid is refused as a whole
	bad := siteConfig(fmt.Sprintf("localhost:%d", testAdminPort), testHTTPPort, "", "\troute {\n\t\t"+site(7, fmt.Sprintf(`reverse_proxy /never %s {
		lb_policy lm_warden {
			model broken
			poll_interval 1s
			poll_timeout 2s
		}
	}`, fs[0].addr))+"\n\t}")
	resp, err := testClient.Post(fmt.Sprintf("http://localhost:%d/load", testAdminPort), "text/caddyfile", strings.NewReader(bad))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("invalid configuration loaded: %s", b)
	}
	if c := getCard(t, "keep"); c.SpillThreshold != 3 {
		t.Errorf("a refused configuration changed the running model: spill threshold %d", c.SpillThreshold)
	}
	if _, ok := lookupModel("broken"); ok {
		t.Error("the refused configuration's model stayed registered")
	}
	if res := sendTurn(t, "/v1/messages", chatTurn("k", 1, false), nil); res.status != http.StatusOK {
		t.Errorf("old configuration stopped serving: %d", res.status)
	}
}
