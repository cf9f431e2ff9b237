package caddymodule

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-lmwarden/emulator"
)

// lifecycleSite starts an emulator with n one-engine replicas behind Caddy
// and returns it with the replicas' IDs (host:port) in emulator order.
func lifecycleSite(t *testing.T, n int, modelName, poll string) (*emulator.Server, []string) {
	t.Helper()
	emu, ids := startEmulator(t, n, 50)
	loadSite(t, fmt.Sprintf(`
	lm_warden {
		restart_detection on
		session_end_headers on
	}
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			poll_interval %s
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
			max_num_seqs 32
		}
		flush_interval -1
	}`, strings.Join(ids, " "), modelName, poll))
	return emu, ids
}

// agentTurn sends turn k (1-based) of a conversation in Claude Code's shape:
// a long shared system prompt, the first task, then k-1 exchanges.
func agentTurn(t *testing.T, session, task string, k int, hdr map[string]string) turnResult {
	t.Helper()
	system := strings.Repeat("You are a careful coding agent. Follow the repository's conventions. ", 20)
	msgs := []map[string]any{{"role": "user", "content": task + " " + strings.Repeat("read the code and fix the failing test. ", 40)}}
	for i := 1; i < k; i++ {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "done step " + fmt.Sprint(i) + strings.Repeat(" and looked at the files", 10)},
			map[string]any{"role": "user", "content": "continue with step " + fmt.Sprint(i+1)})
	}
	body, _ := json.Marshal(map[string]any{
		"model": "qwen3-4b", "max_tokens": 8,
		"system": []map[string]any{{"type": "text", "text": system}}, "messages": msgs,
	})
	h := map[string]string{"X-Claude-Code-Session-Id": session}
	for k, v := range hdr {
		h[k] = v
	}
	res := sendTurn(t, "/v1/messages", string(body), h)
	if res.status != 200 {
		t.Fatalf("%s turn %d: %d %s", session, k, res.status, res.body)
	}
	return res
}

