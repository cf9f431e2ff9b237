package caddymodule

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// A session ID travels in clear: what a client that knows another's can do
// to that conversation. The victim's turns must all find their prefix where
// they left it.

// abuseSite loads three emulated replicas behind the handler with its
// defaults (restart detection on, no session-end header) and the policy
// with extra settings.
func abuseSite(t *testing.T, model, extra string) ([]string, func(i int, factor float64)) {
	t.Helper()
	emu, ids := startEmulator(t, 3, 50)
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			max_num_seqs 32
			%s
		}
		flush_interval -1
	}`, strings.Join(ids, " "), model, extra))
	return ids, func(i int, factor float64) {
		if err := emu.SetSlow(i, factor); err != nil {
			t.Fatal(err)
		}
	}
}

// cachedTokens is the prompt tokens the engine found cached for a turn
// (the Anthropic usage's cache_read_input_tokens).
func cachedTokens(res turnResult) int64 {
	return gjson.Get(res.body, "usage.cache_read_input_tokens").Int()
}

// TestForeignSessionEndIgnoredByDefault: a client that sends the victim's
// session ID with X-Session-End before each of the victim's turns ends
// nothing: session_end_headers is off by default.
func TestForeignSessionEndIgnoredByDefault(t *testing.T) {
	abuseSite(t, "abuse-end", "")
	first := agentTurn(t, "victim-end", "Task V:", 1, nil)
	for k := 2; k <= 6; k++ {
		evil := agentTurn(t, "victim-end", fmt.Sprintf("Probe %d:", k), 1, map[string]string{"X-Session-End": "true"})
		if evil.status != http.StatusOK {
			t.Fatalf("the other client's request: %d", evil.status)
		}
		v := agentTurn(t, "victim-end", "Task V:", k, nil)
		if v.replica != first.replica || v.reason != "sticky" || cachedTokens(v) == 0 {
			t.Errorf("victim turn %d: %s (%s), %d tokens cached; want %s, sticky, its prefix cached", k, v.replica, v.reason, cachedTokens(v), first.replica)
		}
	}
	for _, row := range getCard(t, "abuse-end").Replicas {
		if row.Ended != 0 {
			t.Errorf("%s: %d sessions ended by a header that is off", row.ID, row.Ended)
		}
	}
}

// holdSide sends a streaming request under key with a start of its own
// (a side request) that generates for long, and returns once its response
// headers came, with the replica it went to; cancel ends it.
func holdSide(t *testing.T, ctx context.Context, key, task string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 4000, "stream": true,
		"messages": []map[string]any{{"role": "user", "content": task}},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", key)
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("held request: %d", resp.StatusCode)
	}
	go func() {
		// drain until cancelled, so the engine is not held by a full
		// socket
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
		}
	}()
	replica, _, _ := strings.Cut(resp.Header.Get(RouteHeader), "; ")
	return replica
}

// TestForeignRestartMovesNothing: a client that knows the victim's session
// ID loads the victim's replica over the spill threshold with requests under
// that ID, then sends a start of its own twice with history, which restart
// detection takes for the conversation restarting (a compaction). The
// conversation stays on its replica, and the victim's next turn, with its
// own start, is sticky there with its prefix cached.
func TestForeignRestartMovesNothing(t *testing.T) {
	ids, slow := abuseSite(t, "abuse-restart", "spill_threshold 1")
	v1 := agentTurn(t, "victim-rs", "Task V:", 1, nil)
	v2 := agentTurn(t, "victim-rs", "Task V:", 2, nil)
	if v2.replica != v1.replica || v2.reason != "sticky" {
		t.Fatalf("victim turn 2: %s (%s), want %s sticky", v2.replica, v2.reason, v1.replica)
	}
	home := -1
	for i, id := range ids {
		if id == v1.replica {
			home = i
		}
	}
	// the victim's replica over the threshold: two long requests there
	slow(home, 200)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 2; i++ {
		if at := holdSide(t, ctx, "victim-rs", fmt.Sprintf("Say something long, %d.", i)); at != v1.replica {
			t.Fatalf("held request %d went to %s, want the victim's replica %s", i, at, v1.replica)
		}
	}
	// another start with history, twice: a restart
	a1 := agentTurn(t, "victim-rs", "Evil task:", 2, nil)
	a2 := agentTurn(t, "victim-rs", "Evil task:", 2, nil)
	t.Logf("the other client's requests: %s (%s), %s (%s)", a1.replica, a1.reason, a2.replica, a2.reason)
	if a2.reason == "restarted" && a2.replica != v1.replica {
		t.Errorf("the other client's restart moved the conversation to %s", a2.replica)
	}
	cancel()
	slow(home, 1)
	waitFor(t, "the held requests to end", func() bool { return cardRow(getCard(t, "abuse-restart"), v1.replica).Held == 0 })
	for k := 3; k <= 4; k++ {
		v := agentTurn(t, "victim-rs", "Task V:", k, nil)
		if v.replica != v1.replica || v.reason != "sticky" || cachedTokens(v) == 0 {
			t.Errorf("victim turn %d: %s (%s), %d tokens cached; want %s, sticky, its prefix cached", k, v.replica, v.reason, cachedTokens(v), v1.replica)
		}
	}
}
