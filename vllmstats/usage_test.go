package vllmstats

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e)
		b.WriteString("\n\n")
	}
	return b.String()
}

var longText = strings.Repeat("héllo wörld 日本語 ", 700) // > maxUsageLine bytes, multi-byte runes

var usageCases = []struct {
	name   string
	api    API
	stream bool
	body   string
	want   Usage
}{
	{"openai chat json cached", APIOpenAI, false,
		`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"qwen","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\":{\"prompt_tokens\":999} is not it"},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":7400,"total_tokens":7656,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":7296}},"prompt_logprobs":null,"kv_transfer_params":null}`,
		Usage{PromptTokens: 7400, CachedTokens: 7296, CompletionTokens: 256, Measured: true, CachedMeasured: true}},
	{"openai chat json cached null", APIOpenAI, false,
		`{"id":"x","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":null}}`,
		Usage{PromptTokens: 100, CompletionTokens: 5, Measured: true}},
	{"openai completions json no details", APIOpenAI, false,
		"{\n  \"object\": \"text_completion\",\n  \"choices\": [{\"text\": \"" + longText + "\"}],\n  \"usage\" : {\"prompt_tokens\": 12, \"completion_tokens\": 3}\n}\n",
		Usage{PromptTokens: 12, CompletionTokens: 3, Measured: true}},
	{"openai json usage null", APIOpenAI, false,
		`{"choices":[],"usage":null,"x":1}`, Usage{}},
	{"openai json no usage", APIOpenAI, false,
		`{"object":"error","message":"bad","type":"BadRequestError","code":400}`, Usage{}},
	{"openai error json to a stream request", APIOpenAI, true,
		`{"object":"error","message":"bad","type":"BadRequestError","code":400}`, Usage{}},
	{"openai chat sse final usage", APIOpenAI, true,
		sse(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"`+longText+` \"usage\": {\"prompt_tokens\": 1}"}}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"say \"usage\""}}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"qwen","choices":[],"usage":{"prompt_tokens":3600,"total_tokens":3856,"completion_tokens":256,"prompt_tokens_details":{"cached_tokens":3584}}}`,
			`data: [DONE]`),
		Usage{PromptTokens: 3600, CachedTokens: 3584, CompletionTokens: 256, Measured: true, CachedMeasured: true}},
	{"openai completions sse crlf continuous usage", APIOpenAI, true,
		strings.ReplaceAll(sse(`data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`,
			`data:{"choices":[{"text":"b"}],"usage":{"prompt_tokens":10,"completion_tokens":2}}`,
			`data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`,
			`data: [DONE]`), "\n", "\r\n"),
		Usage{PromptTokens: 10, CompletionTokens: 2, Measured: true, CachedMeasured: true}},
	{"openai sse without usage", APIOpenAI, true,
		sse(`data: {"choices":[{"delta":{"content":"hi"}}]}`, `data: {"choices":[],"usage":null}`, `data: [DONE]`), Usage{}},
	{"openai sse bad json usage line", APIOpenAI, true,
		sse(`data: {"choices":[],"usage":{"prompt_tokens":10,`, `data: [DONE]`), Usage{}},
	{"anthropic json", APIAnthropic, false,
		`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{"usage":{"input_tokens":1}}},{"type":"text","text":"` + longText + `"}],` +
			`"model":"qwen","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":120,"cache_creation_input_tokens":0,"cache_read_input_tokens":7200,"output_tokens":256}}`,
		Usage{PromptTokens: 7320, CachedTokens: 7200, CompletionTokens: 256, Measured: true, CachedMeasured: true}},
	{"anthropic json no cache fields", APIAnthropic, false,
		`{"type":"message","content":[],"usage":{"input_tokens":50,"output_tokens":9}}`,
		Usage{PromptTokens: 50, CompletionTokens: 9, Measured: true}},
	{"anthropic sse", APIAnthropic, true,
		sse("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"qwen\",\"stop_reason\":null,\"usage\":{\"input_tokens\":400,\"cache_creation_input_tokens\":16,\"cache_read_input_tokens\":10800,\"output_tokens\":1}}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
			"event: ping\ndata: {\"type\": \"ping\"}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\""+longText+"\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\\"usage\\\": {\\\"output_tokens\\\": 99}\"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":200}}",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}"),
		Usage{PromptTokens: 11216, CachedTokens: 10800, CompletionTokens: 200, Measured: true, CachedMeasured: true}},
	{"anthropic sse delta updates input", APIAnthropic, true,
		sse("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":970,\"cache_creation_input_tokens\":0,\"output_tokens\":64}}",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}"),
		Usage{PromptTokens: 1000, CachedTokens: 970, CompletionTokens: 64, Measured: true, CachedMeasured: true}},
	{"anthropic sse no cache read", APIAnthropic, true,
		sse("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":77,\"output_tokens\":1}}}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":5}}"),
		Usage{PromptTokens: 77, CompletionTokens: 5, Measured: true}},
	{"anthropic sse error event", APIAnthropic, true,
		sse("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}"), Usage{}},
	{"responses json", APIResponses, false,
		`{"id":"resp_1","created_at":1,"instructions":"say \"usage\"","model":"qwen","object":"response","output":[{"id":"msg_1","content":[{"annotations":[],"text":"` + longText + `","type":"output_text","logprobs":null}],"role":"assistant","status":"completed","type":"message"}],` +
			`"parallel_tool_calls":true,"tools":[],"status":"completed","usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4864,"input_tokens_per_turn":[],"cached_tokens_per_turn":[]},"output_tokens":120,"output_tokens_details":{"reasoning_tokens":0,"tool_output_tokens":0,"output_tokens_per_turn":[],"tool_output_tokens_per_turn":[]},"total_tokens":5120},"user":null}`,
		Usage{PromptTokens: 5000, CachedTokens: 4864, CompletionTokens: 120, Measured: true, CachedMeasured: true}},
	{"responses json no details", APIResponses, false,
		`{"object":"response","output":[],"usage":{"input_tokens":40,"output_tokens":2,"total_tokens":42}}`,
		Usage{PromptTokens: 40, CompletionTokens: 2, Measured: true}},
	{"responses sse", APIResponses, true,
		sse("event: response.created\ndata: {\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[],\"status\":\"in_progress\",\"usage\":null},\"sequence_number\":0,\"type\":\"response.created\"}",
			"event: response.in_progress\ndata: {\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null},\"sequence_number\":1,\"type\":\"response.in_progress\"}",
			"event: response.output_text.delta\ndata: {\"content_index\":0,\"delta\":\""+longText+" \\\"usage\\\":{\\\"input_tokens\\\":1}\",\"item_id\":\"msg_1\",\"output_index\":0,\"sequence_number\":4,\"type\":\"response.output_text.delta\",\"logprobs\":[]}",
			"event: response.output_item.done\ndata: {\"item\":{\"id\":\"fc_1\",\"type\":\"function_call\",\"arguments\":\"{\\\"usage\\\":{}}\",\"usage\":{\"input_tokens\":9}},\"output_index\":0,\"sequence_number\":5,\"type\":\"response.output_item.done\"}",
			"event: response.completed\ndata: {\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\""+longText+longText+"\"}]}],\"status\":\"completed\",\"usage\":{\"input_tokens\":9000,\"input_tokens_details\":{\"cached_tokens\":8960},\"output_tokens\":300,\"total_tokens\":9300}},\"sequence_number\":6,\"type\":\"response.completed\"}"),
		Usage{PromptTokens: 9000, CachedTokens: 8960, CompletionTokens: 300, Measured: true, CachedMeasured: true}},
	{"responses sse crlf no event lines", APIResponses, true,
		strings.ReplaceAll(sse(": keep-alive",
			"data:{\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":70,\"output_tokens\":7}}}"), "\n", "\r\n"),
		Usage{PromptTokens: 70, CompletionTokens: 7, Measured: true}},
	{"responses sse cut in completed", APIResponses, true,
		sse("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":70,\"outp"), Usage{}},
	{"responses sse usage outside the response", APIResponses, true,
		sse("event: response.output_item.done\ndata: {\"item\":{\"type\":\"function_call\",\"usage\":{\"input_tokens\":9}},\"usage\":{\"input_tokens\":8},\"type\":\"response.output_item.done\"}",
			"data: {\"response\":[{\"usage\":{\"input_tokens\":7}}],\"responses\":{\"usage\":{\"input_tokens\":6}},\"x\":{\"response\":{\"usage\":{\"input_tokens\":5}}}}"), Usage{}},
	{"responses error json", APIResponses, true,
		`{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`, Usage{}},
	{"garbage", APIOpenAI, true, "\x00\xff<html>\n\"usage\":{\n}}}]]]", Usage{}},
	{"truncated json before usage", APIOpenAI, false, `{"id":"x","choices":[{"message":{"content":"abc`, Usage{}},
	{"truncated json inside usage", APIAnthropic, false, `{"id":"x","usage":{"input_tokens":5,"cache_read_in`, Usage{}},
	{"truncated sse", APIAnthropic, true, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4", Usage{}},
}

