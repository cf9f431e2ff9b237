package caddymodule

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
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
//	    # finding the conversation
//	    session_headers     <header...>
//	    agent_header        <header>|off
//	    parent_agent_header <header>|off
//	    session_end_headers <header...>|on|off
//	    body_keys           on|off
//	    fingerprint         on|off
//	    fingerprint_bytes   <size>
//	    restart_detection   on|off
//	    # the request and the reply
//	    model_var           on|off
//	    max_body            <size>
//	    error_response      api|caddy
//	    strip_billing_block on|off
//	    # recording
//	    trace               <file> [<max_size>]
//	}
//
// Every switch takes on|off (true|false too) and is a boolean of the same
// name in the JSON, absent for its default; a header that is off is stored
// as "-".
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		var err error
		switch opt := d.Val(); opt {
		case "session_headers":
			h.SessionHeaders, err = parseList(d)
		case "agent_header":
			h.AgentHeader, err = parseHeaderOrOff(d)
		case "parent_agent_header":
			h.ParentAgentHeader, err = parseHeaderOrOff(d)
		case "session_end_headers":
			h.SessionEndHeaders, err = parseList(d)
			if len(h.SessionEndHeaders) == 1 && h.SessionEndHeaders[0] == "off" {
				h.SessionEndHeaders = []string{"-"}
			} else if len(h.SessionEndHeaders) == 1 && h.SessionEndHeaders[0] == "on" {
				h.SessionEndHeaders = []string{SessionEndHeader}
			}
		case "body_keys":
			h.BodyKeys, err = parseSwitch(d)
		case "fingerprint":
			h.Fingerprint, err = parseSwitch(d)
		case "fingerprint_bytes":
			var n int64
			n, err = parseSize(d)
			h.FingerprintBytes = int(n)
		case "restart_detection":
			h.RestartDetection, err = parseSwitch(d)
		case "model_var":
			h.ModelVar, err = parseSwitch(d)
		case "max_body":
			h.MaxBody, err = parseSize(d)
		case "error_response":
			h.ErrorResponse, err = parseArg(d)
			if err == nil && h.ErrorResponse != "api" && h.ErrorResponse != "caddy" {
				err = d.Errf("error_response must be api or caddy, got %q", h.ErrorResponse)
			}
		case "strip_billing_block":
			h.StripBillingBlock, err = parseOnOff(d)
		case "trace":
			err = h.unmarshalTrace(d)
		default:
			err = d.Errf("unrecognized lm_warden option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the policy from the tokens of
//
//	lb_policy lm_warden [<model>] {
//	    model              <name>
//	    max_num_seqs       <n>
//	    data_parallel_size <n>
//	    affinity           on|off
//	    admission          on|off
//	    kv_tokens          <n>
//	    admit_queue        <n>
//	    store redis { ... }  (see unmarshalStore)
//	    metrics_path       <path>
//	    poll_scheme        http|https
//	    client_pin_header  <header>
//	    route_header       on|off
//	}
//
// The model may also be given inline: `lb_policy lm_warden <name>`. Every
// switch takes on|off (true|false too). The deprecated options
// (deprecatedOptions) still load, and Provision warns of each.
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // policy name
	if d.NextArg() {
		p.Model = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	for d.NextBlock(0) {
		var err error
		switch opt := d.Val(); opt {
		// placement
		case "model":
			p.Model, err = parseArg(d)
		case "max_num_seqs":
			p.MaxNumSeqs, err = parsePositive(d)
		case "data_parallel_size":
			p.DataParallelSize, err = parsePositive(d)
		case "affinity":
			p.Affinity, err = parseSwitch(d)
		// admission
		case "admission":
			p.Admission, err = parseSwitch(d)
		case "kv_tokens":
			p.KVTokens, err = parsePositive(d)
		case "admit_queue":
			p.AdmitQueue, err = parsePositive(d)
		case "store":
			err = p.unmarshalStore(d)
		// the replicas' metrics
		case "metrics_path":
			p.MetricsPath, err = parseArg(d)
			if err == nil && !strings.HasPrefix(p.MetricsPath, "/") {
				err = d.Errf("metrics_path must start with /: %q", p.MetricsPath)
			}
		case "poll_scheme":
			p.PollScheme, err = parseArg(d)
		case "client_pin_header":
			p.ClientPinHeader, err = parseArg(d)
		case "route_header":
			p.RouteHeader, err = parseSwitch(d)
		default:
			if dep, ok := deprecatedOptions[opt]; ok {
				err = dep.parse(p, d, opt)
			} else {
				err = d.Errf("unrecognized lm_warden policy option %q", opt)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalStore parses the policy's store block:
//
//	store redis {
//	    address         <host:port>
//	    username        <user>
//	    password        <password>
//	    db              <n>
//	    tls             [on|off]
//	    tls_server_name <name>
//	    prefix          <prefix>
//	    timeout         <duration>
//	}
func (p *Policy) unmarshalStore(d *caddyfile.Dispenser) error {
	var typ string
	if !d.AllArgs(&typ) {
		return d.Errf("store needs its type: store redis { ... }")
	}
	if typ != "redis" {
		return d.Errf("store type must be redis, got %q", typ)
	}
	sc := &StoreConfig{Type: typ}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "address":
			sc.Address, err = parseArg(d)
		case "username":
			sc.Username, err = parseArg(d)
		case "password":
			sc.Password, err = parseArg(d)
		case "db":
			var v string
			if v, err = parseArg(d); err == nil {
				n, aerr := strconv.Atoi(v)
				if aerr != nil || n < 0 {
					return d.Errf("db must be a non-negative integer, got %q", v)
				}
				sc.DB = n
			}
		case "tls":
			args := d.RemainingArgs()
			switch {
			case len(args) == 0:
				sc.TLS = true
			case len(args) == 1 && (args[0] == "on" || args[0] == "off"):
				sc.TLS = args[0] == "on"
			default:
				err = d.Errf("tls takes no argument, or on|off")
			}
		case "tls_server_name":
			sc.TLSServerName, err = parseArg(d)
		case "prefix":
			sc.Prefix, err = parseArg(d)
			if err == nil && sc.Prefix == "" {
				err = d.Errf("prefix must not be empty")
			}
		case "timeout":
			sc.Timeout, err = parseDuration(d, opt)
		default:
			err = d.Errf("unrecognized store option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	p.Store = sc
	return nil
}

// parseArg reads an option's single argument.
func parseArg(d *caddyfile.Dispenser) (string, error) {
	var v string
	if !d.AllArgs(&v) {
		return "", d.ArgErr()
	}
	return v, nil
}

// parseList reads an option's one or more arguments.
func parseList(d *caddyfile.Dispenser) ([]string, error) {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.ArgErr()
	}
	return args, nil
}

// parseHeaderOrOff reads a header name, or off, stored as "-".
func parseHeaderOrOff(d *caddyfile.Dispenser) (string, error) {
	v, err := parseArg(d)
	if v == "off" {
		v = "-"
	}
	return v, err
}

// parseSwitch reads on|off into an optional boolean (nil: the default).
func parseSwitch(d *caddyfile.Dispenser) (*bool, error) {
	on, err := parseOnOff(d)
	if err != nil {
		return nil, err
	}
	return &on, nil
}

// parsePositiveOr reads a positive integer, or the word that stands for
// the value word (auto or off).
func parsePositiveOr(d *caddyfile.Dispenser, opt, word string, wordValue int) (int, error) {
	v, err := parseArg(d)
	if err != nil {
		return 0, err
	}
	if v == word {
		return wordValue, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, d.Errf("%s must be %s or a positive integer, got %q", opt, word, v)
	}
	return n, nil
}

// parsePositiveFloat reads a positive number.
func parsePositiveFloat(d *caddyfile.Dispenser, opt string) (float64, error) {
	v, err := parseArg(d)
	if err != nil {
		return 0, err
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		return 0, d.Errf("%s must be a positive number, got %q", opt, v)
	}
	return f, nil
}

// parseDuration reads a positive duration.
func parseDuration(d *caddyfile.Dispenser, opt string) (caddy.Duration, error) {
	v, err := parseArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur <= 0 {
		return 0, d.Errf("%s must be a positive duration, got %q", opt, v)
	}
	return caddy.Duration(dur), nil
}

// parseOnOff reads on|off (or true|false).
func parseOnOff(d *caddyfile.Dispenser) (bool, error) {
	v, err := parseArg(d)
	if err != nil {
		return false, err
	}
	switch v {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, d.Errf("expected on or off, got %q", v)
}

// parsePositive reads a positive integer.
func parsePositive(d *caddyfile.Dispenser) (int, error) {
	v, err := parseArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, d.Errf("expected a positive integer, got %q", v)
	}
	return n, nil
}

// parseSize reads a size such as 32MiB.
func parseSize(d *caddyfile.Dispenser) (int64, error) {
	v, err := parseArg(d)
	if err != nil {
		return 0, err
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
