package caddymodule

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("lm_warden", parseHandlerCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("lm_warden", httpcaddyfile.Before, "reverse_proxy")
}

func parseHandlerCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Handler)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens:
//
//	lm_warden {
//	    session_headers     <header...>
//	    agent_header        <header>|off
//	    parent_agent_header <header>|off
//	    body_keys           on|off
//	    fingerprint         on|off
//	    fingerprint_bytes   <size>
//	    restart_detection   on|off
//	    session_end_headers <header...>|off
//	    model_var           on|off
//	    max_body            <size>
//	    error_response      api|caddy
//	    strip_billing_block on|off
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "session_headers":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			h.SessionHeaders = args
		case "agent_header", "parent_agent_header":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v == "off" {
				v = "-"
			}
			if opt == "agent_header" {
				h.AgentHeader = v
			} else {
				h.ParentAgentHeader = v
			}
		case "session_end_headers":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			if len(args) == 1 && args[0] == "off" {
				args = []string{"-"}
			}
			h.SessionEndHeaders = args
		case "body_keys", "fingerprint", "model_var", "restart_detection", "strip_billing_block":
			on, err := parseOnOff(d)
			if err != nil {
				return err
			}
			switch opt {
			case "strip_billing_block":
				h.StripBillingBlock = on
			case "body_keys":
				h.NoBodyKeys = !on
			case "fingerprint":
				h.NoFingerprint = !on
			case "restart_detection":
				h.NoRestartDetection = !on
			default:
				h.NoModelVar = !on
			}
		case "fingerprint_bytes", "max_body":
			n, err := parseSize(d)
			if err != nil {
				return err
			}
			if opt == "max_body" {
				h.MaxBody = n
			} else {
				h.FingerprintBytes = int(n)
			}
		case "error_response":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v != "api" && v != "caddy" {
				return d.Errf("error_response must be api or caddy, got %q", v)
			}
			h.ErrorResponse = v
		default:
			return d.Errf("unrecognized lm_warden option %q", opt)
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from the tokens of
//
//	lb_policy lm_warden {
//	    model              <name>
//	    affinity           on|off
//	    spill_threshold    auto|<n>
//	    spill_waiting      off|<n>
//	    max_num_seqs       <n>
//	    idle_ttl           <duration>
//	    active_window      <duration>
//	    max_sessions       <n>
//	    poll_interval      <duration>
//	    poll_timeout       <duration>
//	    fail_after         <n>
//	    fail_cooldown      <duration>
//	    abandon_after      off|<n>
//	    metrics_path       <path>
//	    engine             auto|vllm|sglang|llamacpp|tgi
//	    poll_scheme        http|https
//	    data_parallel_size <n>
//	    client_pin_header  <header>
//	    route_header       on|off
//	    admission          on|off
//	    kv_tokens          <n>
//	    admit_high_water   <fraction>
//	    admit_window       <duration>
//	    admit_wait         <duration>
//	    admit_queue        <n>
//	    bytes_per_token    <n>
//	    store redis { ... }  (see unmarshalStore)
//	}
//
// The model may also be given inline: `lb_policy lm_warden <name>`.
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		p.Model = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for d.NextBlock(0) {
		opt := d.Val()
		switch opt {
		case "model", "metrics_path", "poll_scheme", "client_pin_header", "engine":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			switch opt {
			case "model":
				p.Model = v
			case "metrics_path":
				if !strings.HasPrefix(v, "/") {
					return d.Errf("metrics_path must start with /: %q", v)
				}
				p.MetricsPath = v
			case "poll_scheme":
				p.PollScheme = v
			case "engine":
				if !validEngine(v) {
					_, err := vllmstats.ParseDialect(v)
					return d.Err(err.Error())
				}
				p.Engine = strings.ToLower(v)
			default:
				p.ClientPinHeader = v
			}
		case "affinity", "route_header", "admission":
			on, err := parseOnOff(d)
			if err != nil {
				return err
			}
			switch opt {
			case "affinity":
				p.Affinity = &on
			case "admission":
				p.Admission = &on
			default:
				p.RouteHeader = &on
			}
		case "admit_high_water", "bytes_per_token":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				return d.Errf("%s must be a positive number, got %q", opt, v)
			}
			if opt == "admit_high_water" {
				p.AdmitHighWater = f
			} else {
				p.BytesPerToken = f
			}
		case "spill_threshold":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v == "auto" {
				p.SpillThreshold = 0
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return d.Errf("spill_threshold must be auto or a positive integer, got %q", v)
			}
			p.SpillThreshold = n
		case "spill_waiting":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			if v == "off" {
				p.SpillWaiting = 0
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return d.Errf("spill_waiting must be off or a positive integer, got %q", v)
			}
			p.SpillWaiting = n
		case "abandon_after":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if v := d.Val(); v == "off" {
				p.AbandonAfter = -1
			} else if n, err := strconv.Atoi(v); err != nil || n < 1 {
				return d.Errf("abandon_after must be off or a positive integer, got %q", v)
			} else {
				p.AbandonAfter = n
			}
		case "store":
			if err := p.unmarshalStore(d); err != nil {
				return err
			}
		case "max_num_seqs", "max_sessions", "fail_after", "data_parallel_size", "kv_tokens", "admit_queue":
			n, err := parsePositive(d)
			if err != nil {
				return err
			}
			switch opt {
			case "max_num_seqs":
				p.MaxNumSeqs = n
			case "max_sessions":
				p.MaxSessions = n
			case "fail_after":
				p.FailAfter = n
			case "kv_tokens":
				p.KVTokens = n
			case "admit_queue":
				p.AdmitQueue = n
			default:
				p.DataParallelSize = n
			}
		case "idle_ttl", "active_window", "poll_interval", "poll_timeout", "fail_cooldown", "admit_window", "admit_wait":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("%s must be a positive duration, got %q", opt, v)
			}
			switch opt {
			case "idle_ttl":
				p.IdleTTL = caddy.Duration(dur)
			case "active_window":
				p.ActiveWindow = caddy.Duration(dur)
			case "poll_interval":
				p.PollInterval = caddy.Duration(dur)
			case "fail_cooldown":
				p.FailCooldown = caddy.Duration(dur)
			case "admit_window":
				p.AdmitWindow = caddy.Duration(dur)
			case "admit_wait":
				p.AdmitWait = caddy.Duration(dur)
			default:
				p.PollTimeout = caddy.Duration(dur)
			}
		default:
			return d.Errf("unrecognized lm_warden policy option %q", opt)
		}
	}
	return nil
}

func parseOnOff(d *caddyfile.Dispenser) (bool, error) {
	var v string
	if !d.AllArgs(&v) {
		return false, d.ArgErr()
	}
	switch v {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, d.Errf("expected on or off, got %q", v)
}

func parsePositive(d *caddyfile.Dispenser) (int, error) {
	var v string
	if !d.AllArgs(&v) {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, d.Errf("expected a positive integer, got %q", v)
	}
	return n, nil
}

func parseSize(d *caddyfile.Dispenser) (int64, error) {
	var v string
	if !d.AllArgs(&v) {
		return 0, d.ArgErr()
	}
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > 1<<40 {
		return 0, d.Errf("expected a size such as 32MiB, got %q", v)
	}
	return int64(n), nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Policy)(nil)
)