func parseWhole(api API, stream bool, parts ...string) Usage {
	p := NewUsageParser(api, stream)
	for _, s := range parts {
		p.Write([]byte(s))
	}
	return p.Usage()
}

func TestUsageParser(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range usageCases {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseWhole(tc.api, tc.stream, tc.body); got != tc.want {
				t.Fatalf("whole body:\n got %+v\nwant %+v", got, tc.want)
			}
			// Every two-part split; for long bodies every 7th boundary plus the last 600.
			n := len(tc.body)
			for i := 0; i <= n; i++ {
				if n > 4096 && i%7 != 0 && i < n-600 {
					continue
				}
				if got := parseWhole(tc.api, tc.stream, tc.body[:i], tc.body[i:]); got != tc.want {
					t.Fatalf("split at %d:\n got %+v\nwant %+v", i, got, tc.want)
				}
			}
			// Three parts at random points, and byte by byte.
			for k := 0; k < 200; k++ {
				a, b := rng.IntN(n+1), rng.IntN(n+1)
				if a > b {
					a, b = b, a
				}
				if got := parseWhole(tc.api, tc.stream, tc.body[:a], tc.body[a:b], tc.body[b:]); got != tc.want {
					t.Fatalf("split at %d,%d:\n got %+v\nwant %+v", a, b, got, tc.want)
				}
			}
			p := NewUsageParser(tc.api, tc.stream)
			for i := 0; i < n; i++ {
				p.Write([]byte{tc.body[i]})
			}
			if got := p.Usage(); got != tc.want {
				t.Fatalf("byte by byte:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestUsageParserTruncationsNeverPanic(t *testing.T) {
	t.Parallel()
	for _, tc := range usageCases {
		for i := 0; i <= len(tc.body); i += 1 + len(tc.body)/500 {
			u := parseWhole(tc.api, tc.stream, tc.body[:i])
			if u.Measured && u.PromptTokens < 0 {
				t.Fatalf("%s cut at %d: negative prompt %+v", tc.name, i, u)
			}
		}
	}
}

func TestUsageParserReset(t *testing.T) {
	t.Parallel()
	p := NewUsageParser(APIAnthropic, true)
	p.Write([]byte(usageCases[0].body[:40])) // leave state mid-JSON
	for _, tc := range usageCases {
		p.Reset(tc.api, tc.stream)
		p.Write([]byte(tc.body))
		if got := p.Usage(); got != tc.want {
			t.Fatalf("%s after reset: got %+v want %+v", tc.name, got, tc.want)
		}
	}
}

func TestUsageComputed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		u    Usage
		want int64
	}{
		{Usage{PromptTokens: 100, CachedTokens: 80, Measured: true, CachedMeasured: true}, 20},
		{Usage{PromptTokens: 100, CachedTokens: 80, Measured: true}, 100},
		{Usage{PromptTokens: 10, CachedTokens: 80, Measured: true, CachedMeasured: true}, 0},
		{Usage{}, 0},
	}
	for _, tt := range tests {
		if got := tt.u.Computed(); got != tt.want {
			t.Errorf("%+v.Computed() = %d, want %d", tt.u, got, tt.want)
		}
	}
}

func TestUsageParserLongStreamConstantMemory(t *testing.T) {
	// A 1 MB stream of content chunks followed by the usage chunk; parsing must
	// not allocate per chunk.
	chunk := []byte(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n")
	final := []byte(`data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":9000,"prompt_tokens_details":{"cached_tokens":4}}}` + "\n\ndata: [DONE]\n\n")
	p := NewUsageParser(APIOpenAI, true)
	allocs := testing.AllocsPerRun(5, func() {
		p.Reset(APIOpenAI, true)
		for i := 0; i < 1<<20/len(chunk); i++ {
			p.Write(chunk[:17])
			p.Write(chunk[17:])
		}
		p.Write(final)
	})
	if allocs != 0 {
		t.Errorf("allocations per stream: %v", allocs)
	}
	if got := p.Usage(); got.CompletionTokens != 9000 || got.CachedTokens != 4 {
		t.Fatalf("got %+v", got)
	}

}
