package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/internal/redisserver"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// childCaddyEnv names the Caddyfile a re-executed test binary serves: the
// second front-end of the shared store tests (Caddy has one configuration
// per process, so the second instance is a process of its own).
const childCaddyEnv = "LMW_TEST_CADDY_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(childCaddyEnv); path != "" {
		os.Exit(serveChildCaddy(path))
	}
	os.Exit(m.Run())
}

// serveChildCaddy loads the Caddyfile at path and serves it until its
// standard input closes (the parent stops it, or died).
func serveChildCaddy(path string) int {
	cfg, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := loadCaddyfile(string(cfg)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = caddy.Stop()
	return 0
}

// childCaddy is a second Caddy front-end: this test binary re-executed.
type childCaddy struct {
	admin, port int
	url         string
	log         string
}

// startChildCaddy starts a Caddy process serving site on 127.0.0.1:port
// with its admin endpoint on admin; it is stopped when the test ends.
func startChildCaddy(t *testing.T, admin, port int, site string) *childCaddy {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(robustConfig(admin, port, site)), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &childCaddy{admin: admin, port: port, url: fmt.Sprintf("http://127.0.0.1:%d", port), log: filepath.Join(dir, "caddy.log")}
	logf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childCaddyEnv+"="+path)
	cmd.Stdout, cmd.Stderr = logf, logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := testClient.Get(fmt.Sprintf("http://127.0.0.1:%d/lm-warden/models", admin))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"model"`) {
				return c
			}
		}
		select {
		case <-done:
			out, _ := os.ReadFile(c.log)
			t.Fatalf("the second Caddy exited: %s", out)
		default:
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(c.log)
			t.Fatalf("the second Caddy did not come up: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// storeSite is the site of each front-end of the shared store tests.
func storeSite(model string, dials []string, redisAddr, extra string) string {
	return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			max_num_seqs 32
			spill_threshold 4
			poll_interval 200ms
			fail_after 10 # polls this fast time out on a starved CPU: not a replica failure
			client_pin_header X-Pin
			%s
		}
		flush_interval -1
		transport http {
			dial_timeout 3s
			response_header_timeout 20s
		}
	}`, strings.Join(dials, " "), model, storeBlock(redisAddr, extra))
}

func storeBlock(redisAddr, extra string) string {
	if redisAddr == "" {
		return ""
	}
	// The deadline is generous: the race detector on a shared machine is
	// slow, and a turn past it would route on local bindings (counted).
	return fmt.Sprintf("store redis {\n\t\t\t\taddress %s\n\t\t\t\tprefix lmwtest:\n\t\t\t\ttimeout 200ms\n\t\t\t\t%s\n\t\t\t}", redisAddr, extra)
}

// alternation drives conversations whose turns alternate between the
// front-ends and records where each turn went.
type alternation struct {
	urls  []string
	model string
	mu    sync.Mutex
	turns map[string][]turnLog
	order []string
}

func newAlternation(model string, urls ...string) *alternation {
	return &alternation{urls: urls, model: model, turns: make(map[string][]turnLog)}
}

// run sends convs conversations of turns turns each, workers at a time;
// conversation i's turn n goes to front-end (i+n) mod len(urls). It stops
// early (between turns) when stop is closed.
func (a *alternation) run(prefix string, convs, turns, workers int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		defer close(next)
		for i := range convs {
			select {
			case next <- i:
			case <-stop:
				return
			}
		}
	}()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				conv := fmt.Sprintf("%s-%d", prefix, i)
				a.mu.Lock()
				a.order = append(a.order, conv)
				a.mu.Unlock()
				for n := 1; n <= turns; n++ {
					select {
					case <-stop:
						return
					default:
					}
					l := streamTurn(context.Background(), a.urls[(i+n)%len(a.urls)], a.model, conv, n, nil)
					l.conv = i
					a.mu.Lock()
					a.turns[conv] = append(a.turns[conv], l)
					a.mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
}

// figures: turns sent, failed (no complete answer), turns after the
// first that stayed on the conversation's previous replica, of those
// later turns, and conversations placed per replica.
func (a *alternation) figures() (sent, failed, stayed, later int, placed map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	placed = make(map[string]int)
	for _, conv := range a.order {
		ls := a.turns[conv]
		for i, l := range ls {
			sent++
			if !l.complete {
				failed++
			}
			if i == 0 {
				placed[l.replica]++
				continue
			}
			later++
			if l.replica == ls[i-1].replica {
				stayed++
			}
		}
	}
	return
}

func childCard(t *testing.T, c *childCaddy, model string) Card {
	t.Helper()
	resp, err := testClient.Get(fmt.Sprintf("http://127.0.0.1:%d/lm-warden/models/%s", c.admin, model))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var card Card
	if err := json.NewDecoder(resp.Body).Decode(&card); err != nil {
		t.Fatal(err)
	}
	return card
}

