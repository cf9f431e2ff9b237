package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// goroutineDump is the text of every goroutine's stack (the "goroutine"
// profile at debug=2), one stack per element.
func goroutineDump(t *testing.T) []string {
	t.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Split(buf.String(), "\n\n")
}

// stacksIn counts the stacks of dump that hold a frame of one of funcs.
func stacksIn(dump []string, funcs ...string) int {
	n := 0
	for _, g := range dump {
		for _, f := range funcs {
			if strings.Contains(g, f+"(") {
				n++
				break
			}
		}
	}
	return n
}

const (
	frameProxy     = "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.(*Handler).ServeHTTP"
	frameProxyLoop = "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.(*Handler).proxyLoopIteration"
	frameSelect    = "github.com/lmwarden/caddy-lmwarden/caddymodule.(*Policy).Select"
	frameHeldWait  = "github.com/lmwarden/caddy-lmwarden/caddymodule.(*heldTurn).wait"
	frameHandler   = "github.com/lmwarden/caddy-lmwarden/caddymodule.(*Handler).ServeHTTP"
)

// TestThousandHeldTurnsWaitInTheHandler: 1,000 new conversations held by
// admission wait in the lm_warden handler, not in reverse_proxy nor in the
// policy's Select: a goroutine dump taken while they wait finds each in
// the handler's wait and none in the proxy but the long turn that keeps
// the replica busy. Room made by a reload (a larger kv_tokens) lets them
// all through, answered 200 with the wait header, and no goroutine is
// left.
func TestThousandHeldTurnsWaitInTheHandler(t *testing.T) {
	const mdl, total = "held-1000", 1000
	emu, dial := admissionSite(t, mdl, "", "")
	if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
		t.Fatalf("A: %d %s", r.status, r.body)
	}
	done := occupy(t, emu, mdl, "A")
	defer done()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: total}}
	baseline := settledGoroutines(client)
	type answer struct {
		status int
		wait   string
		err    error
	}
	answers := make(chan answer, total)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	sent := time.Now()
	for i := range total {
		id := fmt.Sprint("held-1000-", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(bigTurn(id)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", id)
			resp, err := client.Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers <- answer{status: resp.StatusCode, wait: resp.Header.Get(WaitHeader)}
		}()
	}
	waitLong(t, "all held", time.Minute, func() bool { return waitingNow(t, mdl) == total })
	heldIn := time.Since(sent)

	dumpStart := time.Now()
	dump := goroutineDump(t)
	dumpTook := time.Since(dumpStart)
	handler := stacksIn(dump, frameHandler)
	waiting := stacksIn(dump, frameHeldWait)
	proxy := stacksIn(dump, frameProxy, frameProxyLoop)
	selecting := stacksIn(dump, frameSelect)
	t.Logf("%d held in %v; dump of %d goroutines in %v: %d in the handler, %d in its wait, %d in reverse_proxy, %d in Select",
		total, heldIn.Round(time.Millisecond), len(dump), dumpTook.Round(time.Millisecond), handler, waiting, proxy, selecting)
	if waiting != total {
		t.Errorf("%d goroutines in the handler's wait, want %d", waiting, total)
	}
	if selecting != 0 {
		t.Errorf("%d goroutines in Policy.Select, want 0", selecting)
	}
	// the long turn that keeps the replica busy is proxied, nothing else
	if inFlight := getCard(t, mdl).InFlight; proxy != inFlight || proxy > 1 {
		t.Errorf("%d goroutines in reverse_proxy, want the %d turn(s) at the engine", proxy, inFlight)
	}

	// room for all: every held turn is admitted and answered
	loadSite(t, strings.Replace(admissionConfig(dial, mdl, "", ""), "kv_tokens 3000", "kv_tokens 100000000", 1))
	_ = emu.SetSlow(0, 1)
	wg.Wait()
	close(answers)
	var ok, refused int
	for a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("a held turn failed: %v", a.err)
		case a.status == http.StatusOK:
			ok++
			if w, err := strconv.ParseFloat(a.wait, 64); err != nil || w <= 0 {
				t.Errorf("a held turn answered with %s %q", WaitHeader, a.wait)
			}
		case a.status == http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("a held turn answered %d", a.status)
		}
	}
	if ok != total || refused != 0 {
		t.Errorf("%d answered 200, %d refused; want %d, 0 (admit_queue 1024)", ok, refused, total)
	}
	adm := getCard(t, mdl).Admission
	if adm.Queued < total || adm.Cancelled != 0 || adm.Waiting != 0 {
		t.Errorf("admission: queued %d, cancelled %d, waiting %d; want ≥ %d, 0, 0", adm.Queued, adm.Cancelled, adm.Waiting, total)
	}
	var after int
	waitLong(t, "goroutines to settle", 10*time.Second, func() bool {
		after = settledGoroutines(client)
		return after <= baseline+10
	})
	t.Logf("all %d answered 200 %v after they were sent; goroutines %d → %d", total, time.Since(sent).Round(time.Millisecond), baseline, after)
}

