package caddymodule

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAdmissionNeverHoldsWhileAReplicaIsIdle drives admission through real
// Caddy and two emulated replicas whose working sets are full by the
// estimate (a conversation that has not paused yet stays resident for
// admit_window 10m after its turn) while their engines have nothing to do:
// a new conversation is admitted at once, past the estimate; then sessions
// take two turns each, back to back, and new ones arrive, and none waits.
func TestAdmissionNeverHoldsWhileAReplicaIsIdle(t *testing.T) {
	const model = "adm-idle"
	_, dials := startEmulator(t, 2, 50)
	loadSite(t, admissionConfig(strings.Join(dials, " "), model, "", ""))
	waitFor(t, "admission in force", func() bool { return getCard(t, model).Admission.Active })

	// two conversations fill both replicas by the estimate, then go quiet
	for _, id := range []string{"A", "B"} {
		if r := sendTurn(t, "/v1/messages", bigTurn(id), session(id)); r.status != 200 || r.reason != "placed" {
			t.Fatalf("%s: %d %s %s", id, r.status, r.reason, r.body)
		}
	}
	// another bigTurn fits beside neither by the estimate
	c := getCard(t, model)
	for _, row := range c.Replicas {
		if row.WorkingSetTokens < 1500 {
			t.Fatalf("replica %s holds %d tokens by the estimate, room for another: the test shows nothing", row.ID, row.WorkingSetTokens)
		}
	}
	// a newcomer while both engines are idle: admitted at once
	start := time.Now()
	if r := sendTurn(t, "/v1/messages", bigTurn("C"), session("C")); r.status != 200 || r.reason != "placed" {
		t.Fatalf("C: %d %s %s", r.status, r.reason, r.body)
	}
	a := getCard(t, model).Admission
	if a.Queued != 0 {
		t.Fatalf("C waited for admission (queued %d, %v) with both replicas idle", a.Queued, time.Since(start))
	}
	// C's replica holds more than its 3,000 tokens (kv_tokens) by the
	// estimate: admitted past it
	over := false
	for _, row := range getCard(t, model).Replicas {
		over = over || row.WorkingSetTokens > 3000
	}
	if !over {
		t.Fatal("no replica over its capacity by the estimate after C: the estimate did not say full, the test shows nothing")
	}

	// the newcomer scenario: sessions take their turns and finish, new
	// ones arrive one after another; no request ever waits in the queue
	// (a replica is idle whenever one arrives, and a finished session,
	// whose pause was milliseconds, stops counting milliseconds later)
	for i := range 6 {
		id := fmt.Sprint("new-", i)
		for turn := range 2 {
			r := sendTurn(t, "/v1/messages", bigTurn(id), session(id))
			if r.status != 200 {
				t.Fatalf("%s turn %d: %d %s", id, turn, r.status, r.body)
			}
		}
	}
	a = getCard(t, model).Admission
	if a.Queued != 0 || a.AdmittedAtLimit != 0 || a.Waiting != 0 {
		t.Fatalf("newcomers waited with idle replicas: queued %d, at the limit %d, waiting %d", a.Queued, a.AdmittedAtLimit, a.Waiting)
	}
}
