// Package caddymodule plugs LM Warden into Caddy: the lm_warden HTTP handler,
// the lm_warden reverse_proxy selection policy, the app that owns the pollers,
// the admin API and the Prometheus collectors.
package caddymodule
