package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"     // the Caddyfile adapter
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the http server type
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	_ "github.com/lmwarden/caddy-lmwarden/caddymodule"
	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
)

var updateTrace = flag.Bool("update-trace", false, "rewrite testdata/claudecode.trace.jsonl from a recording through Caddy")

// traceFixture is the trace recorded from the Claude Code captures.
const traceFixture = "testdata/claudecode.trace.jsonl"

// ccCapture is one request of the module's Claude Code captures
// (caddymodule/testdata/claudecode and claudecode-interactive).
type ccCapture struct {
	File    string            `json:"file"`
	Kind    string            `json:"kind"` // interactive only: probe, main, agent, side
	Path    string            `json:"path"`
	Headers map[string]string `json:"headers"`
	body    []byte
}

// loadCaptures reads the captures of both sets, in the order they were
// sent: the non-interactive conversations, then the interactive sessions.
// Probes (HEAD, no body) are left out: they are no turns.
func loadCaptures(t *testing.T) []ccCapture {
	t.Helper()
	var all []ccCapture
	for _, dir := range []string{"claudecode", "claudecode-interactive"} {
		dir = filepath.Join("..", "..", "caddymodule", "testdata", dir)
		b, err := os.ReadFile(filepath.Join(dir, "requests.json"))
		if err != nil {
			t.Fatal(err)
		}
		var reqs []ccCapture
		if err := json.Unmarshal(b, &reqs); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if r.Kind == "probe" || r.File == "" {
				continue
			}
			if r.body, err = os.ReadFile(filepath.Join(dir, r.File)); err != nil {
				t.Fatal(err)
			}
			all = append(all, r)
		}
	}
	return all
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var capMaxTokens = regexp.MustCompile(`"max_tokens":[0-9]+`)

