// Package vllmstats reads what vLLM replicas say about themselves and what
// their responses say about each request.
//
// It has three parts, none of which knows about Caddy or the placement policy:
//
//   - ParseMetrics and Poller read vLLM's Prometheus exposition (GET /metrics)
//     per replica (one server, or one data-parallel engine of a server),
//     keep the prefix hit rate over a sliding window (hitwindow.go) and
//     since start, and publish an immutable Snapshot that readers on the
//     request path load without locking or allocating. Counters are read
//     with or without the _total suffix; a figure the engine does not export
//     is reported absent (EngineMetrics.Present, ReplicaStats.HitRateKnown),
//     never as 0.
//   - UsageParser reads the token usage of one response (OpenAI chat/completions
//     and completions, Anthropic messages; JSON bodies and SSE streams) from the
//     bytes as they pass through a proxy, in constant memory.
//   - Accountant sums that usage per replica into cached, computed and
//     generated prompt/output tokens: totals since start and one-second buckets
//     for the last hour in a fixed ring.
//
// Cached tokens are the engine's own per-request count. A response that does
// not report it (no usage, or no cached field) counts all its prompt tokens as
// computed.
package vllmstats
