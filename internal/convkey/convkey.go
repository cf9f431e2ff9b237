// Package convkey finds the conversation a request belongs to: its key from
// the session headers, the body's metadata or a fingerprint of the
// conversation's start, the model it names, and the start fingerprint that
// restart detection compares. It is pure: no I/O, no Caddy, no state.
package convkey

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"github.com/tidwall/gjson"
)

// DefaultSessionHeaders are the request headers that carry a conversation
// key, in the order they are tried: Claude Code's session header first, then
// the headers other coding agents and gateways send (OpenCode's
// X-Session-Affinity, Codex's Session-Id). No name with "_" or "." is
// among them: Caddy drops such request headers before any handler runs
// unless the server's expected_underscore_headers (expected_dot_headers)
// lists them.
var DefaultSessionHeaders = []string{
	"X-Claude-Code-Session-Id",
	"X-Session-Affinity",
	"Session-Id",
	"X-Session-Id",
}

const (
	// DefaultAgentHeader names the header Claude Code sends from a sub-agent.
	// Its value is appended to the session key, so every sub-agent's
	// conversation (which has its own prompt prefix) gets its own binding.
	DefaultAgentHeader = "X-Claude-Code-Agent-Id"
	// DefaultParentAgentHeader names the header that carries the agent that
	// started a sub-agent; absent, the parent is the main conversation.
	DefaultParentAgentHeader = "X-Claude-Code-Parent-Agent-Id"

	// MaxKeyLen bounds a key taken from a header or body field, and a model
	// name. A longer key is kept as its start and a digest of all of it
	// (compactKey): conversations whose keys differ anywhere stay apart.
	MaxKeyLen = 256

	// DefaultFingerprintBytes is how much of a body the fingerprint reads
	// by default.
	DefaultFingerprintBytes = 32 << 10

	fingerprintPrefix = "fp:"
)

// Extractor finds a conversation key in a request. Its zero value finds
// nothing; newKeyExtractor fills in canonical header names once so the
// per-request path only does map lookups.
type Extractor struct {
	headers     []string // canonical MIME form
	agent       string
	parentAgent string
}

func NewExtractor(headers []string, agent, parentAgent string) Extractor {
	ke := Extractor{headers: make([]string, 0, len(headers))}
	for _, h := range headers {
		ke.headers = append(ke.headers, textproto.CanonicalMIMEHeaderKey(h))
	}
	if agent != "" {
		ke.agent = textproto.CanonicalMIMEHeaderKey(agent)
	}
	if parentAgent != "" {
		ke.parentAgent = textproto.CanonicalMIMEHeaderKey(parentAgent)
	}
	return ke
}

// DefaultExtractor is what the selection policy uses when the handler did
// not run.
var DefaultExtractor = NewExtractor(DefaultSessionHeaders, DefaultAgentHeader, DefaultParentAgentHeader)

// FromHeaders returns the conversation key and the key of its parent
// conversation ("" when it has none) from the configured headers.
func (ke *Extractor) FromHeaders(h http.Header) (key, parent string) {
	for _, name := range ke.headers {
		v := h[name]
		if len(v) == 0 || v[0] == "" {
			continue
		}
		key = Compact(strings.TrimSpace(v[0]))
		if key == "" {
			continue
		}
		break
	}
	if key == "" || ke.agent == "" {
		return key, ""
	}
	agent := h[ke.agent]
	if len(agent) == 0 || agent[0] == "" {
		return key, ""
	}
	parent = key
	if ke.parentAgent != "" {
		if pa := h[ke.parentAgent]; len(pa) > 0 && pa[0] != "" {
			parent = key + "/" + Compact(pa[0])
		}
	}
	return key + "/" + Compact(agent[0]), parent
}

// keyDigestLen is the length of the hex digest that ends a compacted key.
const keyDigestLen = 40

