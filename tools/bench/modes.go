package bench

import (
	"slices"

	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// The routing modes a run compares. ModeVLLMDP is vLLM's own data-parallel
// balancer: one server with one engine per replica, the engine picked by
// the coordinator's published waiting×4+running (the "off" of the
// reference measurement: 4 × RTX A4000, Qwen3-4B, vLLM data-parallel 4).
// ModeOff and ModeOn are LM Warden's policy with affinity off (its own
// least-loaded pick) and on; ModeLifecycle is affinity on with the
// conversation lifecycle checks (start fingerprint, delivered-hit feedback,
// counter resets marking a replica's bindings cold). In the demo, on runs
// with the handler's restart detection off and lifecycle with it on (LM
// Warden's default); feedback and cold marking are always on in Caddy;
// ModeAdmit is affinity on with working-set admission (new conversations
// wait at the router while they fit no replica's KV cache); ModeDefault is
// LM Warden as shipped, a Caddyfile naming only the model: affinity,
// admission and the lifecycle checks all on. The others are Caddy's own
// selection policies.
const (
	ModeVLLMDP     = "vllm-dp"
	ModeOff        = "off"
	ModeOn         = "on"
	ModeLifecycle  = "lifecycle"
	ModeAdmit      = "admit"   // affinity on with working-set admission
	ModeDefault    = "default" // LM Warden's defaults: admission and lifecycle checks on
	ModeLeastConn  = "least_conn"
	ModeRoundRobin = "round_robin"
	ModeHeader     = "header" // rendezvous hash of X-Claude-Code-Session-Id
)

// CompareModes are the modes of --compare, in the order they run.
var CompareModes = []string{ModeVLLMDP, ModeOff, ModeOn, ModeAdmit, ModeLifecycle, ModeDefault, ModeLeastConn, ModeRoundRobin, ModeHeader}

// PeerModes are the other routers' policies (package peers), reimplemented
// for the bench: vllm-project/router's sticky_least_loaded, SGLang's
// gateway cache_aware, llm-d's endpoint picker, Dynamo's KV router,
// KubeAI's PrefixHash and production-stack's session router.
var PeerModes = peers.Names

// AllModes are every mode the simulator runs: CompareModes, then
// PeerModes. A trace's replay runs them all unless told otherwise.
func AllModes() []string {
	return append(slices.Clip(CompareModes), PeerModes...)
}

// Admits tells whether a mode runs with working-set admission.
func Admits(mode string) bool { return mode == ModeAdmit || mode == ModeDefault }

// ChecksLifecycle tells whether a mode runs with the conversation
// lifecycle checks (restart detection, counter resets marking bindings
// cold).
func ChecksLifecycle(mode string) bool { return mode == ModeLifecycle || mode == ModeDefault }
