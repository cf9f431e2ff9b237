// Package caddymodule plugs LM Warden into Caddy: the lm_warden HTTP handler,
// the lm_warden reverse_proxy selection policy, the app that owns the pollers,
// the admin API and the Prometheus collectors.
//
// One request, end to end:
//
//  1. The handler (http.handlers.lm_warden) finds the conversation key —
//     session headers, then the body's metadata, then a fingerprint of the
//     conversation's start — publishes it as {http.vars.lm_warden.session}
//     (and the body's model as {http.vars.lm_warden.model}) and wraps the
//     response writer.
//  2. The policy (http.reverse_proxy.selection_policies.lm_warden) asks the
//     model's placement.Router for a replica among the available upstreams
//     (or the engines of a data-parallel server, pinned with
//     X-data-parallel-rank), skipping replicas already tried for this request.
//     It never waits and never reads the body: a new conversation that
//     working-set admission holds gets a ticket and no upstream, and the
//     handler holds the request (admit_wait, then placed anyway; a client
//     that leaves cancels it) and runs the proxy again, whose policy maps
//     the router's decision to its upstream. lb_try_duration does not bound
//     that wait. A body over 1 MiB that the handler streams is read in full
//     first when the policy asks for it (a new conversation under
//     admission, see unread.go).
//  3. The wrapper passes the response through at once, reads the token usage
//     from a copy, records it for the replica that served and frees the
//     in-flight slot when the response ends, however it ends.
//
// Per model, the router, the vllmstats poller and the token accountant live
// in a package-level caddy.UsagePool, so `caddy reload` keeps bindings and
// counters; the lm_warden app starts the pollers, and the last configuration
// that drops a model stops its poller. The admin API (admin.api.lm_warden)
// and the metrics collector reach the live models by ranging over that pool,
// as reverse_proxy's admin API ranges over its hosts.
package caddymodule
