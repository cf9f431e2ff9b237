package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// The real engine: llama.cpp's llama-server, built by
// scripts/build-llama-server from the source node-llama-cpp ships, with the
// random-weight model tools/cmd/tinygguf writes. The test runs when the
// build is cached (LLAMA_SERVER and LLAMA_MODEL name them, or the script's
// cache holds them) and skips, saying so, otherwise; a LLAMA_SERVER that
// names a missing file fails it.

// llamaBuild returns the llama-server binary and the model, or why not.
func llamaBuild() (server, model, why string) {
	server, model = os.Getenv("LLAMA_SERVER"), os.Getenv("LLAMA_MODEL")
	if server == "" || model == "" {
		home, _ := os.UserHomeDir()
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			cache = filepath.Join(home, ".cache")
		}
		markers, _ := filepath.Glob(filepath.Join(cache, "lm-warden", "node-llama-cpp-*.dir"))
		for _, m := range markers {
			b, err := os.ReadFile(m)
			if err != nil {
				continue
			}
			dir := strings.TrimSpace(string(b))
			if server == "" {
				server = filepath.Join(dir, "bin", "llama-server")
			}
			if model == "" {
				model = filepath.Join(dir, "models", "tiny-llama.gguf")
			}
			break
		}
	}
	if server == "" {
		return "", "", "no llama-server build cached: run scripts/build-llama-server (about 7 min on 2 cores; scripts/test runs it), or set LLAMA_SERVER and LLAMA_MODEL"
	}
	for _, p := range []string{server, model} {
		if _, err := os.Stat(p); err != nil {
			return "", "", fmt.Sprintf("%v: run scripts/build-llama-server, or set LLAMA_SERVER and LLAMA_MODEL", err)
		}
	}
	return server, model, ""
}

// llamaReplica is one llama-server on a free loopback port.
type llamaReplica struct {
	addr string
	cmd  *exec.Cmd
	log  *bytes.Buffer
}

