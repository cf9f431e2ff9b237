package caddymodule

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// modelFirstBody is a first request as Claude Code orders it: the model
// first, then the messages, padded to size bytes; its first 4 KiB hold the
// model, so over streamOver the handler reads no further when the key came
// from a header (admission reads the rest).
func modelFirstBody(id string, size int) string {
	head := `{"model":"qwen3-4b","max_tokens":8,"stream":false,"messages":[{"role":"user","content":"` + id + `: `
	tail := `"}]}`
	fill := max(size-len(head)-len(tail), 0)
	return head + strings.Repeat("x", fill) + tail
}

// engineRequests is how many generation requests reached the emulated
// engines behind url: finished (any reason, aborted included), running or
// waiting, from its /metrics parsed with expfmt.
func engineRequests(t *testing.T, url string) float64 {
	t.Helper()
	fams := emulatorMetrics(t, url)
	var n float64
	for _, m := range fams["vllm:request_success_total"].GetMetric() {
		n += m.GetCounter().GetValue()
	}
	return n + engineHolds(fams)
}

// engineHolds is how many requests the engines of fams run or queue now.
func engineHolds(fams map[string]*dto.MetricFamily) float64 {
	var n float64
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting"} {
		for _, m := range fams[name].GetMetric() {
			n += m.GetGauge().GetValue()
		}
	}
	return n
}

// emulatorMetrics is the /metrics of the emulated engines behind url, parsed
// with expfmt.
func emulatorMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return parseExposition(t, url+"/metrics", resp.Body)
}

// waitLong is waitFor with a longer bound, for conditions that need a
// thousand connections to be made on a loaded machine.
func waitLong(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHeldClientsThatLeaveLeaveTheQueue: 1,000 new conversations with 8 KB
// bodies (model first, key in X-Claude-Code-Session-Id: the handler reads
// them in full) are held by admission; the 500 whose clients give up
// leave the queue at once, counted as cancelled, and none of them reaches
// the engine; then the other 500 give up too, and no goroutine is left.
// The same with 20 bodies over streamOver, of which the handler reads only
// the start and admission the rest.
func TestHeldClientsThatLeaveLeaveTheQueue(t *testing.T) {
	for _, tc := range []struct {
		name        string
		total, size int
		extra       string // policy settings
	}{
		{"8 KB", 1000, 8 << 10, ""},
		// about 17,400 tokens: it fits the replica alone, not beside A
		{"over streamOver", 20, streamOver + 64<<10, "bytes_per_token 64\nkv_tokens 19000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heldClientsLeave(t, "held-gone-"+strings.Fields(tc.name)[0], tc.total, tc.size, tc.extra)
		})
	}
}

func heldClientsLeave(t *testing.T, mdl string, total, size int, extra string) {
	emu, dials := startEmulator(t, 1, 50)
	loadSite(t, admissionConfig(dials[0], mdl, extra, ""))
	waitFor(t, "admission in force", func() bool { return getCard(t, mdl).Admission.Active })
	emuURL := "http://" + dials[0]
	if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
		t.Fatalf("A: %d %s", r.status, r.body)
	}
	// an idle replica takes newcomers at once: keep it busy
	before := engineRequests(t, emuURL)
	done := occupy(t, emu, mdl, "A")
	waitFor(t, "A's long turn at the engine", func() bool { return engineRequests(t, emuURL) > before })
	reached := engineRequests(t, emuURL)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1000}}
	settle := func() int { return settledGoroutines(client) }
	baseline := settle()

	cancels := make([]context.CancelFunc, total)
	var wg sync.WaitGroup
	answered := make(chan string, total)
	for i := range total {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		id := fmt.Sprint("held-", i)
		body := modelFirstBody(id, size)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", id)
			resp, err := client.Do(req)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answered <- fmt.Sprintf("%s: %d %s", id, resp.StatusCode, b)
			}
		}()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	waitLong(t, "all held", time.Minute, func() bool { return waitingNow(t, mdl) == total })

	for i := range total / 2 {
		cancels[i]()
	}
	waitFor(t, "the half cancelled to leave the queue", func() bool {
		a := getCard(t, mdl).Admission
		return a.Cancelled == uint64(total/2) && a.Waiting == total/2
	})
	for i := total / 2; i < total; i++ {
		cancels[i]()
	}
	waitFor(t, "the queue to empty", func() bool { return waitingNow(t, mdl) == 0 })
	wg.Wait()
	close(answered)
	for a := range answered {
		t.Errorf("a held request was answered: %s", a)
	}
	a := getCard(t, mdl).Admission
	if a.Queued != uint64(total) || a.Cancelled != uint64(total) || a.AdmittedAfterWait+a.AdmittedAtLimit != 0 {
		t.Errorf("queued %d, cancelled %d, admitted %d; want %d, %d, 0", a.Queued, a.Cancelled, a.AdmittedAfterWait+a.AdmittedAtLimit, total, total)
	}
	if got := engineRequests(t, emuURL); got != reached {
		t.Errorf("%v requests reached the engine after the held ones were sent, want 0", got-reached)
	}
	var after int
	waitLong(t, "goroutines to settle", 10*time.Second, func() bool {
		after = settle()
		return after <= baseline+10
	})
	t.Logf("queued %d, cancelled %d; goroutines %d → %d", a.Queued, a.Cancelled, baseline, after)
	done()
}

