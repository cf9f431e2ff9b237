package caddymodule

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"
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
	emu, _ := admissionSite(t, model, "kv_tokens 2300", "")
	if err := emu.SetSlow(0, 50); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.SetSlow(0, 1) })
	turn := func(id, want string) {
		t.Helper()
		if r := sendTurn(t, "/v1/messages", bigTurn(id), session(id)); r.status != 200 || r.reason != want {
			t.Fatalf("%s: %d %s, want 200 %s: %s", id, r.status, r.reason, want, r.body)
		}
	}
	turn("A", "placed")
	turn("B", "placed") // the engine idles between turns: admitted beside A
	turn("A", "sticky") // A's second turn: A and B need ≈4k of 3k
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
