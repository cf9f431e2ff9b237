// Package peers reimplements, as plain Go, the routing policies of the
// routers a user would pick instead of LM Warden for agent traffic, so the
// bench can run them on the same engines and workloads as LM Warden's
// default. They are yardsticks for the bench, never features of the
// module: the plugin does not import this package.
//
// Each policy names the file of its router it follows and the defaults it
// takes from there. Each gets the signals it gets in its own stack: the
// router's own in-flight counts (Pick and Done), the replicas' polled
// queue and KV usage (Poll), and an index over the request it builds
// itself from the prompt's tokens (Request.Tokens, the request text of the
// simulation).
//
// A Policy is not safe for concurrent use; the HTTP proxy serialises its
// calls.
package peers

import (
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Request is what a policy sees of one turn.
type Request struct {
	// Key is the session header's value (X-Claude-Code-Session-Id); empty
	// when the client sent none.
	Key string
	// Tokens is the prompt as token IDs: the request text the prefix
	// indexes are built over.
	Tokens []uint32
	// FirstUser is the text of the conversation's first user message
	// (KubeAI hashes its first 100 characters).
	FirstUser string
	// Now is the router's clock.
	Now time.Time
}

// Load is one replica's polled state, as the replicas' /metrics report
// it: vllm:num_requests_waiting, vllm:num_requests_running and
// vllm:kv_cache_usage_perc (0..1).
type Load struct {
	Waiting, Running int
	KVUsage          float64
}

// Flight is one routed turn, from Pick to Done. The policy keeps what it
// needs to undo its own accounting in it.
type Flight struct {
	Replica int
	// uncached: prompt tokens the policy predicted were not cached on
	// Replica (llm-d's in-flight tokens, Dynamo's prefill blocks)
	uncached int
	// blocks: the prompt's blocks (Dynamo's decode load)
	blocks   int
	prefill  bool // still counted as prefill load (before its first token)
	key      string
	finished bool
}

// Policy is one peer router's replica selection.
type Policy interface {
	// Name is the bench mode's name.
	Name() string
	// Pick chooses the replica for r and counts it in flight there. A
	// policy that holds requests at the router (ThunderAgent's paused
	// programs) returns nil: the caller asks again after the next Poll.
	Pick(r Request) *Flight
	// FirstToken tells that f's first token arrived (its prefill is done).
	FirstToken(f *Flight, now time.Time)
	// Done tells that f finished (or failed, or was abandoned).
	Done(f *Flight, now time.Time)
	// Poll gives the replicas' latest polled load, in replica order.
	Poll(loads []Load, now time.Time)
	// EndSession tells that a conversation is over (the client said so).
	EndSession(key string, now time.Time)
}

// Config sizes the policies to the replicas they route to.
type Config struct {
	// Replicas are the replicas' names (their URLs in the HTTP bench).
	Replicas []string
	// BlockSize and NumGPUBlocks are a replica's KV cache geometry, as
	// vLLM publishes it (cache_config_info).
	BlockSize, NumGPUBlocks int
	// PrefillTokensPerSecond is a replica's prefill throughput on one
	// unloaded chunk of max_num_batched_tokens (llm-d's
	// peakPrefillThroughput, which its docs say to retune per deployment).
	PrefillTokensPerSecond float64
	// Seed seeds the random tie-breaks.
	Seed uint64
}

// Names are the peer modes, in the order the bench runs them.
var Names = []string{ModeSticky, ModeSMG, ModeLLMD, ModeDynamo, ModeThunder, ModeKubeAI, ModeProdStack}

// The peer modes.
const (
	ModeSticky    = "vllm-router"      // vllm-project/router sticky_least_loaded
	ModeSMG       = "smg"              // SGLang model gateway cache_aware
	ModeLLMD      = "llm-d"            // llm-d EPP, default profile plus the agent plugins
	ModeDynamo    = "dynamo"           // NVIDIA Dynamo KV router, approximate mode
	ModeThunder   = "thunderagent"     // Dynamo's ThunderAgent program scheduler over its KV router
	ModeKubeAI    = "kubeai"           // KubeAI PrefixHash (CHWBL)
	ModeProdStack = "production-stack" // vLLM production-stack session router
)

// Is tells whether mode names a peer policy.
func Is(mode string) bool {
	for _, n := range Names {
		if n == mode {
			return true
		}
	}
	return false
}

// New returns the policy of that mode.
func New(mode string, c Config) (Policy, error) {
	if len(c.Replicas) == 0 {
		return nil, fmt.Errorf("peers: %s needs at least one replica", mode)
	}
	if c.BlockSize <= 0 {
		c.BlockSize = 16
	}
	switch mode {
	case ModeSticky:
		return NewStickyLeastLoaded(c), nil
	case ModeSMG:
		return NewCacheAware(c), nil
	case ModeLLMD:
		return NewLLMD(c), nil
	case ModeDynamo:
		return NewDynamo(c), nil
	case ModeThunder:
		if c.NumGPUBlocks <= 0 {
			return nil, fmt.Errorf("peers: %s needs the replicas' KV pool (NumGPUBlocks)", mode)
		}
		return NewThunder(c), nil
	case ModeKubeAI:
		return NewCHWBL(c), nil
	case ModeProdStack:
		return NewSessionRing(c), nil
	}
	return nil, fmt.Errorf("peers: unknown mode %q", mode)
}

// inflight is the per-replica in-flight count every router keeps of the
// requests it sent and that have not finished.
type inflight []int

func (n inflight) pick(i int) *Flight {
	n[i]++
	return &Flight{Replica: i, prefill: true}
}

// done counts f out once; it reports whether it was still in flight.
func (n inflight) done(f *Flight) bool {
	if f == nil || f.finished {
		return false
	}
	f.finished = true
	n[f.Replica]--
	return true
}

// chainHashes returns the chained hashes of the prompt's complete blocks
// of size bs, at most max of them (0: all): block i's hash covers blocks
// 0..i, so equal hashes mean equal prefixes.
func chainHashes(tokens []uint32, bs, max int) []uint64 {
	n := len(tokens) / bs
	if max > 0 && n > max {
		n = max
	}
	out := make([]uint64, n)
	buf := make([]byte, 8+4*bs)
	h := uint64(0)
	for i := range n {
		b := buf[:0]
		b = append(b, byte(h), byte(h>>8), byte(h>>16), byte(h>>24), byte(h>>32), byte(h>>40), byte(h>>48), byte(h>>56))
		for _, t := range tokens[i*bs : (i+1)*bs] {
			b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
		}
		h = xxhash.Sum64(b)
		out[i] = h
	}
	return out
}
