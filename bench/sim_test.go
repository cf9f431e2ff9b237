package bench

import (
	"bytes"
	"testing"
	"time"
)

func shortSim() SimConfig {
	cfg := DefaultSimConfig()
	cfg.Stages = []int{4, 8}
	cfg.StageLength = 90 * time.Second
	cfg.Warmup = 20 * time.Second
	return cfg
}

func TestSimDirection(t *testing.T) {
	cfg := shortSim()
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	t.Logf("\n%s", b.String())
	for _, n := range cfg.Stages {
		off, _ := rep.Find(ModeOff, n)
		on, _ := rep.Find(ModeOn, n)
		if off.Requests == 0 || on.Requests == 0 {
			t.Fatalf("%d sessions: no requests (off %d, on %d)", n, off.Requests, on.Requests)
		}
		if on.Errors != 0 || off.Errors != 0 {
			t.Errorf("%d sessions: errors off %d on %d", n, off.Errors, on.Errors)
		}
		if on.PrefixHitPct < off.PrefixHitPct {
			t.Errorf("%d sessions: prefix hits on %.1f%% < off %.1f%%", n, on.PrefixHitPct, off.PrefixHitPct)
		}
		if on.StayedPct != 100 {
			t.Errorf("%d sessions: stayed %.1f%% with affinity on at low load, want 100", n, on.StayedPct)
		}
		if on.TTFBP50S > off.TTFBP50S {
			t.Errorf("%d sessions: TTFB p50 on %.2fs > off %.2fs", n, on.TTFBP50S, off.TTFBP50S)
		}
	}
}

func TestSimDeterministic(t *testing.T) {
	cfg := shortSim()
	cfg.Stages = []int{4}
	cfg.StageLength = 40 * time.Second
	cfg.Modes = CompareModes
	a, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Stages {
		if a.Stages[i] != b.Stages[i] {
			t.Errorf("stage %d differs between runs:\n%+v\n%+v", i, a.Stages[i], b.Stages[i])
		}
	}
}
