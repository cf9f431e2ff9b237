package caddymodule

import (
	"fmt"
	"slices"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
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

// durationOption, countOption and fractionOption make the deprecated
// option of a field of each kind; parse reads a count's argument.
func durationOption(field func(*Policy) *caddy.Duration, why string) deprecatedOption {
	return deprecatedOption{
		parse: func(p *Policy, d *caddyfile.Dispenser, opt string) (err error) {
			*field(p), err = parseDuration(d, opt)
			return err
		},
		set: func(p *Policy) bool { return *field(p) != 0 },
		why: why,
	}
}

func countOption(field func(*Policy) *int, parse func(d *caddyfile.Dispenser, opt string) (int, error), why string) deprecatedOption {
	return deprecatedOption{
		parse: func(p *Policy, d *caddyfile.Dispenser, opt string) (err error) {
			*field(p), err = parse(d, opt)
			return err
		},
		set: func(p *Policy) bool { return *field(p) != 0 },
		why: why,
	}
}

func fractionOption(field func(*Policy) *float64, why string) deprecatedOption {
	return deprecatedOption{
		parse: func(p *Policy, d *caddyfile.Dispenser, opt string) (err error) {
			*field(p), err = parsePositiveFloat(d, opt)
			return err
		},
		set: func(p *Policy) bool { return *field(p) != 0 },
		why: why,
	}
}

// positive reads a positive count; orWord a positive count or a word
// standing for a value (auto or off).
func positive(d *caddyfile.Dispenser, _ string) (int, error) { return parsePositive(d) }

func orWord(word string, value int) func(*caddyfile.Dispenser, string) (int, error) {
	return func(d *caddyfile.Dispenser, opt string) (int, error) { return parsePositiveOr(d, opt, word, value) }
}

var deprecatedOptions = map[string]deprecatedOption{
	"spill_threshold": countOption(func(p *Policy) *int { return &p.SpillThreshold }, orWord("auto", 0),
		"the threshold follows max_num_seqs (a quarter of it), and a turn over it moves only when its time to first token is expected to be shorter elsewhere"),
	"spill_waiting": countOption(func(p *Policy) *int { return &p.SpillWaiting }, orWord("off", 0),
		"off by default: the time-to-first-token estimate that decides a spill counts the requests waiting in the engine, and in the 7-GPU simulation this option lengthened the median TTFB"),
	"idle_ttl": durationOption(func(p *Policy) *caddy.Duration { return &p.IdleTTL },
		"a conversation is forgotten an hour after its last turn, longer than an engine under load keeps its cache"),
	"active_window": durationOption(func(p *Policy) *caddy.Duration { return &p.ActiveWindow },
		"a conversation counts as active on its replica for 10 minutes after a turn when new ones are placed; under admission the working set, which counts it for twice its measured pauses, decides"),
	"max_sessions": countOption(func(p *Policy) *int { return &p.MaxSessions }, positive,
		"at most 100,000 conversations are kept bound (about 8 MB)"),
	"fail_after": countOption(func(p *Policy) *int { return &p.FailAfter }, positive,
		"a replica is out after 3 failed polls in a row, at once when a poll is refused or reset; Caddy's health checks add their own"),
	"fail_cooldown": durationOption(func(p *Policy) *caddy.Duration { return &p.FailCooldown },
		"a replica a request failed on stays out 5 s, doubled for each further failure up to a minute; Caddy's passive health checks (fail_duration) add their own"),
	"abandon_after": countOption(func(p *Policy) *int { return &p.AbandonAfter }, orWord("off", -1),
		"a replica is out after 3 turns in a row whose clients gave up before any response header"),
	"admit_high_water": fractionOption(func(p *Policy) *float64 { return &p.AdmitHighWater },
		"new conversations may fill a replica's whole KV capacity (kv_tokens sets the capacity)"),
	"admit_window": durationOption(func(p *Policy) *caddy.Duration { return &p.AdmitWindow },
		"a quiet conversation counts in its replica's working set for twice its measured pauses, at most a minute"),
	"admit_wait": durationOption(func(p *Policy) *caddy.Duration { return &p.AdmitWait },
		"a new conversation waits for room at most 5 minutes, then goes to the best replica"),
	"rotate_turns": countOption(func(p *Policy) *int { return &p.RotateTurns }, orWord("off", -1),
		"time-slicing's quantum is 8 turns; admission off turns time-slicing off with it"),
	"poll_interval": durationOption(func(p *Policy) *caddy.Duration { return &p.PollInterval },
		"the replicas' metrics are read every second"),
	"poll_timeout": durationOption(func(p *Policy) *caddy.Duration { return &p.PollTimeout },
		"a poll times out at 80 % of the poll interval"),
	"bytes_per_token": fractionOption(func(p *Policy) *float64 { return &p.BytesPerToken },
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

// deprecatedNames returns the deprecated options' names, sorted.
func deprecatedNames() []string {
	var out []string
	for name := range deprecatedOptions {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
