package emulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// The Responses API (POST /v1/responses), as vLLM serves it
// (vllm/entrypoints/openai/responses/: api_router.py, serving.py,
// simple_streaming_events.py): the request's instructions and input items
// are rendered as chat messages; a stream is a series of typed events, each
// written as "event: <type>\ndata: <json>\n\n", from response.created to
// response.completed, which repeats the whole response with its usage
// (input_tokens, input_tokens_details.cached_tokens, output_tokens). The
// emulator keeps no responses (store and previous_response_id are not
// served), as a client that sends its whole conversation every turn
// (Codex, store: false) needs none.

// responsesRequest is the part of a Responses API request the emulator reads.
type responsesRequest struct {
	Model           string            `json:"model"`
	Instructions    *string           `json:"instructions"`
	Input           json.RawMessage   `json:"input"`
	MaxOutputTokens *int              `json:"max_output_tokens"`
	Stream          bool              `json:"stream"`
	Tools           []json.RawMessage `json:"tools"`
	PreviousID      *string           `json:"previous_response_id"`
}

// responsesItem is one input item: a message (with a role), a function
// call, a function call's output, or reasoning.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	CallID    string          `json:"call_id"`
	Output    json.RawMessage `json:"output"`
}

// render renders the request as vLLM does after turning it into chat
// messages: the instructions as the system message (after the tools), each
// message item as a turn of its role, a function call as an assistant
// turn holding the call, its output as a tool turn; reasoning items are
// left out, as Qwen's template drops earlier reasoning.
func (r *responsesRequest) render() (string, error) {
	if r.PreviousID != nil && *r.PreviousID != "" {
		return "", fmt.Errorf("previous_response_id is not supported: this server stores no responses; send the whole conversation in input")
	}
	var b strings.Builder
	var sys strings.Builder
	writeTools(&sys, r.Tools)
	if r.Instructions != nil {
		sys.WriteString(*r.Instructions)
	}
	if sys.Len() > 0 {
		renderTurn(&b, "system", sys.String())
	}
	raw := bytes.TrimSpace(r.Input)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", fmt.Errorf("input: Field required")
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", fmt.Errorf("input: %w", err)
		}
		renderTurn(&b, "user", s)
	default:
		var items []responsesItem
		if err := json.Unmarshal(raw, &items); err != nil {
			return "", fmt.Errorf("input must be a string or an array of items: %w", err)
		}
		for i, it := range items {
			switch {
			case it.Role != "":
				var c strings.Builder
				if err := renderContent(&c, it.Content); err != nil {
					return "", fmt.Errorf("input[%d]: %w", i, err)
				}
				renderTurn(&b, it.Role, c.String())
			case it.Type == "function_call":
				name, _ := json.Marshal(it.Name)
				args := it.Arguments
				if !json.Valid([]byte(args)) {
					a, _ := json.Marshal(args)
					args = string(a)
				}
				renderTurn(&b, "assistant", "<tool_call>\n{\"name\":"+string(name)+",\"arguments\":"+compactJSON(json.RawMessage(args))+"}\n</tool_call>")
			case it.Type == "function_call_output" || it.Type == "custom_tool_call_output":
				var c strings.Builder
				if err := renderContent(&c, it.Output); err != nil {
					return "", fmt.Errorf("input[%d].output: %w", i, err)
				}
				renderTurn(&b, "tool", "<tool_response>\n"+c.String()+"\n</tool_response>")
			case it.Type == "reasoning":
			default:
				renderTurn(&b, "user", "["+it.Type+"]")
			}
		}
	}
	b.WriteString(GenerationPrompt)
	return b.String(), nil
}

// ResponsesResponse is a Responses API response object (vLLM's
// ResponsesResponse, the fields a client reads).
type ResponsesResponse struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	CreatedAt         int64           `json:"created_at"`
	Model             string          `json:"model"`
	Status            string          `json:"status"`
	Output            []ResponsesItem `json:"output"`
	ParallelToolCalls bool            `json:"parallel_tool_calls"`
	ToolChoice        string          `json:"tool_choice"`
	Tools             []any           `json:"tools"`
	Usage             *ResponsesUsage `json:"usage"`
}

// ResponsesItem is an output message.
type ResponsesItem struct {
	ID      string             `json:"id"`
	Type    string             `json:"type"`
	Role    string             `json:"role"`
	Status  string             `json:"status"`
	Content []ResponsesContent `json:"content"`
}

// ResponsesContent is an output_text part.
type ResponsesContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
	Logprobs    []any  `json:"logprobs,omitempty"`
}

