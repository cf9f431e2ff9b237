package caddymodule

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
)

// traceWriter returns the live writer of the trace file at path.
func traceWriter(t *testing.T, path string) *turntrace.Writer {
	t.Helper()
	var w *turntrace.Writer
	traceFiles.Range(func(key, val any) bool {
		if key == path {
			w = val.(traceFile).Writer
			return false
		}
		return true
	})
	if w == nil {
		t.Fatalf("no trace writer for %s", path)
	}
	return w
}

var traceRuns int

// TestTraceRecordsClaudeCodeThroughCaddy sends what interactive Claude
// Code sent (testdata/claudecode-interactive) through Caddy with the
// handler's trace on, in front of four emulated replicas: the trace has
// one line per answered request, one conv per conversation key (a
// sub-agent's its own, with its parent's as parent), the side and
// compaction marks exactly where the responses said side and restarted,
// the token sizes the replicas reported (the same sums as the module's own
// token counters), and no session or agent ID. A reload that keeps the
// file keeps its writer (a conversation keeps its hash); a configuration
// without trace closes it.
func TestTraceRecordsClaudeCodeThroughCaddy(t *testing.T) {
	engine := emulator.DefaultEngineConfig()
	engine.NumGPUBlocks = 100000
	engine.MaxModelLen = 400000
	_, ids := startEmulatorConfig(t, emulator.ServerConfig{Replicas: 4, Speed: 50, Model: "qwen3-4b", Engine: engine})
	traceRuns++
	model := fmt.Sprintf("cc-trace-%d", traceRuns)
	path := filepath.Join(t.TempDir(), "turns.jsonl")
	site := func(trace string) string {
		return fmt.Sprintf(`
	lm_warden {
		%s
	}
	reverse_proxy %s {
		%s
		flush_interval -1
	}`, trace, strings.Join(ids, " "), policyBlock(model, ""))
	}
	loadSite(t, site("trace "+path+" 10MiB"))

	var lines, side, restarted, agent int
	keys := map[string]bool{}
	var secrets []string
	for _, r := range loadInteractive(t) {
		if r.Kind == "probe" {
			continue
		}
		hdr := map[string]string{
			"X-Claude-Code-Session-Id": r.Headers["X-Claude-Code-Session-Id"],
			"Anthropic-Version":        r.Headers["Anthropic-Version"],
		}
		key := hdr["X-Claude-Code-Session-Id"]
		secrets = append(secrets, key)
		if a := r.Headers["X-Claude-Code-Agent-Id"]; a != "" {
			hdr["X-Claude-Code-Agent-Id"] = a
			key += "/" + a
			secrets = append(secrets, a)
			agent++
		}
		keys[key] = true
		res := sendTurn(t, r.Path, maxTokens.ReplaceAllString(r.body, `"max_tokens":16`), hdr)
		if res.status != http.StatusOK {
			t.Fatalf("%s: %d %s", r.File, res.status, res.body)
		}
		lines++
		switch res.reason {
		case "side":
			side++
		case "restarted":
			restarted++
		}
	}
	w := traceWriter(t, path)
	waitFor(t, "every turn in the trace", func() bool { return w.Stats().Written == uint64(lines) })
	w.Flush()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets {
		if bytes.Contains(raw, []byte(s)) {
			t.Fatalf("the trace holds the key %q", s)
		}
	}
	turns, err := turntrace.Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var gotSide, gotRestarted, gotAgent, firsts int
	var prompt, output int64
	convs := map[string]bool{}
	for _, tr := range turns {
		convs[tr.Conv] = true
		gotSide += b2i(tr.Side)
		gotRestarted += b2i(tr.Compacted)
		gotAgent += b2i(tr.Agent)
		firsts += b2i(tr.First)
		prompt += tr.Prompt
		output += tr.Output
		if tr.Cached == nil || tr.Model != model || tr.Output < 1 || tr.DurMS < 0 {
			t.Errorf("turn %+v: want cached known, model %s, output", tr, model)
		}
		if tr.Agent && (tr.Parent == "" || !convs[tr.Parent]) {
			t.Errorf("sub-agent turn %+v: parent not a conversation seen before", tr)
		}
	}
	if len(turns) != lines || gotSide != side || gotRestarted != restarted || gotAgent != agent ||
		len(convs) != len(keys) || firsts != len(keys) {
		t.Errorf("trace: %d turns, %d side, %d compacted, %d sub-agent, %d conversations (%d first); "+
			"sent %d, side %d, restarted %d, sub-agent %d, %d keys",
			len(turns), gotSide, gotRestarted, gotAgent, len(convs), firsts, lines, side, restarted, agent, len(keys))
	}
	if side == 0 || restarted == 0 || agent == 0 {
		t.Fatalf("side %d restarted %d sub-agent %d: the fixtures should have each", side, restarted, agent)
	}
	// the same sizes the module counts for its own metrics
	fams := adminMetrics(t)
	var mPrompt, mOutput float64
	for _, m := range fams["lm_warden_prompt_tokens_total"].GetMetric() {
		if labelOf(m.GetLabel(), "model") == model {
			mPrompt += m.GetCounter().GetValue()
		}
	}
	for _, m := range fams["lm_warden_generation_tokens_total"].GetMetric() {
		if labelOf(m.GetLabel(), "model") == model {
			mOutput += m.GetCounter().GetValue()
		}
	}
	if float64(prompt) != mPrompt || float64(output) != mOutput {
		t.Errorf("trace: %d prompt and %d output tokens; the module counted %v and %v", prompt, output, mPrompt, mOutput)
	}
	var written float64
	for _, m := range fams["lm_warden_trace_turns_total"].GetMetric() {
		if labelOf(m.GetLabel(), "file") == path {
			written = m.GetCounter().GetValue()
		}
	}
	if written != float64(lines) {
		t.Errorf("lm_warden_trace_turns_total %v, want %d", written, lines)
	}

	// a reload keeping the file keeps the writer: the first conversation's
	// next turn has its hash and is no first turn
	loadSite(t, site("trace "+path))
	if traceWriter(t, path) != w {
		t.Fatal("the reload replaced the trace writer")
	}
	first := loadInteractive(t)[2] // s1's first turn
	res := sendTurn(t, first.Path, maxTokens.ReplaceAllString(first.body, `"max_tokens":16`), map[string]string{
		"X-Claude-Code-Session-Id": first.Headers["X-Claude-Code-Session-Id"], "Anthropic-Version": "2023-06-01"})
	if res.status != http.StatusOK {
		t.Fatalf("after the reload: %d %s", res.status, res.body)
	}
	waitFor(t, "the turn after the reload", func() bool { return w.Stats().Written == uint64(lines+1) })
	w.Flush()
	raw, _ = os.ReadFile(path)
	again, err := turntrace.Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	last := again[len(again)-1]
	var s1 string
	for _, tr := range turns {
		if !tr.Side && !tr.Agent {
			s1 = tr.Conv
			break
		}
	}
	if last.Conv != s1 || last.First {
		t.Errorf("after the reload: conv %s first %v, want %s, not first", last.Conv, last.First, s1)
	}

	// without trace the file is let go of: its writer closed
	loadSite(t, site(""))
	traceFiles.Range(func(key, _ any) bool {
		if key == path {
			t.Errorf("the trace file is still open after a configuration without it")
		}
		return true
	})
	if st := w.Stats(); st.Dropped != 0 || st.Failed != 0 {
		t.Errorf("writer stats %+v", st)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// labelOf returns the value of the label name ("" when absent).
func labelOf(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestTraceDocSnippetAdapts: docs/trace.md's Caddyfile adapts, and its
// trace line becomes the handler's trace_file and trace_max_size.
func TestTraceDocSnippetAdapts(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/trace.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/trace.md has no caddyfile snippet")
	}
	got, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(m[1], map[string]any{"filename": "trace.md"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, []byte(`"trace_file":"/var/log/caddy/turns.jsonl","trace_max_size":104857600`)) {
		t.Errorf("adapted JSON has no trace settings:\n%s", got)
	}
}

// TestTraceFileUnopenable: a trace file that cannot be opened fails the
// configuration with the reason, before anything is served.
func TestTraceFileUnopenable(t *testing.T) {
	h := &Handler{TraceFile: filepath.Join(t.TempDir(), "missing", "turns.jsonl")}
	err := h.Provision(benchCtx())
	if err == nil || !strings.Contains(err.Error(), "trace_file") || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("Provision: %v; want the trace file's error", err)
	}
	if h.trace != nil {
		t.Fatal("a writer without a file")
	}
	if err := h.Cleanup(); err != nil {
		t.Fatal(err)
	}
}