// TestHeldTurnOutlastsTryDuration: with lb_try_duration 1s, a turn
// admission holds is served after its wait, however long: 3 s here
// (admit_wait, then placed anyway), and 0.5 s, where the proxy's own
// retry loop finds the decision made and takes it.
func TestHeldTurnOutlastsTryDuration(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{
		{"wait 3s", 3 * time.Second},
		{"wait 0.5s", 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mdl := "held-try-" + strings.Fields(tc.name)[1]
			emu, _ := admissionSite(t, mdl, "admit_wait "+tc.wait.String(), "lb_try_duration 1s")
			if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
				t.Fatalf("A: %d %s", r.status, r.body)
			}
			done := occupy(t, emu, mdl, "A")
			res := postAsync(context.Background(), "/v1/messages", bigTurn("B"), session("B"))
			// B waits its admit_wait and is placed anyway, on the busy
			// replica: the engine may speed up then
			waitLong(t, "B placed at its wait limit", time.Minute, func() bool {
				return getCard(t, mdl).Admission.AdmittedAtLimit == 1
			})
			done()
			var r turnResult
			select {
			case r = <-res:
			case <-time.After(30 * time.Second):
				t.Fatal("B not answered 30 s after it was placed")
			}
			waited, err := strconv.ParseFloat(r.header.Get(WaitHeader), 64)
			if r.status != 200 || err != nil || waited < tc.wait.Seconds()-0.05 {
				t.Fatalf("B: %d, waited %q (want ≥ %v) %s", r.status, r.header.Get(WaitHeader), tc.wait, r.body)
			}
			if r.reason != "placed" {
				t.Errorf("B's route %q, want placed", r.reason)
			}
			t.Logf("B answered %d after a wait of %.3f s (admit_wait %v, lb_try_duration 1s)", r.status, waited, tc.wait)
		})
	}
}

// TestHeldClientGivesUp: a client that gives up while its turn is held
// takes its ticket out of the queue (counted as cancelled), its turn never
// reaches the engine, and its goroutines end; also when it leaves while
// the proxy retries (lb_try_duration), which Select notices.
func TestHeldClientGivesUp(t *testing.T) {
	for _, tc := range []struct{ name, proxy string }{
		{"plain", ""},
		{"lb_try_duration", "lb_try_duration 3s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mdl := "held-gone-" + strings.ReplaceAll(tc.name, "_", "-")
			emu, dial := admissionSite(t, mdl, "", tc.proxy)
			if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
				t.Fatalf("A: %d %s", r.status, r.body)
			}
			done := occupy(t, emu, mdl, "A")
			defer done()
			emuURL := "http://" + dial
			reached := engineRequests(t, emuURL)
			client := &http.Client{Transport: &http.Transport{}}
			baseline := settledGoroutines(client)

			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteURL+"/v1/messages", strings.NewReader(bigTurn("B")))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Claude-Code-Session-Id", "B")
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("answered %d", resp.StatusCode)
				}
				errc <- err
			}()
			waitFor(t, "B held", func() bool { return waitingNow(t, mdl) == 1 })
			cancel()
			if err := <-errc; !strings.Contains(err.Error(), "context canceled") {
				t.Fatalf("B: %v, want its client's cancellation", err)
			}
			waitFor(t, "B's ticket cancelled", func() bool {
				a := getCard(t, mdl).Admission
				return a.Waiting == 0 && a.Cancelled == 1
			})
			var after int
			waitLong(t, "goroutines to settle", 10*time.Second, func() bool {
				after = settledGoroutines(client)
				return after <= baseline+5
			})
			if got := engineRequests(t, emuURL); got != reached {
				t.Errorf("%v requests reached the engine after B was sent, want 0", got-reached)
			}
			if a := getCard(t, mdl).Admission; a.AdmittedAfterWait+a.AdmittedAtLimit != 0 {
				t.Errorf("B admitted after its client left: %+v", a)
			}
			t.Logf("goroutines %d → %d", baseline, after)
		})
	}
}

