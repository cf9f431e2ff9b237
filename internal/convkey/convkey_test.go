package convkey

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

func TestFromHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		hdr         map[string]string
		key, parent string
	}{
		{"none", nil, "", ""},
		{"claude code", map[string]string{"X-Claude-Code-Session-Id": "s1"}, "s1", ""},
		{"order: claude code wins", map[string]string{"X-Session-Id": "late", "X-Claude-Code-Session-Id": "s1"}, "s1", ""},
		{"opencode", map[string]string{"x-session-affinity": "oc"}, "oc", ""},
		{"underscore: not a default (Caddy drops it)", map[string]string{"session_id": "cx"}, "", ""},
		{"codex dash", map[string]string{"session-id": "cx2"}, "cx2", ""},
		{"gateway", map[string]string{"x-session-id": "gw"}, "gw", ""},
		{"blank skipped", map[string]string{"X-Claude-Code-Session-Id": "  ", "x-session-id": "gw"}, "gw", ""},
		{"sub-agent", map[string]string{"X-Claude-Code-Session-Id": "s1", "X-Claude-Code-Agent-Id": "a7"}, "s1/a7", "s1"},
		{"sub-agent of sub-agent", map[string]string{"X-Claude-Code-Session-Id": "s1", "X-Claude-Code-Agent-Id": "a8", "X-Claude-Code-Parent-Agent-Id": "a7"}, "s1/a8", "s1/a7"},
		{"agent without session", map[string]string{"X-Claude-Code-Agent-Id": "a7"}, "", ""},
		{"request id is never a key", map[string]string{"x-client-request-id": "r1"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tt.hdr {
				h.Set(k, v)
			}
			key, parent := DefaultExtractor.FromHeaders(h)
			if key != tt.key || parent != tt.parent {
				t.Fatalf("got (%q, %q), want (%q, %q)", key, parent, tt.key, tt.parent)
			}
		})
	}
}

// Keys longer than maxKeyLen are kept compact, but the whole key decides the
// binding: two keys differing only in their last byte are two conversations.
func TestLongKeysDifferingAtTheEnd(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 1000)
	tests := []struct {
		name string
		key  func(tail string) string
	}{
		{"header", func(tail string) string {
			h := http.Header{}
			h.Set("X-Session-Id", long+tail)
			k, _ := DefaultExtractor.FromHeaders(h)
			return k
		}},
		{"agent header", func(tail string) string {
			h := http.Header{}
			h.Set("X-Session-Id", "s")
			h.Set("X-Claude-Code-Agent-Id", long+tail)
			k, _ := DefaultExtractor.FromHeaders(h)
			return k
		}},
		{"body session_id", func(tail string) string {
			return SessionFromBody(`{"metadata":{"session_id":"` + long + tail + `"}}`)
		}},
		{"body user_id", func(tail string) string {
			return SessionFromBody(`{"metadata":{"user_id":"user_a_account_b_session_` + long + tail + `"}}`)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := tt.key("a"), tt.key("b")
			if a == b {
				t.Fatalf("keys differing at byte 1001 collapsed to %q", a)
			}
			if len(a) > MaxKeyLen+2 || len(b) > MaxKeyLen+2 { // +"s/" for the agent form
				t.Fatalf("key lengths %d, %d: not compact", len(a), len(b))
			}
			if tt.key("a") != a {
				t.Fatal("compact key not deterministic")
			}
			r := placement.NewRouter(placement.Config{})
			r.SetReplicas([]string{"r0", "r1"})
			for _, k := range []string{a, b} {
				d, err := r.Route(placement.Request{Key: k})
				if err != nil {
					t.Fatal(err)
				}
				d.Release()
			}
			if r.Len() != 2 {
				t.Fatalf("%d bindings for two conversations", r.Len())
			}
		})
	}
	if k := Compact("short"); k != "short" {
		t.Fatalf("short key changed: %q", k)
	}
	if k := Compact(strings.Repeat("y", MaxKeyLen)); len(k) != MaxKeyLen || strings.Contains(k, "~") {
		t.Fatal("a key of exactly MaxKeyLen bytes must stay as it is")
	}
}

