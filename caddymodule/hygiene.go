package caddymodule

import (
	"bytes"

	"github.com/tidwall/gjson"
)

// Prefix hygiene: Claude Code puts a per-conversation billing block first
// in an Anthropic request's system array,
//
//	{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.37.3a1; cc_entrypoint=cli; cch=…;"}
//
// An engine that caches prompt prefixes by tokens sees every conversation
// start differently, so the system prompt and tools that follow (tens of
// kB, the same for every conversation) are computed anew for each new one.
// vLLM's Anthropic front end drops the block itself since about v0.18;
// llama.cpp and SGLang do not. With strip_billing_block on, the handler
// removes it before the body goes on.

const billingText = "x-anthropic-billing-header"

// stripBillingBlock returns body without the first system block when that
// is Claude Code's billing block, and false (body unchanged) otherwise. It
// allocates only when it removes the block.
func stripBillingBlock(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(billingText)) {
		return body, false // the common case for other clients: one scan, no parse
	}
	first := gjson.GetBytes(body, "system.0")
	if !first.IsObject() || first.Index <= 0 || first.Index+len(first.Raw) > len(body) ||
		!bytes.Equal(body[first.Index:first.Index+len(first.Raw)], []byte(first.Raw)) {
		return body, false
	}
	text := first.Get("text")
	if text.Type != gjson.String || len(text.Str) < len(billingText) || text.Str[:len(billingText)] != billingText {
		return body, false
	}
	start, end := first.Index, first.Index+len(first.Raw)
	// drop the comma (and spaces) after it, when another block follows
	rest := end
	for rest < len(body) && isJSONSpace(body[rest]) {
		rest++
	}
	if rest < len(body) && body[rest] == ',' {
		end = rest + 1
		for end < len(body) && isJSONSpace(body[end]) {
			end++
		}
	}
	out := make([]byte, 0, len(body)-(end-start))
	out = append(out, body[:start]...)
	return append(out, body[end:]...), true
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
