package bench

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
)

// The bench's run on llm-d-inference-sim (docs/other-engines.md, seed 1,
// 60-second stages): output tok/min and prefix hits (%) of off and on,
// and the default's output over off's at 16 sessions, where it holds
// new conversations although nothing needs protecting. The runs: 0.56–0.59×
// at first; 115,212 against 154,924 tok/min (0.74×) once a conversation
// stopped counting past twice its pauses; 140,718 against 150,489
// (0.935×) once new conversations were sized at the bytes per token the
// engine's counts teach.
var llmdRecorded = []struct {
	sessions int
	mode     string
	output   float64
	hits     float64
}{
	{8, ModeOff, 82101, 86.0},
	{8, ModeOn, 82648, 86.1},
	{16, ModeOff, 161182, 85.4}, // two runs: 160,729 and 161,634
	{16, ModeOn, 152141, 82.0},
}

const llmdDefaultOverOff = 0.935

// At 24 sessions the simulator refused turns of off and affinity alone
// (its KV cache full beside the running requests): 2,035 of 3,660 and
// 2,010 of 3,648 in the ninth run, at 72.7 and 72.1 % hits.
var llmdRefused = []struct {
	mode          string
	refused, hits float64
}{
	{ModeOff, 2035.0 / 3660, 72.7},
	{ModeOn, 2010.0 / 3648, 72.1},
}

// TestSimLLMDSimMatchesTheRecordedRun runs the llmd-sim preset at 8 and 16
// sessions, where that run refused no turn of off: off and on within 20 %
// of the recorded output and 5 points of its hits, and the default's
// output at 16 sessions under off's, within 0.15 of the recorded
// 0.935×. At 24 sessions, where the simulator refuses turns whose
// blocks do not fit, off and on with the share of their turns refused
// within 10 points of the recorded run's. Their hits there are logged,
// not checked: they run 4–6 points over the recorded ones, for a reason
// not found.
func TestSimLLMDSimMatchesTheRecordedRun(t *testing.T) {
	sweep(t)
	cfg := LLMDSimConfig()
	cfg.Stages = []int{8, 16, 24}
	rep, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range llmdRecorded {
		st, ok := rep.Find(r.mode, r.sessions)
		if !ok {
			t.Fatalf("no stage %s at %d", r.mode, r.sessions)
		}
		t.Logf("%2d sessions %-3s: %.0f tok/min (recorded %.0f, %.2f×), hits %.1f %% (recorded %.1f)",
			r.sessions, r.mode, st.OutputTokensPerMin, r.output, st.OutputTokensPerMin/r.output, st.PrefixHitPct, r.hits)
		if q := st.OutputTokensPerMin / r.output; q < 0.8 || q > 1.2 {
			t.Errorf("%d sessions %s: output %.2f× the recorded run's", r.sessions, r.mode, q)
		}
		if d := st.PrefixHitPct - r.hits; d < -5 || d > 5 {
			t.Errorf("%d sessions %s: hits %.1f %%, recorded %.1f", r.sessions, r.mode, st.PrefixHitPct, r.hits)
		}
	}
	for _, r := range llmdRefused {
		st, ok := rep.Find(r.mode, 24)
		if !ok || st.Requests == 0 {
			t.Fatalf("no stage %s at 24", r.mode)
		}
		share := float64(st.Errors) / float64(st.Requests)
		t.Logf("24 sessions %-3s: %d of %d turns refused (%.1f %%, recorded %.1f %%), hits %.1f %% (recorded %.1f)",
			r.mode, st.Errors, st.Requests, 100*share, 100*r.refused, st.PrefixHitPct, r.hits)
		if d := share - r.refused; d < -0.1 || d > 0.1 {
			t.Errorf("24 sessions %s: %.1f %% of turns refused, recorded %.1f %%", r.mode, 100*share, 100*r.refused)
		}
	}
	off, _ := rep.Find(ModeOff, 16)
	def, ok := rep.Find(ModeDefault, 16)
	if !ok {
		t.Fatal("no default stage at 16")
	}
	q := def.OutputTokensPerMin / off.OutputTokensPerMin
	t.Logf("16 sessions: default %.0f tok/min, %.2f× off's (recorded %.2f×), first-turn router wait p50 %.2f s",
		def.OutputTokensPerMin, q, llmdDefaultOverOff, def.WaitFirstP50S)
	if q >= 1 || q < llmdDefaultOverOff-0.15 || q > llmdDefaultOverOff+0.15 {
		t.Errorf("16 sessions: the default gives %.2f× off's output, the recorded run %.2f×", q, llmdDefaultOverOff)
	}
}

