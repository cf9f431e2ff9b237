package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
)

// TestTimeSlicingHoldsAPausedTurn drives turn-boundary time-slicing through
// real Caddy: two conversations on one replica that holds only one of
// them (kv_tokens 2300, each ≈2,000 tokens; the second was admitted while
// the engine idled); after its second turn the first is paused, its next
// turn waits in Caddy with its body, and it resumes on its replica once
// the other leaves, with X-LM-Warden-Wait saying how long it waited.
func TestTimeSlicingHoldsAPausedTurn(t *testing.T) {
	const model = "ts-hold"
	// 2,300 tokens: one bigTurn conversation (≈1,700 tokens of its own)
	// fits, two do not even at their share of the time in flight; a
	// client that sends one turn after the other keeps each in flight
	// about half the time once the engine's turns are long against the
	// round trips between them (slowed 50×: about half a second)
	timeSlicingSite(t, model)
	turn := func(id, want string) {
		t.Helper()
		if r := sendTurn(t, "/v1/messages", bigTurn(id), session(id)); r.status != 200 || r.reason != want {
			t.Fatalf("%s: %d %s, want 200 %s: %s", id, r.status, r.reason, want, r.body)
		}
	}
	turn("A", "placed")
	turn("B", "placed") // the engine idles between turns: admitted beside A
	turn("A", "sticky") // A's second turn: A and B need ≈4k of 3k
	// the pause is decided when the handler records the turn's end, which
	// the client may see after its answer
	waitFor(t, "A paused at its turn's end", func() bool { return getCard(t, model).Admission.PausedTotal > 0 })
	c := getCard(t, model)
	if c.Admission.Paused != 1 || c.Admission.PausedTotal != 1 || c.Replicas[0].Paused != 1 {
		t.Fatalf("after A's second turn: paused %d (total %d, replica %d); want A paused", c.Admission.Paused, c.Admission.PausedTotal, c.Replicas[0].Paused)
	}
	waitsBefore := pausedWaits(t)
	held := postAsync(context.Background(), "/v1/messages", bigTurn("A"), session("A"))
	waitFor(t, "A's next turn waiting", func() bool { return getCard(t, model).Admission.Waiting == 1 })
	select {
	case r := <-held:
		t.Fatalf("A's turn answered while paused: %d %s", r.status, r.body)
	case <-time.After(300 * time.Millisecond):
	}
	if code, b := adminDo(t, testAdminPort, http.MethodDelete, "/lm-warden/models/"+model+"/sessions/B", ""); code != 200 {
		t.Fatalf("unpinning B: %d %s", code, b)
	}
	var wall float64
	select {
	case r := <-held:
		w, err := strconv.ParseFloat(r.header.Get(WaitHeader), 64)
		wall = w
		if r.status != 200 || r.reason != "sticky" || err != nil || w < 0.3 {
			t.Fatalf("A resumed: %d %s, %s %q; want 200 sticky with the wait", r.status, r.reason, WaitHeader, r.header.Get(WaitHeader))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("A still held 5 s after B left")
	}
	c = getCard(t, model)
	if c.Admission.Paused != 0 || c.Admission.QueuedTurns != 1 || c.Admission.Waiting != 0 {
		t.Fatalf("after A resumed: paused %d, queued turns %d, waiting %d", c.Admission.Paused, c.Admission.QueuedTurns, c.Admission.Waiting)
	}
	// the router measures the wait on its own clock, which moves with
	// requests and polls: some of the wall's wait, not more
	if p50 := c.Admission.PausedWaitP50S; p50 == nil || *p50 <= 0 || *p50 > wall+0.05 {
		t.Fatalf("after A resumed: paused wait p50 %v, want above 0 and at most A's %.3f s", derefOr(p50), wall)
	}
	if n := pausedWaits(t) - waitsBefore; n != 1 {
		t.Fatalf("lm_warden_paused_wait_seconds counted %d waits, want 1", n)
	}
}

// timeSlicingSite is admissionSite with a replica of 2,300 KV tokens and
// its engine slowed 50×: one bigTurn-sized conversation fits, two do not,
// and turns last long enough against the round trips between them that a
// conversation is in flight about half the time (see
// TestTimeSlicingHoldsAPausedTurn).
func timeSlicingSite(t *testing.T, model string) {
	t.Helper()
	emu, _ := admissionSite(t, model, "kv_tokens 2300", "")
	if err := emu.SetSlow(0, 50); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.SetSlow(0, 1) })
}

