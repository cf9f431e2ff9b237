package vllmstats_test

import (
	"fmt"
	"time"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// A proxy feeds each response chunk to a UsageParser and records the result.
func ExampleUsageParser() {
	p := vllmstats.NewUsageParser(vllmstats.APIAnthropic, true)
	for _, chunk := range []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":400,\"cache_read_in",
		"put_tokens\":10800,\"cache_creation_input_tokens\":16,\"output_tokens\":1}}}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":200}}\n\n",
	} {
		p.Write([]byte(chunk))
	}
	u := p.Usage()
	fmt.Println(u.PromptTokens, u.CachedTokens, u.Computed(), u.CompletionTokens)

	a := vllmstats.NewAccountant()
	a.Record("127.0.0.1:8001", u, time.Now())
	fmt.Printf("%+v\n", a.Totals()["127.0.0.1:8001"])
	// Output:
	// 11216 10800 416 200
	// {Cached:10800 Computed:416 Generated:200 Requests:1 Unmeasured:0 NoUsage:0 Predicted:0 Delivered:0}
}