// TestH100Preset checks the arithmetic behind H100EngineConfig: the KV
// capacity left at gpu_memory_utilization 0.9 after Qwen3-32B's FP8
// weights, and the step times of the physics the other presets use, on
// the engine itself.
func TestH100Preset(t *testing.T) {
	c := H100EngineConfig()
	// 0.9 × 81,559 MiB, less 31.2e9 FP8 and 2 × 0.778e9 bf16 parameters
	// and 4 GiB of profile, over 16 tokens × 256 KiB
	mem, weights, other, kvTok := 0.9*81559*(1<<20), 31.2e9+4*0.778e9, float64(4<<30), float64(64*8*128*2*2)
	if want := int((mem - weights - other) / (16 * kvTok)); c.NumGPUBlocks != want || want != 9146 {
		t.Errorf("KV blocks %d, want %d (9,146)", c.NumGPUBlocks, want)
	}
	if c.KVCapacityTokens() < c.MaxModelLen {
		t.Errorf("one %d-token sequence does not fit %d tokens of KV: vLLM would not start", c.MaxModelLen, c.KVCapacityTokens())
	}
	e := emulator.NewEngine(c)
	lone := &emulator.EngineRequest{ID: "lone", Prompt: promptTokens(100, 1), MaxTokens: 101}
	cold := &emulator.EngineRequest{ID: "cold", Prompt: promptTokens(10000, 2), MaxTokens: 1}
	for _, r := range []*emulator.EngineRequest{lone, cold} {
		start := e.Now()
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
		for !r.Done {
			e.Step()
		}
		r.Finished -= start
		r.FirstToken -= start
	}
	rate := 100 / (lone.Finished - lone.FirstToken).Seconds()
	t.Logf("a lone sequence decodes at %.1f tok/s; a cold 10,000-token prefill takes %v", rate, cold.FirstToken)
	if rate < 50 || rate > 60 {
		t.Errorf("lone decode %.1f tok/s, want about 55 (15.1 ms of weights + 3 ms a step)", rate)
	}
	if cold.FirstToken < 700*time.Millisecond || cold.FirstToken > 900*time.Millisecond {
		t.Errorf("cold 10k prefill %v, want about 0.8 s", cold.FirstToken)
	}
}

// promptTokens is n distinct token ids.
func promptTokens(n int, salt uint32) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(i)*2654435761 ^ salt
	}
	return p
}

// TestSimChatAndEstimate: under PromptsWords a prompt is the simulator's
// rendering in its simple tokenizer's tokens, an answer enters the
// history after "### assistant: ", and under BytesPerToken the router is
// told a first turn's size from its text's bytes.
func TestSimChatAndEstimate(t *testing.T) {
	words, err := newSimChat(PromptsWords)
	if err != nil {
		t.Fatal(err)
	}
	got := words.appendAnswer(words.appendMessage(nil, "user", "Hello, world!"), []uint32{7, 8})
	want := append(emulator.AppendWordTokens(nil, "### user: Hello, world!\n### assistant: "), 7, 8)
	if len(got) != len(want) {
		t.Fatalf("%d tokens, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("token %d differs", i)
		}
	}
	if _, err := newSimChat("bpe"); err == nil {
		t.Error("unknown prompts accepted")
	}
	if _, err := Sim(SimConfig{Workload: DefaultWorkload(), Engine: LLMDSimEngineConfig(), Replicas: 1, Stages: []int{1},
		Modes: []string{ModeOn}, StageLength: time.Second, Prompts: "bpe"}); err == nil {
		t.Error("Sim ran with unknown prompts")
	}

	gen, err := NewGenerator(DefaultWorkload(), emulator.CountTokens)
	if err != nil {
		t.Fatal(err)
	}
	sl := &simSlot{sess: gen.NextAt(0)}
	s := &simulator{cfg: SimConfig{BytesPerToken: 4}, gen: gen}
	bytes := len(sl.sess.System) + len(sl.sess.Messages[0])
	if est := s.estimate(sl, 7900); est != bytes/4 {
		t.Errorf("first turn estimated at %d tokens, want %d (%d bytes / 4)", est, bytes/4, bytes)
	}
	t.Logf("first turn: %d bytes, told %d tokens; the simulator counts %d", bytes, bytes/4,
		len(words.appendMessage(words.appendMessage(nil, "system", sl.sess.System), "user", sl.sess.Messages[0])))
	s.cfg.BytesPerToken = 0
	if est := s.estimate(sl, 7900); est != 7900 {
		t.Errorf("without BytesPerToken the router is told %d, want the engine's 7900", est)
	}
}
