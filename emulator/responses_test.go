package emulator

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestResponsesStream: a streamed Responses API turn comes as vLLM's events
// in order, each named by an event line that equals its type, numbered in
// sequence, the last (response.completed) carrying the usage; the next
// turn, with the reply sent back as an assistant message item, reads the
// whole previous prompt and reply from the prefix cache.
func TestResponsesStream(t *testing.T) {
	s := startServer(t, ServerConfig{})
	input := []map[string]any{
		{"type": "message", "role": "developer", "content": []map[string]any{{"type": "input_text", "text": "sandboxed"}}},
		{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": longText("u", 1500)}}},
	}
	body := map[string]any{"model": "m", "instructions": "You are a coding agent.", "input": input, "stream": true,
		"store": false, "max_output_tokens": 5, "prompt_cache_key": "k", "tools": []map[string]any{{"type": "function", "name": "shell"}}}
	type usage struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
	}
	turn := func() (text string, u usage) {
		resp := post(t, s.URLs()[0]+"/v1/responses", body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		events := readSSE(t, resp.Body)
		want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
		for range 5 {
			want = append(want, "response.output_text.delta")
		}
		want = append(want, "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
		if len(events) != len(want) {
			t.Fatalf("%d events, want %d: %+v", len(events), len(want), events)
		}
		var deltas strings.Builder
		for i, ev := range events {
			var e struct {
				Type     string `json:"type"`
				Seq      int    `json:"sequence_number"`
				Delta    string `json:"delta"`
				Text     string `json:"text"`
				Response *struct {
					Status string `json:"status"`
					Output []struct {
						Content []struct {
							Text string `json:"text"`
						} `json:"content"`
					} `json:"output"`
					Usage *usage `json:"usage"`
				} `json:"response"`
			}
			if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
				t.Fatal(err)
			}
			if ev.name != want[i] || e.Type != want[i] || e.Seq != i {
				t.Fatalf("event %d is %q/%q #%d, want %q #%d", i, ev.name, e.Type, e.Seq, want[i], i)
			}
			switch e.Type {
			case "response.created":
				if e.Response == nil || e.Response.Usage != nil || e.Response.Status != "in_progress" {
					t.Fatalf("bad response.created %s", ev.data)
				}
			case "response.output_text.delta":
				deltas.WriteString(e.Delta)
			case "response.output_text.done":
				if e.Text != deltas.String() {
					t.Fatalf("done text %q, deltas %q", e.Text, deltas.String())
				}
			case "response.completed":
				if e.Response == nil || e.Response.Usage == nil || len(e.Response.Output) != 1 || e.Response.Output[0].Content[0].Text != deltas.String() {
					t.Fatalf("bad response.completed %s", ev.data)
				}
				u = *e.Response.Usage
			}
		}
		return deltas.String(), u
	}
	reply, u1 := turn()
	if u1.OutputTokens != 5 || u1.InputTokens < 1500 || u1.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("first usage %+v", u1)
	}
	body["input"] = append(input,
		map[string]any{"type": "message", "role": "assistant", "content": []map[string]any{{"type": "output_text", "text": reply}}},
		map[string]any{"type": "message", "role": "user", "content": []map[string]any{{"type": "input_text", "text": "go on"}}})
	_, u2 := turn()
	if want := (u1.InputTokens + 5 - 1) / 16 * 16; u2.InputTokensDetails.CachedTokens != want {
		t.Fatalf("second turn cached %d, want %d (prompt %d + 5 output, whole blocks)", u2.InputTokensDetails.CachedTokens, want, u1.InputTokens)
	}
}

func TestResponsesJSONAndErrors(t *testing.T) {
	s := startServer(t, ServerConfig{DefaultMaxTokens: 7})
	resp := post(t, s.URLs()[0]+"/v1/responses", map[string]any{"model": "m", "input": "Write a title"})
	var r ResponsesResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "response" || !strings.HasPrefix(r.ID, "resp_") || r.Usage == nil || r.Usage.OutputTokens != 7 ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("bad response %+v", r)
	}
	for _, tc := range []struct {
		name string
		body map[string]any
	}{
		{"no input", map[string]any{"model": "m"}},
		{"previous response", map[string]any{"model": "m", "input": "x", "previous_response_id": "resp_1"}},
		{"bad input", map[string]any{"model": "m", "input": 7}},
	} {
		resp := post(t, s.URLs()[0]+"/v1/responses", tc.body)
		var e openAIError
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 400 || e.Error.Code != 400 {
			t.Errorf("%s: status %d, %+v, %v", tc.name, resp.StatusCode, e, err)
		}
	}
}

// TestResponsesRender: function calls and their outputs render as the
// assistant's tool calls and tool turns; reasoning items are left out.
func TestResponsesRender(t *testing.T) {
	r := responsesRequest{Instructions: new(string), Input: json.RawMessage(`[
		{"type":"message","role":"user","content":"list"},
		{"type":"reasoning","summary":[]},
		{"type":"function_call","name":"shell","arguments":"{\"cmd\": [\"ls\"]}","call_id":"c1"},
		{"type":"function_call_output","call_id":"c1","output":"a.go"}]`)}
	*r.Instructions = "be brief"
	got, err := r.render()
	if err != nil {
		t.Fatal(err)
	}
	want := RenderMessage("system", "be brief") + RenderMessage("user", "list") +
		RenderMessage("assistant", "<tool_call>\n{\"name\":\"shell\",\"arguments\":{\"cmd\":[\"ls\"]}}\n</tool_call>") +
		RenderMessage("tool", "<tool_response>\na.go\n</tool_response>") + GenerationPrompt
	if got != want {
		t.Fatalf("rendered\n%q\nwant\n%q", got, want)
	}
}
