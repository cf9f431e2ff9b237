package bench

// The routing modes a run compares. ModeOff and ModeOn are LM Warden's
// policy with affinity off (which balances like vLLM's own data-parallel
// balancer) and on; the others are Caddy's own selection policies.
const (
	ModeOff        = "off"
	ModeOn         = "on"
	ModeLeastConn  = "least_conn"
	ModeRoundRobin = "round_robin"
	ModeHeader     = "header" // rendezvous hash of X-Claude-Code-Session-Id
)

// CompareModes are the modes of --compare, in the order they run.
var CompareModes = []string{ModeOff, ModeOn, ModeLeastConn, ModeRoundRobin, ModeHeader}
