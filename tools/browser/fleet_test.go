package browser

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/lmwarden/caddy-lmwarden/caddymodule"
	"github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/tools/bench"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/demo"
)

// TestBrowserFleetTimeSlicing runs the demo over HTTP (emulated replicas
// behind in-process Caddy) with the fleet preset's agents, shortened: two
// replicas of 40k tokens each and six agents that outgrow them, with
// admission (and so time-slicing) on. While the stage runs, the card in
// chromium shows conversations paused in a replica's Bindings cell and on
// the Admission line, as the admin JSON says at the same moment (a
// screenshot); afterwards every turn was answered, some after waiting in
// Caddy.
func TestBrowserFleetTimeSlicing(t *testing.T) {
	refresh := card.Refresh
	t.Cleanup(func() { card.Refresh = refresh })
	card.Refresh = browserRefresh
	ctx := newBrowserTab(t, 150*time.Second)

	fleet := bench.FleetSimConfig()
	cfg := demo.DefaultConfig()
	cfg.Admin = fmt.Sprintf("127.0.0.1:%d", browserFreePort(t))
	cfg.Replicas = 2
	cfg.Engine = fleet.Engine
	cfg.Engine.NumGPUBlocks = 40000 / cfg.Engine.BlockSize
	cfg.Workload = fleet.Workload
	cfg.Workload.Turns = 16 // 11.5k tokens growing to ≈38k: six do not fit 2 × 40k
	cfg.Workload.CompactAfter = cfg.Workload.CompactTurn(bench.ClaudeCodeCompactLimit(cfg.Engine.MaxModelLen))
	cfg.Modes = []string{bench.ModeAdmit}
	cfg.Stages = []int{6}
	cfg.Speed = 20
	// A paused conversation's next turn waits in Caddy until room appears,
	// at most admit_wait (5 min); the stage runs long enough past the
	// first pause for that turn to be answered inside it.
	cfg.Warmup, cfg.StageLength = 20*time.Second, 600*time.Second
	model := cfg.Workload.Model

	type result struct {
		rep *bench.Report
		err error
	}
	done := make(chan result, 1)
	rctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	go func() {
		rep, err := demo.Run(rctx, cfg)
		done <- result{rep, err}
	}()

	admin := "http://" + cfg.Admin
	cardURL := admin + "/lm-warden/models/" + model
	// wait for a pause, as the admin JSON shows it
	start := time.Now()
	deadline := start.Add(90 * time.Second)
	var c caddymodule.Card
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no conversation paused within 90 s: admission %+v", c.Admission)
		}
		select {
		case r := <-done:
			t.Fatalf("the demo ended before a conversation was paused: %v", r.err)
		case <-time.After(200 * time.Millisecond):
		}
		if resp, err := http.Get(cardURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				browserGetAdmin(t, cardURL, &c)
				if c.Admission.Paused > 0 {
					break
				}
			}
		}
	}

	// the engine's time at the pause: its wait ends within admit_wait and
	// a turn, which the stage must still cover
	pausedAt := time.Duration(float64(time.Since(start)) * cfg.Speed)
	if most := cfg.Warmup + cfg.StageLength - placement.DefaultAdmitWait - time.Minute; pausedAt > most {
		t.Fatalf("the first pause came %v into the run (engine time); a stage of %v cannot show its turn answered", pausedAt.Round(time.Second), cfg.StageLength)
	}
	t.Logf("first pause seen %v into the run (engine time)", pausedAt.Round(time.Second))

	// the page, typed in as the demo's log says
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(admin+"/lm-warden/ui/"+model))
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("the card in the browser: %v %+v", err, resp)
	}
	// the page and the JSON agree on what is paused at one moment (the
	// traffic goes on: a few tries)
	var shown string
	for try := 0; ; try++ {
		browserWaitRenders(t, ctx, 1)
		got := browserReadCard(t, ctx)
		var now caddymodule.Card
		browserGetAdmin(t, cardURL, &now)
		var cells []string
		want := 0
		for i, w := range now.Replicas {
			if i < len(got.Replicas) {
				cells = append(cells, got.Replicas[i].Cells["bindings"].T)
			}
			want += w.Paused
		}
		shown = strings.Join(cells, " | ") + " · " + got.Head["admission"].T
		if want > 0 && strings.Contains(shown, " paused") && strings.Contains(got.Head["admission"].T, fmt.Sprintf("%d paused (", now.Admission.Paused)) {
			break
		}
		if try == 20 {
			t.Fatalf("the card shows %q; the admin JSON: %d paused, replicas %+v", shown, now.Admission.Paused, now.Replicas)
		}
	}
	t.Logf("card: %s", shown)
	browserScreenshot(t, ctx, "fleet-card.png")

	r := <-done
	if r.err != nil {
		t.Fatalf("demo: %v", r.err)
	}
	st, ok := r.rep.Find(bench.ModeAdmit, 6)
	if !ok || st.Requests == 0 || st.Errors != 0 {
		t.Fatalf("fleet stage: %+v", st)
	}
	if st.WaitLaterMaxS <= 0 {
		t.Errorf("no later turn waited in Caddy (router wait max %.2f s), though conversations were paused", st.WaitLaterMaxS)
	}
	t.Logf("fleet stage: %d requests, 0 errors, %.1f %% prefix hits, later turns' router wait p95 %.2f s, max %.2f s",
		st.Requests, st.PrefixHitPct, st.WaitLaterP95S, st.WaitLaterMaxS)
}
