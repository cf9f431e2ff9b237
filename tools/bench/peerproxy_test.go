package bench

import (
	"slices"
	"testing"
)

// TestRenderRequestExtends: a conversation's next turn renders to this
// turn's tokens plus the new messages' (what the peers' prefix indexes
// rely on), in both APIs, and the first user message is found.
func TestRenderRequestExtends(t *testing.T) {
	for _, tc := range []struct{ name, one, two string }{
		{"anthropic",
			`{"system":[{"type":"text","text":"You are a coding agent."}],"messages":[{"role":"user","content":[{"type":"text","text":"fix the parser"}]}]}`,
			`{"system":[{"type":"text","text":"You are a coding agent."}],"messages":[{"role":"user","content":[{"type":"text","text":"fix the parser"}]},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"path":"a.go"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package a"}]}]}`},
		{"openai",
			`{"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"fix the parser"}]}`,
			`{"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"fix the parser"},{"role":"assistant","content":"done"},{"role":"user","content":"now the tests"}]}`},
	} {
		a, firstA := RenderRequest([]byte(tc.one))
		b, firstB := RenderRequest([]byte(tc.two))
		if len(a) == 0 || len(b) <= len(a) || !slices.Equal(a, b[:len(a)]) {
			t.Errorf("%s: turn 2 (%d tokens) does not extend turn 1 (%d)", tc.name, len(b), len(a))
		}
		if firstA != "fix the parser" || firstB != firstA {
			t.Errorf("%s: first user message %q, %q", tc.name, firstA, firstB)
		}
	}
	if toks, first := RenderRequest([]byte("not json")); toks != nil || first != "" {
		t.Errorf("bad body: %d tokens, %q", len(toks), first)
	}
}

// FuzzRenderRequest: any body renders or is refused, never panics, and
// the first user message is text of the body's.
func FuzzRenderRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":null}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		toks, first := RenderRequest(body)
		if first != "" && len(toks) == 0 {
			t.Fatalf("a first user message %q without tokens", first)
		}
	})
}
