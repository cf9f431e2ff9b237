package emulator

import (
	"fmt"
	"time"
)

// EngineConfig sizes one engine (one data-parallel replica).
type EngineConfig struct {
	// BlockSize is the number of tokens per KV block (vLLM's default 16).
	BlockSize int
	// NumGPUBlocks is the KV cache size in blocks.
	NumGPUBlocks int
	// MaxNumSeqs caps the requests in the running batch.
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget of chunked prefill.
	MaxNumBatchedTokens int
	// MaxModelLen caps prompt plus output tokens of one request. It is
	// lowered to the KV capacity when larger.
	MaxModelLen int
	// Timing is the step-time model.
	Timing Timing
	// PerRequest, when On, replaces the step scheduler and Timing by
	// llm-d-inference-sim's model: every request on its own timeline,
	// no batch (see PerRequestTiming).
	PerRequest PerRequestTiming
	// ReserveFullSequence admits a waiting request only when its whole
	// sequence (not just the first prefill chunk) fits in the free blocks
	// (vLLM's scheduler_reserve_full_isl, on by default in current
	// releases: KVCacheManager.allocate_slots(full_sequence_must_fit=True)
	// for waiting requests). Releases before it, such as the one of the
	// reference measurement, checked only the first chunk.
	ReserveFullSequence bool
	// CountEveryLookup records the prefix cache query and hits at every
	// lookup of a waiting request, also when it then fails to get blocks
	// and is looked up again next step (KVCacheManager.get_computed_blocks
	// before vLLM PR 48860, July 2026). Off, a request counts once, when
	// it is admitted (KVCacheManager.record_prefix_cache_stats after
	// allocate_slots succeeds).
	CountEveryLookup bool
}

// Timing turns the work of one scheduler step into engine time. All fields
// are seconds. A step that computes T tokens (prefill chunk tokens plus one
// per decoding sequence) takes
//
//	StepOverhead + max(WeightRead, T·PrefillPerToken)
//	  + AttentionPerPair · Σ prefill (query, key) pairs
//	  + DecodePerContextToken · Σ context length of decoding sequences
//
// that is: the weights are streamed once per step (the floor of a small
// decode batch), dense compute grows with batched tokens, prefill attention
// is quadratic in context, and decode attention reads each sequence's KV.
type Timing struct {
	StepOverhead          float64
	WeightRead            float64
	PrefillPerToken       float64
	AttentionPerPair      float64
	DecodePerContextToken float64
}

// Hardware and model figures behind DefaultEngineConfig (RTX A4000 16 GiB,
// Qwen3-4B-Instruct-2507 in bf16). See DefaultEngineConfig for the arithmetic.
const (
	a4000Bandwidth     = 448e9 // bytes/s, GDDR6 spec
	bandwidthEfficacy  = 0.65  // share of spec bandwidth a decode step achieves
	qwen3Params        = 4.02e9
	qwen3Layers        = 36
	qwen3QueryHeads    = 32
	qwen3KVHeads       = 8
	qwen3HeadDim       = 128
	kvBytesPerToken    = qwen3Layers * qwen3KVHeads * qwen3HeadDim * 2 * 2 // K and V, 2 bytes each = 144 KiB
	linearFLOPsPerTok  = 2 * qwen3Params
	attnFLOPsPerPair   = 4 * qwen3Layers * qwen3QueryHeads * qwen3HeadDim // QKᵀ and AV
	prefillEffectiveFL = 44e12                                            // FLOP/s that make a cold 10k prefill take ~2.5 s
)

