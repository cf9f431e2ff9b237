package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestHandleErrorsRuns checks Caddy's error idiom: a failure the handler
// meets (no replica answering; a body over max_body) goes to the site's
// handle_errors when it has one, is an empty response with the status under
// error_response caddy, and is a JSON error in the request's API format
// otherwise.
func TestHandleErrorsRuns(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t)) // nothing listens
	site := func(handlerOpts, errorsBlock string) string {
		return fmt.Sprintf(`
	lm_warden {
		max_body 1KiB
		%s
	}
	reverse_proxy %s {
		lb_policy lm_warden {
			model handle-errors
		}
	}
	%s`, handlerOpts, dead, errorsBlock)
	}
	const withErrors = `handle_errors {
		respond "custom {err.status_code}" {err.status_code}
	}`
	small := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`
	cases := []struct {
		name, opts, errs, path, body string
		wantStatus                   []int // any of
		wantBody                     string
	}{
		{"handle_errors, dead replica", "", withErrors, "/v1/messages", small,
			[]int{http.StatusBadGateway, http.StatusServiceUnavailable}, "custom 50"},
		{"handle_errors, body too big", "", withErrors, "/v1/messages", big,
			[]int{http.StatusRequestEntityTooLarge}, "custom 413"},
		{"default: Anthropic JSON", "", "", "/v1/messages", small,
			[]int{http.StatusBadGateway, http.StatusServiceUnavailable}, `"type":"error"`},
		{"default: OpenAI JSON, too big", "", "", "/v1/chat/completions", big,
			[]int{http.StatusRequestEntityTooLarge}, `"code":413`},
		{"error_response caddy: bare status", "error_response caddy", "", "/v1/messages", small,
			[]int{http.StatusBadGateway, http.StatusServiceUnavailable}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := loadRobustSite(t, site(c.opts, c.errs))
			req, _ := http.NewRequest(http.MethodPost, rs.url+c.path, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", "handle-errors-1")
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			okStatus := false
			for _, s := range c.wantStatus {
				okStatus = okStatus || resp.StatusCode == s
			}
			if !okStatus || (c.wantBody == "" && len(b) != 0) || !strings.Contains(string(b), c.wantBody) {
				t.Fatalf("status %d body %q, want one of %v with %q", resp.StatusCode, b, c.wantStatus, c.wantBody)
			}
		})
	}
}
