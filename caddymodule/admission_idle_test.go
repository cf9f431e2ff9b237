package caddymodule

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAdmissionNeverHoldsWhileAReplicaIsIdle drives admission through real
// Caddy and two emulated replicas whose working sets are full by the
// estimate (conversations stay resident for admit_window 10m after their
// turn) while their engines have nothing to do: a new conversation is
// admitted at once; then sessions finish and new ones arrive, and none
// waits while a replica is idle.
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
	if a := getCard(t, model).Admission; a.Queued != 0 {
		t.Fatalf("C waited for admission (queued %d, %v) with both replicas idle", a.Queued, time.Since(start))
	}

	// the newcomer scenario: sessions take their turns and finish, new
	// ones arrive one after another; no request ever waits in the queue,
	// since a replica is idle whenever one arrives
	for i := range 6 {
		id := fmt.Sprint("new-", i)
		for turn := range 2 {
			r := sendTurn(t, "/v1/messages", bigTurn(id), session(id))
			if r.status != 200 {
				t.Fatalf("%s turn %d: %d %s", id, turn, r.status, r.body)
			}
		}
	}
	a := getCard(t, model).Admission
	if a.Queued != 0 || a.AdmittedAtLimit != 0 || a.Waiting != 0 {
		t.Fatalf("newcomers waited with idle replicas: queued %d, at the limit %d, waiting %d", a.Queued, a.AdmittedAtLimit, a.Waiting)
	}
	// the estimate was over the caches: the working set outgrew them, or
	// time-slicing paused conversations that finished their turns (they
	// went quiet here) to keep it within them
	if a.WorkingSetTokens <= a.CapacityTokens && a.PausedTotal == 0 {
		t.Fatalf("working set %d within the capacity %d and nothing paused: the estimate never held anyone back, the test shows nothing", a.WorkingSetTokens, a.CapacityTokens)
	}
}