// startLlama starts n llama-servers with --metrics, two slots of ctx/2
// tokens each, and waits until every one answers /health.
func startLlama(t *testing.T, server, model string, n, ctx int) []*llamaReplica {
	t.Helper()
	out := make([]*llamaReplica, n)
	for i := range out {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command(server, "-m", model, "--host", "127.0.0.1", "--port", port,
			"--metrics", "-c", fmt.Sprint(ctx), "-np", "2", "-t", "1", "--no-webui")
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Dir(server))
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", server, err)
		}
		r := &llamaReplica{addr: addr, cmd: cmd, log: &log}
		out[i] = r
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("llama-server %s log (tail):\n%s", addr, tail(log.String(), 2000))
			}
		})
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, r := range out {
		for {
			resp, err := http.Get("http://" + r.addr + "/health")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("llama-server %s not healthy after 2 min: %v\n%s", r.addr, err, tail(r.log.String(), 2000))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var llamaClient = &http.Client{Timeout: 3 * time.Minute}

// llamaTurn is turn n of conversation c: a system prompt of its own (so no
// other conversation shares its prefix), then n user turns with the
// assistant's earlier answers as fixed text.
func llamaTurn(api, c string, n int, stream bool) string {
	system := fmt.Sprintf("Conversation %s. ", c) + strings.Repeat(fmt.Sprintf("Rule %s: keep the code tidy and the tests green. ", c), 40)
	var msgs []map[string]any
	for i := 1; i <= n; i++ {
		if i > 1 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": strings.Repeat("done ", 30)})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("turn %d of %s: %s", i, c, strings.Repeat("change the file. ", 20))})
	}
	req := map[string]any{"model": "tiny", "max_tokens": 4, "stream": stream, "temperature": 0}
	if api == "/v1/messages" {
		req["system"] = []map[string]any{{"type": "text", "text": system}}
		req["messages"] = msgs
	} else {
		req["messages"] = append([]map[string]any{{"role": "system", "content": system}}, msgs...)
		if stream {
			// llama.cpp, like OpenAI, puts usage in a stream only when asked
			req["stream_options"] = map[string]any{"include_usage": true}
		}
	}
	b, _ := json.Marshal(req)
	return string(b)
}

type llamaResult struct {
	replica, reason string
	prompt, cached  int64
}

// postLlama sends one turn to base (Caddy or a replica) and reads the usage
// llama.cpp reports.
func postLlama(t *testing.T, base, api, body, session string) llamaResult {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+api, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", session)
	resp, err := llamaClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s%s: %v", base, api, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s%s: %d %s", base, api, resp.StatusCode, b)
	}
	var res llamaResult
	res.replica, res.reason, _ = strings.Cut(resp.Header.Get(RouteHeader), "; ")
	u := vllmstats.NewUsageParser(vllmstats.APIOpenAI, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	if api == "/v1/messages" {
		u = vllmstats.NewUsageParser(vllmstats.APIAnthropic, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	}
	_, _ = u.Write(b)
	usage := u.Usage()
	if !usage.Measured || !usage.CachedMeasured {
		t.Fatalf("POST %s%s: usage not measured (%+v) in %s", base, api, usage, tail(string(b), 600))
	}
	res.prompt, res.cached = usage.PromptTokens, usage.CachedTokens
	return res
}

// engineMetrics reads a replica's own /metrics.
func engineMetrics(t *testing.T, addr string) *vllmstats.EngineMetrics {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	ems, err := vllmstats.ParseMetrics(resp.Body)
	if err != nil {
		t.Fatalf("%s/metrics: %v", addr, err)
	}
	return ems["0"]
}

// Several real llama.cpp replicas behind in-process Caddy: multi-turn
// conversations on both APIs stay on their replica, a sticky turn reads its
// prefix from the cache and a cold one does not, and the card's figures are
// llama.cpp's own.
func TestLlamaCppBehindCaddy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts real llama.cpp servers")
	}
	server, model, why := llamaBuild()
	if why != "" && os.Getenv("LLAMA_SERVER") != "" {
		// named (scripts/test names the build it made): missing is an error
		t.Fatal(why)
	}
	if why != "" {
		t.Skip(why)
	}
	reps := startLlama(t, server, model, 3, 8192)
	var dials []string
	for _, r := range reps {
		dials = append(dials, r.addr)
	}
	// llama-server answers /metrics from the thread pool that computes on
	// the CPU: on a loaded 2-core machine one poll in a while is late, which
	// is a poll failure (fail_after 1 would take the replica out for it);
	// that a server exporting no known series is never out is
	// TestReachableWithoutKnownSeriesStaysAvailableAndSticky's
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, strings.Join(dials, " "), policyBlock("llama", "fail_after 3\n\t\t\tpoll_interval 2s")))

	const convs, turns = 6, 4
	where := map[string]string{}
	for turn := 1; turn <= turns; turn++ {
		for c := range convs {
			name := fmt.Sprintf("ll-%d", c)
			api := "/v1/chat/completions"
			if c%2 == 1 {
				api = "/v1/messages"
			}
			res := postLlama(t, siteURL, api, llamaTurn(api, name, turn, c%3 == 0), name)
			if turn == 1 {
				where[name] = res.replica
				continue
			}
			if res.reason != "sticky" || res.replica != where[name] {
				t.Errorf("%s turn %d: %s on %s, want sticky on %s", name, turn, res.reason, res.replica, where[name])
			}
			// the previous turn's prompt is this one's prefix: most of it
			// came from the cache
			if res.cached*2 < res.prompt {
				t.Errorf("%s turn %d (%s): %d of %d prompt tokens cached on its replica", name, turn, api, res.cached, res.prompt)
			}
		}
	}

	// The card against llama.cpp's own counters, once a poll has read the
	// servers idle (the card is as old as the last poll, 2 s at most).
	waitLong(t, "a poll of the idle servers", 15*time.Second, func() bool {
		card := getCard(t, "llama")
		for _, r := range reps {
			row := cardRow(card, r.addr)
			em := engineMetrics(t, r.addr)
			if row.Running == nil || row.Waiting == nil || *row.Running != int(em.Running) || *row.Waiting != int(em.Waiting) ||
				uint64(em.PromptTokens) != row.Tokens.Cached+row.Tokens.Computed {
				return false
			}
		}
		return true
	})
	card := getCard(t, "llama")
	for _, r := range reps {
		row := cardRow(card, r.addr)
		em := engineMetrics(t, r.addr)
		if !row.Available || !row.Reachable || row.Engine != "llamacpp" {
			t.Errorf("%s: available %v reachable %v engine %q out %v", r.addr, row.Available, row.Reachable, row.Engine, row.Out)
		}
		if uint64(em.PrefixHits) != row.Tokens.Cached || uint64(em.PromptTokens) != row.Tokens.Cached+row.Tokens.Computed {
			t.Errorf("%s: card cached/computed %d/%d, engine cached %v of %v prompt tokens", r.addr, row.Tokens.Cached, row.Tokens.Computed, em.PrefixHits, em.PromptTokens)
		}
		if row.Running == nil || row.Waiting == nil || *row.Running != int(em.Running) || *row.Waiting != int(em.Waiting) {
			t.Errorf("%s: card running/waiting %v/%v, engine %v/%v", r.addr, row.Running, row.Waiting, em.Running, em.Waiting)
		}
		if row.KVCapacityTokens == nil || *row.KVCapacityTokens != 8192 {
			t.Errorf("%s: KV capacity %v, want 8192 from /props (2 slots of 4096)", r.addr, row.KVCapacityTokens)
		}
		if row.PrefixHitRateTotal == nil {
			t.Errorf("%s: no hit rate", r.addr)
		}
		t.Logf("%s: engine %s, card cached %d computed %d = llama.cpp cached %v, prompt %v; hit rate since start %.3f",
			r.addr, row.Engine, row.Tokens.Cached, row.Tokens.Computed, em.PrefixHits, em.PromptTokens, *row.PrefixHitRateTotal)
	}

	// A cold turn: the next turn of a conversation sent straight to a
	// replica that never saw it reads (almost) nothing from the cache — at
	// most the chat template's opening tokens, which every prompt shares.
	for _, api := range []string{"/v1/chat/completions", "/v1/messages"} {
		name := "ll-0"
		if api == "/v1/messages" {
			name = "ll-1"
		}
		var cold string
		for _, r := range reps {
			if r.addr != where[name] {
				cold = r.addr
				break
			}
		}
		res := postLlama(t, "http://"+cold, api, llamaTurn(api, name, turns+1, false), name)
		if res.cached > 16 || res.prompt < 500 {
			t.Errorf("cold %s turn on %s: %d of %d prompt tokens cached, want none beyond the template's start", api, cold, res.cached, res.prompt)
		}
		t.Logf("cold %s turn: %d of %d cached", api, res.cached, res.prompt)
	}
}