func TestSessionFromBody(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, body, want string }{
		{"user_id session form", `{"model":"m","metadata":{"user_id":"user_abc123_account_0f3e_session_2b1e-77"}}`, "2b1e-77"},
		{"user_id json form", `{"metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"9c0d\"}"}}`, "9c0d"},
		{"session_id field", `{"metadata":{"session_id":"s-42"}}`, "s-42"},
		{"user_id without session falls to session_id", `{"metadata":{"user_id":"user_abc","session_id":"s-43"}}`, "s-43"},
		{"plain user id is no key", `{"metadata":{"user_id":"user_abc"}}`, ""},
		{"no metadata", `{"model":"m","messages":[]}`, ""},
		{"metadata not object", `{"metadata":"x"}`, ""},
		{"empty session", `{"metadata":{"user_id":"user_a_session_"}}`, ""},
		{"not json", `garbage`, ""},
		{"keys after metadata", `{"messages":[],"metadata":{"user_id":"user_x_session_s1"},"max_tokens":5,"stream":true}`, "s1"},
		{"nested metadata is not the client's", `{"tools":[{"metadata":{"session_id":"nested"}}],"messages":[]}`, ""},
		{"nested after top-level", `{"metadata":{"user_id":"user_a_session_top"},"tools":[{"input_schema":{"metadata":{"session_id":"nested"}}}]}`, "top"},
		{"nested last in an array", `{"metadata":{"session_id":"top"},"tools":[{"metadata":{"session_id":"nested"}}]}`, "top"},
		{"metadata in a string", `{"metadata":{"session_id":"top"},"messages":[{"role":"user","content":""metadata":{"session_id":"fake"}"}]}`, "top"},
		// a member name may spell its letters as escapes: found from the start
		{"escaped member name", `{"metad\u0061ta":{"session_id":"esc"},"messages":[]}`, "esc"},
		{"no metadata, escapes elsewhere", `{"messages":[{"role":"user","content":"caf\u00e9"}]}`, ""},
		{"metadata only in the text", `{"messages":[{"role":"user","content":"the \"metadata\" field"}]}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SessionFromBody(tt.body); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// conversation renders an Anthropic request body of a conversation after n
// turns, as Claude Code does: a billing block that changes every request,
// cache_control on the last message only.
func claudeBody(first string, n int, billing string) string {
	var b strings.Builder
	b.WriteString(`{"model":"qwen3-4b","max_tokens":256,"stream":true,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=` + billing + `;"},{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[`)
	msgs := []string{`{"role":"user","content":[{"type":"text","text":"` + first + `"}]}`}
	for i := 1; i < n; i++ {
		msgs = append(msgs, `{"role":"assistant","content":[{"type":"text","text":"answer"}]}`,
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"ok"}]}`)
	}
	last := msgs[len(msgs)-1]
	msgs[len(msgs)-1] = strings.Replace(last, `}]}`, `,"cache_control":{"type":"ephemeral"}}]}`, 1)
	b.WriteString(strings.Join(msgs, ","))
	b.WriteString(`]}`)
	return b.String()
}

func TestFingerprintStableAcrossTurns(t *testing.T) {
	t.Parallel()
	first := Fingerprint(claudeBody("fix the bug in main.go", 1, "aaa"), DefaultFingerprintBytes)
	if !strings.HasPrefix(first, fingerprintPrefix) || len(first) != len(fingerprintPrefix)+32 {
		t.Fatalf("unexpected fingerprint %q", first)
	}
	for turn := 2; turn <= 6; turn++ {
		got := Fingerprint(claudeBody("fix the bug in main.go", turn, strings.Repeat("b", turn)), DefaultFingerprintBytes)
		if got != first {
			t.Fatalf("turn %d: fingerprint %q differs from first turn's %q", turn, got, first)
		}
	}
	other := Fingerprint(claudeBody("write the tests", 1, "aaa"), DefaultFingerprintBytes)
	if other == first {
		t.Fatal("different conversations share a fingerprint")
	}
}

func TestFingerprintOpenAIAndBounds(t *testing.T) {
	t.Parallel()
	a := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"},{"role":"assistant","content":"hi"}]}`
	b := `{"model":"m","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"},{"role":"assistant","content":"hi"},{"role":"user","content":"more"}]}`
	if Fingerprint(a, 1024) != Fingerprint(b, 1024) || Fingerprint(a, 1024) == "" {
		t.Fatal("OpenAI conversation's fingerprint changed between turns")
	}
	if got := Fingerprint(`{"model":"m","messages":[]}`, 1024); got != "" {
		t.Fatalf("empty conversation got fingerprint %q", got)
	}
	// only the first limit bytes count
	long1 := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 100) + `x"}]}`
	long2 := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", 100) + `y"}]}`
	if Fingerprint(long1, 50) != Fingerprint(long2, 50) {
		t.Fatal("bytes past the limit changed the fingerprint")
	}
	if Fingerprint(long1, 4096) == Fingerprint(long2, 4096) {
		t.Fatal("bytes within the limit did not change the fingerprint")
	}
}

func FuzzBodyKeys(f *testing.F) {
	f.Add(claudeBody("hello", 3, "x"))
	f.Add(`{"metadata":{"user_id":"user_a_account_b_session_c"}}`)
	f.Add(`{"metadata":{"user_id":"{\"session_id\":\"s\"}"}}`)
	f.Add(`{"system":"s","messages":[{"role":"user","content":[1,{"type":"image"}]}]}`)
	f.Add(`{"messages":[],"metadata":{"user_id":"u_session_s"},"stream":true}`)
	f.Add(`{"tools":[{"metadata":{"a":"}"}}],"x":1}`)
	f.Add(`{"metad\u0061ta":{"session_id":"esc"}}`)
	f.Fuzz(func(t *testing.T, body string) {
		if k := SessionFromBody(body); len(k) > MaxKeyLen {
			t.Fatalf("key longer than %d: %d", MaxKeyLen, len(k))
		}
		fp := Fingerprint(body, 256)
		if fp != "" && len(fp) != len(fingerprintPrefix)+32 {
			t.Fatalf("bad fingerprint %q", fp)
		}
		if fp != Fingerprint(body, 256) {
			t.Fatal("fingerprint not deterministic")
		}
		if m, _ := ModelFromBody(body); len(m) > MaxKeyLen {
			t.Fatalf("model longer than %d: %d", MaxKeyLen, len(m))
		}
		// the start read from any first bytes of a valid body is the
		// whole body's start, or refused
		if gjson.Valid(body) {
			full := StartFingerprint(body, 256)
			for _, cut := range []int{len(body) / 3, len(body) / 2, len(body) - 1} {
				if cut <= 0 {
					continue
				}
				if fp, ok := StartFromPrefix(body[:cut], 256); ok && fp != full {
					t.Fatalf("start from %d of %d bytes %x, whole body's %x", cut, len(body), fp, full)
				}
			}
		}
		if got, want := lastIndex(body, `"metadata"`), strings.LastIndex(body, `"metadata"`); got != want {
			t.Fatalf("lastIndex %d, strings.LastIndex %d", got, want)
		}
		// a body without the member's name (and no escape to spell it)
		// has no key, as a lookup from the start finds
		if gjson.Valid(body) && !strings.Contains(body, `"metadata"`) {
			if got, want := SessionFromBody(body), sessionFromMetadata(gjson.Get(body, "metadata")); got != want {
				t.Fatalf("key %q, from the start %q", got, want)
			}
		}
		// the fast path from the end agrees with a lookup from the start
		if gjson.Valid(body) && strings.Count(body, `"metadata"`) == 1 {
			if v, ok, _ := trailingMetadata(body); ok {
				if full := gjson.Get(body, "metadata"); full.Raw != v.Raw {
					t.Fatalf("from the end %q, from the start %q", v.Raw, full.Raw)
				}
			}
		}
	})
}

// The start fingerprint is the fingerprint's hash as a number: stable over a
// conversation's turns (later messages, the billing block and cache_control
// markers change, the start does not), different after a compaction
// replaces the history with a summary, 0 when there is no start.
func TestStartFingerprint(t *testing.T) {
	t.Parallel()
	start, lone := SplitStart(StartFingerprint(claudeBody("fix the bug in main.go", 1, "aaa"), DefaultFingerprintBytes))
	if start == 0 || !lone {
		t.Fatalf("start %x, lone %v: want a start, and lone (one message)", start, lone)
	}
	tests := []struct {
		name string
		body string
		same bool
	}{
		{"later turn, new billing block", claudeBody("fix the bug in main.go", 7, "zzz"), true},
		{"compacted into a summary", claudeBody("This session is being continued from a previous conversation. Summary: …", 1, "aaa"), false},
		{"cleared, new task", claudeBody("write the tests", 1, "aaa"), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := SplitStart(StartFingerprint(tc.body, DefaultFingerprintBytes))
			if got == 0 || (got == start) != tc.same {
				t.Fatalf("start %x, first turn's %x, want same=%v", got, start, tc.same)
			}
		})
	}
	for _, body := range []string{`{}`, `{"model":"m"}`, `not json`, ``} {
		if got := StartFingerprint(body, DefaultFingerprintBytes); got != 0 {
			t.Errorf("StartFingerprint(%q) = %x, want 0", body, got)
		}
	}
}

// TestStartLone: the start's lone bit says whether the request holds one
// message, read from the same first bytes as the start: a body cut before
// it is known is refused.
func TestStartLone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		lone bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"Write a title"}],"max_tokens":64}`, true},
		{`{"model":"m","messages":[ {"role":"user","content":"Write a title"} ] }`, true},
		{`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"system","content":"env"}]}`, false},
		{`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}]}`, false},
		{`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"go on"}]}`, false},
	} {
		start, lone := SplitStart(StartFingerprint(tc.body, DefaultFingerprintBytes))
		if start == 0 || lone != tc.lone {
			t.Errorf("%s: start %x lone %v, want lone %v", tc.body, start, lone, tc.lone)
		}
		full := StartFingerprint(tc.body, DefaultFingerprintBytes)
		for cut := 1; cut < len(tc.body); cut++ {
			if fp, ok := StartFromPrefix(tc.body[:cut], DefaultFingerprintBytes); ok && fp != full {
				t.Errorf("%s: from %d bytes %x, whole body %x", tc.body, cut, fp, full)
			}
		}
	}
}

