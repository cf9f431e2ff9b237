package vllmstats

import (
	"bytes"
	"unsafe"

	"github.com/tidwall/gjson"
)

// API names the wire format of a response.
type API uint8

// The response formats UsageParser understands.
const (
	// APIOpenAI is OpenAI's /v1/chat/completions and /v1/completions.
	APIOpenAI API = iota + 1
	// APIAnthropic is Anthropic's /v1/messages.
	APIAnthropic
	// APIResponses is OpenAI's Responses API, /v1/responses: usage as
	// input_tokens, input_tokens_details.cached_tokens and output_tokens,
	// at the top of a JSON body and inside the response object of a
	// stream's response.completed (or .incomplete, .failed) event.
	APIResponses
)

// String returns "openai", "anthropic" or "responses".
func (a API) String() string {
	switch a {
	case APIOpenAI:
		return "openai"
	case APIAnthropic:
		return "anthropic"
	case APIResponses:
		return "responses"
	}
	return "unknown"
}

// Usage is the token usage one response reported.
type Usage struct {
	// PromptTokens is every prompt token of the request, cached or not.
	// For Anthropic it is input_tokens + cache_read_input_tokens +
	// cache_creation_input_tokens.
	PromptTokens int64
	// CachedTokens is the part of the prompt the engine read from its prefix
	// cache (OpenAI prompt_tokens_details.cached_tokens, Anthropic
	// cache_read_input_tokens); valid only when CachedMeasured.
	CachedTokens int64
	// CompletionTokens is the number of generated tokens.
	CompletionTokens int64
	// Measured is true when the response carried a usage object with the
	// prompt token count.
	Measured bool
	// CachedMeasured is true when it also carried the cached count.
	CachedMeasured bool
}

// Computed returns the prompt tokens the engine had to compute: the prompt
// minus the cached part when that was measured, else the whole prompt.
func (u Usage) Computed() int64 {
	if !u.CachedMeasured {
		return u.PromptTokens
	}
	if c := u.PromptTokens - u.CachedTokens; c > 0 {
		return c
	}
	return 0
}

// Bounds of UsageParser's fixed buffers.
const (
	// maxUsageLine is the longest SSE line that is examined; longer lines are
	// content deltas and skipped.
	maxUsageLine = 8 << 10
	// maxUsageObject is the longest top-level "usage" value captured from a
	// JSON body.
	maxUsageObject = 4 << 10
)

type parseMode uint8

const (
	modeDetect parseMode = iota // before the first non-space byte
	modeSSE
	modeJSON
)

// UsageParser reads the usage of one response from its body bytes as they
// pass by. Write never fails and never holds more than a fixed buffer, however
// the body is split into writes (mid-line, mid-UTF-8) and however long it is.
//
// The format is told by the first non-space byte: '{' is a JSON body (whatever
// stream says: errors to streaming requests come as JSON), anything else an
// SSE stream. In SSE mode every "data:" line mentioning "usage" is examined
// (OpenAI's final chunk, Anthropic's message_start and message_delta); in JSON
// mode the top-level "usage" value is captured by a small tokenizer without
// buffering the body. A Responses API stream repeats the whole response,
// generated text included, in its closing event, so a line can be of any
// length: there every "data:" line goes through the same tokenizer, which
// captures the "usage" member of the event's response object. Malformed or
// truncated input leaves the usage not measured.
//
// A UsageParser is not safe for concurrent use; reuse one with Reset.
type UsageParser struct {
	api  API
	mode parseMode

	// SSE line assembly.
	line     []byte // len ≤ maxUsageLine, backed by lineBuf
	skipping bool   // inside a line longer than maxUsageLine
	lineBuf  [maxUsageLine]byte

	// Responses API stream: the "data:" prefix of the current line as far
	// as it came, and whether the line is data (fed to the tokenizer) or
	// something else (skipped to its end).
	rsPre  [len("data:")]byte
	rsPreN int
	rsData bool
	rsSkip bool

	// JSON tokenizer state.
	keyDepth int // the depth whose "usage" member is captured (1: top level)
	depth    int
	inString bool
	escaped  bool
	keyLen   int  // bytes of the current depth-1 string seen so far (capped)
	keyIsUse bool // the current keyDepth string so far equals a prefix of "usage"
	afterKey bool // a keyDepth string equal to "usage" just ended
	// With keyDepth 2, usage is read only inside the top-level "response"
	// object: parLen is as keyLen for the depth-1 string, afterParent
	// reports one equal to "response" just ended, parMember that its ':'
	// followed, inParent that the current depth-2 object is its value.
	parLen                           int
	afterParent, parMember, inParent bool
	capturing                        bool
	capDepth                         int
	capOver                          bool
	capStr                           bool
	capEsc                           bool
	obj                              []byte // backed by objBuf
	objBuf                           [maxUsageObject]byte

	// Result.
	u                             Usage
	input, cacheRead, cacheCreate int64
	hasInput, hasRead, hasCreate  bool
}

