// Package emulator is a vLLM-like inference replica without a GPU: a pure
// engine model (paged KV cache with vLLM's prefix caching, a V1-style
// scheduler with chunked prefill and recompute preemption, and a step-time
// model calibrated to an RTX A4000 serving Qwen3-4B) and an HTTP server
// that speaks vLLM's OpenAI-compatible (chat, completions, Responses) and
// Anthropic-compatible APIs and its
// Prometheus metrics.
//
// The Engine has no clock: Step runs one scheduler step and returns its
// duration in engine time. A discrete-event simulation drives it on a
// virtual clock; the Server drives one goroutine per engine on the wall
// clock, optionally sped up.
package emulator