// recordCaptures sends the captures through an in-process Caddy with
// LM Warden's handler recording a trace, in front of four emulated
// replicas, and returns the trace file's path (Caddy stopped, the file
// closed) and each request's conversation key and answered usage.
func recordCaptures(t *testing.T) (string, []sentTurn) {
	t.Helper()
	engine := emulator.DefaultEngineConfig()
	engine.NumGPUBlocks = 100000
	engine.MaxModelLen = 400000
	emu, err := emulator.NewServer(emulator.ServerConfig{Replicas: 4, Speed: 50, Model: "qwen3-4b", Engine: engine})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	var ups []string
	for _, u := range emu.URLs() {
		ups = append(ups, strings.TrimPrefix(u, "http://"))
	}
	path := filepath.Join(t.TempDir(), "turns.jsonl")
	admin, port := freePort(t), freePort(t)
	cfg := fmt.Sprintf(`{
	admin 127.0.0.1:%d
	http_port %d
	auto_https off
	persist_config off
}
http://127.0.0.1:%d {
	lm_warden {
		trace %s
	}
	reverse_proxy %s {
		lb_policy lm_warden {
			model qwen3-4b
			poll_interval 100ms
		}
		flush_interval -1
	}
}
`, admin, port, port, path, strings.Join(ups, " "))
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			if err := caddy.Stop(); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(stop)
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var sent []sentTurn
	for _, r := range loadCaptures(t) {
		body := capMaxTokens.ReplaceAll(r.body, []byte(`"max_tokens":16`))
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", port, r.Path), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		key := r.Headers["X-Claude-Code-Session-Id"]
		req.Header.Set("X-Claude-Code-Session-Id", key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		if a := r.Headers["X-Claude-Code-Agent-Id"]; a != "" {
			req.Header.Set("X-Claude-Code-Agent-Id", a)
			key += "/" + a
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", r.File, resp.StatusCode, b)
		}
		prompt, output := answeredUsage(t, r.File, b)
		sent = append(sent, sentTurn{key: key, prompt: prompt, output: output})
	}
	// the module writes a turn once its response has ended: wait for the
	// last one, then stop Caddy, which closes the file
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Count(b, []byte("\n")) >= len(sent) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the trace has %d lines, %d turns were answered", bytes.Count(b, []byte("\n")), len(sent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	return path, sent
}

// sentTurn is one request the recording sent: its conversation key and
// the token usage its answer reported.
type sentTurn struct {
	key            string
	prompt, output int64
}

// answeredUsage reads the usage of an Anthropic answer, streamed or not:
// the prompt (input and cache read and written) and output tokens.
func answeredUsage(t *testing.T, file string, body []byte) (prompt, output int64) {
	t.Helper()
	type usage struct {
		Input     int64 `json:"input_tokens"`
		CacheRead int64 `json:"cache_read_input_tokens"`
		CacheNew  int64 `json:"cache_creation_input_tokens"`
		Output    int64 `json:"output_tokens"`
	}
	add := func(u *usage) {
		if u == nil {
			return
		}
		if p := u.Input + u.CacheRead + u.CacheNew; p > 0 {
			prompt = p
		}
		if u.Output > 0 {
			output = u.Output
		}
	}
	var msg struct {
		Usage   *usage `json:"usage"`
		Message *struct {
			Usage *usage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(body, &msg) == nil && msg.Usage != nil {
		add(msg.Usage)
		return prompt, output
	}
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		msg.Usage, msg.Message = nil, nil
		if json.Unmarshal([]byte(data), &msg) != nil {
			continue
		}
		add(msg.Usage)
		if msg.Message != nil {
			add(msg.Message.Usage)
		}
	}
	if prompt == 0 {
		t.Fatalf("%s: no usage in the answer", file)
	}
	return prompt, output
}

// TestTraceRoundTrip records the Claude Code captures through Caddy with
// the trace on and replays the trace in the simulator under every mode:
// the trace has a line per answered request with the sizes the replicas
// reported and a conversation per key, and each mode's replay sends
// every turn, in its conversation and order, with the recorded prompt and
// output sizes. With -update-trace the recording becomes the fixture.
func TestTraceRoundTrip(t *testing.T) {
	path, sent := recordCaptures(t)
	turns, err := ReadTraceFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != len(sent) {
		t.Fatalf("%d turns in the trace, %d sent", len(turns), len(sent))
	}
	// the trace is in start order, as the requests were sent (one at a
	// time): line i is request i
	convOf := map[string]string{}
	for i, tr := range turns {
		s := sent[i]
		if c, ok := convOf[s.key]; ok && c != tr.Conv {
			t.Errorf("turn %d: conv %s, the key's earlier turns %s", i, tr.Conv, c)
		}
		convOf[s.key] = tr.Conv
		if tr.Prompt != s.prompt || tr.Output != s.output {
			t.Errorf("turn %d: prompt %d output %d, the answer said %d and %d", i, tr.Prompt, tr.Output, s.prompt, s.output)
		}
	}
	if sum := SummarizeTrace(turns); sum.Conversations != len(convOf) {
		t.Errorf("%d conversations in the trace, %d keys sent", sum.Conversations, len(convOf))
	}
	if *updateTrace {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(traceFixture, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := traceSimConfig()
	for _, mode := range AllModes() {
		st, got := replayTrace(t, cfg, turns, TraceOptions{}, mode)
		checkReplay(t, mode, turns, st, got)
	}
}

// replayTrace replays turns under one mode as SimTrace does and returns
// what the replay sent too.
func replayTrace(t *testing.T, cfg SimConfig, turns []turntrace.Turn, opt TraceOptions, mode string) (Stage, []replayedTurn) {
	t.Helper()
	cfg, opt, _, err := traceSetup(cfg, turns, opt)
	if err != nil {
		t.Fatal(err)
	}
	st, got, err := replayMode(cfg, turns, opt, mode)
	if err != nil {
		t.Fatal(err)
	}
	return st, got
}

// traceSimConfig is the replicas the tests replay the captures on: four
// with room for the captures' longest conversation (≈35k tokens).
func traceSimConfig() SimConfig {
	cfg := DefaultSimConfig()
	cfg.Engine.NumGPUBlocks = 20000
	cfg.Engine.MaxModelLen = 131072
	cfg.Modes = CompareModes
	return cfg
}

// checkReplay asserts that a mode's replay sent every turn of the trace,
// in its conversation and order, with its sizes, and answered it.
func checkReplay(t *testing.T, mode string, turns []turntrace.Turn, st Stage, got []replayedTurn) {
	t.Helper()
	if len(got) != len(turns) {
		t.Fatalf("%s: %d turns replayed, %d in the trace", mode, len(got), len(turns))
	}
	convs := map[string]int{}
	next := map[string]int{}
	for _, tr := range turns {
		if _, ok := convs[tr.Conv]; !ok {
			convs[tr.Conv] = len(convs)
		}
	}
	byConv := map[int][]replayedTurn{}
	for _, g := range got {
		byConv[g.serial] = append(byConv[g.serial], g)
	}
	for _, tr := range turns {
		serial := convs[tr.Conv]
		idx := next[tr.Conv]
		next[tr.Conv]++
		var g *replayedTurn
		for i := range byConv[serial] {
			if byConv[serial][i].idx == idx {
				g = &byConv[serial][i]
			}
		}
		if g == nil {
			t.Errorf("%s: turn %d of conversation %s not replayed", mode, idx, tr.Conv)
			continue
		}
		if g.conv != tr.Conv || int64(g.prompt) != tr.Prompt || int64(g.output) != max(tr.Output, 1) || g.err || g.aborted {
			t.Errorf("%s: conversation %s turn %d replayed as %+v; recorded prompt %d output %d", mode, tr.Conv, idx, *g, tr.Prompt, tr.Output)
		}
	}
	if st.Sessions != len(convs) || st.Requests != len(turns) || st.Errors != 0 {
		t.Errorf("%s: stage of %d sessions, %d requests (%d errors); the trace has %d conversations, %d turns",
			mode, st.Sessions, st.Requests, st.Errors, len(convs), len(turns))
	}
}
