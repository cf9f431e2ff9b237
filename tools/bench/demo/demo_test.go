package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/tools/bench"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// TestDemoEndToEnd runs a short demo through real Caddy with LM Warden in
// front of the emulator and checks the table and the JSON.
func TestDemoEndToEnd(t *testing.T) {
	var cfg Config
	rep, log := shortDemo(t, func(c *Config) {
		c.Stages = []int{2, 4}
		c.StageLength = 40 * time.Second
		cfg = *c
	})
	var table, js bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s%s", log, table.String())
	if !strings.Contains(log, "/lm-warden/") {
		t.Error("the demo does not say where the routing card is")
	}
	back, err := bench.ReadReport(&js)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(cfg.Stages) * len(cfg.Modes); len(back.Stages) != want {
		t.Fatalf("%d stages in the JSON, want %d", len(back.Stages), want)
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
		for _, m := range []string{bench.ModeDefault, bench.ModeOn} {
			on, _ := back.Find(m, n)
			if on.StayedPct != 100 {
				t.Errorf("%s, %d sessions: stayed %.1f%%, want 100", m, n, on.StayedPct)
			}
		}
	}
	if !strings.Contains(table.String(), "| 2 | ") || !strings.Contains(table.String(), "vllm-dp → default") {
		t.Errorf("table:\n%s", table.String())
	}
}

// TestDemoAdmission runs the admit mode through real Caddy on replicas too
// small for the sessions: first requests wait in Caddy (reported by
// X-LM-Warden-Wait), nothing fails, turns of admitted conversations answer
// fast, and switching between on and admit goes through the admin API.
func TestDemoAdmission(t *testing.T) {
	rep, log := shortDemo(t, func(c *Config) {
		c.Modes = []string{bench.ModeOn, bench.ModeAdmit}
		c.Stages = []int{12}
		c.StageLength = 60 * time.Second
		c.Engine.NumGPUBlocks = 600 // 9,600 tokens per replica: about two sessions
		// at 10×, not 20×: the assertions below read the engines' queues,
		// and an emulator that falls behind its clock on a slow, shared
		// machine queues turns that would not queue in engine time
		c.Speed = 10
	})
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s%s", log, table.String())
	on, _ := rep.Find(bench.ModeOn, 12)
	ad, ok := rep.Find(bench.ModeAdmit, 12)
	if !ok || ad.Requests == 0 || ad.Errors != 0 {
		t.Fatalf("admit stage: %+v", ad)
	}
	if ad.WaitFirstP95S <= 0 {
		t.Errorf("no first request waited at the router with 12 sessions on replicas holding about 8")
	}
	if on.WaitFirstP95S != 0 {
		t.Errorf("a first request waited %.2fs with admission off", on.WaitFirstP95S)
	}
	// against affinity alone in the same run, not a fixed second: the
	// TTFBs are the emulator's time, which a loaded machine stretches
	// (later turns at p50 0.3-0.7 s with admission and about 21 s
	// without on an idle machine; 1.4-3.2 s with admission on a loaded
	// one, without still about 21 s)
	if on.TTFBLaterP50S <= 0 || ad.TTFBLaterP50S > on.TTFBLaterP50S/4 {
		t.Errorf("later turns' TTFB p50 %.2fs with admission, %.2fs without: want under a quarter", ad.TTFBLaterP50S, on.TTFBLaterP50S)
	}
	if ad.PrefixHitPct <= on.PrefixHitPct {
		t.Errorf("prefix hits with admission %.1f%%, without %.1f%%", ad.PrefixHitPct, on.PrefixHitPct)
	}
}

// shortDemo runs a demo through real Caddy at 20× with short sessions
// (3,000-token first messages, 4 turns) and 20-second warm-ups, as set
// changes it, and returns its report and log.
func shortDemo(t *testing.T, set func(*Config)) (*bench.Report, string) {
	t.Helper()
	admin, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Admin = admin
	cfg.Speed = 20
	cfg.Warmup = 20 * time.Second
	cfg.Workload.FirstTokens, cfg.Workload.Turns = 3000, 4
	var log bytes.Buffer
	cfg.Log = &log
	set(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, log.String())
	}
	return rep, log.String()
}

