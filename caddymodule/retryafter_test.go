package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQueueClock: the expected wait is the mean of the recent admissions'
// waits, no less than the oldest waiting conversation's wait so far;
// admissions past the horizon are forgotten.
func TestQueueClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var q queueClock
	if _, ok := q.expect(t0); ok {
		t.Fatal("an empty clock expects a wait")
	}
	a := q.enter(t0)
	b := q.enter(t0.Add(time.Second))
	q.leave(a, true, t0.Add(4*time.Second), 4*time.Second)
	q.leave(b, true, t0.Add(7*time.Second), 6*time.Second)
	for _, tc := range []struct {
		name string
		at   time.Time
		want time.Duration
		ok   bool
	}{
		{"mean of two", t0.Add(8 * time.Second), 5 * time.Second, true},
		{"past the horizon", t0.Add(7*time.Second + waitHorizon + time.Second), 0, false},
	} {
		got, ok := q.expect(tc.at)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %v %v, want %v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	// one waiting longer than the mean
	c := q.enter(t0.Add(8 * time.Second))
	if got, _ := q.expect(t0.Add(20 * time.Second)); got != 12*time.Second {
		t.Errorf("with one waiting 12 s: %v", got)
	}
	q.leave(c, false, t0.Add(21*time.Second), 13*time.Second)
	if got, _ := q.expect(t0.Add(21 * time.Second)); got != 5*time.Second {
		t.Errorf("after it left, not admitted: %v, want the admissions' 5 s", got)
	}
}

// TestRetryAfterFollowsTheQueue drives admission through real Caddy with
// one slow replica, each conversation's turn taking seconds: B waits in
// the queue for A's turn, C for B's; D, refused while C waits, is told to
// retry after about what the queued conversations waited (within 2× of
// C's wait), not after admit_wait.
func TestRetryAfterFollowsTheQueue(t *testing.T) {
	const model = "adm-retry"
	emu, _ := admissionSite(t, model, "admit_queue 1\n\t\t\tadmit_wait 2m", "")
	// engine time at the wall clock's pace: a turn below takes seconds
	if err := emu.SetSlow(0, 50); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.SetSlow(0, 1) })
	turn := func(id string) string {
		b, _ := json.Marshal(map[string]any{
			"model": "qwen3-4b", "max_tokens": 120, "system": "You are a coding agent.",
			"messages": []map[string]any{{"role": "user", "content": id + ": " + strings.Repeat("Please look at this file and fix the bug. ", 150)}},
		})
		return string(b)
	}
	waitFor(t, "nothing in flight", func() bool { return getCard(t, model).InFlight == 0 })
	ctx := context.Background()
	a := postAsync(ctx, "/v1/chat/completions", turn("A"), session("A"))
	waitFor(t, "A in flight", func() bool { return getCard(t, model).InFlight == 1 })
	// B waits for A's turn; admitted when A's ends
	bSent := time.Now()
	b := postAsync(ctx, "/v1/chat/completions", turn("B"), session("B"))
	waitFor(t, "B waiting", func() bool { return waitingNow(t, model) == 1 })
	// admitted when A's turn ends: about 5 s of engine time at the wall
	// clock's pace, so waitFor's 5 s bound is no bound for it
	waitLong(t, "B admitted", time.Minute, func() bool { return waitingNow(t, model) == 0 })
	bWait := time.Since(bSent)
	// C waits for B's turn; D finds the queue full
	cSent := time.Now()
	c := postAsync(ctx, "/v1/chat/completions", turn("C"), session("C"))
	waitFor(t, "C waiting", func() bool { return waitingNow(t, model) == 1 })
	d := sendTurn(t, "/v1/chat/completions", turn("D"), session("D"))
	if d.status != http.StatusTooManyRequests {
		t.Fatalf("D: %d %s, want 429", d.status, d.body)
	}
	retry, err := strconv.Atoi(d.header.Get("Retry-After"))
	if err != nil {
		t.Fatalf("D's Retry-After %q", d.header.Get("Retry-After"))
	}
	waitLong(t, "C admitted", time.Minute, func() bool { return waitingNow(t, model) == 0 })
	cWait := time.Since(cSent)
	for name, ch := range map[string]<-chan turnResult{"A": a, "B": b, "C": c} {
		if r := <-ch; r.status != 200 {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	t.Logf("B waited %.1f s, C %.1f s; D was told Retry-After: %d", bWait.Seconds(), cWait.Seconds(), retry)
	if cWait < 2*time.Second {
		t.Fatalf("C waited %v: the turns are too short to tell a queue's wait from the minimum", cWait)
	}
	if r := time.Duration(retry) * time.Second; r > 2*cWait || 2*r < cWait {
		t.Errorf("Retry-After %d s, C actually waited %.1f s: not within 2×", retry, cWait.Seconds())
	}
}
