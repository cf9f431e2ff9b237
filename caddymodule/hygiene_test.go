package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestStripBillingBlock(t *testing.T) {
	const billing = `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.37.3a1; cc_entrypoint=cli;"}`
	const sys = `{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}`
	tests := []struct {
		name, in, want string
	}{
		{"first of two", `{"model":"m","system":[` + billing + `,` + sys + `],"messages":[]}`, `{"model":"m","system":[` + sys + `],"messages":[]}`},
		{"spaces around", `{"system": [ ` + billing + ` ,  ` + sys + ` ], "messages": []}`, `{"system": [ ` + sys + ` ], "messages": []}`},
		{"the only block", `{"system":[` + billing + `]}`, `{"system":[]}`},
		{"after the messages", `{"messages":[{"role":"user","content":"x-anthropic-billing-header"}],"system":[` + billing + `,` + sys + `]}`,
			`{"messages":[{"role":"user","content":"x-anthropic-billing-header"}],"system":[` + sys + `]}`},
		{"not first", `{"system":[` + sys + `,` + billing + `]}`, ""},
		{"string system", `{"system":"x-anthropic-billing-header: cc_version=1;"}`, ""},
		{"no system", `{"messages":[{"role":"user","content":"hello"}]}`, ""},
		{"mention in text", `{"system":[{"type":"text","text":"see x-anthropic-billing-header"}]}`, ""},
		{"not JSON", `x-anthropic-billing-header`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := stripBillingBlock([]byte(tt.in))
			if tt.want == "" {
				if ok || string(got) != tt.in {
					t.Fatalf("changed: %s", got)
				}
				return
			}
			if !ok || string(got) != tt.want {
				t.Fatalf("got %s (%v)\nwant %s", got, ok, tt.want)
			}
			if !json.Valid(got) {
				t.Fatalf("not JSON: %s", got)
			}
		})
	}
}

func FuzzStripBillingBlock(f *testing.F) {
	f.Add([]byte(`{"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"},{"type":"text","text":"a"}]}`))
	f.Add([]byte(`{"system":[{"text":"x-anthropic-billing-header"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := stripBillingBlock(b)
		if !ok {
			if string(got) != string(b) {
				t.Fatal("changed without saying so")
			}
			return
		}
		if len(got) >= len(b) {
			t.Fatalf("removed nothing: %q", b)
		}
		if json.Valid(b) && !json.Valid(got) {
			t.Fatalf("valid %q became invalid %q", b, got)
		}
	})
}

// Through Caddy: with strip_billing_block on, the replica gets the body
// without Claude Code's billing block and the rest unchanged; off, as sent.
func TestStripBillingBlockThroughCaddy(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprint("on=", on), func(t *testing.T) {
			fs := startFakes(t, 1)
			opt := "off"
			if on {
				opt = "on"
			}
			loadSite(t, fmt.Sprintf(`
	lm_warden {
		strip_billing_block %s
	}
	reverse_proxy %s {
		%s
	}`, opt, dialList(fs), policyBlock("hygiene", "")))
			body := claudeBody("fix the bug", 3, "abc")
			res := sendTurn(t, "/v1/messages", body, map[string]string{"X-Claude-Code-Session-Id": "h1"})
			if res.status != http.StatusOK {
				t.Fatalf("%d %s", res.status, res.body)
			}
			got := fs[0].lastBody()
			has := strings.Contains(got, billingText)
			if has == on {
				t.Fatalf("billing block present %v with strip %s: %s", has, opt, got)
			}
			if gjson.Get(got, "messages.#").Int() != gjson.Get(body, "messages.#").Int() || gjson.Get(got, "system.#").Int() != gjson.Get(body, "system.#").Int()-map[bool]int64{true: 1, false: 0}[on] {
				t.Fatalf("body changed beyond the block: %s", got)
			}
		})
	}
}