// NewUsageParser returns a parser for a response of the given API; stream is
// whether the request asked for a stream (a hint: the body decides).
func NewUsageParser(api API, stream bool) *UsageParser {
	p := &UsageParser{}
	p.Reset(api, stream)
	return p
}

// Reset prepares p for a new response.
func (p *UsageParser) Reset(api API, stream bool) {
	p.api = api
	p.mode = modeDetect
	p.line = p.lineBuf[:0]
	p.skipping = false
	p.rsPreN, p.rsData, p.rsSkip = 0, false, false
	p.resetJSON(1)
	p.u = Usage{}
	p.input, p.cacheRead, p.cacheCreate = 0, 0, 0
	p.hasInput, p.hasRead, p.hasCreate = false, false, false
	_ = stream
}

// resetJSON readies the tokenizer for a new document whose "usage" member
// at keyDepth is captured.
func (p *UsageParser) resetJSON(keyDepth int) {
	p.keyDepth = keyDepth
	p.depth, p.inString, p.escaped = 0, false, false
	p.keyLen, p.keyIsUse, p.afterKey = 0, false, false
	p.parLen, p.afterParent, p.parMember, p.inParent = 0, false, false, false
	p.capturing, p.capDepth, p.capOver, p.capStr, p.capEsc = false, 0, false, false, false
	p.obj = p.objBuf[:0]
}

// Usage returns what was read so far.
func (p *UsageParser) Usage() Usage { return p.u }

// Write consumes body bytes. It always returns len(b), nil.
func (p *UsageParser) Write(b []byte) (int, error) {
	n := len(b)
	if p.mode == modeDetect {
		i := 0
		for i < len(b) && isJSONSpace(b[i]) {
			i++
		}
		if i == len(b) {
			return n, nil
		}
		if b[i] == '{' {
			p.mode = modeJSON
		} else {
			p.mode = modeSSE
		}
		b = b[i:]
	}
	switch {
	case p.mode == modeJSON:
		p.writeJSON(b)
	case p.api == APIResponses:
		p.writeResponsesSSE(b)
	default:
		p.writeSSE(b)
	}
	return n, nil
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// writeSSE splits b into lines; complete lines are examined in place, the
// unfinished tail is kept in the line buffer (or skipped when too long).
func (p *UsageParser) writeSSE(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.appendLine(b)
			return
		}
		if len(p.line) == 0 && !p.skipping {
			if i <= maxUsageLine { // the same bound as for lines split across writes
				p.sseLine(b[:i])
			}
		} else {
			p.appendLine(b[:i])
			if !p.skipping {
				p.sseLine(p.line)
			}
			p.line = p.line[:0]
		}
		p.skipping = false
		b = b[i+1:]
	}
}

// writeResponsesSSE feeds each "data:" line of a Responses API stream to
// the tokenizer, which captures usage at depth 2: {"type":…,"response":
// {…,"usage":{…}}}. Only a line's first bytes are held (its prefix); the
// rest passes through the tokenizer as it comes, so a completed event that
// repeats megabytes of output costs no buffer.
func (p *UsageParser) writeResponsesSSE(b []byte) {
	for len(b) > 0 {
		if !p.rsData && !p.rsSkip {
			for len(b) > 0 && p.rsPreN < len(p.rsPre) && b[0] != '\n' {
				p.rsPre[p.rsPreN] = b[0]
				p.rsPreN++
				b = b[1:]
			}
			if p.rsPreN == len(p.rsPre) {
				if string(p.rsPre[:]) == "data:" {
					p.rsData = true
					p.resetJSON(2)
				} else {
					p.rsSkip = true
				}
			}
			if len(b) == 0 {
				return
			}
			if b[0] == '\n' && !p.rsData && !p.rsSkip {
				// a line shorter than the prefix
				p.rsPreN = 0
				b = b[1:]
				continue
			}
		}
		i := bytes.IndexByte(b, '\n')
		seg := b
		if i >= 0 {
			seg = b[:i]
		}
		if p.rsData {
			p.writeJSON(seg)
		}
		if i < 0 {
			return
		}
		p.rsPreN, p.rsData, p.rsSkip = 0, false, false
		b = b[i+1:]
	}
}

