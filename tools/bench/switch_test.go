package bench

import (
	"context"
	"strings"
	"testing"
)

// TestSwitcherRefusesVLLMDP: vLLM's balancer lives in the data-parallel
// server, so switching Caddy to it is refused before any request is made.
func TestSwitcherRefusesVLLMDP(t *testing.T) {
	sw := &CaddySwitcher{Admin: "127.0.0.1:1", LBPath: "/config/x", Model: "m"}
	err := sw.SetMode(context.Background(), ModeVLLMDP)
	if err == nil || !strings.Contains(err.Error(), "vLLM's own balancer") {
		t.Fatalf("SetMode(vllm-dp) = %v, want a refusal naming vLLM's own balancer", err)
	}
	if sw.original != nil || sw.replaced {
		t.Error("the refusal touched the switcher's state")
	}
}