// stalledBody opens a connection to the site and sends a new
// conversation's request whose body announces size bytes but stops after
// sent of them. It returns the connection (closed at cleanup).
func stalledBody(t *testing.T, id string, size, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(siteURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := modelFirstBody(id, size)
	fmt.Fprintf(c, "POST /v1/messages HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nX-Claude-Code-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s",
		strings.TrimPrefix(siteURL, "http://"), id, len(body), body[:sent])
	return c
}

// TestStalledBodiesDoNotHoldAdmission: 40 clients each send 6 KB of a
// 100 KB first request and stop (read in full by the handler), or of a
// first request over streamOver (its start read by the handler, the rest
// by admission), or of a turn of a conversation already bound. They take
// no place in the admission queue and no room on the replica, so a new
// small conversation sent after them is placed at once; when the body
// deadline passes they are answered 408 and their goroutines end.
func TestStalledBodiesDoNotHoldAdmission(t *testing.T) {
	old := bodyTimeout.Load()
	bodyTimeout.Store(int64(3 * time.Second))
	t.Cleanup(func() { bodyTimeout.Store(old) })
	for _, tc := range []struct {
		name  string
		size  int
		bound bool // the stalled requests are turns of bound conversations
	}{
		{"100 KB", 100 << 10, false},
		{"over streamOver", streamOver + 64<<10, false},
		{"bound", 100 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) { stalledBodies(t, "held-stalled-"+strings.Fields(tc.name)[0], tc.size, tc.bound) })
	}
}

func stalledBodies(t *testing.T, mdl string, size int, bound bool) {
	_, dials := startEmulator(t, 1, 50)
	loadSite(t, admissionConfig(dials[0], mdl, "", ""))
	waitFor(t, "admission in force", func() bool { return getCard(t, mdl).Admission.Active })
	if bound {
		for i := range 40 {
			id := fmt.Sprint(mdl, "-", i)
			if r := sendTurn(t, "/v1/messages", modelFirstBody(id, 200), session(id)); r.status != 200 {
				t.Fatalf("binding %s: %d %s", id, r.status, r.body)
			}
		}
	}
	testClient.CloseIdleConnections()
	runtime.GC()
	baseline := runtime.NumGoroutine()

	conns := make([]net.Conn, 40)
	for i := range conns {
		conns[i] = stalledBody(t, fmt.Sprint(mdl, "-", i), size, 6<<10)
	}
	// give the server time to take every stalled request to admission
	time.Sleep(300 * time.Millisecond)
	if a := getCard(t, mdl).Admission; a.Waiting != 0 || a.Queued != 0 {
		t.Fatalf("stalled bodies in the queue: waiting %d, queued %d", a.Waiting, a.Queued)
	}

	small := modelFirstBody(mdl+"-small", 200)
	start := time.Now()
	r := sendTurn(t, "/v1/messages", small, session(mdl+"-small"))
	took := time.Since(start)
	if r.status != 200 || r.reason != "placed" || r.header.Get(WaitHeader) != "" {
		t.Fatalf("small conversation behind 40 stalled bodies: %d %s wait %q %s", r.status, r.reason, r.header.Get(WaitHeader), r.body)
	}
	if a := getCard(t, mdl).Admission; a.Queued != 0 {
		t.Fatalf("the small conversation waited: queued %d", a.Queued)
	}
	t.Logf("small conversation answered in %v behind 40 stalled bodies", took)

	// the deadline ends the stalled requests: 408 in the API's format
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("stalled %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "did not arrive") {
			t.Fatalf("stalled %d answered %d %s", i, resp.StatusCode, b)
		}
		c.Close()
	}
	var after int
	waitLong(t, "goroutines to settle", 10*time.Second, func() bool {
		testClient.CloseIdleConnections()
		runtime.GC()
		after = runtime.NumGoroutine()
		return after <= baseline+10
	})
}
