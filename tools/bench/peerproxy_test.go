package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

var t0p = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestRenderRequestExtends: a conversation's next turn renders to this
// turn's tokens plus the new messages' (what the peers' prefix indexes
// rely on), in both APIs, and the first user message is found.
func TestRenderRequestExtends(t *testing.T) {
	for _, tc := range []struct{ name, one, two string }{
		{"anthropic",
			`{"system":[{"type":"text","text":"You are a coding agent."}],"messages":[{"role":"user","content":[{"type":"text","text":"fix the parser"}]}]}`,
			`{"system":[{"type":"text","text":"You are a coding agent."}],"messages":[{"role":"user","content":[{"type":"text","text":"fix the parser"}]},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"Read","input":{"path":"a.go"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package a"}]}]}`},
		{"openai",
			`{"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"fix the parser"}]}`,
			`{"messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"fix the parser"},{"role":"assistant","content":"done"},{"role":"user","content":"now the tests"}]}`},
	} {
		a, firstA := RenderRequest([]byte(tc.one))
		b, firstB := RenderRequest([]byte(tc.two))
		if len(a) == 0 || len(b) <= len(a) || !slices.Equal(a, b[:len(a)]) {
			t.Errorf("%s: turn 2 (%d tokens) does not extend turn 1 (%d)", tc.name, len(b), len(a))
		}
		if firstA != "fix the parser" || firstB != firstA {
			t.Errorf("%s: first user message %q, %q", tc.name, firstA, firstB)
		}
	}
	if toks, first := RenderRequest([]byte("not json")); toks != nil || first != "" {
		t.Errorf("bad body: %d tokens, %q", len(toks), first)
	}
}

// FuzzRenderRequest: any body renders or is refused, never panics, and
// the first user message is text of the body's.
func FuzzRenderRequest(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":null}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		toks, first := RenderRequest(body)
		if first != "" && len(toks) == 0 {
			t.Fatalf("a first user message %q without tokens", first)
		}
	})
}

// TestPeerProxyHoldsPausedProgram runs ThunderAgent's policy in the peer
// proxy in front of a real emulator replica whose KV pool two
// conversations overfill: at the scheduler's tick the smaller is paused,
// its next turn is held in the proxy (the client waits, nothing fails)
// and streamed once a later tick resumes it.
func TestPeerProxyHoldsPausedProgram(t *testing.T) {
	eng := emulator.DefaultEngineConfig()
	eng.NumGPUBlocks = 200 // 3,200 tokens
	srv, err := emulator.NewServer(emulator.ServerConfig{Replicas: 1, Speed: 50, Model: "m", Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var mu sync.Mutex
	clock := t0p
	held := make(chan struct{}, 4)
	p := &PeerProxy{Replicas: srv.URLs(), PollInterval: time.Hour,
		Config: peers.Config{BlockSize: eng.BlockSize, NumGPUBlocks: eng.NumGPUBlocks, Seed: 1},
		Clock:  func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }}
	p.onHold = func() { held <- struct{}{} }
	if err := p.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.SetMode(ctx, peers.ModeThunder); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: time.Minute}
	send := func(key string, words int) (int, string) {
		text := strings.Repeat(key+" word ", words)
		body := fmt.Sprintf(`{"model":"m","max_tokens":8,"stream":true,"messages":[{"role":"user","content":%q}]}`, text)
		req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", key)
		resp, err := hc.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// a and b: about 1,800 and 1,300 tokens of a 3,200-token pool (0.97)
	for _, c := range []struct {
		key   string
		words int
	}{{"a", 900}, {"b", 650}} {
		if code, body := send(c.key, c.words); code != http.StatusOK || !strings.Contains(body, "message_stop") {
			t.Fatalf("%s: %d %q", c.key, code, body)
		}
	}
	th := func() *peers.Thunder { p.mu.Lock(); defer p.mu.Unlock(); return p.policy.(*peers.Thunder) }
	advance := func() {
		mu.Lock()
		clock = clock.Add(peers.ThunderTick)
		mu.Unlock()
		p.PollNow(ctx, hc)
	}
	advance()
	if u := th().Utilisation()[0]; !th().IsPaused("b") || th().IsPaused("a") {
		t.Fatalf("utilisation %.2f: paused a %v, b %v; want b", u, th().IsPaused("a"), th().IsPaused("b"))
	}
	done := make(chan string, 1)
	go func() {
		code, body := send("b", 700)
		done <- fmt.Sprint(code, strings.Contains(body, "message_stop"))
	}()
	select { // the proxy holds b's turn
	case <-held:
	case r := <-done:
		t.Fatalf("b's turn answered while its program was paused: %s", r)
	case <-time.After(30 * time.Second):
		t.Fatal("b's turn was neither held nor answered in 30 s")
	}
	select {
	case r := <-done:
		t.Fatalf("b's turn answered while its program was paused: %s", r)
	default:
	}
	p.EndSession(ctx, "a")
	advance() // a gone: b fits again and resumes; its held turn goes
	if r := <-done; r != "200 true" {
		t.Fatalf("b's held turn: %s", r)
	}
}
