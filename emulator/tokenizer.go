package emulator

// The emulator's tokenizer stands in for a real BPE vocabulary. It is
// deterministic, allocation-light and prefix-stable at the boundaries that
// matter for prefix caching.
//
// Rules, applied left to right over the bytes of the text:
//   - a run of "word" bytes (ASCII letters, digits, '_' and every byte of a
//     multi-byte UTF-8 sequence) is cut into chunks of at most 5 bytes;
//   - a single space directly before a word byte joins the first chunk of
//     that word (" hello", " token", "izer"), as GPT-style tokenizers attach leading spaces;
//   - other runs of spaces are cut into chunks of at most 5 spaces;
//   - every other byte (newline, tab, punctuation, symbols) is a token of
//     its own.
//
// Each chunk's id is the 32-bit FNV-1a hash of its bytes, so the same chunk
// always has the same id. English prose comes out near 4 bytes per token
// (TestTokenizerRatio measures it); code and JSON, heavier in punctuation,
// come out lower, as with real tokenizers.
//
// Prefix stability: a newline or punctuation byte always ends a token, so
// when text a ends with one, Tokenize(a+b) == append(Tokenize(a), Tokenize(b)...).
// The prompt renderer ends every message with a newline, which makes every
// message boundary of a conversation a token boundary.

const maxChunk = 5

// Tokenize returns the token ids of text.
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, len(text)/3+1), text)
}

// AppendTokens appends the token ids of text to dst and returns the result.
func AppendTokens(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		j := nextToken(text, i)
		dst = append(dst, fnv32(text[i:j]))
		i = j
	}
	return dst
}

// CountTokens returns len(Tokenize(text)) without building the slice.
func CountTokens(text string) int {
	n := 0
	for i := 0; i < len(text); n++ {
		i = nextToken(text, i)
	}
	return n
}

// nextToken returns the end of the token starting at i (i < len(text)).
func nextToken(text string, i int) int {
	c := text[i]
	switch {
	case isWord(c):
		return wordEnd(text, i, i)
	case c == ' ':
		if i+1 < len(text) && isWord(text[i+1]) {
			return wordEnd(text, i, i+1)
		}
		j := i + 1
		for j < len(text) && j-i < maxChunk && text[j] == ' ' && !(j+1 < len(text) && isWord(text[j+1])) {
			j++
		}
		return j
	default:
		return i + 1
	}
}

// wordEnd returns the end of a chunk that starts at start and whose word
// bytes begin at w: at most maxChunk word bytes.
func wordEnd(text string, start, w int) int {
	j := w
	for j < len(text) && j-w < maxChunk && isWord(text[j]) {
		j++
	}
	return j
}

func isWord(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c >= 0x80
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// outputWords are the words generated text is made of. Each is at most
// maxChunk word bytes, so " "+word is exactly one token and generated text
// tokenizes back to exactly the generated ids.
var outputWords = [...]string{
	"the", "of", "and", "to", "in", "is", "it", "that", "for", "on",
	"with", "as", "this", "be", "at", "by", "from", "or", "an", "are",
	"code", "file", "test", "func", "type", "var", "call", "data", "list", "map",
	"read", "load", "save", "open", "send", "loop", "next", "then", "when", "each",
	"new", "old", "line", "path", "name", "key", "bool", "byte", "int", "case",
	"fix", "add", "use", "set", "get", "run", "can", "will", "must", "now",
	"we", "so", "if", "not",
}

var (
	outputIDs  [len(outputWords)]uint32
	outputText = map[uint32]string{}
)

func init() {
	for i, w := range outputWords {
		id := fnv32(" " + w)
		outputIDs[i] = id
		outputText[id] = " " + w
	}
}

// TokenText returns the text of a token the engine generated (each is a
// space followed by a short word); ok is false for other ids.
func TokenText(id uint32) (text string, ok bool) {
	text, ok = outputText[id]
	return text, ok
}

// outputToken is the i-th generated token of a request whose prompt hashes
// to seed: deterministic, so the same prompt always gets the same answer,
// as with greedy sampling.
func outputToken(seed uint64, i int) uint32 {
	x := mix64(seed ^ uint64(i+1)*0x9e3779b97f4a7c15)
	return outputIDs[x%uint64(len(outputIDs))]
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// chainHash is the hash of a full block given the hash of the block before
// it (0 for the first block), as vLLM chains block hashes over the prefix.
func chainHash(parent uint64, tokens []uint32) uint64 {
	h := parent ^ 0x51afd7ed558ccd
	for _, t := range tokens {
		h = mix64(h ^ uint64(t))
	}
	if h == 0 {
		h = 1
	}
	return h
}
