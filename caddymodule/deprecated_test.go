package caddymodule

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// deprecatedValues is a valid Caddyfile value of each deprecated option.
var deprecatedValues = map[string]string{
	"spill_threshold": "8", "spill_waiting": "2", "idle_ttl": "2h", "active_window": "5m",
	"max_sessions": "5000", "fail_after": "4", "fail_cooldown": "2s", "abandon_after": "off",
	"admit_high_water": "0.9", "admit_window": "30s", "admit_wait": "2m", "rotate_turns": "4",
	"poll_interval": "2s", "poll_timeout": "1500ms", "bytes_per_token": "3.5",
	"engine": "sglang",
}

// TestDeprecatedOptionsLoadAndWarn: every deprecated option still parses
// (and sets its field, which the router still applies) and yields exactly
// one warning that names it; the options that stay yield none.
func TestDeprecatedOptionsLoadAndWarn(t *testing.T) {
	t.Parallel()
	if got, want := deprecatedNames(), slices.Sorted(maps.Keys(deprecatedValues)); !slices.Equal(got, want) {
		t.Fatalf("deprecated options %v; this test has values for %v", got, want)
	}
	for _, name := range deprecatedNames() {
		t.Run(name, func(t *testing.T) {
			p := new(Policy)
			in := fmt.Sprintf("lm_warden m {\n%s %s\n}", name, deprecatedValues[name])
			if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
				t.Fatalf("%s no longer loads: %v", name, err)
			}
			if err := p.Validate(); err != nil {
				t.Fatalf("%s %s: %v", name, deprecatedValues[name], err)
			}
			w := p.deprecations()
			if len(w) != 1 || !strings.Contains(w[0], "option "+name+" is deprecated") {
				t.Fatalf("warnings %q; want one naming %s", w, name)
			}
		})
	}
	p := new(Policy)
	current := `lm_warden m {
		max_num_seqs 32
		data_parallel_size 2
		affinity on
		admission on
		kv_tokens 36800
		admit_queue 64
		metrics_path /metrics
		poll_scheme http
		client_pin_header X-Replica
		route_header on
	}`
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(current)); err != nil {
		t.Fatal(err)
	}
	if w := p.deprecations(); len(w) != 0 {
		t.Fatalf("current options warned: %q", w)
	}
}

// TestDeprecatedOptionsApply: a deprecated option still changes what the
// router does in this release (its placement.Config).
func TestDeprecatedOptionsApply(t *testing.T) {
	t.Parallel()
	p := new(Policy)
	in := "lm_warden m {\nspill_threshold 3\nrotate_turns off\nadmit_window 30s\n}"
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	c := p.routerConfig()
	if c.SpillThreshold != 3 || c.RotateTurns != -1 || c.AdmitWindow.Seconds() != 30 {
		t.Fatalf("router config %+v; want spill threshold 3, rotate_turns -1, admit window 30s", c)
	}
}

// TestDeprecatedOptionsDocumented: docs/deprecated.md has a row for every
// deprecated option and none for another.
func TestDeprecatedOptionsDocumented(t *testing.T) {
	t.Parallel()
	page := docPages(t)[filepath.Join("..", "docs", "deprecated.md")]
	if page == "" {
		t.Fatal("docs/deprecated.md is missing")
	}
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(page, -1) {
		rows = append(rows, m[1])
	}
	slices.Sort(rows)
	if want := deprecatedNames(); !slices.Equal(rows, want) {
		t.Fatalf("docs/deprecated.md's rows %v; the deprecated options are %v", rows, want)
	}
}

// TestDeprecatedOptionWarnsAtLoad: Caddy loading a configuration with a
// deprecated option logs the warning (the policy's Provision) and serves.
func TestDeprecatedOptionWarnsAtLoad(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	up := freeLoopbackPort(t)
	port := freeLoopbackPort(t)
	site := fmt.Sprintf(`reverse_proxy 127.0.0.1:%d {
		lb_policy lm_warden deprecated-warns {
			fail_cooldown 2s
		}
	}`, up)
	extra := fmt.Sprintf("\tpersist_config off\n\tlog {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel WARN\n\t}\n", logFile)
	cfg := globalOptions(fmt.Sprintf("127.0.0.1:%d", robustAdminPort(t)), port, extra) +
		fmt.Sprintf("http://127.0.0.1:%d {\n%s\n}\n", port, site)
	if err := loadCaddyfile(cfg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "lm_warden policy option fail_cooldown is deprecated") || !strings.Contains(string(b), `"model":"deprecated-warns"`) {
		t.Fatalf("Caddy's log has no warning of fail_cooldown for the model:\n%s", b)
	}
}

// deprecatedNames returns the deprecated options' names, sorted.
func deprecatedNames() []string { return slices.Sorted(maps.Keys(deprecatedOptions)) }