// Compact returns s when it is at most maxKeyLen bytes long, else a key of
// exactly maxKeyLen bytes made of s's start, "~" and a SHA-256 digest (160
// bits, hex) of the whole of s: keys that differ only past the start get
// different bindings, and what is kept per request (and logged) stays small.
func Compact(s string) string {
	if len(s) <= MaxKeyLen {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	var b strings.Builder
	b.Grow(MaxKeyLen)
	b.WriteString(s[:MaxKeyLen-1-keyDigestLen])
	b.WriteByte('~')
	var hx [keyDigestLen]byte
	hex.Encode(hx[:], sum[:keyDigestLen/2])
	b.Write(hx[:])
	return b.String()
}

func Clip(s string) string {
	if len(s) > MaxKeyLen {
		return s[:MaxKeyLen]
	}
	return s
}

// BytesView returns b as a string without copying. The caller keeps b alive
// and unmodified while the string (or anything gjson returns from it) is used.
func BytesView(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// SessionFromBody returns the session key a client put in the body's
// metadata: metadata.user_id in Claude Code's two forms
// ("user_<hash>_account_<uuid>_session_<uuid>" or a JSON-encoded object with
// "session_id"), then metadata.session_id. The result is a copy, safe to
// keep after the body is gone.
func SessionFromBody(body string) string {
	meta, ok, absent := trailingMetadata(body)
	if !ok {
		if absent && !strings.Contains(body, `\u`) {
			// no member can be named metadata: only a \u escape could
			// spell its letters otherwise
			return ""
		}
		meta = gjson.Get(body, "metadata")
	}
	return sessionFromMetadata(meta)
}

// sessionFromMetadata is SessionFromBody's key from the body's metadata.
func sessionFromMetadata(meta gjson.Result) string {
	if !meta.IsObject() {
		return ""
	}
	if uid := meta.Get("user_id"); uid.Type == gjson.String {
		s := uid.Str
		if i := strings.LastIndex(s, "_session_"); i >= 0 {
			if v := s[i+len("_session_"):]; v != "" {
				return strings.Clone(Compact(v))
			}
		}
		if t := strings.TrimSpace(s); strings.HasPrefix(t, "{") {
			if v := gjson.Get(t, "session_id"); v.Type == gjson.String && v.Str != "" {
				return strings.Clone(Compact(v.Str))
			}
		}
	}
	if v := meta.Get("session_id"); v.Type == gjson.String && v.Str != "" {
		return strings.Clone(Compact(v.Str))
	}
	return ""
}

// trailingMetadata finds a top-level "metadata" object near the end of the
// body without scanning the messages before it: clients put metadata after
// the conversation, and a megabyte body is then read from the end. It takes
// the last `"metadata":` in the body and accepts it only when what follows
// its value proves it is a member of the outermost object: the rest, with
// its leading comma replaced by "{", must be one valid JSON object (a nested
// value would leave extra closing brackets). ok is false when the fast path
// does not apply; the caller then looks the field up from the start.
// absent reports that the body holds no `"metadata"` at all.
func trailingMetadata(body string) (v gjson.Result, ok, absent bool) {
	raw, ok, absent := trailingMember(body, `"metadata"`, objectEnd)
	if !ok {
		return gjson.Result{}, false, absent
	}
	return gjson.Parse(raw), true, false
}

// trailingMember finds the last member named key (quoted) within
// metadataTail bytes of the end of body and returns its raw value, whose
// length valueEnd measures, accepted only when what follows the value
// proves it a member of the outermost object. absent reports that the
// body holds no key at all.
func trailingMember(body, key string, valueEnd func(string) int) (raw string, ok, absent bool) {
	tail := max(0, len(body)-metadataTail)
	i := lastIndex(body[tail:], key)
	if i < 0 {
		return "", false, !strings.Contains(body[:min(len(body), tail+len(key)-1)], key)
	}
	i += tail
	j := i + len(key)
	for j < len(body) && isSpace(body[j]) {
		j++
	}
	if j >= len(body) || body[j] != ':' {
		return "", false, false
	}
	start := j + 1
	for start < len(body) && isSpace(body[start]) {
		start++
	}
	end := valueEnd(body[start:])
	if end < 0 {
		return "", false, false
	}
	rest := strings.TrimSpace(body[start+end:])
	switch {
	case rest == "}":
	case strings.HasPrefix(rest, ",") && gjson.Valid("{"+rest[1:]):
	default:
		return "", false, false
	}
	return body[start : start+end], true, false
}

// metadataTail is how far from the end of a body trailingMetadata looks.
const metadataTail = 64 << 10

// lastIndex is strings.LastIndex(s, sub): it searches windows from the end
// that grow fourfold, each forward, which the standard library vectorises
// (LastIndex compares byte by byte from the end: 8 µs for a 5 KB body
// without sub), so a sub near the end is found at once.
func lastIndex(s, sub string) int {
	end := len(s)
	for w := 1 << 10; ; w *= 4 {
		lo := max(0, end-w)
		last := -1
		for from := lo; ; {
			i := strings.Index(s[from:end], sub)
			if i < 0 {
				break
			}
			last = from + i
			from = last + 1
		}
		if last >= 0 {
			return last
		}
		if lo == 0 {
			return -1
		}
		// a match that starts before lo ends before lo+len(sub)
		end = min(len(s), lo+len(sub)-1)
	}
}

// objectEnd returns the length of the JSON object s starts with, or -1 when
// s does not start with a complete object.
func objectEnd(s string) int {
	if s == "" || s[0] != '{' {
		return -1
	}
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '"':
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// ModelFromBody returns the body's top-level "model" field (a copy), and
// twice when SecondModel finds another after it.
func ModelFromBody(body string) (model string, twice bool) {
	v := gjson.Get(body, "model")
	if !v.Exists() {
		return "", false
	}
	twice = SecondModel(body, v)
	if v.Type != gjson.String {
		return "", twice
	}
	return strings.Clone(Clip(v.Str)), twice
}

// SecondModelSpan is how far past the first "model" member SecondModel
// looks for a second.
const SecondModelSpan = 4 << 10

// SecondModel reports whether a JSON document (or its start) whose first
// top-level "model" member has the value first holds a second one within
// SecondModelSpan bytes after it. The engines' JSON parsers (Python's,
// vLLM's and SGLang's) keep the last of duplicate members, gjson the first:
// such a request would be routed by a model the engine does not read.
// Finding one further on would cost reading the whole body; a member whose
// name is escaped (\u006dodel) is found as gjson unescapes it; other
// escapes (\u00e9 in text) cost no walk.
func SecondModel(doc string, first gjson.Result) bool {
	end := first.Index + len(first.Raw)
	if first.Index <= 0 || end > len(doc) {
		return false
	}
	rest := doc[end:min(len(doc), end+SecondModelSpan)]
	// an escaped letter of "model" is \u006x (m, o, d, l) or \u0065 (e)
	if !strings.Contains(rest, `"model"`) && !strings.Contains(rest, `\u006`) && !strings.Contains(rest, `\u0065`) {
		return false
	}
	n := 0
	gjson.Parse(doc[:end+len(rest)]).ForEach(func(k, _ gjson.Result) bool {
		if k.Str == "model" {
			n++
		}
		return n < 2
	})
	return n >= 2
}

// billingPrefix starts the system block Claude Code inserts with a value that
// changes on every request; it must not take part in the fingerprint.
const billingPrefix = `"x-anthropic-billing-header`

// Fingerprint hashes the start of a conversation — the model, the system
// prompt and the first user message — so clients that send no key still get
// affinity: every later turn resends the same start. At most limit bytes of
// text are hashed. Only text values are hashed (as their raw JSON literals),
// so markers that move between turns (cache_control) do not change the key,
// and Claude Code's per-request billing block is skipped. It returns "" when
// the body has neither a system prompt nor a user message.
func Fingerprint(body string, limit int) string {
	return FingerprintOf(body, limit, ShapeMessages)
}

// FingerprintOf is Fingerprint of a body of the given shape.
func FingerprintOf(body string, limit int, shape Shape) string {
	fp, ok := hashStart(body, limit, true, shape)
	if !ok {
		return ""
	}
	return fp.sum()
}

// startLone is the lowest bit of what startFingerprint and
// StartFromPrefix return: set when the request holds one message only
// (placement.Request.Lone: a title request, a classifier call, a probe);
// the other bits are the start (see splitStart). It is read with the start
// from the same first bytes.
const startLone = 1

// SplitStart splits what startFingerprint returns into the start
// (placement.Request.Start; 0 = unknown) and whether the request holds one
// message.
func SplitStart(v uint64) (start uint64, lone bool) {
	return v &^ startLone, v&startLone != 0
}

// StartFingerprint is a number for the router's restart detection
// (placement.Request.Start, with startLone: see splitStart): a conversation whose key comes from a header
// but whose start changed was compacted or cleared. The start is the model
// and the messages up to the first user message (the system prompt stays
// the same across a conversation, so it tells nothing here, and leaving it
// out lets the start be read from a body's first bytes: see
// startFromPrefix). It returns 0 (unknown) when the body has no start.
func StartFingerprint(body string, limit int) uint64 {
	return StartFingerprintOf(body, limit, ShapeMessages)
}

// StartFingerprintOf is StartFingerprint of a body of the given shape.
func StartFingerprintOf(body string, limit int, shape Shape) uint64 {
	fp, _ := hashRestartStart(body, limit, false, shape)
	return fp
}

// StartFromPrefix is startFingerprint of a body of which prefix is the
// start; ok is false when prefix ends before the start does (the caller
// then reads the whole body).
func StartFromPrefix(prefix string, limit int) (fp uint64, ok bool) {
	return hashRestartStart(prefix, limit, true, ShapeMessages)
}

// StartFromPrefixOf is StartFromPrefix of a body of the given shape.
func StartFromPrefixOf(prefix string, limit int, shape Shape) (fp uint64, ok bool) {
	return hashRestartStart(prefix, limit, true, shape)
}

// hashRestartStart hashes the model and the messages up to the first user
// message. With partial, body may be cut anywhere: every member hashed
// must end inside it, and running out of messages before a user message
// is not an end.
func hashRestartStart(body string, limit int, partial bool, shape Shape) (uint64, bool) {
	fp := newStartHash(limit, false)
	model := gjson.Get(body, "model")
	if !model.Exists() || (partial && !EndsInside(model, body)) {
		return 0, false
	}
	fp.write(model.Raw)
	fp.sep()
	if !fp.messages(body, partial, shape) {
		return 0, false
	}
	if fp.texts == 0 {
		return 0, !partial
	}
	v := (fp.a.Sum64() | 2) &^ startLone // never 0
	if fp.lone {
		v |= startLone
	}
	return v, true
}

// hashStart hashes the conversation's start for fingerprint: the model,
// the system prompt and the messages up to the first user message; ok is
// false when there was no text to hash.
func hashStart(body string, limit int, wide bool, shape Shape) (fp startHash, ok bool) {
	fp = newStartHash(limit, wide)
	fp.write(gjson.Get(body, "model").Raw)
	fp.sep()
	sys := gjson.Get(body, shape.systemField())
	switch {
	case sys.Type == gjson.String:
		fp.text(sys.Raw)
	case sys.IsArray():
		fp.content(sys)
	}
	fp.messages(body, false, shape)
	return fp, fp.texts > 0
}

// messages hashes the system, developer and user messages up to the first
// user message, one by one from the start: taking "messages" whole would
// scan a long conversation to its end for the first few of them. With
// partial (body may be cut anywhere) it reports false when a message does
// not end inside body or body ends before the first user message.
func (f *startHash) messages(body string, partial bool, shape Shape) bool {
	paths := &messagePaths
	if shape == ShapeResponses {
		paths = &inputPaths
	}
	for i, path := range paths {
		m := gjson.Get(body, path)
		if !m.Exists() {
			if i == 0 && shape == ShapeResponses {
				return f.inputString(body, partial)
			}
			return !partial
		}
		if partial && !EndsInside(m, body) {
			return false
		}
		role := m.Get("role").Str
		if role == "system" || role == "developer" || role == "user" {
			f.content(m.Get("content"))
		}
		if role == "user" || f.budget <= 0 {
			if i == 0 && m.Index > 0 {
				// one message only when the array ends after it
				rest := strings.TrimLeft(body[m.Index+len(m.Raw):], " \t\r\n")
				if rest == "" {
					return !partial
				}
				f.lone = rest[0] == ']'
			}
			return true
		}
	}
	return true
}

// EndsInside reports whether the value v found in body ends before body
// does (body may be the first bytes of a document).
func EndsInside(v gjson.Result, body string) bool {
	return v.Index > 0 && v.Index+len(v.Raw) < len(body)
}

// messagePaths are the paths of the messages the fingerprint may read: the
// first user message is looked for among the first few only.
var messagePaths = func() (out [16]string) {
	for i := range out {
		out[i] = "messages." + strconv.Itoa(i)
	}
	return out
}()

// startHash hashes a conversation's start with xxHash64 (cespare/xxhash,
// the hash Prometheus's client uses): lane a always, and for a
// fingerprint key (wide) a second lane with another seed, so that
// accidental collisions between conversations are negligible. Both are
// stable across processes, as the shared store needs, and computed
// without allocation.
type startHash struct {
	a, b   xxhash.Digest
	wide   bool
	budget int
	texts  int
	lone   bool // messages: the first user message is the only message
}

// laneB is the second lane's seed.
const laneB = 0x9e3779b97f4a7c15

func newStartHash(limit int, wide bool) startHash {
	f := startHash{budget: limit, wide: wide}
	f.a.Reset()
	if wide {
		f.b.ResetWithSeed(laneB)
	}
	return f
}

func (f *startHash) write(s string) {
	if f.budget <= 0 {
		return
	}
	if len(s) > f.budget {
		s = s[:f.budget]
	}
	f.budget -= len(s)
	_, _ = f.a.WriteString(s)
	if f.wide {
		_, _ = f.b.WriteString(s)
	}
}

func (f *startHash) sep() { f.write("\x00") }

func (f *startHash) text(raw string) {
	if raw == "" || strings.HasPrefix(raw, billingPrefix) {
		return
	}
	f.texts++
	f.write(raw)
	f.sep()
}

// content hashes a message's content: a string, or an array of blocks whose
// "text" values are hashed (blocks without text contribute their type).
func (f *startHash) content(c gjson.Result) {
	switch {
	case c.Type == gjson.String:
		f.text(c.Raw)
	case c.IsArray():
		c.ForEach(func(_, blk gjson.Result) bool {
			if blk.Type == gjson.String {
				f.text(blk.Raw)
			} else if t := blk.Get("text"); t.Type == gjson.String {
				f.text(t.Raw)
			} else if t := blk.Get("type"); t.Exists() {
				f.text(t.Raw)
			}
			return f.budget > 0
		})
	}
}

func (f *startHash) sum() string {
	var buf [16]byte
	a, b := f.a.Sum64(), f.b.Sum64()
	for i := 0; i < 8; i++ {
		buf[i] = byte(a >> (56 - 8*i))
		buf[8+i] = byte(b >> (56 - 8*i))
	}
	var out [len(fingerprintPrefix) + 32]byte
	copy(out[:], fingerprintPrefix)
	hex.Encode(out[len(fingerprintPrefix):], buf[:])
	return string(out[:])
}

// BudgetLeft returns how many of the limit bytes the fingerprint of body
// left unread; above 0, it reached the first user message.
func BudgetLeft(body string, limit int) int {
	fp, _ := hashStart(body, limit, false, ShapeMessages)
	return fp.budget
}