// TestDemoDefaultCaddyfile: the default mode is LM Warden as a user
// deploys it, a policy block that sets none of affinity, admission or
// restart detection; affinity alone turns admission and restart
// detection off.
func TestDemoDefaultCaddyfile(t *testing.T) {
	p := &demoProxy{upstreams: []string{"http://127.0.0.1:9"}, admin: "127.0.0.1:1", listen: "127.0.0.1:2",
		model: "m", maxSeqs: 32, poll: 100 * time.Millisecond, speed: 10, rht: time.Minute, dpSize: 4}
	def := p.Caddyfile(bench.ModeDefault)
	for _, unset := range []string{"affinity", "admission ", "restart_detection"} {
		if strings.Contains(def, unset) {
			t.Errorf("the default mode's Caddyfile sets %s:\n%s", unset, def)
		}
	}
	// polled every 100 ms, a replica is out after 3 s of failed polls,
	// as a deployment's defaults (3 at 1 s) have it, not after 300 ms
	// admission's window of 10 minutes is engine time: a minute at 10x
	for _, want := range []string{"lb_policy lm_warden", "data_parallel_size 4", "admit_window 1m0s", "fail_after 30"} {
		if !strings.Contains(def, want) {
			t.Errorf("the default mode's Caddyfile lacks %q:\n%s", want, def)
		}
	}
	// a browser opens the card: typed in (the empty origin) or from the
	// page at the admin address
	if want := "origins 127.0.0.1:1 localhost:1 [::1]:1 \"\""; !strings.Contains(def, want) {
		t.Errorf("the admin block lacks %q:\n%s", want, def)
	}
	on := p.Caddyfile(bench.ModeOn)
	for _, want := range []string{"affinity on", "admission off", "restart_detection off"} {
		if !strings.Contains(on, want) {
			t.Errorf("the on mode's Caddyfile lacks %q:\n%s", want, on)
		}
	}
}

// TestDemoPeerModes runs every peer router's policy over HTTP: Caddy in
// front of the bench's own proxy, which picks each turn's replica with the
// policy and streams the replies back; the sticky policies keep every
// conversation on one replica.
func TestDemoPeerModes(t *testing.T) {
	rep, log := shortDemo(t, func(c *Config) {
		c.Modes = bench.PeerModes
		c.Stages = []int{4}
		c.StageLength = 30 * time.Second
		c.Warmup = 10 * time.Second
		// at 10×, not 20×: an emulator that falls behind its clock on a
		// slow, shared machine (or under -race) serves too few turns to
		// see a conversation's later ones
		c.Speed = 10
	})
	var table bytes.Buffer
	_ = rep.WriteTable(&table)
	t.Logf("\n%s%s", log, table.String())
	for _, m := range bench.PeerModes {
		st, ok := rep.Find(m, 4)
		if !ok || st.Requests == 0 || st.Errors != 0 {
			t.Errorf("%s: %+v", m, st)
			continue
		}
		if st.Policy != m || st.TTFBP50S <= 0 {
			t.Errorf("%s: policy %q, TTFB p50 %gs", m, st.Policy, st.TTFBP50S)
		}
		sticky := m == peers.ModeSticky || m == peers.ModeProdStack
		if st.TTFBLaterP50S <= 0 {
			// only first turns in the window: nothing to stay or hit
			if sticky {
				t.Errorf("%s: no later turns in the stage, stickiness unseen", m)
			}
			continue
		}
		if st.PrefixHitPct <= 0 {
			t.Errorf("%s: later turns and no prefix hits", m)
		}
		if sticky && st.StayedPct != 100 {
			t.Errorf("%s: stayed %.1f%%, want 100", m, st.StayedPct)
		}
	}
}