func (p *UsageParser) appendLine(b []byte) {
	if p.skipping {
		return
	}
	if len(p.line)+len(b) > maxUsageLine {
		p.skipping = true
		p.line = p.line[:0]
		return
	}
	p.line = append(p.line, b...)
}

var (
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage"`)
)

// sseLine examines one complete line (without its '\n').
func (p *UsageParser) sseLine(line []byte) {
	if !bytes.HasPrefix(line, dataPrefix) || !bytes.Contains(line, usageKey) {
		return
	}
	data := bytes.TrimSpace(line[len(dataPrefix):])
	if len(data) == 0 || data[0] != '{' {
		return
	}
	s := bytesString(data)
	if !gjson.Valid(s) {
		return
	}
	switch p.api {
	case APIAnthropic:
		switch gjson.Get(s, "type").Str {
		case "message_start":
			p.anthropicUsage(gjson.Get(s, "message.usage"))
		case "message_delta":
			p.anthropicUsage(gjson.Get(s, "usage"))
		case "message":
			p.anthropicUsage(gjson.Get(s, "usage"))
		}
	default:
		p.openAIUsage(gjson.Get(s, "usage"))
	}
}

// writeJSON runs the tokenizer that captures the top-level "usage" value.
func (p *UsageParser) writeJSON(b []byte) {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if p.capturing {
			p.captureByte(c)
			continue
		}
		if p.inString {
			// Fast path: skip to the next quote or backslash, unless the
			// string may still be a member name that matters.
			if !p.escaped && (p.depth != p.keyDepth || p.keyLen > len("usage")) &&
				(p.depth != p.keyDepth-1 || p.parLen > len(responseKey)) {
				j := indexQuoteOrBackslash(b[i:])
				if j < 0 {
					return
				}
				i += j
				c = b[i]
			}
			switch {
			case p.escaped:
				p.escaped = false
			case c == '\\':
				p.escaped = true
				p.keyIsUse = false
				p.keyLen, p.parLen = len("usage")+1, len(responseKey)+1
			case c == '"':
				p.inString = false
				if p.depth == p.keyDepth {
					p.afterKey = p.keyIsUse && p.keyLen == len("usage")
				}
				if p.depth == p.keyDepth-1 {
					p.afterParent = p.parLen == len(responseKey)
				}
			default:
				if p.depth == p.keyDepth {
					if p.keyLen < len("usage") && c == "usage"[p.keyLen] {
						p.keyLen++
					} else {
						p.keyIsUse = false
						p.keyLen = len("usage") + 1
					}
				}
				if p.depth == p.keyDepth-1 {
					if p.parLen < len(responseKey) && c == responseKey[p.parLen] {
						p.parLen++
					} else {
						p.parLen = len(responseKey) + 1
					}
				}
			}
			continue
		}
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '"':
			p.inString = true
			p.keyLen, p.keyIsUse, p.afterKey = 0, true, false
			p.parLen, p.afterParent = 0, false
		case ':':
			if p.afterKey && p.depth == p.keyDepth && (p.keyDepth == 1 || p.inParent) {
				p.capturing = true
				p.capDepth = 0
				p.capOver = false
				p.obj = p.objBuf[:0]
			}
			p.afterKey = false
			p.parMember = p.afterParent && p.depth == p.keyDepth-1
			p.afterParent = false
		case '{', '[':
			p.depth++
			if p.depth == p.keyDepth {
				// the object the usage is looked for in
				p.inParent = c == '{' && p.parMember
			}
			p.afterKey, p.afterParent, p.parMember = false, false, false
		case '}', ']':
			p.depth--
			p.afterKey, p.afterParent, p.parMember = false, false, false
		default:
			p.afterKey, p.afterParent, p.parMember = false, false, false
		}
	}
}

// responseKey names the member of a Responses API event that holds the
// response, whose usage is read (keyDepth 2).
const responseKey = "response"

func indexQuoteOrBackslash(b []byte) int {
	for i, c := range b {
		if c == '"' || c == '\\' {
			return i
		}
	}
	return -1
}

