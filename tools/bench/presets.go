package bench

import (
	"fmt"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// Figures behind SevenGPUEngineConfig: one RTX 5090 (32 GB GDDR7,
// 1,792 GB/s) serving a 27B-class model quantised to 4 bits (≈15 GB of
// weights).
const (
	rtx5090Bandwidth   = 1792e9
	rtx5090Efficacy    = 0.65
	model27BParams     = 27e9
	model27BWeightByte = 15e9   // 4-bit weights plus scales
	rtx5090PrefillFL   = 110e12 // effective FLOP/s of a large prefill
	model27BAttnFLOPs  = 4 * 64 * 32 * 128
	sevenGPUKVTokens   = 144000
	sevenGPUKVBytesTok = 12e9 / sevenGPUKVTokens // ≈ 83 KB of KV per token
)

// SevenGPUEngineConfig is one replica of the 7-GPU story (docs/reference-measurement.md): a
// 27B-class model on one RTX 5090. The KV capacity is set from the story's
// own account rather than a model card: 16 sessions of ~58k tokens on
// seven replicas "fit" (≈ 133k tokens per replica) and 26 do not, so each
// replica holds 144,000 tokens (9,000 blocks of 16), about 12 GB of KV at
// ≈ 83 KB per token. Step times follow the emulator's model: 15 GB of
// weights streamed per step at 65 % of 1,792 GB/s (≈ 12.9 ms, ≈ 70 tok/s
// for a lone sequence), 2 × 27e9 FLOPs per prefill token and a 64-layer,
// 32-head, 128-dim attention at an effective 110 TFLOP/s.
func SevenGPUEngineConfig() emulator.EngineConfig {
	bw := rtx5090Bandwidth * rtx5090Efficacy
	return emulator.EngineConfig{
		BlockSize:           16,
		NumGPUBlocks:        sevenGPUKVTokens / 16,
		MaxNumSeqs:          32,
		MaxNumBatchedTokens: 2048,
		MaxModelLen:         131072,
		Timing: emulator.Timing{
			StepOverhead:          0.003,
			WeightRead:            model27BWeightByte / bw,
			PrefillPerToken:       2 * model27BParams / rtx5090PrefillFL,
			AttentionPerPair:      model27BAttnFLOPs / rtx5090PrefillFL,
			DecodePerContextToken: sevenGPUKVBytesTok / bw,
		},
	}
}

// SevenGPUSimConfig is the 7-GPU story (docs/reference-measurement.md) as a simulation: seven
// replicas, sessions of ~58k tokens, 26 and then 16 concurrent sessions,
// under Caddy's header hash of the session ID (the first rule in the
// story), vLLM's own data-parallel balancer (vllm-dp) and LM Warden
// (affinity on). The agents keep their 3-second think time: headless
// agents run tools between turns.
// Stages are 10 minutes after a 3-minute warm-up (the story's decline took
// 35; pass a longer StageLength to watch all of it).
func SevenGPUSimConfig() SimConfig {
	return SimConfig{
		Workload:     SevenGPUWorkload(),
		Engine:       SevenGPUEngineConfig(),
		Replicas:     7,
		Stages:       []int{16, 26},
		Modes:        []string{ModeHeader, ModeVLLMDP, ModeOn},
		StageLength:  10 * time.Minute,
		Warmup:       3 * time.Minute,
		PollInterval: time.Second,
		Placement:    placement.Config{MaxNumSeqs: 32},
	}
}

// Presets where the spill rule decides (docs/overload.md, "When a spill
// pays"): the reference preset with replicas that run few sequences, and
// with sessions that start in waves.
const (
	// SmallSeqsMaxNumSeqs is the max_num_seqs of SmallSeqsSimConfig: the
	// auto spill threshold is then 2 running requests per replica.
	SmallSeqsMaxNumSeqs = 8
	// WavesPeriod is how often a wave of sessions starts in
	// WavesSimConfig.
	WavesPeriod = time.Minute
)

// SmallSeqsSimConfig is the reference preset (DefaultSimConfig) with
// max_num_seqs 8 per replica (engine and router): the auto threshold is 2,
// so replicas cross it as soon as a few sessions are in flight and the
// spill rule decides nearly every turn.
func SmallSeqsSimConfig() SimConfig {
	c := DefaultSimConfig()
	c.Engine.MaxNumSeqs = SmallSeqsMaxNumSeqs
	c.Placement.MaxNumSeqs = SmallSeqsMaxNumSeqs
	c.Stages = []int{4, 8, 16, 24}
	return c
}

// WavesSimConfig is the reference preset (DefaultSimConfig) with sessions
// starting in waves (Workload.Waves = WavesPeriod): every stage begins with
// all sessions at their first turn, and a session that ended waits for the
// next wave. Many new conversations arrive at once and the replicas'
// loads swing, so turns of running conversations meet replicas over the
// threshold.
func WavesSimConfig() SimConfig {
	c := DefaultSimConfig()
	c.Workload.Waves = WavesPeriod
	return c
}

// SimPreset returns the simulation preset of that name: 4gpu (the
// reference measurement), 7gpu, seqs8 (SmallSeqsSimConfig), waves
// (WavesSimConfig), fleet (FleetSimConfig) or llmd-sim (LLMDSimConfig).
func SimPreset(name string) (SimConfig, error) {
	switch name {
	case "4gpu":
		return DefaultSimConfig(), nil
	case "7gpu":
		return SevenGPUSimConfig(), nil
	case "seqs8":
		return SmallSeqsSimConfig(), nil
	case "waves":
		return WavesSimConfig(), nil
	case "fleet":
		return FleetSimConfig(), nil
	case "llmd-sim":
		return LLMDSimConfig(), nil
	case "h100":
		return H100SimConfig(), nil
	}
	return SimConfig{}, fmt.Errorf("unknown preset %q (4gpu, 7gpu, seqs8, waves, fleet, llmd-sim or h100)", name)
}

// FleetSimConfig is the 7-GPU story's agents as they run: headless agents
// that keep going for 60 turns (an 8,000-token first message, 1,500 new
// tokens a turn, 3 s tool pauses), growing toward the model's context
// (131,072 tokens); each compacts, as Claude Code does on its own, at the
// turn whose prompt would pass Claude Code's threshold
// (ClaudeCodeCompactLimit: 98,072 tokens, turn 50 at these sizes), its
// history replaced by a FleetSummaryTokens summary under the same session
// ID, and runs its last turns from there. 16 of them fit the seven caches,
// 26 do not (≈1.4M tokens against 7 × 144k). Stages are 40 minutes after
// 5 of warm-up.
func FleetSimConfig() SimConfig {
	c := SevenGPUSimConfig()
	w := &c.Workload
	w.Turns, w.FirstTokens, w.TurnTokens = 60, 8000, 1500
	w.CompactShare, w.CompactTokens = 1, FleetSummaryTokens
	w.CompactAfter = w.CompactTurn(ClaudeCodeCompactLimit(c.Engine.MaxModelLen))
	c.Modes = []string{ModeHeader, ModeOn, ModeAdmit}
	c.StageLength, c.Warmup = 40*time.Minute, 5*time.Minute
	return c
}

// FleetSummaryTokens is the size of the summary a fleet agent's history is
// compacted into: a few thousand tokens, as Claude Code's structured
// summaries of a long session run.
const FleetSummaryTokens = 4000

// The flags of llm-d-inference-sim's run that LLMDSimConfig reproduces
// (docs/other-engines.md): four replicas, each with these.
const (
	LLMDSimKVBlocks        = 2048 // --kv-cache-size, blocks of --block-size 16
	LLMDSimMaxNumSeqs      = 8    // --max-num-seqs
	LLMDSimMaxModelLen     = 65536
	LLMDSimPrefillOverhead = 20 * time.Millisecond  // --prefill-overhead
	LLMDSimPrefillPerToken = 100 * time.Microsecond // --prefill-time-per-token
	LLMDSimInterToken      = 4 * time.Millisecond   // --inter-token-latency
)

// LLMDSimEngineConfig is one replica of llm-d-inference-sim as the recipe
// of docs/other-engines.md starts it: the emulator's per-request mode
// (emulator.PerRequestTiming), which follows the simulator's latency
// calculator, worker pool and block cache, refusing a request whose blocks
// do not fit as the simulator does, with its flags. Nothing is
// fitted: every figure is a flag of that run or a constant of the
// simulator's source (the output-length histogram of its dataset, used
// because the bench sends max_tokens without ignore_eos).
func LLMDSimEngineConfig() emulator.EngineConfig {
	return emulator.EngineConfig{
		BlockSize:           16,
		NumGPUBlocks:        LLMDSimKVBlocks,
		MaxNumSeqs:          LLMDSimMaxNumSeqs,
		MaxNumBatchedTokens: 2048, // unused by the per-request mode
		MaxModelLen:         LLMDSimMaxModelLen,
		PerRequest: emulator.PerRequestTiming{
			PrefillOverhead:   LLMDSimPrefillOverhead,
			PrefillPerToken:   LLMDSimPrefillPerToken,
			InterTokenLatency: LLMDSimInterToken,
			OutputHistogram:   true,
			Refuse:            true,
		},
	}
}

// LLMDSimConfig is the bench's run on llm-d-inference-sim
// (docs/other-engines.md) as a simulation: four replicas of
// LLMDSimEngineConfig, the default workload in a closed loop, 8, 16 and 24
// sessions in 60-second stages after 10 s of warm-up, off, on and the
// default. The engines count tokens as the simulator's simple tokenizer
// does (PromptsWords), and the router estimates a new conversation's
// prompt from its bytes as the Caddy module does (the bytes per token
// learned from the turns answered so far, 4 before the first), so it sees
// the same sizes as in that run.
func LLMDSimConfig() SimConfig {
	return SimConfig{
		Workload:      DefaultWorkload(),
		Engine:        LLMDSimEngineConfig(),
		Replicas:      4,
		Stages:        []int{8, 16, 24},
		Modes:         []string{ModeOff, ModeOn, ModeDefault},
		StageLength:   time.Minute,
		Warmup:        10 * time.Second,
		PollInterval:  time.Second,
		Placement:     placement.Config{MaxNumSeqs: LLMDSimMaxNumSeqs},
		Prompts:       PromptsWords,
		BytesPerToken: 4,
	}
}

// Figures behind H100EngineConfig: one H100 SXM 80 GB serving Qwen3-32B
// in FP8 (Qwen/Qwen3-32B-FP8: the linear layers in 8-bit floats with
// block scales, the embedding and the output head in bf16; the KV cache
// in bf16, vLLM's default for it).
const (
	h100Bandwidth  = 3.35e12     // bytes/s, HBM3 spec
	h100Efficacy   = 0.65        // share of it a decode step achieves, as the other presets
	h100FP8FLOPs   = 1979e12     // dense FP8 tensor peak
	h100BF16FLOPs  = 989e12      // dense bf16 tensor peak
	h100FLOPShare  = 0.57        // share of the peak a large prefill achieves, as the 4gpu preset
	h100MemoryByte = 81559 << 20 // 81,559 MiB, what the driver reports

	qwen32Linear    = 31.2e9  // parameters outside the embedding and the output head
	qwen32Embedding = 0.778e9 // 151,936 × 5,120, once for the embedding and once for the head
	qwen32Layers    = 64
	qwen32Heads     = 64
	qwen32KVHeads   = 8
	qwen32HeadDim   = 128
	// KV per token: 64 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes.
	qwen32KVBytes = qwen32Layers * qwen32KVHeads * qwen32HeadDim * 2 * 2
	// weights in memory: FP8 linear layers, bf16 embedding and head
	qwen32WeightBytes = qwen32Linear + 2*2*qwen32Embedding
	// read every step: the linear layers and the head (the embedding is
	// only gathered)
	qwen32StepBytes = qwen32Linear + 2*qwen32Embedding

	// H100MemoryUtilization is vLLM's gpu_memory_utilization (its default).
	H100MemoryUtilization = 0.9
	// h100OtherBytes is what vLLM's memory profile takes besides weights
	// and KV: the activations of an 8,192-token step, CUDA graphs, the
	// runtime (about 4 GiB on a 32B model).
	h100OtherBytes = 4 << 30
)

// H100KVBlocks is the KV capacity of H100EngineConfig in 16-token blocks:
// the memory vLLM may use at gpu_memory_utilization 0.9, less the weights
// and the profile's other memory, over the KV bytes of a block.
func H100KVBlocks() int {
	free := H100MemoryUtilization*float64(h100MemoryByte) - qwen32WeightBytes - h100OtherBytes
	return int(free / (16 * qwen32KVBytes))
}

// H100EngineConfig is one H100 SXM 80 GB serving Qwen3-32B in FP8 with
// vLLM's defaults for a GPU of 70 GiB or more (`vllm serve`: max_num_seqs
// 1,024, max_num_batched_tokens 8,192), the model teams run for coding
// agents on one datacenter GPU. The figures follow the physics of the
// 4gpu and 7gpu presets:
//
//   - KV: 256 KiB per token (64 layers × 8 KV heads × 128 × K, V × 2
//     bytes); 0.9 × 81,559 MiB = 76.97 GB, less 34.3 GB of weights
//     (31.2e9 FP8 parameters, 2 × 0.778e9 bf16) and 4 GiB of profile,
//     leaves 38.4 GB: 9,146 blocks of 16, 146,336 tokens (H100KVBlocks).
//   - WeightRead: 32.8 GB a step (the FP8 layers and the bf16 head) at 65 %
//     of 3.35 TB/s ≈ 15.1 ms; with the 3 ms step overhead a lone sequence
//     decodes at ≈ 55 tok/s.
//   - PrefillPerToken: 2 × 32.8e9 FLOPs at 57 % of the 1,979 TFLOP/s FP8
//     dense peak ≈ 58 µs; AttentionPerPair: 4 × 64 × 64 × 128 FLOPs at
//     57 % of the 989 TFLOP/s bf16 peak ≈ 3.7 ns. A cold 10,000-token
//     prefill takes ≈ 0.8 s, about 3× faster than the 4gpu preset's.
//   - DecodePerContextToken: 256 KiB at the same 2.18 TB/s ≈ 0.12 µs per
//     token of context per decoding sequence.
//   - MaxModelLen 131,072: Qwen3's 32k native context stretched by YaRN
//     (factor 4, as Qwen's model card documents for long inputs), which
//     agents' sessions need; one such sequence fits the KV cache, so
//     vLLM starts.
func H100EngineConfig() emulator.EngineConfig {
	bw := h100Bandwidth * h100Efficacy
	return emulator.EngineConfig{
		BlockSize:           16,
		NumGPUBlocks:        H100KVBlocks(),
		MaxNumSeqs:          1024,
		MaxNumBatchedTokens: 8192,
		MaxModelLen:         131072,
		Timing: emulator.Timing{
			StepOverhead:          0.003,
			WeightRead:            qwen32StepBytes / bw,
			PrefillPerToken:       2 * (qwen32Linear + qwen32Embedding) / (h100FLOPShare * h100FP8FLOPs),
			AttentionPerPair:      4 * qwen32Layers * qwen32Heads * qwen32HeadDim / (h100FLOPShare * h100BF16FLOPs),
			DecodePerContextToken: qwen32KVBytes / bw,
		},
	}
}

// H100SimConfig is four H100s serving Qwen3-32B (H100EngineConfig) to
// coding agents: the 7-GPU story's agents (3.5k system tokens, a 24k
// first message, eight more turns of 3.5k, 256 output tokens, 3 s tool
// pauses), ≈ 58k tokens at their end. Four replicas hold 4 × 146,336 =
// 585k tokens: 8 sessions fit, 16 about fill them and 24 do not. Stages
// are 5 minutes after 2 of warm-up.
func H100SimConfig() SimConfig {
	w := SevenGPUWorkload()
	w.Model = "qwen3-32b"
	return SimConfig{
		Workload:     w,
		Engine:       H100EngineConfig(),
		Replicas:     4,
		Stages:       []int{8, 16, 24},
		Modes:        []string{ModeVLLMDP, ModeOn, ModeDefault},
		StageLength:  5 * time.Minute,
		Warmup:       2 * time.Minute,
		PollInterval: time.Second,
		Placement:    placement.Config{MaxNumSeqs: 1024},
	}
}