// TestHeldTurnWithoutTheHandler: the policy without the lm_warden handler
// in front never waits either. A turn admission holds gets 503 at once,
// its ticket cancelled with the request; with lb_try_duration longer than
// its wait, the proxy's own retries find the decision made and serve it.
func TestHeldTurnWithoutTheHandler(t *testing.T) {
	for _, tc := range []struct {
		name, policy, proxy string
		status              int
	}{
		{"no retries", "", "", http.StatusServiceUnavailable},
		{"lb_try_duration", "admit_wait 500ms", "lb_try_duration 5s", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mdl := "held-alone-" + strings.Fields(tc.name)[0]
			emu, dials := startEmulator(t, 1, 50)
			// the site without its lm_warden handler line
			cfg := admissionConfig(dials[0], mdl, tc.policy, tc.proxy)
			if !strings.Contains(cfg, "\tlm_warden\n") {
				t.Fatal("no lm_warden handler line to take out of the site")
			}
			cfg = strings.Replace(cfg, "\tlm_warden\n", "", 1)
			loadSite(t, cfg)
			waitFor(t, "admission in force", func() bool { return getCard(t, mdl).Admission.Active })
			t.Cleanup(func() {
				if t.Failed() {
					// how admission and the replica stood: whether B was
					// queued at all, the replica's outs, what it holds
					c := getCard(t, mdl)
					b, _ := json.Marshal(struct {
						InFlight            int
						Admission, Replicas any
					}{c.InFlight, c.Admission, c.Replicas})
					t.Logf("card after the failure: %s", b)
				}
			})
			if r := sendTurn(t, "/v1/messages", bigTurn("A"), session("A")); r.status != 200 {
				t.Fatalf("A: %d %s", r.status, r.body)
			}
			done := occupy(t, emu, mdl, "A")
			res := postAsync(context.Background(), "/v1/messages", bigTurn("B"), session("B"))
			var r turnResult
			if tc.status == http.StatusOK {
				waitLong(t, "B placed at its wait limit", time.Minute, func() bool {
					return getCard(t, mdl).Admission.AdmittedAtLimit == 1
				})
				done()
				r = <-res
			} else {
				r = <-res
				done()
			}
			if r.status != tc.status {
				t.Fatalf("B: %d %s, want %d", r.status, r.body, tc.status)
			}
			a := getCard(t, mdl).Admission
			if tc.status == http.StatusOK {
				if w, err := strconv.ParseFloat(r.header.Get(WaitHeader), 64); err != nil || w < 0.45 {
					t.Errorf("B's wait header %q, want ≥ 0.5", r.header.Get(WaitHeader))
				}
			} else {
				waitFor(t, "B's ticket cancelled", func() bool {
					a = getCard(t, mdl).Admission
					return a.Waiting == 0 && a.Cancelled == 1
				})
			}
			t.Logf("B: %d, wait %q; queued %d, cancelled %d, admitted at the limit %d", r.status, r.header.Get(WaitHeader), a.Queued, a.Cancelled, a.AdmittedAtLimit)
		})
	}
}

// TestStreamedBodyReadAfterRequestBuffers: reverse_proxy's request_buffers
// reads the start of the body before the policy runs. A new conversation
// over streamOver (its key in a header, its body streamed) whose policy
// asks the handler for the whole body still reaches the engine whole, and
// so do the turns of the bound conversation whose start lies beyond the
// handler's peek: read in full, their start tells a turn (sticky) from a
// side request.
func TestStreamedBodyReadAfterRequestBuffers(t *testing.T) {
	const mdl = "held-buffers"
	_, _ = admissionSite(t, mdl, "bytes_per_token 64", "request_buffers 64k")
	for i, tc := range []struct{ text, reason string }{
		{"hello", "placed"},
		{"hello", "sticky"},
		{"a title for this session", "side"},
	} {
		// over streamOver in JSON whitespace: few tokens for the engine,
		// and the conversation's start beyond the handler's peek
		body := `{"model":"qwen3-4b","max_tokens":8,"stream":false,` + strings.Repeat(" ", streamOver+256<<10) +
			`"messages":[{"role":"user","content":"big: ` + tc.text + `"}]}`
		r := sendTurn(t, "/v1/messages", body, session("big"))
		if r.status != 200 || r.reason != tc.reason {
			t.Fatalf("request %d: %d %s %s, want 200 %s", i, r.status, r.reason, r.body, tc.reason)
		}
		t.Logf("request %d (%d bytes): %d %s", i, len(body), r.status, r.reason)
	}
}
