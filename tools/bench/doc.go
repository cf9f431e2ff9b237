// Package bench is warden-bench: the Claude-Code-like workload of the reference
// measurement (docs/reference-measurement.md),
// the closed-loop stage runner that drives it over HTTP against any base URL
// (an emulator, a real vLLM, or LM Warden in front of either), the per-stage
// metrics with the reference measurement's definitions, the report (table, JSON, PNG charts),
// the one-command demo (emulator and Caddy in-process) and a discrete-event
// simulation that runs the same workload against the emulator's engine and
// the real placement router on a virtual clock.
//
// The metric definitions follow the reference measurement:
//
//   - sessions/h: sessions whose last turn finished inside the measured
//     window, scaled to an hour;
//   - output tokens/min: output tokens of the turns that finished inside the
//     window, per minute;
//   - TTFB p50/p95: client-side time from sending a turn to its first
//     streamed content token, over the turns whose first token arrived inside
//     the window (nearest-rank percentiles);
//   - replicas busy: the number of replicas with at least one running request
//     at each poll, averaged over the polls inside the window;
//   - prefix hits: Δ prefix_cache_hits / Δ prefix_cache_queries summed over
//     replicas between the first and the last poll of the window (counter
//     resets tolerated);
//   - stayed on replica: of the turns after a session's first whose replica
//     is known, the share served by the replica that served the session's
//     previous turn.
//
// The warm-up at the start of every stage is excluded. When the engine runs
// sped up, all times are engine seconds.
package bench
