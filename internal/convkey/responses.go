package convkey

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Shape says where a request body keeps its conversation.
type Shape uint8

const (
	// ShapeMessages: a "messages" array, with the system prompt in a
	// "system" field (Anthropic's /v1/messages) or as its first messages
	// (OpenAI's /v1/chat/completions).
	ShapeMessages Shape = iota
	// ShapeResponses: OpenAI's Responses API (/v1/responses): the system
	// prompt in "instructions", the conversation in "input", an array of
	// items (messages with a role, function calls and their outputs,
	// reasoning) or one string, a user message.
	ShapeResponses
)

// ShapeOf returns the shape of a request to path: ShapeResponses for the
// Responses API, ShapeMessages otherwise.
func ShapeOf(path string) Shape {
	if strings.HasSuffix(strings.TrimSuffix(path, "/"), "/responses") {
		return ShapeResponses
	}
	return ShapeMessages
}

// systemField names the member holding the system prompt.
func (s Shape) systemField() string {
	if s == ShapeResponses {
		return "instructions"
	}
	return "system"
}

// inputPaths are messagePaths for the Responses API's input items.
var inputPaths = func() (out [16]string) {
	for i := range out {
		out[i] = "input." + strconv.Itoa(i)
	}
	return out
}()

// inputString hashes a Responses body's input when it is one string: the
// first (and only) user message. With partial, false when the string does
// not end inside body (or body ends before it).
func (f *startHash) inputString(body string, partial bool) bool {
	in := gjson.Get(body, "input")
	if in.Type != gjson.String {
		return !partial
	}
	if partial && !EndsInside(in, body) {
		return false
	}
	f.text(in.Raw)
	f.lone = true
	return true
}

// PromptCacheKey returns the body's top-level "prompt_cache_key" (a copy,
// compacted as keys are): OpenAI's field for "requests that share a
// prefix", which Codex fills with its conversation's ID on every request.
// Clients put it after the conversation, so it is looked for from the end
// first, as metadata is (trailingMetadata).
func PromptCacheKey(body string) string {
	v, ok, absent := trailingString(body, `"prompt_cache_key"`)
	if !ok {
		if absent && !strings.Contains(body, `\u`) {
			return ""
		}
		v = gjson.Get(body, "prompt_cache_key")
	}
	if v.Type != gjson.String || strings.TrimSpace(v.Str) == "" {
		return ""
	}
	return strings.Clone(Compact(strings.TrimSpace(v.Str)))
}

// trailingString is trailingMetadata for a member whose value is a string:
// the last key (quoted) within metadataTail bytes of the end, accepted
// only when what follows its value proves it a member of the outermost
// object. absent reports that the body holds no key at all.
func trailingString(body, key string) (v gjson.Result, ok, absent bool) {
	raw, ok, absent := trailingMember(body, key, stringEnd)
	if !ok {
		return gjson.Result{}, false, absent
	}
	v = gjson.Parse(raw)
	return v, v.Type == gjson.String, false
}

// stringEnd returns the length of the JSON string s starts with, or -1.
func stringEnd(s string) int {
	if s == "" || s[0] != '"' {
		return -1
	}
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}
