package caddymodule

import (
	"encoding/json"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// The proxy's idle connections to the replicas.
//
// Engines close a kept-alive connection left idle: vLLM after
// VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (default 5, passed to uvicorn as
// timeout_keep_alive, whose own default is 5 too), SGLang after 5 s (it
// starts uvicorn with timeout_keep_alive=5), llama-server after 5 s
// (cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND; it also closes a
// connection after 100 requests, announced with Connection: close).
// Caddy's HTTP transport keeps idle connections for 2 minutes, so a turn
// after a pause of a few seconds (the agent ran a tool, the user typed)
// went out on a connection the engine was closing or had closed. The
// handler replays such a turn (replay.go); keeping connections for less
// than the engines do makes the race rare in the first place.

// DefaultUpstreamIdleTimeout is how long the reverse_proxy in front of the
// replicas keeps an idle connection when its transport does not set
// keepalive: below the 5 s after which vLLM, SGLang and llama-server close
// one, with room for a response's last bytes and a busy host (the engine's
// clock starts when it has written the response, the proxy's when it has
// read it). A new connection to a replica on the same network costs well
// under a millisecond, nothing beside a turn's prefill.
const DefaultUpstreamIdleTimeout = 2 * time.Second

// defaultKeepAlive gives the reverse_proxy whose selection policy p is an
// HTTP transport with DefaultUpstreamIdleTimeout when its configuration
// leaves keepalive unset: when it names no transport, the policy provisions
// the transport the proxy would make, with that idle timeout (the proxy
// makes its own only after loading the policy, when it has none); when it
// names the http transport without keep_alive, the policy lowers the idle
// timeout of the transport just made, before any request. A transport
// block with keepalive (a duration, or off) is left as written.
func (p *Policy) defaultKeepAlive(ctx caddy.Context) error {
	mods := ctx.Modules()
	var h *reverseproxy.Handler
	for i := len(mods) - 1; i >= 0; i-- {
		if rp, ok := mods[i].(*reverseproxy.Handler); ok {
			h = rp
			break
		}
	}
	if h == nil {
		return nil
	}
	idle := caddy.Duration(DefaultUpstreamIdleTimeout)
	switch {
	case h.Transport == nil && h.TransportRaw == nil:
		t := &reverseproxy.HTTPTransport{KeepAlive: &reverseproxy.KeepAlive{IdleConnTimeout: idle}}
		if err := t.Provision(ctx); err != nil {
			return err
		}
		h.Transport = t
	case h.Transport != nil:
		t, ok := h.Transport.(*reverseproxy.HTTPTransport)
		if !ok || t.Transport == nil || keepAliveSet(h.TransportRaw) {
			return nil
		}
		t.KeepAlive.IdleConnTimeout = idle
		t.Transport.IdleConnTimeout = time.Duration(idle)
	default:
		return nil
	}
	if p.logger != nil {
		p.logger.Debug("idle connections to the replicas are closed after "+DefaultUpstreamIdleTimeout.String()+" (the transport sets no keepalive)",
			zap.String("model", p.Model))
	}
	return nil
}

// keepAliveSet reports whether a transport's JSON configuration sets its
// keep-alive idle timeout or turns keep-alive off.
func keepAliveSet(raw json.RawMessage) bool {
	var cfg struct {
		KeepAlive *struct {
			Enabled     *bool           `json:"enabled"`
			IdleTimeout json.RawMessage `json:"idle_timeout"`
		} `json:"keep_alive"`
	}
	if len(raw) == 0 || json.Unmarshal(raw, &cfg) != nil || cfg.KeepAlive == nil {
		return false
	}
	return cfg.KeepAlive.Enabled != nil || len(cfg.KeepAlive.IdleTimeout) > 0
}
