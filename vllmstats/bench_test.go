package vllmstats

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func BenchmarkParseMetricsFourEngines(b *testing.B) {
	in := readFixture(b, "four_engines.txt")
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseMetrics(strings.NewReader(in)); err != nil {
			b.Fatal(err)
		}
	}
}

// sseStream builds about size bytes of a streamed response ending with usage.
func sseStream(api API, size int) []byte {
	var sb strings.Builder
	if api == APIAnthropic {
		sb.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"qwen3-4b\",\"usage\":{\"input_tokens\":400,\"cache_read_input_tokens\":10800,\"cache_creation_input_tokens\":0,\"output_tokens\":1}}}\n\n")
		for i := 0; sb.Len() < size; i++ {
			fmt.Fprintf(&sb, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" token%d\"}}\n\n", i)
		}
		sb.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9000}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		return []byte(sb.String())
	}
	for i := 0; sb.Len() < size; i++ {
		fmt.Fprintf(&sb, "data: {\"id\":\"chatcmpl-8f2c\",\"object\":\"chat.completion.chunk\",\"created\":1764522000,\"model\":\"qwen3-4b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", i)
	}
	sb.WriteString("data: {\"id\":\"chatcmpl-8f2c\",\"object\":\"chat.completion.chunk\",\"created\":1764522000,\"model\":\"qwen3-4b\",\"choices\":[],\"usage\":{\"prompt_tokens\":11200,\"total_tokens\":20200,\"completion_tokens\":9000,\"prompt_tokens_details\":{\"cached_tokens\":10800}}}\n\ndata: [DONE]\n\n")
	return []byte(sb.String())
}

func benchUsage(b *testing.B, api API, body []byte, chunk int, want int64) {
	p := NewUsageParser(api, true)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		p.Reset(api, true)
		for i := 0; i < len(body); i += chunk {
			p.Write(body[i:min(i+chunk, len(body))])
		}
	}
	if u := p.Usage(); u.CompletionTokens != want {
		b.Fatalf("usage %+v", u)
	}
}

// Chunks of 4 KiB as a proxy's copy buffer passes them, and 97 bytes so that
// most lines straddle writes.
func BenchmarkUsageParserOpenAISSE1MB(b *testing.B) {
	benchUsage(b, APIOpenAI, sseStream(APIOpenAI, 1<<20), 4096, 9000)
}

func BenchmarkUsageParserOpenAISSE1MBSmallWrites(b *testing.B) {
	benchUsage(b, APIOpenAI, sseStream(APIOpenAI, 1<<20), 97, 9000)
}

func BenchmarkUsageParserAnthropicSSE1MB(b *testing.B) {
	benchUsage(b, APIAnthropic, sseStream(APIAnthropic, 1<<20), 4096, 9000)
}

func BenchmarkUsageParserOpenAIJSON1MB(b *testing.B) {
	text := strings.Repeat("lorem ipsum \\\"dolor\\\" sit amet ", (1<<20)/32)
	body := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + text +
		`"},"finish_reason":"stop"}],"usage":{"prompt_tokens":11200,"completion_tokens":9000,"prompt_tokens_details":{"cached_tokens":10800}}}`)
	benchUsage(b, APIOpenAI, body, 4096, 9000)
}

func BenchmarkSnapshotReplica(b *testing.B) {
	var targets []Target
	for i := range 8 {
		targets = append(targets, Target{ID: fmt.Sprintf("127.0.0.1:80%02d", i), BaseURL: "http://127.0.0.1:1"})
	}
	p := NewPoller(PollerConfig{Targets: targets})
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := p.Snapshot().Replica("127.0.0.1:8007"); !ok {
			b.Fatal("missing")
		}
	}
}

func BenchmarkAccountantRecord(b *testing.B) {
	a := NewAccountant()
	u := Usage{PromptTokens: 11200, CachedTokens: 10800, CompletionTokens: 256, Measured: true, CachedMeasured: true}
	t0 := time.Unix(1_800_000_000, 0)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		a.Record("127.0.0.1:8001", u, t0.Add(time.Duration(i)*time.Millisecond))
		i++
	}
}
