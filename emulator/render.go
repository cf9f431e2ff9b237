package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Prompts are rendered into one string with a ChatML-like template (the
// one Qwen3 uses), deterministically, so that a conversation's next turn
// renders to this turn's text plus the reply plus the new message:
//
//	<|im_start|>system\n{tools}{system}<|im_end|>\n
//	<|im_start|>{role}\n{content}<|im_end|>\n ...
//	<|im_start|>assistant\n
//
// Text blocks render as their text, tool calls as <tool_call> JSON, tool
// results as <tool_response> text. A system text block starting with
// "x-anthropic-billing-header:" is left out, as vLLM releases with the fix
// do (its cch= value changes on every request).

const billingHeaderPrefix = "x-anthropic-billing-header:"

// GenerationPrompt ends every rendered prompt; the reply follows it.
const GenerationPrompt = "<|im_start|>assistant\n"

// TurnEnd closes a rendered message.
const TurnEnd = "<|im_end|>\n"

// RenderMessage renders one message the way the server renders prompts:
// a conversation's prompt is RenderMessage("system", ...) (when there is a
// system prompt), then RenderMessage(role, text) for each message, then
// GenerationPrompt. The previous reply re-sent as an assistant message is
// GenerationPrompt + reply + TurnEnd, token for token, so a simulation can
// build the next turn's tokens by appending to the last prompt's.
func RenderMessage(role, text string) string {
	var b strings.Builder
	renderTurn(&b, role, text)
	return b.String()
}

func renderTurn(b *strings.Builder, role, content string) {
	b.WriteString("<|im_start|>")
	b.WriteString(role)
	b.WriteString("\n")
	b.WriteString(content)
	b.WriteString(TurnEnd)
}

// compactJSON returns raw with insignificant space removed (raw when invalid).
func compactJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}

// contentBlock is a block of an Anthropic message or an OpenAI content part.
type contentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	Thinking  string          `json:"thinking"`
	ToolUseID string          `json:"tool_use_id"`
}

// renderContent renders a string or an array of blocks.
func renderContent(b *strings.Builder, raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		b.WriteString(s)
		return nil
	}
	var blocks []contentBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return fmt.Errorf("content must be a string or an array of blocks: %w", err)
	}
	for i, blk := range blocks {
		if i > 0 {
			b.WriteString("\n")
		}
		switch blk.Type {
		case "text", "input_text", "output_text":
			b.WriteString(blk.Text)
		case "tool_use":
			b.WriteString("<tool_call>\n{\"name\":")
			name, _ := json.Marshal(blk.Name)
			b.Write(name)
			b.WriteString(",\"arguments\":")
			if len(blk.Input) == 0 {
				b.WriteString("{}")
			} else {
				b.WriteString(compactJSON(blk.Input))
			}
			b.WriteString("}\n</tool_call>")
		case "tool_result":
			b.WriteString("<tool_response>\n")
			if err := renderContent(b, blk.Content); err != nil {
				return err
			}
			b.WriteString("\n</tool_response>")
		case "thinking", "redacted_thinking":
			// Not part of the prompt (Qwen's template drops earlier reasoning).
		default:
			b.WriteString("[" + blk.Type + "]")
		}
	}
	return nil
}

// anthropicRequest is the part of a Messages API request the emulator reads.
type anthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens *int               `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	System    json.RawMessage    `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Tools     []json.RawMessage  `json:"tools"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

func (r *anthropicRequest) render() (string, error) {
	var b strings.Builder
	var sys strings.Builder
	writeTools(&sys, r.Tools)
	raw := bytes.TrimSpace(r.System)
	if len(raw) > 0 && raw[0] == '[' {
		var blocks []contentBlock
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return "", fmt.Errorf("system: %w", err)
		}
		first := true
		for _, blk := range blocks {
			if strings.HasPrefix(blk.Text, billingHeaderPrefix) {
				continue
			}
			if !first {
				sys.WriteString("\n")
			}
			first = false
			sys.WriteString(blk.Text)
		}
	} else if err := renderContent(&sys, raw); err != nil {
		return "", fmt.Errorf("system: %w", err)
	}
	if sys.Len() > 0 {
		renderTurn(&b, "system", sys.String())
	}
	for i, m := range r.Messages {
		var c strings.Builder
		if err := renderContent(&c, m.Content); err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		renderTurn(&b, m.Role, c.String())
	}
	b.WriteString(GenerationPrompt)
	return b.String(), nil
}

func writeTools(b *strings.Builder, tools []json.RawMessage) {
	if len(tools) == 0 {
		return
	}
	b.WriteString("# Tools\n<tools>\n")
	for _, t := range tools {
		b.WriteString(compactJSON(t))
		b.WriteString("\n")
	}
	b.WriteString("</tools>\n")
}

// chatRequest is the part of an OpenAI chat completion request the emulator reads.
type chatRequest struct {
	Model               string            `json:"model"`
	Messages            []chatMessage     `json:"messages"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	Stream              bool              `json:"stream"`
	StreamOptions       *streamOptions    `json:"stream_options"`
	Tools               []json.RawMessage `json:"tools"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string            `json:"role"`
	Content    json.RawMessage   `json:"content"`
	ToolCalls  []json.RawMessage `json:"tool_calls"`
	ToolCallID string            `json:"tool_call_id"`
}

func (r *chatRequest) render() (string, error) {
	var b strings.Builder
	if len(r.Tools) > 0 {
		var sys strings.Builder
		writeTools(&sys, r.Tools)
		renderTurn(&b, "system", sys.String())
	}
	for i, m := range r.Messages {
		var c strings.Builder
		if err := renderContent(&c, m.Content); err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		for _, tc := range m.ToolCalls {
			c.WriteString("\n<tool_call>\n")
			c.WriteString(compactJSON(tc))
			c.WriteString("\n</tool_call>")
		}
		renderTurn(&b, m.Role, c.String())
	}
	b.WriteString(GenerationPrompt)
	return b.String(), nil
}

func (r *chatRequest) maxTokens() *int {
	if r.MaxCompletionTokens != nil {
		return r.MaxCompletionTokens
	}
	return r.MaxTokens
}

// completionRequest is the part of an OpenAI completion request the emulator reads.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
}

// prompt returns the prompt as text, or as token ids when given as ids.
func (r *completionRequest) prompt() (string, []uint32, error) {
	raw := bytes.TrimSpace(r.Prompt)
	if len(raw) == 0 {
		return "", nil, fmt.Errorf("prompt is required")
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, nil, err
	case '[':
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err == nil {
			return "", ids, nil
		}
		var list []string
		if err := json.Unmarshal(raw, &list); err != nil {
			return "", nil, fmt.Errorf("prompt must be a string, a list of one string, or token ids: %w", err)
		}
		if len(list) != 1 {
			return "", nil, fmt.Errorf("batched prompts (%d) are not supported", len(list))
		}
		return list[0], nil, nil
	}
	return "", nil, fmt.Errorf("prompt must be a string or token ids")
}
