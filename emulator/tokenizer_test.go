package emulator

import (
	"slices"
	"strings"
	"testing"
)

const english = `The prefix cache keeps the attention state of prompts the engine has already read. When the same prefix comes again, the engine skips that work, but only on the replica that did it. Every full copy of the model has its own cache, and a balancer that looks only at queue length sends each turn somewhere new, where the whole history is read again. Coding agents resend the entire conversation on every turn, so most of a long conversation is a prefix the engine has seen before.`

func TestTokenizerDeterministicAndPrefixStable(t *testing.T) {
	tests := []struct{ a, b string }{
		{"hello world\n", "more text"},
		{"{\"x\":", " 1}"},
		{"<|im_start|>assistant\n", " the code"},
		{english + "\n", english},
	}
	for _, tt := range tests {
		whole := Tokenize(tt.a + tt.b)
		if !slices.Equal(whole, Tokenize(tt.a+tt.b)) {
			t.Fatal("not deterministic")
		}
		split := append(Tokenize(tt.a), Tokenize(tt.b)...)
		if !slices.Equal(whole, split) {
			t.Fatalf("%q+%q not prefix-stable", tt.a, tt.b)
		}
		if CountTokens(tt.a+tt.b) != len(whole) {
			t.Fatal("CountTokens disagrees")
		}
	}
}

func TestTokenizerRatio(t *testing.T) {
	n := len(Tokenize(english))
	ratio := float64(len(english)) / float64(n)
	t.Logf("English: %d bytes, %d tokens, %.2f bytes/token", len(english), n, ratio)
	if ratio < 3.6 || ratio > 4.4 {
		t.Fatalf("bytes per token %.2f, want about 4", ratio)
	}
}

func TestGeneratedTextRoundTrips(t *testing.T) {
	var ids []uint32
	var text strings.Builder
	for i := 0; i < 200; i++ {
		id := outputToken(42, i)
		s, ok := TokenText(id)
		if !ok {
			t.Fatalf("no text for generated id %d", id)
		}
		ids = append(ids, id)
		text.WriteString(s)
	}
	if !slices.Equal(Tokenize(text.String()), ids) {
		t.Fatal("generated text does not tokenize back to its ids")
	}
	if !slices.Equal(Tokenize("assistant\n"+text.String()), append(Tokenize("assistant\n"), ids...)) {
		t.Fatal("generated text not prefix-stable after the generation prompt")
	}
}

func FuzzTokenize(f *testing.F) {
	f.Add("hello world\n", " more")
	f.Add("  \t{}\n", "x")
	f.Fuzz(func(t *testing.T, a, b string) {
		toks := Tokenize(a)
		if CountTokens(a) != len(toks) {
			t.Fatal("count mismatch")
		}
		if len(a) > 0 && (len(toks) == 0 || len(toks) > len(a)) {
			t.Fatal("token count out of range")
		}
		if strings.HasSuffix(a, "\n") {
			if !slices.Equal(Tokenize(a+b), append(toks, Tokenize(b)...)) {
				t.Fatal("not prefix-stable after newline")
			}
		}
	})
}

func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat(english+"\n", 100)
	b.SetBytes(int64(len(text)))
	for i := 0; i < b.N; i++ {
		Tokenize(text)
	}
}

func FuzzParseGen(f *testing.F) {
	f.Add(uint8(0), `{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`)
	f.Add(uint8(1), `{"prompt":["a"],"max_tokens":3}`)
	f.Add(uint8(1), `{"prompt":[1,2,3]}`)
	f.Add(uint8(2), `{"max_tokens":3,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}]}`)
	f.Add(uint8(3), `{"instructions":"i","input":[{"role":"developer","content":"d"},{"type":"function_call","name":"f","arguments":"{"},{"type":"function_call_output","output":[{"type":"input_text","text":"o"}]}]}`)
	f.Add(uint8(3), `{"input":"one string","max_output_tokens":2}`)
	f.Fuzz(func(t *testing.T, kind uint8, body string) {
		g, err := parseGen(apiKind(kind%4), strings.NewReader(body))
		if err != nil {
			return
		}
		if g.kind != apiCompletion && !strings.HasSuffix(g.text, GenerationPrompt) {
			t.Fatalf("rendered prompt does not end with the generation prompt: %q", g.text)
		}
	})
}
