package caddymodule

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

var droppedRuns int

// TestUnderscoreSessionHeader: Caddy drops a session header named with
// "_" before the handler runs, so three requests carrying session_id get
// no key (three per-request picks) and Provision's warning names
// expected_underscore_headers; with the header listed there, the same
// requests are one conversation (placed, then sticky) and nothing is
// logged.
func TestUnderscoreSessionHeader(t *testing.T) {
	fs := startFakes(t, 3)
	for _, expect := range []bool{false, true} {
		t.Run(fmt.Sprintf("expected_%v", expect), func(t *testing.T) {
			droppedRuns++
			model := fmt.Sprintf("underscore-%d", droppedRuns)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			servers := "\t\tprotocols h1 h2c\n"
			if expect {
				servers += "\t\texpected_underscore_headers session_id\n"
			}
			cfg := fmt.Sprintf(`{
	admin localhost:%d
	http_port %d
	https_port %d
	auto_https off
	default_bind 127.0.0.1
	skip_install_trust
	grace_period 1s
	log {
		output file %s
		format json
	}
	servers {
%s	}
}
http://127.0.0.1:%d {
	lm_warden {
		session_headers session_id X-Session-Id
		fingerprint off
	}
	reverse_proxy %s {
		%s
	}
}
`, testAdminPort, testHTTPPort, testHTTPPort+1, logFile, servers, testHTTPPort, dialList(fs), policyBlock(model, ""))
			tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: testAdminPort, LoadRequestTimeout: 15 * time.Second})
			tc.InitServer(cfg, "caddyfile")
			if t.Failed() {
				t.FailNow()
			}
			var reasons []string
			for range 3 {
				res := sendTurn(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, map[string]string{"session_id": "conv-7"})
				if res.status != 200 {
					t.Fatalf("%d %s", res.status, res.body)
				}
				reasons = append(reasons, res.reason)
			}
			want := []string{"no-key", "no-key", "no-key"}
			if expect {
				want = []string{"placed", "sticky", "sticky"}
			}
			if strings.Join(reasons, " ") != strings.Join(want, " ") {
				t.Errorf("reasons %v, want %v", reasons, want)
			}
			b, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			var warned int
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, `"header":"session_id"`) && strings.Contains(line, "expected_underscore_headers") && strings.Contains(line, `"level":"warn"`) {
					warned++
				}
			}
			if (warned > 0) == expect {
				t.Errorf("%d warnings about session_id in the log, want them only when the server does not expect it:\n%s", warned, b)
			}
		})
	}
}

// TestHeaderListed: entries match as Caddy's allowlists do.
func TestHeaderListed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		list  []string
		globs bool
		want  bool
	}{
		{"session_id", []string{"Session_Id"}, true, true},
		{"session_id", []string{"session-id"}, true, false},
		{"session_id", []string{"session_*"}, true, true},
		{"session_id", []string{"session_*"}, false, false},
		{"x_session_id", []string{"session_*"}, true, false},
		{"session_id", nil, true, false},
	} {
		if got := headerListed(tc.name, tc.list, tc.globs); got != tc.want {
			t.Errorf("headerListed(%q, %q, %v) = %v, want %v", tc.name, tc.list, tc.globs, got, tc.want)
		}
	}
}
