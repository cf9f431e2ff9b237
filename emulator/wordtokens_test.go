package emulator

import (
	"strings"
	"testing"
)

// TestWordTokens cuts text as llm-d-inference-sim's simple tokenizer does:
// its regular expression `(punctuation|\w+)(\s*)`, one match a token.
func TestWordTokens(t *testing.T) {
	cases := []struct {
		text string
		want []string
	}{
		{WordMessage("user", "Hello, world!"), []string{"#", "#", "# ", "user", ": ", "Hello", ", ", "world", "!\n"}},
		{"a_b _c  x-y\t(see line 12). ", []string{"a_b ", "_", "c  ", "x", "-", "y\t", "(", "see ", "line ", "12", ")", ". "}},
		{"héllo wörld", []string{"h", "llo ", "w", "rld"}},
		{"   ", nil},
		{"", nil},
	}
	for _, c := range cases {
		got := AppendWordTokens(nil, c.text)
		want := make([]uint32, len(c.want))
		for i, w := range c.want {
			want[i] = fnv32(w)
		}
		if len(got) != len(want) || CountWordTokens(c.text) != len(want) {
			t.Errorf("%q: %d tokens, want %d (%q)", c.text, len(got), len(want), c.want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%q: token %d is not %q", c.text, i, c.want[i])
			}
		}
	}
}

// FuzzWordTokensPrefixStable: rendered messages concatenate token for
// token, so a conversation's next prompt extends the last one's tokens.
func FuzzWordTokensPrefixStable(f *testing.F) {
	f.Add("Review the handler.", "Fix it (see line 3).")
	f.Add("", "x")
	f.Add("a\n", "  b")
	f.Fuzz(func(t *testing.T, a, b string) {
		ma, mb := WordMessage("user", a), WordMessage("assistant", b)
		whole := AppendWordTokens(nil, ma+mb)
		parts := AppendWordTokens(AppendWordTokens(nil, ma), mb)
		if len(whole) != len(parts) {
			t.Fatalf("%d tokens whole, %d in parts", len(whole), len(parts))
		}
		for i := range whole {
			if whole[i] != parts[i] {
				t.Fatalf("token %d differs", i)
			}
		}
		if n := CountWordTokens(a); n > len(a) || (strings.TrimSpace(a) == "" && n != 0) {
			t.Fatalf("%d tokens in %d bytes", n, len(a))
		}
	})
}