// waitConnected waits until both front-ends show the store connected.
func waitConnected(t *testing.T, model string, child *childCaddy, want bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		a, b := getCard(t, model).Store, childCard(t, child, model).Store
		if a != nil && b != nil && a.Connected == want && b.Connected == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("store connected: want %v on both, have %+v and %+v", want, a, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSharedStoreTwoInstances runs two Caddy front-ends (this process and
// a child process) in front of the same emulated replicas, sharing their
// bindings through a real redis-server, and drives conversations whose
// turns alternate between them.
func TestSharedStoreTwoInstances(t *testing.T) {
	rds := redisserver.ForTest(t)
	const model = "qwen3-4b"
	_, dials := startEmulator(t, 3, 20)
	site := storeSite(model, dials, rds.Addr, "")
	loadSite(t, site)
	child := startChildCaddy(t, testAdminPort+1, testHTTPPort+2, site)
	waitConnected(t, model, child, true)
	urls := []string{siteURL, child.url}

	t.Run("alternating turns stay on one replica", func(t *testing.T) {
		before, _ := rds.Commands()
		a := newAlternation(model, urls...)
		a.run("alt", 12, 6, 3, nil)
		after, _ := rds.Commands()
		sent, failed, stayed, later, placed := a.figures()
		t.Logf("%d turns, %d failed; stayed %d of %d later turns; conversations placed per replica %v; redis commands %d (%.2f per turn)",
			sent, failed, stayed, later, placed, after-before-1, float64(after-before-1)/float64(sent))
		if failed > 0 || stayed != later || sent != 72 {
			t.Fatalf("want 72 turns, none failed, all stayed: %d sent, %d failed, stayed %d of %d", sent, failed, stayed, later)
		}
		if len(placed) != len(dials) {
			t.Errorf("new conversations went to %d of %d replicas: %v", len(placed), len(dials), placed)
		}
		for id, n := range placed {
			if n > 6 {
				t.Errorf("replica %s got %d of 12 conversations: placement is not by load", id, n)
			}
		}
	})

	t.Run("long conversations cost few commands per turn", func(t *testing.T) {
		before, _ := rds.Commands()
		a := newAlternation(model, urls...)
		a.run("long", 3, 30, 3, nil)
		after, _ := rds.Commands()
		sent, failed, stayed, later, _ := a.figures()
		perTurn := float64(after-before-1) / float64(sent)
		t.Logf("%d turns, %d failed, stayed %d of %d; redis commands %d: %.3f per turn", sent, failed, stayed, later, after-before-1, perTurn)
		if failed > 0 || stayed != later {
			t.Fatalf("%d failed, stayed %d of %d", failed, stayed, later)
		}
		if perTurn > 0.25 {
			t.Errorf("%.3f commands per turn; a confirmed binding's sticky turn should cost none", perTurn)
		}
	})

	t.Run("a move on one front-end is followed by the other", func(t *testing.T) {
		conv := "spill-conv"
		first := streamTurn(context.Background(), siteURL, model, conv, 1, nil)
		if !first.complete {
			t.Fatalf("first turn: %+v", first)
		}
		second := streamTurn(context.Background(), child.url, model, conv, 2, nil)
		if second.replica != first.replica || second.reason != "sticky" {
			t.Fatalf("second turn on the other front-end went to %s (%s), want %s sticky", second.replica, second.reason, first.replica)
		}
		// Move the conversation on this front-end: a spill moves it only
		// when waiting costs more than recomputing its history (which
		// the emulator's quick turns never make true), a client pin
		// whenever asked; both re-bind it and publish the move.
		other := ""
		for _, d := range dials {
			if d != first.replica {
				other = d
				break
			}
		}
		third := streamTurn(context.Background(), siteURL, model, conv, 3, map[string]string{"X-Pin": other})
		if third.reason != "client-pinned" || third.replica != other {
			t.Fatalf("third turn went to %s (%s), want pinned to %s", third.replica, third.reason, other)
		}
		fourth := streamTurn(context.Background(), child.url, model, conv, 4, nil)
		if fourth.replica != third.replica || fourth.reason != "sticky" {
			t.Fatalf("after the move the other front-end sent the turn to %s (%s), want %s sticky", fourth.replica, fourth.reason, third.replica)
		}
	})

	t.Run("an unpin on one front-end unbinds the conversation on both", func(t *testing.T) {
		conv := "unpin-conv"
		first := streamTurn(context.Background(), child.url, model, conv, 1, nil)
		if l := streamTurn(context.Background(), siteURL, model, conv, 2, nil); l.replica != first.replica {
			t.Fatalf("turn 2 on %s, want %s", l.replica, first.replica)
		}
		received := getCard(t, model).Store.MovesReceived
		if code, _ := adminDo(t, child.admin, http.MethodDelete, "/lm-warden/models/"+model+"/sessions/"+conv, ""); code != http.StatusOK {
			t.Fatalf("DELETE: %d", code)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			v, _ := rds.Do("EXISTS", bindstore.Key("lmwtest:", model, conv))
			if v == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the store still holds the unpinned binding")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// the move message's way to this front-end: it applies the
		// message at the conversation's next turn
		waitFor(t, "this front-end to receive the unpin", func() bool { return getCard(t, model).Store.MovesReceived > received })
		if l := streamTurn(context.Background(), siteURL, model, conv, 3, nil); l.reason != "placed" {
			t.Fatalf("after the unpin this front-end routed the turn %s (%s), want placed anew", l.replica, l.reason)
		}
	})

	t.Run("redis stopped mid-run costs no request, and back restores sharing", func(t *testing.T) {
		stop := make(chan struct{})
		a := newAlternation(model, urls...)
		done := make(chan struct{})
		go func() { a.run("outage", 200, 6, 3, stop); close(done) }()
		time.Sleep(700 * time.Millisecond)
		rds.Stop()
		waitConnected(t, model, child, false)
		time.Sleep(700 * time.Millisecond)
		if err := rds.Restart(); err != nil {
			t.Fatal(err)
		}
		waitConnected(t, model, child, true)
		time.Sleep(500 * time.Millisecond)
		close(stop)
		<-done
		sent, failed, stayed, later, _ := a.figures()
		sa, sb := getCard(t, model).Store, childCard(t, child, model).Store
		t.Logf("through the outage: %d turns, %d failed, stayed %d of %d; store errors %d + %d, fallbacks %d + %d",
			sent, failed, stayed, later, sa.Errors, sb.Errors, sa.Fallbacks, sb.Fallbacks)
		if failed > 0 {
			t.Errorf("%d of %d turns failed while the store was out", failed, sent)
		}
		if sa.Fallbacks == 0 || sb.Fallbacks == 0 {
			t.Errorf("no fallbacks counted while the store was out: %d, %d", sa.Fallbacks, sb.Fallbacks)
		}

		after := newAlternation(model, urls...)
		after.run("after", 9, 6, 3, nil)
		sent, failed, stayed, later, _ = after.figures()
		t.Logf("after the restart: %d turns, %d failed, stayed %d of %d", sent, failed, stayed, later)
		if failed > 0 || stayed != later {
			t.Fatalf("sharing not restored: %d failed, stayed %d of %d", failed, stayed, later)
		}
	})
}

// storeGoroutines counts the goroutines of shared stores and, with
// client, of the Redis client too.
func storeGoroutines(client bool) int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	n := 0
	for _, block := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(block, "bindstore.(*Store)") || (client && strings.Contains(block, "github.com/redis/go-redis")) {
			var count int
			fmt.Sscanf(block, "%d @", &count)
			n += count
		}
	}
	return n
}

// TestStoreReloads reloads configurations with, without and with another
// store: the store is kept while its settings stay, replaced when they
// change and closed when it goes, with its goroutines.
func TestStoreReloads(t *testing.T) {
	rds := redisserver.ForTest(t)
	const model = "qwen3-4b"
	fakes := startFakes(t, 2)
	site := func(store string) string {
		return fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		lb_policy lm_warden {
			model %s
			%s
		}
	}`, dialList(fakes), model, store)
	}
	steps := []struct {
		name  string
		store string
		want  int // store goroutines after the load
	}{
		{"with a store", storeBlock(rds.Addr, ""), 3},
		{"same store", storeBlock(rds.Addr, ""), 3},
		{"other prefix", strings.Replace(storeBlock(rds.Addr, ""), "lmwtest:", "other:", 1), 3},
		{"no store", "", 0},
		{"store again", storeBlock(rds.Addr, ""), 3},
		{"store again, same", storeBlock(rds.Addr, ""), 3},
		{"no store at last", "", 0},
	}
	var kept *bindstore.Store
	for _, st := range steps {
		loadSite(t, site(st.store))
		m, ok := lookupModel(model)
		if !ok {
			t.Fatal("model not loaded")
		}
		s := m.store.Load()
		if strings.Contains(st.name, "same") && s != kept {
			t.Errorf("%s: the store was replaced, want it kept", st.name)
		}
		kept = s
		deadline := time.Now().Add(5 * time.Second)
		for storeGoroutines(st.want == 0) != st.want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := storeGoroutines(st.want == 0); n != st.want {
			t.Errorf("%s: %d store goroutines, want %d", st.name, n, st.want)
		}
	}
}

// sharedStore gives a model with replicas r0..r3 a shared store on a fresh
// redis-server, as its policy does when the configuration starts.
func sharedStore(t *testing.T, model string) (*modelState, *redisserver.Server) {
	t.Helper()
	rds := redisserver.ForTest(t)
	m := newModelState(model, placement.Config{MaxNumSeqs: 1 << 20})
	m.router.SetReplicas([]string{"r0", "r1", "r2", "r3"})
	if err := m.configureStore(&StoreConfig{Type: "redis", Address: rds.Addr, Prefix: "lmwtest:", Timeout: caddy.Duration(100 * time.Millisecond)}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.closeStore)
	waitFor(t, "the store to connect", func() bool { st := m.storeStatus(); return st != nil && st.Connected })
	return m, rds
}
