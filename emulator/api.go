package emulator

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
)

// OpenAI and Anthropic response shapes, with the official field names.

// ChatCompletion is an OpenAI chat.completion (or text_completion) body.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *OpenAIUsage `json:"usage,omitempty"`
}

// ChatChoice is one choice of a completion or a stream chunk.
type ChatChoice struct {
	Index        int          `json:"index"`
	Message      *ChatMessage `json:"message,omitempty"`
	Delta        *ChatMessage `json:"delta,omitempty"`
	Text         *string      `json:"text,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

// ChatMessage is a message or a stream delta.
type ChatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// OpenAIUsage is the usage block, with vLLM's prompt_tokens_details.
type OpenAIUsage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetail `json:"prompt_tokens_details"`
}

// PromptTokensDetail carries the cached prompt tokens.
type PromptTokensDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

// AnthropicMessage is a Messages API response (and message_start's message).
type AnthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []AnthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        AnthropicUsage   `json:"usage"`
}

// AnthropicBlock is a text content block.
type AnthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// AnthropicUsage is the Messages API usage block.
type AnthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

// AnthropicEvent is one streamed Messages API event.
type AnthropicEvent struct {
	Type         string               `json:"type"`
	Message      *AnthropicMessage    `json:"message,omitempty"`
	Index        *int                 `json:"index,omitempty"`
	ContentBlock *AnthropicBlock      `json:"content_block,omitempty"`
	Delta        any                  `json:"delta,omitempty"` // *AnthropicTextDelta or *AnthropicMessageDelta
	Usage        *AnthropicDeltaUsage `json:"usage,omitempty"`
}

// AnthropicTextDelta is the delta of content_block_delta.
type AnthropicTextDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// AnthropicMessageDelta is the delta of message_delta.
type AnthropicMessageDelta struct {
	StopReason   *string `json:"stop_reason"`
	StopSequence *string `json:"stop_sequence"`
}

// AnthropicDeltaUsage is message_delta's usage.
type AnthropicDeltaUsage struct {
	OutputTokens int `json:"output_tokens"`
}

// responder writes one generation's response in the request's API.
type responder struct {
	w       http.ResponseWriter
	g       *genRequest
	id      string
	prompt  int
	created int64
	buf     []byte
	seq     int             // the next Responses API event's sequence number
	text    strings.Builder // the Responses API's output so far
	// late: a stream's headers wait for its first token, as an engine that
	// may refuse a request when it starts answers the refusal instead
	// (PerRequestTiming.Refuse)
	late bool
}

// fail answers a request that ended before its response began: a 500,
// with the refusal's message when the engine refused it; nothing when the
// client went away.
func (o *responder) fail(err error) {
	switch err {
	case errRefused:
		writeError(o.w, o.g.kind == apiMessages, http.StatusInternalServerError, err.Error())
	case errStreamFailed:
		writeError(o.w, o.g.kind == apiMessages, http.StatusInternalServerError, "engine stopped")
	}
}

func strp(s string) *string { return &s }

// OutputText is the text of generated tokens, as the API returns it.
func OutputText(toks []uint32) string { return tokensText(toks) }

func tokensText(toks []uint32) string {
	var b strings.Builder
	for _, t := range toks {
		s, _ := TokenText(t)
		b.WriteString(s)
	}
	return b.String()
}

// serve writes the response; false when the client went away or the
// replica stopped before the end.
func (o *responder) serve(ctx context.Context, st *stream) bool {
	if !o.g.stream {
		var toks []uint32
		var cached int
		for {
			t, c, finished, err := wait(ctx, st, len(toks))
			if err != nil {
				o.fail(err)
				return false
			}
			toks, cached = t, c
			if finished {
				break
			}
		}
		o.writeJSONResponse(toks, cached)
		return true
	}
	// primed: the first tokens are in hand already (late)
	var toks []uint32
	var cached int
	var finished, primed bool
	if o.late {
		var err error
		if toks, cached, finished, err = wait(ctx, st, 0); err != nil {
			o.fail(err)
			return false
		}
		primed = true
	}
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(o.w)
	rc.Flush()
	sent := 0
	for {
		if !primed {
			var err error
			if toks, cached, finished, err = wait(ctx, st, sent); err != nil {
				return false
			}
		}
		primed = false
		o.buf = o.buf[:0]
		for i := sent; i < len(toks); i++ {
			last := finished && i == len(toks)-1
			o.chunk(i, toks[i], cached, last)
		}
		sent = len(toks)
		if finished {
			o.end(sent, cached)
		}
		if _, err := o.w.Write(o.buf); err != nil {
			return false
		}
		if err := rc.Flush(); err != nil {
			return false
		}
		if finished {
			return true
		}
	}
}

func (o *responder) usage(out, cached int) *OpenAIUsage {
	return &OpenAIUsage{
		PromptTokens: o.prompt, CompletionTokens: out, TotalTokens: o.prompt + out,
		PromptTokensDetails: &PromptTokensDetail{CachedTokens: cached},
	}
}

func (o *responder) writeJSONResponse(toks []uint32, cached int) {
	text := tokensText(toks)
	switch o.g.kind {
	case apiResponses:
		writeJSON(o.w, http.StatusOK, o.responsesObject(text, len(toks), cached, true))
	case apiMessages:
		writeJSON(o.w, http.StatusOK, AnthropicMessage{
			ID: "msg_" + o.id, Type: "message", Role: "assistant", Model: o.g.model,
			Content:    []AnthropicBlock{{Type: "text", Text: text}},
			StopReason: strp("max_tokens"),
			Usage:      AnthropicUsage{InputTokens: o.prompt - cached, CacheReadInputTokens: cached, OutputTokens: len(toks)},
		})
	case apiCompletion:
		writeJSON(o.w, http.StatusOK, ChatCompletion{
			ID: "cmpl-" + o.id, Object: "text_completion", Created: o.created, Model: o.g.model,
			Choices: []ChatChoice{{Text: &text, FinishReason: strp("length")}},
			Usage:   o.usage(len(toks), cached),
		})
	default:
		writeJSON(o.w, http.StatusOK, ChatCompletion{
			ID: "chatcmpl-" + o.id, Object: "chat.completion", Created: o.created, Model: o.g.model,
			Choices: []ChatChoice{{Message: &ChatMessage{Role: "assistant", Content: &text}, FinishReason: strp("length")}},
			Usage:   o.usage(len(toks), cached),
		})
	}
}

func (o *responder) data(v any) {
	b, _ := json.Marshal(v)
	o.buf = append(o.buf, "data: "...)
	o.buf = append(o.buf, b...)
	o.buf = append(o.buf, "\n\n"...)
}

func (o *responder) event(name string, v any) {
	o.buf = append(o.buf, "event: "...)
	o.buf = append(o.buf, name...)
	o.buf = append(o.buf, '\n')
	o.data(v)
}

// chunk writes the stream events of output token i.
func (o *responder) chunk(i int, tok uint32, cached int, last bool) {
	text, _ := TokenText(tok)
	var finish *string
	if last {
		finish = strp("length")
	}
	switch o.g.kind {
	case apiResponses:
		o.responsesChunk(i, text)
	case apiMessages:
		zero := 0
		if i == 0 {
			o.event("message_start", AnthropicEvent{Type: "message_start", Message: &AnthropicMessage{
				ID: "msg_" + o.id, Type: "message", Role: "assistant", Model: o.g.model, Content: []AnthropicBlock{},
				Usage: AnthropicUsage{InputTokens: o.prompt - cached, CacheReadInputTokens: cached},
			}})
			o.event("content_block_start", AnthropicEvent{Type: "content_block_start", Index: &zero, ContentBlock: &AnthropicBlock{Type: "text"}})
			o.event("ping", AnthropicEvent{Type: "ping"})
		}
		o.event("content_block_delta", AnthropicEvent{Type: "content_block_delta", Index: &zero, Delta: &AnthropicTextDelta{Type: "text_delta", Text: text}})
	case apiCompletion:
		o.data(ChatCompletion{ID: "cmpl-" + o.id, Object: "text_completion", Created: o.created, Model: o.g.model,
			Choices: []ChatChoice{{Text: &text, FinishReason: finish}}})
	default:
		if i == 0 {
			empty := ""
			o.data(ChatCompletion{ID: "chatcmpl-" + o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.g.model,
				Choices: []ChatChoice{{Delta: &ChatMessage{Role: "assistant", Content: &empty}}}})
		}
		o.data(ChatCompletion{ID: "chatcmpl-" + o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.g.model,
			Choices: []ChatChoice{{Delta: &ChatMessage{Content: &text}, FinishReason: finish}}})
	}
}

// end writes the closing events.
func (o *responder) end(out, cached int) {
	switch o.g.kind {
	case apiResponses:
		o.responsesEnd(out, cached)
	case apiMessages:
		zero := 0
		o.event("content_block_stop", AnthropicEvent{Type: "content_block_stop", Index: &zero})
		o.event("message_delta", AnthropicEvent{Type: "message_delta", Delta: &AnthropicMessageDelta{StopReason: strp("max_tokens")}, Usage: &AnthropicDeltaUsage{OutputTokens: out}})
		o.event("message_stop", AnthropicEvent{Type: "message_stop"})
	default:
		if o.g.includeUsage {
			obj, prefix := "chat.completion.chunk", "chatcmpl-"
			if o.g.kind == apiCompletion {
				obj, prefix = "text_completion", "cmpl-"
			}
			o.data(ChatCompletion{ID: prefix + o.id, Object: obj, Created: o.created, Model: o.g.model,
				Choices: []ChatChoice{}, Usage: o.usage(out, cached)})
		}
		o.buf = append(o.buf, "data: [DONE]\n\n"...)
	}
}