// ResponsesUsage is the Responses API's usage: input_tokens counts the
// cached part too.
type ResponsesUsage struct {
	InputTokens         int                    `json:"input_tokens"`
	InputTokensDetails  ResponsesInputDetails  `json:"input_tokens_details"`
	OutputTokens        int                    `json:"output_tokens"`
	OutputTokensDetails ResponsesOutputDetails `json:"output_tokens_details"`
	TotalTokens         int                    `json:"total_tokens"`
}

// ResponsesInputDetails carries the cached input tokens.
type ResponsesInputDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// ResponsesOutputDetails carries the reasoning tokens (none here).
type ResponsesOutputDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

// responsesEvent is one streamed event; the fields set depend on its type.
type responsesEvent struct {
	Type           string             `json:"type"`
	SequenceNumber int                `json:"sequence_number"`
	Response       *ResponsesResponse `json:"response,omitempty"`
	OutputIndex    *int               `json:"output_index,omitempty"`
	ContentIndex   *int               `json:"content_index,omitempty"`
	ItemID         string             `json:"item_id,omitempty"`
	Item           *ResponsesItem     `json:"item,omitempty"`
	Part           *ResponsesContent  `json:"part,omitempty"`
	Delta          *string            `json:"delta,omitempty"`
	Text           *string            `json:"text,omitempty"`
	Logprobs       []any              `json:"logprobs,omitempty"`
}

// responsesObject is the response at its end (usage set) or before it
// (in progress, no output, usage null).
func (o *responder) responsesObject(text string, out, cached int, done bool) *ResponsesResponse {
	r := &ResponsesResponse{
		ID: "resp_" + o.id, Object: "response", CreatedAt: o.created, Model: o.g.model,
		Status: "in_progress", Output: []ResponsesItem{}, ParallelToolCalls: true, ToolChoice: "auto", Tools: []any{},
	}
	if done {
		// the engine stops at max tokens: vLLM says incomplete then
		r.Status = "incomplete"
		r.Output = []ResponsesItem{o.responsesMessage(text, "completed")}
		r.Usage = &ResponsesUsage{
			InputTokens: o.prompt, InputTokensDetails: ResponsesInputDetails{CachedTokens: cached},
			OutputTokens: out, TotalTokens: o.prompt + out,
		}
	}
	return r
}

func (o *responder) responsesMessage(text, status string) ResponsesItem {
	it := ResponsesItem{ID: "msg_" + o.id, Type: "message", Role: "assistant", Status: status, Content: []ResponsesContent{}}
	if status == "completed" {
		it.Content = []ResponsesContent{{Type: "output_text", Text: text, Annotations: []any{}}}
	}
	return it
}

// responsesEvent appends one event with the next sequence number.
func (o *responder) responsesEvent(ev responsesEvent) {
	ev.SequenceNumber = o.seq
	o.seq++
	o.event(ev.Type, ev)
}

// responsesChunk writes output token i's events: the opening events
// before the first, then its text delta.
func (o *responder) responsesChunk(i int, text string) {
	zero := 0
	if i == 0 {
		o.responsesEvent(responsesEvent{Type: "response.created", Response: o.responsesObject("", 0, 0, false)})
		o.responsesEvent(responsesEvent{Type: "response.in_progress", Response: o.responsesObject("", 0, 0, false)})
		msg := o.responsesMessage("", "in_progress")
		o.responsesEvent(responsesEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &msg})
		o.responsesEvent(responsesEvent{Type: "response.content_part.added", OutputIndex: &zero, ContentIndex: &zero,
			ItemID: msg.ID, Part: &ResponsesContent{Type: "output_text", Annotations: []any{}, Logprobs: []any{}}})
	}
	o.text.WriteString(text)
	o.responsesEvent(responsesEvent{Type: "response.output_text.delta", OutputIndex: &zero, ContentIndex: &zero,
		ItemID: "msg_" + o.id, Delta: &text, Logprobs: []any{}})
}

// responsesEnd writes the closing events, the last with the usage.
func (o *responder) responsesEnd(out, cached int) {
	zero := 0
	text := o.text.String()
	o.responsesEvent(responsesEvent{Type: "response.output_text.done", OutputIndex: &zero, ContentIndex: &zero,
		ItemID: "msg_" + o.id, Text: &text, Logprobs: []any{}})
	o.responsesEvent(responsesEvent{Type: "response.content_part.done", OutputIndex: &zero, ContentIndex: &zero,
		ItemID: "msg_" + o.id, Part: &ResponsesContent{Type: "output_text", Text: text, Annotations: []any{}}})
	msg := o.responsesMessage(text, "completed")
	o.responsesEvent(responsesEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &msg})
	o.responsesEvent(responsesEvent{Type: "response.completed", Response: o.responsesObject(text, out, cached, true)})
}
