package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// admissionSite starts one emulated replica behind Caddy with admission
// sized so that one resident conversation leaves no room for a second of
// bigTurn's size: kv_tokens 3000, and a conversation stays resident for
// admit_window 10m after its turn. extra goes into the policy block.
func admissionSite(t *testing.T, model, extra, proxyExtra string) (*emulator.Server, string) {
	t.Helper()
	emu, dials := startEmulator(t, 1, 50)
	loadSite(t, admissionConfig(dials[0], model, extra, proxyExtra))
	waitFor(t, "admission in force", func() bool { return getCard(t, model).Admission.Active })
	return emu, dials[0]
}

// occupy keeps the only replica of emu busy with a long turn of the
// admitted conversation id (its engine slowed down), so that it is not
// idle and admission holds new conversations by their working set; an idle
// replica takes them at once. The returned func lets the engine run at its
// speed again and waits for the turn's answer.
func occupy(t *testing.T, emu *emulator.Server, model, id string) (done func()) {
	t.Helper()
	if err := emu.SetSlow(0, 3000); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 4000,
		"messages": []map[string]any{{"role": "user", "content": id + ": go on"}},
	})
	// the slot of a turn answered just before is freed a moment after its
	// client read the answer: without this wait it could pass for the
	// long turn's below, before that one was routed
	waitFor(t, "nothing in flight before "+id+"'s long turn", func() bool { return getCard(t, model).InFlight == 0 })
	res := postAsync(context.Background(), "/v1/messages", string(b), session(id))
	waitFor(t, id+" in flight", func() bool { return getCard(t, model).InFlight > 0 })
	// routed is not yet arrived: the proxy sends the turn on after the
	// policy chose the replica, and on a busy CPU that takes a while. A
	// count of the engine's requests taken before it arrived would count
	// the long turn as a later request's.
	url := emu.URLs()[0]
	waitFor(t, id+"'s long turn at the engine", func() bool { return engineHolds(emulatorMetrics(t, url)) > 0 })
	return func() {
		_ = emu.SetSlow(0, 1)
		select {
		case <-res:
		case <-time.After(20 * time.Second):
			t.Errorf("%s's long turn not answered 20 s after the engine sped up", id)
		}
	}
}

