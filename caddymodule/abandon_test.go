package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// impatientTurn is one turn of an impatientConv: whether its client gave
// up, and the replica that answered otherwise.
type impatientTurn struct {
	conv           string
	start, end     time.Time
	gaveUp         bool
	status         int
	replica, cause string
}

// impatientConv sends turns of conversation conv until stop is closed,
// each with a client that gives up after timeout; with perConv > 0 it
// starts a new conversation (conv-1, conv-2, …) every perConv turns.
func impatientConv(conv0 string, body func(conv string) string, timeout time.Duration, perConv int, stop <-chan struct{}, out chan<- impatientTurn) {
	client := &http.Client{}
	defer client.CloseIdleConnections()
	conv := conv0
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		if perConv > 0 {
			conv = fmt.Sprintf("%s-%d", conv0, n/perConv)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(body(conv)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", conv)
		tu := impatientTurn{conv: conv, start: time.Now()}
		resp, err := client.Do(req)
		if err != nil {
			tu.gaveUp = true
		} else {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			tu.gaveUp = err != nil
			tu.status = resp.StatusCode
			tu.replica, tu.cause, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
		}
		cancel()
		tu.end = time.Now()
		out <- tu
		time.Sleep(20 * time.Millisecond)
	}
}

func fixBug(conv string) string { return chatTurnBody(conv, "fix the bug") }

// observeModelLog points the live model's logger at an observer.
func observeModelLog(t *testing.T, model string) *observer.ObservedLogs {
	t.Helper()
	m, ok := lookupModel(model)
	if !ok {
		t.Fatalf("no model %s", model)
	}
	core, logs := observer.New(zap.InfoLevel)
	m.mu.Lock()
	m.logger = zap.New(core)
	m.mu.Unlock()
	return logs
}

// replicaLog returns the messages logged for replica.
func replicaLog(logs *observer.ObservedLogs, replica string) []string {
	var out []string
	for _, e := range logs.All() {
		if e.ContextMap()["replica"] == replica {
			out = append(out, e.Level.String()+": "+e.Message)
		}
	}
	return out
}

// abandonSite is the core snippet of docs/failures.md with response_header_timeout
// 10m, clients that give up long before it, and a short fail_cooldown.
func abandonSite(model string, dials []string) string {
	return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			max_num_seqs 32
			poll_interval 200ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
			fail_cooldown 2s
		}
		flush_interval -1
		transport http {
			dial_timeout 3s
			response_header_timeout 10m
		}
	}`, strings.Join(dials, " "), model)
}

// TestHungReplicaFoundWhenClientsGiveUpFirst: one of three replicas hangs
// (accepts requests, never answers, /metrics fine) while six agents' clients
// give up on a turn after 2 s, far below response_header_timeout 10m (each
// agent starts a new conversation every four turns). The
// hung replica is out for "abandoned turns" once its run of abandoned turns
// spans two conversations (while the others answer), no
// turn sent after that waits on it, and the log says when it went out and
// when it came back.
func TestHungReplicaFoundWhenClientsGiveUpFirst(t *testing.T) {
	const model, clientTimeout = "abandon-hung", 2 * time.Second
	emu, dials := startEmulator(t, 3, 20)
	loadSite(t, abandonSite(model, dials))
	waitFor(t, "polls", func() bool { return getCard(t, model).Replicas[2].Reachable })
	logs := observeModelLog(t, model)

	stop := make(chan struct{})
	turns := make(chan impatientTurn, 1024)
	var wg sync.WaitGroup
	for i := range 6 {
		conv := fmt.Sprint("conv-", i)
		wg.Add(1)
		go func() { defer wg.Done(); impatientConv(conv, fixBug, clientTimeout, 4, stop, turns) }()
	}
	var log []impatientTurn
	var logMu sync.Mutex
	collected := make(chan struct{})
	go func() {
		for tu := range turns {
			logMu.Lock()
			log = append(log, tu)
			logMu.Unlock()
		}
		close(collected)
	}()
	finish := func() {
		select {
		case <-stop:
			return
		default:
		}
		close(stop)
		wg.Wait()
		close(turns)
		<-collected
	}
	defer finish()

	time.Sleep(time.Second)
	const hung = 1
	tHang := time.Now()
	if err := emu.SetRequestsHang(hung, true); err != nil {
		t.Fatal(err)
	}
	var tOut time.Time
	waitLong(t, "the hung replica out", 20*time.Second, func() bool {
		row := cardRow(getCard(t, model), dials[hung])
		if slices.Contains(row.Out, "abandoned turns") {
			// when the replica went out, not when this loop saw it (a
			// loaded machine reads the card late): its first cool-down
			// (fail_cooldown 2s) ends 2 s after it went out
			tOut = time.Now()
			if row.CooldownUntil != nil {
				if at := row.CooldownUntil.Add(-2 * time.Second); at.Before(tOut) {
					tOut = at
				}
			}
			return true
		}
		return false
	})
	// cleared within the cool-down (2s): a turn sent there after it went
	// out would be held, then answered 503
	time.Sleep(time.Second)
	if err := emu.SetRequestsHang(hung, false); err != nil {
		t.Fatal(err)
	}
	finish()
	waitLong(t, "the replica back in placement", 20*time.Second, func() bool {
		return len(cardRow(getCard(t, model), dials[hung]).Out) == 0
	})

	var gaveUp []impatientTurn
	for _, tu := range log {
		switch {
		case tu.gaveUp:
			gaveUp = append(gaveUp, tu)
		case tu.status != 200 && tu.start.After(tOut.Add(200*time.Millisecond)):
			t.Errorf("%s, sent after the hung replica was out: status %d", tu.conv, tu.status)
		}
	}
	slices.SortFunc(gaveUp, func(a, b impatientTurn) int { return a.end.Compare(b.end) })

	// The rule: out once the run of turns given up on there spans two
	// conversations, the others having answered since its first. Turns
	// given up on in one instant come before any answer; a second
	// conversation's turn given up on a second after the first surely
	// comes after some (the healthy replicas answer within the clients'
	// timeout), so none given up on well after that one is before the out.
	before, second := 0, -1
	for i, tu := range gaveUp {
		if tu.end.Before(tOut) {
			before++
		}
		if second < 0 && tu.conv != gaveUp[0].conv && tu.end.Sub(gaveUp[0].end) >= time.Second {
			second = i
		}
	}
	t.Logf("%d turns; out %v after the hang, after %d turns given up on (%d in all)", len(log), tOut.Sub(tHang), before, len(gaveUp))
	if len(gaveUp) < 2 {
		t.Fatalf("only %d turns given up on", len(gaveUp))
	}
	for _, tu := range gaveUp[:before] {
		if second >= 0 && tu.end.After(gaveUp[second].end.Add(300*time.Millisecond)) {
			t.Errorf("a turn given up on %v after a second conversation's, a second after the first, before the replica was out", tu.end.Sub(gaveUp[second].end))
		}
	}
	got := replicaLog(logs, dials[hung])
	wantOut, wantBack := false, false
	for _, l := range got {
		wantOut = wantOut || strings.HasPrefix(l, "warn: replica out of placement: abandoned turns")
		wantBack = wantBack || (wantOut && strings.HasPrefix(l, "info: replica back in placement: abandoned turns over"))
	}
	if !wantOut || !wantBack {
		t.Errorf("log for the hung replica: %q; want it out for abandoned turns, then back", got)
	}
}

// TestOneImpatientClientTakesNothingOut: a client that gives up on every
// turn before its (non-streamed, slow) answer's headers, next to clients
// that get their answers from the same replicas, takes no replica out.
func TestOneImpatientClientTakesNothingOut(t *testing.T) {
	const model = "abandon-impatient"
	_, dials := startEmulator(t, 2, 1)
	loadSite(t, abandonSite(model, dials))
	waitFor(t, "polls", func() bool { return getCard(t, model).Replicas[1].Reachable })
	logs := observeModelLog(t, model)

	slow, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 400, "stream": false,
		"messages": []map[string]any{{"role": "user", "content": "write a long essay"}},
	})
	stop := make(chan struct{})
	turns := make(chan impatientTurn, 1024)
	var wg sync.WaitGroup
	start := func(conv string, body func(string) string, timeout time.Duration) {
		wg.Add(1)
		go func() { defer wg.Done(); impatientConv(conv, body, timeout, 0, stop, turns) }()
	}
	start("impatient", func(string) string { return string(slow) }, 300*time.Millisecond)
	for i := range 3 {
		start(fmt.Sprint("patient-", i), fixBug, 15*time.Second)
	}
	var outSeen []string
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		for _, row := range getCard(t, model).Replicas {
			if len(row.Out) > 0 {
				outSeen = append(outSeen, row.ID+": "+strings.Join(row.Out, ", "))
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	close(turns)
	gaveUp, answered := 0, 0
	for tu := range turns {
		switch {
		case tu.conv == "impatient" && tu.gaveUp:
			gaveUp++
		case tu.conv != "impatient" && !tu.gaveUp && tu.status == 200:
			answered++
		case tu.conv != "impatient":
			t.Errorf("%s: gave up %v status %d", tu.conv, tu.gaveUp, tu.status)
		}
	}
	t.Logf("the impatient client gave up %d times; %d patient turns answered", gaveUp, answered)
	if gaveUp < 5 || answered == 0 {
		t.Fatalf("the impatient client gave up %d times, %d patient turns answered: the test did not exercise the rule", gaveUp, answered)
	}
	if len(outSeen) > 0 {
		t.Errorf("replicas shown out: %v", outSeen)
	}
	for _, id := range dials {
		if l := replicaLog(logs, id); len(l) > 0 {
			t.Errorf("logged for %s: %q", id, l)
		}
	}
}
