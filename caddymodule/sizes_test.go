package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// sizesRuns numbers the runs of TestBytesPerTokenLearnedFromTheEngine.
var sizesRuns atomic.Int64

// TestBytesPerTokenLearnedFromTheEngine: a turn answered through real
// Caddy and the emulator teaches the model its bytes per prompt token, the
// request's size over the prompt_tokens of the engine's usage; before it,
// nothing was learned.
func TestBytesPerTokenLearnedFromTheEngine(t *testing.T) {
	// a model of its own per run: a model's state survives config loads
	model := fmt.Sprintf("sizes-learned-%d", sizesRuns.Add(1))
	_, dials := startEmulator(t, 1, 50)
	loadSite(t, coreSite(model, dials, "30s", ""))
	m, ok := lookupModel(model)
	if !ok {
		t.Fatalf("no model %s", model)
	}
	if r := m.sizes.Rate(0); r != 0 {
		t.Fatalf("before any turn: %g bytes per token learned", r)
	}
	body, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 8,
		"messages": []map[string]any{
			{"role": "system", "content": "You are a coding agent."},
			{"role": "user", "content": strings.Repeat("Please look at this file and fix the bug in parse(). ", 60)},
		},
	})
	r := sendTurn(t, "/v1/chat/completions", string(body), session("sizes-a"))
	if r.status != http.StatusOK {
		t.Fatalf("turn: %d %s", r.status, r.body)
	}
	var resp struct {
		Usage struct {
			PromptTokens int64 `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(r.body), &resp); err != nil || resp.Usage.PromptTokens <= 0 {
		t.Fatalf("no usage in the answer (%v): %s", err, r.body)
	}
	// the handler records the usage when its response has ended, which
	// the client may see before: wait for it, then check what was learned
	want := float64(len(body)) / float64(resp.Usage.PromptTokens)
	waitFor(t, "the turn's bytes per token learned", func() bool { return m.sizes.Rate(0) != 0 })
	if got := m.sizes.Rate(0); got != want {
		t.Fatalf("after a turn of %d bytes and %d prompt tokens: %g bytes per token, want %g", len(body), resp.Usage.PromptTokens, got, want)
	}
}

// TestTokensUsesTheLearnedRate: a new conversation is sized at the
// model's learned bytes per token, at 4 before any turn, and at
// bytes_per_token when the (deprecated) option sets one.
func TestTokensUsesTheLearnedRate(t *testing.T) {
	t.Parallel()
	req := func(n int64) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, "/v1/messages", nil)
		r.ContentLength = n
		return r
	}
	m := newModelState("sizes-tokens", placement.Config{})
	p := &Policy{Model: "sizes-tokens", m: m}
	st := new(routeState)
	if got := p.tokens(req(40000), st); got != 10000 || st.bodyBytes != 40000 {
		t.Fatalf("before any turn: %d tokens (body %d bytes kept), want 10000 at 4 bytes per token", got, st.bodyBytes)
	}
	m.sizes.Observe(55000, 10000) // an engine that counts words
	if got := p.tokens(req(44000), st); got != 8000 {
		t.Fatalf("after a turn at 5.5 bytes per token: %d tokens, want 8000", got)
	}
	p.BytesPerToken = 2
	if got := p.tokens(req(44000), st); got != 22000 {
		t.Fatalf("with bytes_per_token 2: %d tokens, want 22000", got)
	}
	if got := p.tokens(req(0), new(routeState)); got != 0 {
		t.Fatalf("a body of unknown size: %d tokens, want 0", got)
	}
}
