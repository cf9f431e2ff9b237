package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/tools/bench"
)

// TestDemoEndToEnd runs a short demo through real Caddy with LM Warden in
// front of the emulator and checks the table and the JSON.
func TestDemoEndToEnd(t *testing.T) {
	admin, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Admin = admin
	cfg.Speed = 20
	cfg.Stages = []int{2, 4}
	cfg.StageLength = 40 * time.Second
	cfg.Warmup = 20 * time.Second
	w := cfg.Workload
	w.FirstTokens, w.Turns = 3000, 4
	cfg.Workload = w
	var log bytes.Buffer
	cfg.Log = &log
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, log.String())
	}
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s%s", log.String(), table.String())
	if !strings.Contains(log.String(), "/lm-warden/") {
		t.Error("the demo does not say where the routing card is")
	}
	back, err := bench.ReadReport(&js)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Stages) != 4 {
		t.Fatalf("%d stages in the JSON, want 4", len(back.Stages))
	}
	for _, st := range back.Stages {
		if st.Requests == 0 {
			t.Errorf("%s %d: no requests", st.Mode, st.Sessions)
		}
		if st.Errors != 0 {
			t.Errorf("%s %d: %d errors", st.Mode, st.Sessions, st.Errors)
		}
		if st.Policy != bench.PolicyOf(st.Mode) || st.DurationS != 40 {
			t.Errorf("%s %d: policy %q duration %g", st.Mode, st.Sessions, st.Policy, st.DurationS)
		}
		if st.PrefixHitPct <= 0 || st.TTFBP50S <= 0 {
			t.Errorf("%s %d: prefix hits %g%%, TTFB p50 %gs", st.Mode, st.Sessions, st.PrefixHitPct, st.TTFBP50S)
		}
	}
	for _, n := range cfg.Stages {
		on, _ := back.Find(bench.ModeOn, n)
		if on.StayedPct != 100 {
			t.Errorf("affinity on, %d sessions: stayed %.1f%%, want 100", n, on.StayedPct)
		}
	}
	if !strings.Contains(table.String(), "| 2 | ") || !strings.Contains(table.String(), "vllm-dp → on") {
		t.Errorf("table:\n%s", table.String())
	}
}
