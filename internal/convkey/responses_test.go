package convkey

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// responsesBody is a Responses API request as Codex shapes it: model,
// instructions, input items (a developer message, the environment as a
// user message, the task, then turns of function calls and outputs),
// tools, and prompt_cache_key after them.
func responsesBody(task string, turns int, key string) string {
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-4b","instructions":"You are a coding agent.","input":[`)
	b.WriteString(`{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions>sandboxed</permissions>"}]},`)
	b.WriteString(`{"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context>/work</environment_context>"}]},`)
	b.WriteString(`{"type":"message","role":"user","content":[{"type":"input_text","text":"` + task + `"}]}`)
	for i := 0; i < turns; i++ {
		b.WriteString(`,{"type":"function_call","name":"shell","arguments":"{\"cmd\":\"ls\"}","call_id":"c` + strings.Repeat("x", i) + `"}`)
		b.WriteString(`,{"type":"function_call_output","call_id":"c","output":"` + strings.Repeat("file.go ", 50) + `"}`)
	}
	b.WriteString(`],"tools":[{"type":"function","name":"shell"}],"tool_choice":"auto","store":false,"stream":true`)
	if key != "" {
		b.WriteString(`,"prompt_cache_key":"` + key + `"`)
	}
	b.WriteString(`}`)
	return b.String()
}

func TestResponsesStart(t *testing.T) {
	t.Parallel()
	const lim = DefaultFingerprintBytes
	first := responsesBody("fix the bug", 0, "k")
	fp := FingerprintOf(first, lim, ShapeResponses)
	start := StartFingerprintOf(first, lim, ShapeResponses)
	if fp == "" || start == 0 {
		t.Fatalf("fingerprint %q start %x: want both", fp, start)
	}
	if _, lone := SplitStart(start); lone {
		t.Fatal("a developer message then user messages read as one message")
	}
	for _, tc := range []struct {
		name string
		body string
		same bool
	}{
		{"later turn", responsesBody("fix the bug", 6, "k"), true},
		{"other key, same start", responsesBody("fix the bug", 2, "other"), true},
		{"other task", responsesBody("write tests", 0, "k"), true}, // the start ends at the first user message: the environment
		{"other instructions", strings.Replace(first, "a coding agent", "a reviewer", 1), false},
		{"other environment", strings.Replace(first, "/work", "/srv", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := FingerprintOf(tc.body, lim, ShapeResponses); (got == fp) != tc.same {
				t.Errorf("fingerprint %q, first turn's %q, want same=%v", got, fp, tc.same)
			}
			if tc.name == "other instructions" {
				return // the restart start leaves the system prompt out
			}
			if got := StartFingerprintOf(tc.body, lim, ShapeResponses); (got == start) != tc.same {
				t.Errorf("start %x, first turn's %x, want same=%v", got, start, tc.same)
			}
		})
	}
	// the same conversation read as chat messages has no start at all
	if got := StartFingerprint(first, lim); got != 0 {
		t.Errorf("read as messages: start %x, want 0", got)
	}
	// one string of input is one user message
	s := `{"model":"m","instructions":"i","input":"Write a title"}`
	if st, lone := SplitStart(StartFingerprintOf(s, lim, ShapeResponses)); st == 0 || !lone {
		t.Errorf("string input: start %x lone %v, want a start, lone", st, lone)
	}
	for _, body := range []string{first, responsesBody("x", 3, ""), s, `{"model":"m","input":[{"role":"user","content":"a"}]}`} {
		full := StartFingerprintOf(body, lim, ShapeResponses)
		for cut := 1; cut < len(body); cut++ {
			if got, ok := StartFromPrefixOf(body[:cut], lim, ShapeResponses); ok && got != full {
				t.Fatalf("%s: from %d bytes %x, whole body %x", body, cut, got, full)
			}
		}
	}
}

func TestPromptCacheKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("y", 300)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"codex", responsesBody("t", 3, "019b-thread"), "019b-thread"},
		{"first member", `{"prompt_cache_key":"a","input":[]}`, "a"},
		{"spaces", `{"input":[] , "prompt_cache_key" :  " b " }`, "b"},
		{"absent", responsesBody("t", 1, ""), ""},
		{"nested only", `{"input":[{"prompt_cache_key":"no"}],"x":{"prompt_cache_key":"no"}}`, ""},
		{"nested after top", `{"prompt_cache_key":"top","x":{"prompt_cache_key":"no"}}`, "top"},
		{"not a string", `{"prompt_cache_key":7}`, ""},
		{"null", `{"prompt_cache_key":null}`, ""},
		{"empty", `{"prompt_cache_key":""}`, ""},
		{"escaped name", `{"prompt_cache_\u006bey":"esc"}`, "esc"},
		{"escaped value", `{"prompt_cache_key":"a\"b"}`, `a"b`},
		{"in a string", `{"input":"say \"prompt_cache_key\":\"no\"","z":1}`, ""},
		{"long", `{"prompt_cache_key":"` + long + `"}`, Compact(long)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PromptCacheKey(tc.body); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func FuzzResponsesKeys(f *testing.F) {
	f.Add(responsesBody("hello", 2, "k1"))
	f.Add(`{"model":"m","input":"one string","prompt_cache_key":"k"}`)
	f.Add(`{"input":[{"prompt_cache_key":"no"}],"prompt_cache_key":"yes"}`)
	f.Add(`{"prompt_cache_\u006bey":"esc","input":[{"role":"developer","content":"d"},{"role":"user","content":[{"type":"input_text","text":"u"}]}]}`)
	f.Fuzz(func(t *testing.T, body string) {
		k := PromptCacheKey(body)
		if len(k) > MaxKeyLen {
			t.Fatalf("key longer than %d: %d", MaxKeyLen, len(k))
		}
		// from the end or from the start, the same top-level member
		if gjson.Valid(body) {
			want := ""
			if v := gjson.Get(body, "prompt_cache_key"); v.Type == gjson.String && strings.TrimSpace(v.Str) != "" {
				want = Compact(strings.TrimSpace(v.Str))
			}
			if strings.Count(body, `"prompt_cache_key"`) <= 1 && k != want {
				t.Fatalf("key %q, from the start %q", k, want)
			}
			full := StartFingerprintOf(body, 256, ShapeResponses)
			for _, cut := range []int{len(body) / 3, len(body) / 2, len(body) - 1} {
				if cut <= 0 {
					continue
				}
				if fp, ok := StartFromPrefixOf(body[:cut], 256, ShapeResponses); ok && fp != full {
					t.Fatalf("start from %d of %d bytes %x, whole body's %x", cut, len(body), fp, full)
				}
			}
		}
		if fp := FingerprintOf(body, 256, ShapeResponses); fp != "" && len(fp) != len(fingerprintPrefix)+32 {
			t.Fatalf("bad fingerprint %q", fp)
		}
	})
}