// DefaultEngineConfig is one RTX A4000 16 GiB serving Qwen3-4B-Instruct-2507
// in bf16 with vLLM V1, as in the reference measurement
// (docs/reference-measurement.md):
//
//   - KV per token: 36 layers × 8 KV heads × 128 dims × (K, V) × 2 bytes
//     = 147,456 B (144 KiB); a block of 16 tokens is 2.25 MiB. About 5 GiB
//     is left for KV at gpu_memory_utilization 0.9 after 8 GB of weights and
//     activations: 5 GiB / 2.25 MiB ≈ 2,275, so NumGPUBlocks 2,300 and
//     BlockSize 16 (vLLM's default): 36,800 tokens.
//   - MaxNumSeqs 32: the reference measurement's spill threshold 8 is max_num_seqs/4.
//   - MaxNumBatchedTokens 2,048: vLLM V1's default for `vllm serve` (the
//     OpenAI API server usage context) on GPUs under 70 GiB; the offline
//     LLM class uses 8,192.
//   - MaxModelLen 32,768: vLLM refuses to start when one max-length
//     sequence does not fit the KV cache, so with 36,800 tokens the
//     operator sets at most that; 32k is the usual choice.
//   - WeightRead: 4.02e9 params × 2 B = 8.04 GB per step at 65 % of the
//     A4000's 448 GB/s ≈ 27.6 ms; with StepOverhead 3 ms a lone sequence
//     decodes at ≈ 32 tok/s with a short context and ≈ 28 tok/s at 10k.
//   - DecodePerContextToken: 144 KiB read at the same 291 GB/s ≈ 0.51 µs per
//     token of context per decoding sequence, which slows large batches
//     with long contexts (8 sequences at 10k: ≈ 14 tok/s each).
//   - PrefillPerToken and AttentionPerPair: 2 × 4.02e9 FLOPs per token and
//     4 × 36 × 32 × 128 FLOPs per (query, key) pair at an effective 44
//     TFLOP/s (≈ 57 % of the card's dense bf16 tensor peak), chosen so a
//     cold 10,000-token prefill in 2,048-token chunks takes ≈ 2.5 s.
func DefaultEngineConfig() EngineConfig {
	effBW := a4000Bandwidth * bandwidthEfficacy
	return EngineConfig{
		BlockSize:           16,
		NumGPUBlocks:        2300,
		MaxNumSeqs:          32,
		MaxNumBatchedTokens: 2048,
		MaxModelLen:         32768,
		Timing: Timing{
			StepOverhead:          0.003,
			WeightRead:            2 * qwen3Params / effBW,
			PrefillPerToken:       linearFLOPsPerTok / prefillEffectiveFL,
			AttentionPerPair:      attnFLOPsPerPair / prefillEffectiveFL,
			DecodePerContextToken: kvBytesPerToken / effBW,
		},
	}
}

// KVCapacityTokens is NumGPUBlocks × BlockSize.
func (c EngineConfig) KVCapacityTokens() int { return c.NumGPUBlocks * c.BlockSize }

// Validate reports a configuration the engine cannot run.
func (c EngineConfig) Validate() error {
	switch {
	case c.BlockSize <= 0:
		return fmt.Errorf("emulator: block size %d must be positive", c.BlockSize)
	case c.NumGPUBlocks <= 0:
		return fmt.Errorf("emulator: num gpu blocks %d must be positive", c.NumGPUBlocks)
	case c.MaxNumSeqs <= 0:
		return fmt.Errorf("emulator: max num seqs %d must be positive", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens <= 0:
		return fmt.Errorf("emulator: max num batched tokens %d must be positive", c.MaxNumBatchedTokens)
	case c.MaxModelLen <= 0:
		return fmt.Errorf("emulator: max model len %d must be positive", c.MaxModelLen)
	}
	return nil
}

// StepTime is the engine time of a step with the given work: tokens computed
// in the step, prefill attention pairs, and summed context of decoding
// sequences.
func (t Timing) StepTime(tokens int, prefillPairs, decodeContext float64) time.Duration {
	lin := float64(tokens) * t.PrefillPerToken
	if lin < t.WeightRead {
		lin = t.WeightRead
	}
	s := t.StepOverhead + lin + prefillPairs*t.AttentionPerPair + decodeContext*t.DecodePerContextToken
	return time.Duration(s * float64(time.Second))
}