// upAgain waits until a restarted emulator replica answers on a new
// connection, which also gives the proxy's transport the time to drop the
// connections the stop closed.
func upAgain(t *testing.T, url string) {
	t.Helper()
	waitFor(t, "the restarted replica to answer", func() bool {
		resp, err := testClient.Get(url + "/v1/models")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// modelCounter returns the value of an lm_warden counter of a model and
// replica in the admin /metrics with the given extra labels, parsed with
// expfmt.
func modelCounter(t *testing.T, name, modelName, replica string, labels map[string]string) float64 {
	t.Helper()
	fams := adminMetrics(t)
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if got["model"] != modelName || got["replica"] != replica {
			continue
		}
		ok := true
		for k, v := range labels {
			ok = ok && got[k] == v
		}
		if ok {
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no %s sample for %s %s %v", name, modelName, replica, labels)
	return 0
}

// TestCompactedConversationRestartsOnce: the same session header with a
// new start (Claude Code's /compact or /clear replaces the history with a
// summary) is a side request at first, routed to the conversation's
// replica without moving it; when the new start comes again it is the
// conversation going on, counted restarted once and kept where its first
// request computed the new prefix; later turns, whose start stays the
// same, keep sticking, and the sticky turns' predicted cached tokens are
// delivered.
func TestCompactedConversationRestartsOnce(t *testing.T) {
	_, ids := lifecycleSite(t, 2, "lc-compact", "100ms")
	first := agentTurn(t, "s1", "Task one:", 1, nil)
	for k := 2; k <= 4; k++ {
		if r := agentTurn(t, "s1", "Task one:", k, nil); r.reason != "sticky" || r.replica != first.replica {
			t.Fatalf("turn %d: %s (%s), want %s sticky", k, r.replica, r.reason, first.replica)
		}
	}
	// its first turn holds one message (a lone request is never taken for
	// the conversation going on), its second the history too
	for k := 1; k <= 2; k++ {
		if r := agentTurn(t, "s1", "Summary of the conversation so far:", k, nil); r.reason != "side" || r.replica != first.replica {
			t.Fatalf("turn %d after compaction: %s (%s), want %s side", k, r.replica, r.reason, first.replica)
		}
	}
	compacted := agentTurn(t, "s1", "Summary of the conversation so far:", 3, nil)
	if compacted.reason != "restarted" || compacted.replica != first.replica {
		t.Fatalf("third turn after compaction: %s (%s), want %s restarted", compacted.replica, compacted.reason, first.replica)
	}
	if r := agentTurn(t, "s1", "Summary of the conversation so far:", 4, nil); r.reason != "sticky" || r.replica != compacted.replica {
		t.Fatalf("turn after compaction: %s (%s), want %s sticky", r.replica, r.reason, compacted.replica)
	}
	// the usage is fed back when the handler finishes, just after the
	// client has read the response: wait for the last sticky turn's
	waitFor(t, "the sticky turns measured", func() bool {
		return cardRow(getCard(t, "lc-compact"), compacted.replica).DeliveredShare != nil
	})
	c := getCard(t, "lc-compact")
	var restarted uint64
	for _, id := range ids {
		restarted += cardRow(c, id).Restarted
	}
	if restarted != 1 || cardRow(c, compacted.replica).Restarted != 1 {
		t.Fatalf("card restarted: %d in all, %d on %s; want 1", restarted, cardRow(c, compacted.replica).Restarted, compacted.replica)
	}
	row := cardRow(c, first.replica)
	if row.PredictedCached == 0 || row.DeliveredShare == nil || *row.DeliveredShare < 0.99 {
		t.Fatalf("%s: predicted %d delivered %d share %v; want every predicted token delivered",
			first.replica, row.PredictedCached, row.DeliveredCached, row.DeliveredShare)
	}
	if got := modelCounter(t, "lm_warden_requests_total", "lc-compact", compacted.replica, map[string]string{"reason": "restarted"}); got != 1 {
		t.Fatalf("Prometheus restarted requests %v, want 1", got)
	}
	if got := modelCounter(t, "lm_warden_requests_total", "lc-compact", first.replica, map[string]string{"reason": "side"}); got != 2 || cardRow(c, first.replica).Side != 2 {
		t.Fatalf("side requests: Prometheus %v, card %d; want 2", got, cardRow(c, first.replica).Side)
	}
	// the card and Prometheus read the same counters (the last turn's
	// feedback may land between two reads)
	waitFor(t, "Prometheus and the card to agree", func() bool {
		row := cardRow(getCard(t, "lc-compact"), first.replica)
		p := modelCounter(t, "lm_warden_sticky_cached_tokens_total", "lc-compact", first.replica, map[string]string{"kind": "predicted"})
		d := modelCounter(t, "lm_warden_sticky_cached_tokens_total", "lc-compact", first.replica, map[string]string{"kind": "delivered"})
		return p == float64(row.PredictedCached) && d == float64(row.DeliveredCached) && p > 0
	})
}

// TestLostCacheIsRefilledInPlace: a replica restarted between two polls
// the poller never saw (its interval is an hour) answers the next sticky
// turn without the conversation's cache: the card counts the shortfall
// against the prediction, and the conversation stays, since that turn
// computed its whole prompt on the replica: the following turn, sticky
// again, finds all of it.
func TestLostCacheIsRefilledInPlace(t *testing.T) {
	emu, ids := lifecycleSite(t, 2, "lc-lost", "1h")
	first := agentTurn(t, "s2", "Task two:", 1, nil)
	agentTurn(t, "s2", "Task two:", 2, nil)
	at := slices.Index(ids, first.replica)
	if at < 0 {
		t.Fatalf("routed to %q, not an emulator replica", first.replica)
	}
	row := func() ReplicaRow { return cardRow(getCard(t, "lc-lost"), first.replica) }
	// the usage is fed back when the handler finishes, just after the
	// client has read the response
	waitFor(t, "turn 2 measured", func() bool { return row().PredictedCached > 0 })
	before := row()
	if err := emu.Stop(at); err != nil {
		t.Fatal(err)
	}
	if err := emu.Restart(at); err != nil {
		t.Fatal(err)
	}
	upAgain(t, emu.URLs()[at])
	r := agentTurn(t, "s2", "Task two:", 3, nil)
	if r.reason != "sticky" || r.replica != first.replica {
		t.Fatalf("turn 3: %s (%s), want %s sticky (nothing told the router yet)", r.replica, r.reason, first.replica)
	}
	waitFor(t, "turn 3 measured", func() bool { return row().PredictedCached > before.PredictedCached })
	lost := row()
	if p, d := lost.PredictedCached-before.PredictedCached, lost.DeliveredCached-before.DeliveredCached; d*2 >= p {
		t.Fatalf("turn 3 after the restart delivered %d of %d predicted cached tokens", d, p)
	}
	r = agentTurn(t, "s2", "Task two:", 4, nil)
	if r.reason != "sticky" || r.replica != first.replica {
		t.Fatalf("turn 4: %s (%s), want %s sticky", r.replica, r.reason, first.replica)
	}
	waitFor(t, "turn 4 measured", func() bool { return row().PredictedCached > lost.PredictedCached })
	after := row()
	if p, d := after.PredictedCached-lost.PredictedCached, after.DeliveredCached-lost.DeliveredCached; d != p {
		t.Fatalf("turn 4 delivered %d of %d predicted cached tokens, want all (turn 3 refilled the replica)", d, p)
	}
	if after.ColdMarked != 0 || after.ColdReplaced != 0 {
		t.Fatalf("cold marked %d, cold replaced %d; want 0", after.ColdMarked, after.ColdReplaced)
	}
}

// TestReplicaRestartMakesItsBindingsCold: the poller sees a replica's
// counters drop (a restart between two polls): every binding there goes
// cold at once, and their next turns are placed by load.
func TestReplicaRestartMakesItsBindingsCold(t *testing.T) {
	emu, ids := lifecycleSite(t, 2, "lc-reset", "200ms")
	first := agentTurn(t, "s3", "Task three:", 1, nil)
	agentTurn(t, "s3", "Task three:", 2, nil)
	at := slices.Index(ids, first.replica)
	// the poller has seen the prefix counters move
	waitFor(t, "a poll after the turns", func() bool {
		hit := cardRow(getCard(t, "lc-reset"), first.replica).PrefixHitRateTotal
		return hit != nil && *hit > 0
	})
	if err := emu.Stop(at); err != nil {
		t.Fatal(err)
	}
	if err := emu.Restart(at); err != nil {
		t.Fatal(err)
	}
	upAgain(t, emu.URLs()[at])
	waitFor(t, "the restart seen by the poller", func() bool {
		return cardRow(getCard(t, "lc-reset"), first.replica).ColdMarked == 1
	})
	r := agentTurn(t, "s3", "Task three:", 3, nil)
	if r.reason != "cold-replaced" {
		t.Fatalf("turn 3: %s (%s), want cold-replaced", r.replica, r.reason)
	}
}

// TestSessionEndHeaderDropsTheBinding: the request marked as the session's
// last is routed as usual (sticky), then its binding is dropped and counted
// as ended; a later request of that key is placed anew.
func TestSessionEndHeaderDropsTheBinding(t *testing.T) {
	_, _ = lifecycleSite(t, 2, "lc-end", "100ms")
	first := agentTurn(t, "s4", "Task four:", 1, nil)
	last := agentTurn(t, "s4", "Task four:", 2, map[string]string{"X-Session-End": "true"})
	if last.reason != "sticky" || last.replica != first.replica {
		t.Fatalf("last turn: %s (%s), want %s sticky", last.replica, last.reason, first.replica)
	}
	// the binding is dropped when the handler finishes
	waitFor(t, "the session ended", func() bool { return cardRow(getCard(t, "lc-end"), first.replica).Ended == 1 })
	if row := cardRow(getCard(t, "lc-end"), first.replica); row.Bindings != 0 {
		t.Fatalf("%s: %d bindings after the session ended, want 0", first.replica, row.Bindings)
	}
	if got := modelCounter(t, "lm_warden_ended_sessions_total", "lc-end", first.replica, nil); got != 1 {
		t.Fatalf("Prometheus ended %v, want 1", got)
	}
	if r := agentTurn(t, "s4", "Task four:", 3, map[string]string{"X-Session-End": "0"}); r.reason != "placed" {
		t.Fatalf("turn after the end: %s, want placed", r.reason)
	}
	if row := cardRow(getCard(t, "lc-end"), first.replica); row.Ended != 1 {
		t.Fatalf("X-Session-End: 0 ended the session: %d", row.Ended)
	}
}
