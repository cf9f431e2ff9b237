package emulator

// The tokenizer and chat rendering of llm-d-inference-sim when it runs
// without a real model's tokenizer (--force-dummy-tokenizer, or a model
// name unknown to Hugging Face): its "simple tokenizer" in
// pkg/tokenizer/tokenizer.go and the message rendering of
// SimpleTokenizer.RenderMessages with pkg/api's message separators. A
// simulation that stands in for that simulator counts tokens as it does:
// about 0.73 of this package's Tokenize on the bench's English-like text,
// because a whole word is one token there.

// WordMessage renders one chat message as llm-d-inference-sim's simple
// tokenizer sees it: "### ", the role, ": ", the text and a newline. A
// prompt is its messages rendered one after the other, with nothing after
// the last (no generation prompt).
func WordMessage(role, text string) string {
	return "### " + role + ": " + text + "\n"
}

// AppendWordTokens appends the token ids of text as llm-d-inference-sim's
// simple tokenizer cuts it: a token is one punctuation character of its
// list, or a run of word characters (ASCII letters, digits, '_'), with the
// whitespace after it; other characters are skipped. Each id is the
// 32-bit FNV-1a hash of the token's text, as there. When a ends in
// whitespace and b starts with none, the tokens of a+b are a's followed by
// b's: every rendered message ends in a newline, so a conversation's
// prompt extends the previous turn's token for token.
func AppendWordTokens(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		c := text[i]
		j := i + 1
		switch {
		case isWordPunct(c):
		case isASCIIWord(c):
			for j < len(text) && isASCIIWord(text[j]) {
				j++
			}
		default:
			i++
			continue
		}
		for j < len(text) && isSpace(text[j]) {
			j++
		}
		dst = append(dst, fnv32(text[i:j]))
		i = j
	}
	return dst
}

// CountWordTokens is len(AppendWordTokens(nil, text)).
func CountWordTokens(text string) int {
	return len(AppendWordTokens(nil, text))
}

// isWordPunct reports the characters the simple tokenizer takes one at a
// time; '_' is among them, so it is a token of its own where a token
// starts, though it also continues a word.
func isWordPunct(c byte) bool {
	switch c {
	case '{', '}', ':', ',', '-', '.', '?', '!', ';', '@', '#', '$', '%', '^', '&', '*',
		'(', ')', '+', '_', '~', '/', '\\', '>', '<', '[', ']', '=', '"', '\'':
		return true
	}
	return false
}

func isASCIIWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
}