// captureByte collects the bytes of the value after "usage": until it ends.
func (p *UsageParser) captureByte(c byte) {
	if len(p.obj) == 0 && isJSONSpace(c) {
		return
	}
	done := false
	switch {
	case p.capStr:
		switch {
		case p.capEsc:
			p.capEsc = false
		case c == '\\':
			p.capEsc = true
		case c == '"':
			p.capStr = false
		}
	case c == '"':
		p.capStr = true
	case c == '{' || c == '[':
		p.capDepth++
	case c == '}' || c == ']':
		if p.capDepth == 0 {
			// End of the enclosing object after a scalar value.
			done = true
			p.depth--
		} else {
			p.capDepth--
		}
	case c == ',':
		if p.capDepth == 0 {
			done = true
		}
	}
	if !done {
		if len(p.obj) < maxUsageObject {
			p.obj = append(p.obj, c)
		} else {
			p.capOver = true
		}
		if !(p.capDepth == 0 && (c == '}' || c == ']')) {
			return
		}
		// A captured object or array just closed.
	}
	p.capturing = false
	if !p.capOver {
		s := bytesString(bytes.TrimSpace(p.obj))
		if gjson.Valid(s) {
			r := gjson.Parse(s)
			switch p.api {
			case APIAnthropic:
				p.anthropicUsage(r)
			case APIResponses:
				p.responsesUsage(r)
			default:
				p.openAIUsage(r)
			}
		}
	}
	p.obj = p.objBuf[:0]
}

// openAIUsage reads {"prompt_tokens","completion_tokens",
// "prompt_tokens_details":{"cached_tokens"}}; null or incomplete usage is ignored.
func (p *UsageParser) openAIUsage(r gjson.Result) {
	if !r.IsObject() {
		return
	}
	pt := r.Get("prompt_tokens")
	if pt.Type != gjson.Number {
		return
	}
	u := Usage{PromptTokens: pt.Int(), Measured: true}
	if ct := r.Get("completion_tokens"); ct.Type == gjson.Number {
		u.CompletionTokens = ct.Int()
	}
	if ca := r.Get("prompt_tokens_details.cached_tokens"); ca.Type == gjson.Number {
		u.CachedTokens, u.CachedMeasured = ca.Int(), true
	}
	p.u = u
}

// responsesUsage reads the Responses API's {"input_tokens",
// "input_tokens_details":{"cached_tokens"},"output_tokens"} (vLLM's
// ResponseUsage, vllm/entrypoints/openai/responses/serving.py, and
// OpenAI's); input_tokens counts the cached part too. A null usage (the
// response.created event's) is ignored.
func (p *UsageParser) responsesUsage(r gjson.Result) {
	if !r.IsObject() {
		return
	}
	in := r.Get("input_tokens")
	if in.Type != gjson.Number {
		return
	}
	u := Usage{PromptTokens: in.Int(), Measured: true}
	if v := r.Get("output_tokens"); v.Type == gjson.Number {
		u.CompletionTokens = v.Int()
	}
	if v := r.Get("input_tokens_details.cached_tokens"); v.Type == gjson.Number {
		u.CachedTokens, u.CachedMeasured = v.Int(), true
	}
	p.u = u
}

// anthropicUsage merges {"input_tokens","cache_read_input_tokens",
// "cache_creation_input_tokens","output_tokens"}: message_start brings the
// input side, message_delta the output and sometimes updated input numbers.
func (p *UsageParser) anthropicUsage(r gjson.Result) {
	if !r.IsObject() {
		return
	}
	if v := r.Get("input_tokens"); v.Type == gjson.Number {
		p.input, p.hasInput = v.Int(), true
	}
	if v := r.Get("cache_read_input_tokens"); v.Type == gjson.Number {
		p.cacheRead, p.hasRead = v.Int(), true
	}
	if v := r.Get("cache_creation_input_tokens"); v.Type == gjson.Number {
		p.cacheCreate, p.hasCreate = v.Int(), true
	}
	if v := r.Get("output_tokens"); v.Type == gjson.Number {
		p.u.CompletionTokens = v.Int()
	}
	if p.hasInput {
		p.u.Measured = true
		p.u.PromptTokens = p.input + p.cacheRead + p.cacheCreate
		p.u.CachedTokens, p.u.CachedMeasured = p.cacheRead, p.hasRead
	}
}

// bytesString views b as a string without copying; the result must not
// outlive the next change of b.
func bytesString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}