// TestModelFromBody: the first top-level "model" is the model; a second
// one near it (as an engine's parser would read the last) is reported, an
// escaped name included; "model" inside other members is not a member.
func TestModelFromBody(t *testing.T) {
	t.Parallel()
	far := `{"model":"a","messages":[{"role":"user","content":"` + strings.Repeat("x", SecondModelSpan) + `"}],"model":"b"}`
	for _, tc := range []struct {
		name, body string
		model      string
		twice      bool
	}{
		{"one", `{"model":"qwen3-4b","messages":[]}`, "qwen3-4b", false},
		{"model last", `{"messages":[{"role":"user","content":"hi"}],"model":"qwen3-4b"}`, "qwen3-4b", false},
		{"twice", `{"model":"a","max_tokens":1,"model":"b"}`, "a", true},
		{"twice, escaped name", `{"model":"a","mod\u0065l":"b"}`, "a", true},
		{"twice, escaped in capitals", `{"model":"a","\u006Dodel":"b"}`, "a", true},
		{"escapes in text only", `{"model":"a","messages":[{"role":"user","content":"\u4e2d\u00e9 \u0041"}]}`, "a", false},
		{"nested model", `{"model":"a","tools":[{"name":"Agent","input_schema":{"properties":{"model":{"type":"string"}}}}]}`, "a", false},
		{"model in text", `{"model":"a","messages":[{"role":"user","content":"the \"model\": field"}]}`, "a", false},
		{"escape in text", `{"model":"a","messages":[{"role":"user","content":"caf\u00e9"}]}`, "a", false},
		{"not a string", `{"model":7,"model":"b"}`, "", true},
		{"beyond the span", far, "a", false},
		{"none", `{"messages":[]}`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, twice := ModelFromBody(tc.body)
			if m != tc.model || twice != tc.twice {
				t.Fatalf("ModelFromBody = %q, %v; want %q, %v", m, twice, tc.model, tc.twice)
			}
		})
	}
}

