package caddymodule

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// Deprecated policy options.
//
// These options tuned the rules of placement, admission and failure
// detection; the router now derives what they set from what it measures or
// keeps a documented default. They still load, in the Caddyfile and in
// JSON, and still apply, for one release: Provision logs a warning for each
// one set, naming what replaces it. The release after refuses them as
// unknown options. docs/deprecated.md lists them.

// deprecatedOption is one deprecated option: how the Caddyfile reads it,
// whether a policy sets it (in either form), and why it goes.
type deprecatedOption struct {
	parse func(p *Policy, d *caddyfile.Dispenser, opt string) error
	set   func(p *Policy) bool
	why   string
}

// option makes the deprecated option of a field: parse reads its
// Caddyfile argument, and a field left at its zero value is not set.
func option[T comparable](field func(*Policy) *T, parse func(d *caddyfile.Dispenser, opt string) (T, error), why string) deprecatedOption {
	return deprecatedOption{
		parse: func(p *Policy, d *caddyfile.Dispenser, opt string) (err error) {
			*field(p), err = parse(d, opt)
			return err
		},
		set: func(p *Policy) bool {
			var zero T
			return *field(p) != zero
		},
		why: why,
	}
}

// positive reads a positive count; orWord a positive count or a word
// standing for a value (auto or off).
func positive(d *caddyfile.Dispenser, _ string) (int, error) { return parsePositive(d) }

func orWord(word string, value int) func(*caddyfile.Dispenser, string) (int, error) {
	return func(d *caddyfile.Dispenser, opt string) (int, error) { return parsePositiveOr(d, opt, word, value) }
}

// parseEngine reads an engine name (auto, vllm, sglang, llamacpp or tgi).
func parseEngine(d *caddyfile.Dispenser, _ string) (string, error) {
	v, err := parseArg(d)
	if err != nil {
		return "", err
	}
	if _, err := vllmstats.ParseDialect(v); err != nil {
		return "", d.Err(err.Error())
	}
	return strings.ToLower(v), nil
}

var deprecatedOptions = map[string]deprecatedOption{
	"spill_threshold": option(func(p *Policy) *int { return &p.SpillThreshold }, orWord("auto", 0),
		"the threshold follows max_num_seqs (a quarter of it), and a turn over it moves only when its time to first token is expected to be shorter elsewhere"),
	"spill_waiting": option(func(p *Policy) *int { return &p.SpillWaiting }, orWord("off", 0),
		"off by default: the time-to-first-token estimate that decides a spill counts the requests waiting in the engine, and in the 7-GPU simulation this option lengthened the median TTFB"),
	"idle_ttl": option(func(p *Policy) *caddy.Duration { return &p.IdleTTL }, parseDuration,
		"a conversation is forgotten an hour after its last turn, longer than an engine under load keeps its cache"),
	"active_window": option(func(p *Policy) *caddy.Duration { return &p.ActiveWindow }, parseDuration,
		"a conversation counts as active on its replica for 10 minutes after a turn when new ones are placed; under admission the working set, which counts it for twice its measured pauses, decides"),
	"max_sessions": option(func(p *Policy) *int { return &p.MaxSessions }, positive,
		"at most 100,000 conversations are kept bound (about 8 MB)"),
	"fail_after": option(func(p *Policy) *int { return &p.FailAfter }, positive,
		"a replica is out after 3 failed polls in a row, at once when a poll is refused or reset; Caddy's health checks add their own"),
	"fail_cooldown": option(func(p *Policy) *caddy.Duration { return &p.FailCooldown }, parseDuration,
		"a replica a request failed on stays out 5 s, then until one request sent there is answered; Caddy's passive health checks (fail_duration) add their own"),
	"abandon_after": option(func(p *Policy) *int { return &p.AbandonAfter }, orWord("off", -1),
		"a replica is out once turns in a row whose clients gave up before any response header come from two clients"),
	"admit_high_water": option(func(p *Policy) *float64 { return &p.AdmitHighWater }, parsePositiveFloat,
		"new conversations may fill a replica's whole KV capacity (kv_tokens sets the capacity)"),
	"admit_window": option(func(p *Policy) *caddy.Duration { return &p.AdmitWindow }, parseDuration,
		"a quiet conversation counts in its replica's working set for twice its measured pauses, at most 10 minutes (the window in which it counts as active)"),
	"admit_wait": option(func(p *Policy) *caddy.Duration { return &p.AdmitWait }, parseDuration,
		"a new conversation waits for room at most 5 minutes, then goes to the best replica"),
	"rotate_turns": option(func(p *Policy) *int { return &p.RotateTurns }, orWord("off", -1),
		"time-slicing has no quantum: a conversation is paused only when its replica's conversations outgrow the KV cache (a quantum of 8 turns re-prefilled every rotated agent and cost the fleet of agents 18–41 % of its output); admission off turns time-slicing off with it"),
	"poll_interval": option(func(p *Policy) *caddy.Duration { return &p.PollInterval }, parseDuration,
		"the replicas' metrics are read every second"),
	"poll_timeout": option(func(p *Policy) *caddy.Duration { return &p.PollTimeout }, parseDuration,
		"a poll times out at 80 % of the poll interval"),
	"engine": option(func(p *Policy) *string { return &p.Engine }, parseEngine,
		"the engine is detected from each server's metrics (the names its exposition carries most of), again whenever those names go away"),
	"bytes_per_token": option(func(p *Policy) *float64 { return &p.BytesPerToken }, parsePositiveFloat,
		"a new conversation is sized by the bytes per token of the turns the engine has counted (4 before the first)"),
}

// deprecations returns a warning for every deprecated option p sets, in
// name order.
func (p *Policy) deprecations() []string {
	var out []string
	for name, dep := range deprecatedOptions {
		if dep.set(p) {
			out = append(out, fmt.Sprintf("lm_warden policy option %s is deprecated and will be refused in the next release: %s", name, dep.why))
		}
	}
	slices.Sort(out)
	return out
}