// admissionConfig is admissionSite's site body.
func admissionConfig(dial, model, extra, proxyExtra string) string {
	return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			poll_interval 100ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
			kv_tokens 3000
			admit_window 10m
			%s
		}
		flush_interval -1
		%s
	}`, dial, model, extra, proxyExtra)
}

// bigTurn is a conversation's first request of about 2,000 estimated
// tokens: it fits an empty 3,000-token replica but never beside another
// conversation.
func bigTurn(session string) string {
	return chatTurnBody(session, strings.Repeat("Please look at this file and fix the bug. ", 150))
}

func chatTurnBody(session, text string) string {
	b, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 8,
		"system":   "You are a coding agent.",
		"messages": []map[string]any{{"role": "user", "content": session + ": " + text}},
	})
	return string(b)
}

// postAsync sends a request in the background and delivers its result.
func postAsync(ctx context.Context, path, body string, hdr map[string]string) <-chan turnResult {
	out := make(chan turnResult, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			out <- turnResult{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		res := turnResult{status: resp.StatusCode, body: string(b), header: resp.Header}
		res.replica, res.reason, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
		out <- res
	}()
	return out
}

func session(id string) map[string]string { return map[string]string{"X-Claude-Code-Session-Id": id} }

func waitingNow(t *testing.T, model string) int { return getCard(t, model).Admission.Waiting }

// TestAdmissionHoldsNewConversations drives working-set admission through
// real Caddy: a new conversation that does not fit is held, in Caddy, with
// its body; turns of the admitted conversation pass; beyond admit_queue
// new conversations get 429 in their API's format; a config reload keeps
// the held request; room appearing (the resident conversation unpinned)
// lets it through, and it is answered.
func TestAdmissionHoldsNewConversations(t *testing.T) {
	const model = "adm-hold"
	emu, _ := admissionSite(t, model, "admit_queue 1", "")
	// the histogram is the process's: an earlier run of this test (-count)
	// observed into it already, while the router's counters start anew
	admittedBefore := admittedWaits(adminMetrics(t), model)
	first := sendTurn(t, "/v1/messages", bigTurn("A"), session("A"))
	if first.status != 200 || first.reason != "placed" {
		t.Fatalf("A: %d %s %s", first.status, first.reason, first.body)
	}
	done := occupy(t, emu, model, "A")
	held := postAsync(context.Background(), "/v1/messages", bigTurn("B"), session("B"))
	waitFor(t, "B waiting", func() bool { return waitingNow(t, model) == 1 })

	// a turn of the admitted conversation never waits: it goes to the
	// (slowed) engine at once, beside A's long turn
	next := postAsync(context.Background(), "/v1/messages", bigTurn("A"), session("A"))
	waitFor(t, "A's next turn in flight", func() bool { c := getCard(t, model); return c.InFlight == 2 && c.Admission.Waiting == 1 })

	// the queue is full: refused, with Retry-After, in each API's format
	for _, tc := range []struct {
		path, wantType string
		check          func(map[string]any) bool
	}{
		{"/v1/messages", "rate_limit_error", func(m map[string]any) bool { return m["type"] == "error" }},
		{"/v1/chat/completions", "rate_limit_exceeded", func(m map[string]any) bool {
			e, _ := m["error"].(map[string]any)
			return e != nil && e["code"] == float64(429)
		}},
	} {
		r := sendTurn(t, tc.path, bigTurn("C"), session("C"))
		var m map[string]any
		_ = json.Unmarshal([]byte(r.body), &m)
		e, _ := m["error"].(map[string]any)
		if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || e == nil || e["type"] != tc.wantType || !tc.check(m) ||
			!strings.Contains(fmt.Sprint(e["message"]), "1 conversation is waiting for room") {
			t.Fatalf("%s with the queue full: %d Retry-After %q %s", tc.path, r.status, r.header.Get("Retry-After"), r.body)
		}
	}

	// a reload keeps the queue and the held request
	admissionSiteReload(t, model)
	if n := waitingNow(t, model); n != 1 {
		t.Fatalf("after a reload %d waiting, want 1", n)
	}
	select {
	case r := <-held:
		t.Fatalf("B answered before room appeared: %d %s", r.status, r.body)
	default:
	}

	// room: A is unpinned and its turns end; B goes on and is answered
	if code, b := adminDo(t, testAdminPort, http.MethodDelete, "/lm-warden/models/"+model+"/sessions/A", ""); code != 200 {
		t.Fatalf("unpinning A: %d %s", code, b)
	}
	done()
	if r := <-next; r.status != 200 || r.reason != "sticky" {
		t.Fatalf("A's next turn while B waited: %d %s", r.status, r.reason)
	}
	select {
	case r := <-held:
		if r.status != 200 || r.reason != "placed" {
			t.Fatalf("B after room appeared: %d %s %s", r.status, r.reason, r.body)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B still held 5 s after room appeared")
	}
	a := getCard(t, model).Admission
	if a.Queued != 1 || a.AdmittedAfterWait != 1 || a.Refused != 2 || a.Waiting != 0 || a.MeanWaitS == nil {
		t.Fatalf("admission counters %+v", a)
	}
	fams := adminMetrics(t)
	if n := admittedWaits(fams, model) - admittedBefore; n != 1 {
		t.Fatalf("wait histogram: %d admitted observations, want 1", n)
	}
	for _, name := range []string{"lm_warden_admission_refused_total", "lm_warden_admission_queued_total"} {
		found := false
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				found = found || (l.GetName() == "model" && l.GetValue() == model)
			}
		}
		if !found {
			t.Errorf("no %s sample for %s", name, model)
		}
	}
}

// admittedWaits is the number of admitted waits of model observed in the
// lm_warden_admission_wait_seconds histogram of fams.
func admittedWaits(fams map[string]*dto.MetricFamily, model string) uint64 {
	for _, m := range fams["lm_warden_admission_wait_seconds"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model"] == model && labels["outcome"] == "admitted" {
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// admissionSiteReload reloads the running configuration with a change the
// proxy notices (an added request header), keeping the policy's settings.
func admissionSiteReload(t *testing.T, model string) {
	t.Helper()
	loadSite(t, admissionConfig(getCard(t, model).Replicas[0].ID, model, "admit_queue 1", "header_up X-Reloaded 1"))
}

// TestAdmissionWaitLimit: a conversation held for admit_wait is admitted
// on the best replica anyway, and answered.
func TestAdmissionWaitLimit(t *testing.T) {
	const model = "adm-limit"
	emu, _ := admissionSite(t, model, "admit_wait 300ms", "")
	if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
		t.Fatalf("A: %d", r.status)
	}
	done := occupy(t, emu, model, "A")
	start := time.Now()
	b := postAsync(context.Background(), "/v1/chat/completions", bigTurn("B"), session("B"))
	waitFor(t, "B admitted at admit_wait", func() bool { return getCard(t, model).Admission.AdmittedAtLimit == 1 })
	done()
	r := <-b
	if r.status != 200 || r.reason != "placed" {
		t.Fatalf("B: %d %s %s", r.status, r.reason, r.body)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("B answered after %v, before admit_wait", d)
	}
	if a := getCard(t, model).Admission; a.AdmittedAtLimit != 1 || a.Waiting != 0 {
		t.Fatalf("admission counters %+v", a)
	}
}

// TestAdmissionCancelledLeaveNothing: 1,000 held requests whose clients
// give up leave the queue at once, each counted, and leave no goroutine
// behind.
func TestAdmissionCancelledLeaveNothing(t *testing.T) {
	const model = "adm-cancel"
	emu, _ := admissionSite(t, model, "", "")
	if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
		t.Fatalf("A: %d", r.status)
	}
	done := occupy(t, emu, model, "A")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	settle := func() int { return settledGoroutines(client) }
	baseline := settle()
	const total, workers = 1000, 50
	var next, cancelledByClient atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				id := fmt.Sprint("gone-", i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(bigTurn(id)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Claude-Code-Session-Id", id)
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
					t.Errorf("request %d answered %d while A holds the replica", i, resp.StatusCode)
				} else {
					cancelledByClient.Add(1)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	// a client may give up before its request reached the queue (a slow
	// machine): every request that did wait must have left it
	waitFor(t, "the queue to empty", func() bool {
		a := getCard(t, model).Admission
		return a.Waiting == 0 && a.Cancelled == a.Queued
	})
	// on a loaded machine some clients give up before their request is
	// routed; most must have waited, or the test showed nothing
	if a := getCard(t, model).Admission; a.Queued < total*6/10 {
		t.Fatalf("only %d of %d requests reached the queue", a.Queued, total)
	}
	var after int
	waitFor(t, "goroutines to settle", func() bool {
		after = settle()
		return after <= baseline+10
	})
	done()
	a := getCard(t, model).Admission
	t.Logf("%d requests cancelled by their clients; queued %d, cancelled %d, admitted %d; goroutines %d → %d",
		cancelledByClient.Load(), a.Queued, a.Cancelled, a.AdmittedAfterWait+a.AdmittedAtLimit, baseline, after)
	if a.AdmittedAfterWait+a.AdmittedAtLimit != 0 {
		t.Fatalf("admitted %d of the cancelled requests", a.AdmittedAfterWait+a.AdmittedAtLimit)
	}
}

// TestAdmissionUnknownCapacity: replicas that export no KV capacity (the
// fake vLLM) leave admission out of the way, and the card says why.
func TestAdmissionUnknownCapacity(t *testing.T) {
	fs := startFakes(t, 2)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, dialList(fs), policyBlock("adm-unknown", "")))
	waitFor(t, "a poll", func() bool { return getCard(t, "adm-unknown").Replicas[0].Reachable })
	for i := range 6 {
		if r := sendTurn(t, "/v1/messages", chatTurn(fmt.Sprint("u", i), 1, false), session(fmt.Sprint("u", i))); r.status != 200 {
			t.Fatalf("conversation %d: %d", i, r.status)
		}
	}
	a := getCard(t, "adm-unknown").Admission
	if !a.On || a.Active || !strings.Contains(a.Why, "kv_tokens") || a.Queued != 0 {
		t.Fatalf("admission %+v: want on, not in force, saying to set kv_tokens", a)
	}
	for _, r := range getCard(t, "adm-unknown").Replicas {
		if r.KVCapacityTokens != nil {
			t.Fatalf("%s capacity %d, want null", r.ID, *r.KVCapacityTokens)
		}
	}
}

// TestAdmissionTexts: the card's warning and the Retry-After of a refused
// request (the admission line and the working-set cell are the page's:
// internal/card's TestAdmissionCells).
func TestAdmissionTexts(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"warning", overcommitMessage(placement.AdmissionSnapshot{On: true, Active: true, Waiting: 9, Strained: true,
			WorkingSetTokens: 250000, WaitingTokens: 62000, CapacityTokens: 147200}),
			"active conversations hold 312k tokens; the replicas cache 147k: expect low cache hits, admission is holding 9 conversations"},
		{"warning, admission off", overcommitMessage(placement.AdmissionSnapshot{WorkingSetTokens: 200000, CapacityTokens: 147200, Strained: true}),
			"active conversations hold 200k tokens; the replicas cache 147k: expect low cache hits; admission is off"},
		{"no warning when it fits", overcommitMessage(placement.AdmissionSnapshot{WorkingSetTokens: 100000, CapacityTokens: 147200, Strained: true}), ""},
		// the estimate alone, with the engines keeping the caches and nothing waiting
		{"no warning the engines do not confirm", overcommitMessage(placement.AdmissionSnapshot{WorkingSetTokens: 741000, CapacityTokens: 262000}), ""},
		{"retry after: an expected wait", fmt.Sprint(retrySeconds(10500*time.Millisecond, 5*time.Minute)), "11"},
		// longer than clients wait: Claude Code gives up at once on 61 s
		{"retry after: capped", fmt.Sprint(retrySeconds(4*time.Minute, 5*time.Minute)), "60"},
		{"retry after: admit_wait below the cap", fmt.Sprint(retrySeconds(time.Minute, 20*time.Second)), "20"},
		{"retry after: at least a few seconds", fmt.Sprint(retrySeconds(200*time.Millisecond, time.Minute)), "3"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

// TestOvercommitLoggedOncePerEpisode: the warning that the active
// conversations outgrow the caches is logged when it starts, not again
// while it lasts, and its end is logged once.
func TestOvercommitLoggedOncePerEpisode(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	m := newModelState("overcommit", placement.Config{})
	m.logger = zap.New(core)
	over := placement.AdmissionSnapshot{On: true, Active: true, Waiting: 2, Strained: true, WorkingSetTokens: 200000, CapacityTokens: 147200}
	fits := placement.AdmissionSnapshot{On: true, Active: true, WorkingSetTokens: 100000, CapacityTokens: 147200}
	for _, a := range []placement.AdmissionSnapshot{fits, over, over, over, fits, fits, over} {
		m.checkOvercommit(a)
	}
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+": "+e.Message)
	}
	want := []string{
		"warn: active conversations hold 200k tokens; the replicas cache 147k: expect low cache hits, admission is holding 2 conversations",
		"info: active conversations fit the replicas' KV caches again",
		"warn: active conversations hold 200k tokens; the replicas cache 147k: expect low cache hits, admission is holding 2 conversations",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAdmissionWithSharedStore: a new conversation held for admission is
// claimed in the shared store once admitted, so the other front-ends
// follow it; while it waits, the store holds nothing for it.
func TestAdmissionWithSharedStore(t *testing.T) {
	m, rds := sharedStore(t, "adm-store")
	m.router.Reconfigure(placement.Config{MaxNumSeqs: 1 << 20, KVTokens: 1000, AdmitWindow: 10 * time.Minute})
	for _, id := range []string{"r0", "r1", "r2", "r3"} {
		m.router.UpdateLoad(id, placement.Load{Reachable: true})
	}
	now := time.Now()
	// one conversation in flight per replica: a fifth does not fit
	var turns []placement.Decision
	for i := range 4 {
		d, tk, err := m.route(placement.Request{Key: fmt.Sprint("a", i), Tokens: 900, Now: now})
		if err != nil || tk != nil {
			t.Fatalf("a%d: ticket %v, %v", i, tk, err)
		}
		turns = append(turns, d)
	}
	defer func() {
		for _, d := range turns {
			d.Release()
		}
	}()
	req := placement.Request{Key: "held", Tokens: 900, Now: now}
	_, tk, err := m.route(req)
	if err != nil || tk == nil {
		t.Fatalf("held: ticket %v, %v; want a ticket", tk, err)
	}
	key := bindstore.Key("lmwtest:", "adm-store", "held")
	if n, _ := rds.Do("EXISTS", key); n != "0" {
		t.Fatal("the store holds a binding for a conversation still waiting")
	}
	m.router.Unbind("a2") // room on one replica: a2 gone, its turn ended
	turns[2].ReleaseAt(now)
	<-tk.Ready()
	d, err := tk.Decision()
	if err != nil {
		t.Fatal(err)
	}
	if d, err = m.admitted(req, d); err != nil {
		t.Fatal(err)
	}
	defer d.Release()
	v, err := rds.Do("GET", key)
	if err != nil || !strings.HasSuffix(v, " "+d.Replica) {
		t.Fatalf("store value %q (%v), want the admitted replica %s", v, err, d.Replica)
	}
}