// BenchmarkStart reads a captured Claude Code request's start from its first
// 4 KiB (restart detection on a bound turn) and its fingerprint key (a
// request without a key).
func BenchmarkStart(b *testing.B) {
	raw, err := os.ReadFile("../../caddymodule/testdata/claudecode/03-conv-a.json")
	if err != nil {
		b.Fatal(err)
	}
	body := string(raw)
	head := body[:min(len(body), 4<<10)]
	b.Run("restart-from-4KiB", func(b *testing.B) {
		b.SetBytes(int64(len(head)))
		b.ReportAllocs()
		for range b.N {
			if _, ok := StartFromPrefix(head, DefaultFingerprintBytes); !ok {
				b.Fatal("no start in the first 4 KiB")
			}
		}
	})
	b.Run("fingerprint-key", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for range b.N {
			if Fingerprint(body, DefaultFingerprintBytes) == "" {
				b.Fatal("no fingerprint")
			}
		}
	})
}

func TestLastIndex(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct{ s, sub string }{
		{"", "ab"}, {"ab", "ab"}, {"xabyab", "ab"}, {"aaaa", "aa"}, {"abc", "d"}, {"a\"metadata\":1,\"metadata\":2", `"metadata"`},
		// across the windows' edges (1 KiB, then 4 more from the end)
		{long[:1024-3] + "abcdef" + long[:1024], "abcdef"},
		{"abcdef" + long[:1021], "abcdef"}, {"abcdef" + long[:1018], "abcdef"},
		{long[:900] + "abcdef" + long[:4000] + "abcdef" + long[:1024], "abcdef"},
		{"ab" + long + "ab" + long, "ab"}, {long, "abcdef"},
	} {
		if got, want := lastIndex(tc.s, tc.sub), strings.LastIndex(tc.s, tc.sub); got != want {
			t.Errorf("lastIndex(%q, %q) = %d, want %d", tc.s, tc.sub, got, want)
		}
	}
}

// BenchmarkSessionFromBody looks for the key in a 5 KB body without
// metadata (a client that sends no key: the fingerprint follows), and in a
// 256 KB one with Claude Code's metadata last.
func BenchmarkSessionFromBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"qwen3-4b","max_tokens":256,"messages":[`)
	for i := 0; sb.Len() < 5<<10; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":[{"type":"text","text":"turn ` + strings.Repeat("lorem ipsum dolor sit amet ", 40) + `"}]}`)
	}
	sb.WriteString(`]}`)
	big := `{"model":"qwen3-4b","messages":[` + strings.Repeat(`{"role":"user","content":"lorem ipsum dolor sit amet"},`, 256<<10/52) +
		`{"role":"user","content":"x"}],"metadata":{"user_id":"user_0_account__session_2b1e7f3a"}}`
	for _, bc := range []struct{ name, body, want string }{
		{"5KB-no-key", sb.String(), ""},
		{"256KB-metadata-last", big, "2b1e7f3a"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for range b.N {
				if got := SessionFromBody(bc.body); got != bc.want {
					b.Fatalf("key %q, want %q", got, bc.want)
				}
			}
		})
	}
}