// pausedWaits is the count of lm_warden_paused_wait_seconds, all models.
func pausedWaits(t *testing.T) uint64 {
	var n uint64
	for _, m := range adminMetrics(t)["lm_warden_paused_wait_seconds"].GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

func derefOr(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestTimeSlicingClaudeCodeToolResult holds a paused conversation's turn
// as Claude Code sends it after running a tool: its history (the first
// message, the answer with a tool_use block) and a tool_result. A client
// that gives up while its turn is held leaves the queue and leaves no
// goroutine behind; the client's next try waits its turn, resumes on the
// conversation's replica and finds its history cached (the emulator's
// usage: cache_read_input_tokens).
func TestTimeSlicingClaudeCodeToolResult(t *testing.T) {
	const model = "ts-tool"
	timeSlicingSite(t, model)
	a := newToolAgent("A")
	a.turn(t, "placed")
	if r := sendTurn(t, "/v1/messages", bigTurn("B"), session("B")); r.status != 200 || r.reason != "placed" {
		t.Fatalf("B: %d %s %s", r.status, r.reason, r.body)
	}
	a.turn(t, "sticky") // A's tool result: A and B need more than the replica holds
	waitFor(t, "A paused at its turn's end", func() bool { return getCard(t, model).Admission.PausedTotal > 0 })
	if c := getCard(t, model); c.Admission.Paused != 1 || c.Replicas[0].Paused != 1 {
		t.Fatalf("after A's second turn: paused %d (replica %d); want A paused", c.Admission.Paused, c.Replicas[0].Paused)
	}

	// a client that gives up while held: out of the queue, nothing left
	base := settledGoroutines(testClient)
	cancelledBefore := getCard(t, model).Admission.Cancelled
	ctx, cancel := context.WithCancel(context.Background())
	gone := postAsync(ctx, "/v1/messages", a.next(), session("A"))
	waitFor(t, "A's turn held", func() bool { return getCard(t, model).Admission.Waiting == 1 })
	cancel()
	if r := <-gone; r.status != -1 {
		t.Fatalf("the cancelled client got an answer: %d %s", r.status, r.body)
	}
	waitFor(t, "the cancelled turn out of the queue", func() bool {
		c := getCard(t, model)
		return c.Admission.Waiting == 0 && c.Admission.Cancelled == cancelledBefore+1
	})
	var after int
	waitLong(t, "goroutines back to their count before the held turn", 10*time.Second, func() bool {
		after = settledGoroutines(testClient)
		return after <= base
	})
	if c := getCard(t, model); c.Admission.Paused != 1 {
		t.Fatalf("after the client left: paused %d, want A still paused", c.Admission.Paused)
	}

	// the client's next try: held until B leaves, then resumed with its
	// history cached
	held := postAsync(context.Background(), "/v1/messages", a.next(), session("A"))
	waitFor(t, "A's retry held", func() bool { return getCard(t, model).Admission.Waiting == 1 })
	if code, b := adminDo(t, testAdminPort, http.MethodDelete, "/lm-warden/models/"+model+"/sessions/B", ""); code != 200 {
		t.Fatalf("unpinning B: %d %s", code, b)
	}
	var r turnResult
	select {
	case r = <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("A's turn still held 10 s after B left")
	}
	if r.status != 200 || r.reason != "sticky" || r.header.Get(WaitHeader) == "" {
		t.Fatalf("A resumed: %d %s, %s %q: %s", r.status, r.reason, WaitHeader, r.header.Get(WaitHeader), r.body)
	}
	var msg emulator.AnthropicMessage
	if err := json.Unmarshal([]byte(r.body), &msg); err != nil {
		t.Fatal(err)
	}
	u := msg.Usage
	if prompt := u.InputTokens + u.CacheReadInputTokens; u.CacheReadInputTokens < prompt*9/10 {
		t.Fatalf("A's resumed turn found %d of its %d prompt tokens cached, want its history (≥ 90 %%)", u.CacheReadInputTokens, prompt)
	}
	t.Logf("resumed turn: %d of %d prompt tokens cached, waited %s s", u.CacheReadInputTokens, u.InputTokens+u.CacheReadInputTokens, r.header.Get(WaitHeader))
}

// toolAgent is a conversation as Claude Code runs it: every answer is
// followed by a tool call (tool_use) and the next request carries the
// tool's result (tool_result).
type toolAgent struct {
	id   string
	msgs []map[string]any
}

func newToolAgent(id string) *toolAgent {
	return &toolAgent{id: id, msgs: []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "text", "text": id + ": " + strings.Repeat("Please look at this file and fix the bug. ", 150)},
	}}}}
}

// next is the body of the agent's next request.
func (a *toolAgent) next() string {
	b, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 8, "system": "You are a coding agent.",
		"messages": a.msgs,
	})
	return string(b)
}

// turn sends the next request, wants it answered with reason want, and
// appends the answer with its tool call and the tool's result.
func (a *toolAgent) turn(t *testing.T, want string) {
	t.Helper()
	r := sendTurn(t, "/v1/messages", a.next(), session(a.id))
	if r.status != 200 || r.reason != want {
		t.Fatalf("%s: %d %s, want 200 %s: %s", a.id, r.status, r.reason, want, r.body)
	}
	var msg emulator.AnthropicMessage
	if err := json.Unmarshal([]byte(r.body), &msg); err != nil || len(msg.Content) == 0 {
		t.Fatalf("%s: answer %q: %v", a.id, r.body, err)
	}
	call := fmt.Sprintf("toolu_%s%d", a.id, len(a.msgs))
	a.msgs = append(a.msgs,
		map[string]any{"role": "assistant", "content": []map[string]any{
			{"type": "text", "text": msg.Content[0].Text},
			{"type": "tool_use", "id": call, "name": "Bash", "input": map[string]any{"command": "go test ./..."}},
		}},
		map[string]any{"role": "user", "content": []map[string]any{
			{"type": "tool_result", "tool_use_id": call, "content": "ok  \texample.com/pkg\t0.01s"},
		}})
}
