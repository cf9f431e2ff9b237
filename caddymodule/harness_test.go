package caddymodule

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/lmwarden/caddy-lmwarden/emulator"
)

// The harness for the in-process Caddy the tests load: the ports, the
// global options every configuration starts with, the site template, the
// loaders and the admin requests. Caddy runs once per process, so a test
// that loads a configuration replaces the one before it: these tests do not
// run in parallel.

// The in-process Caddy of this package's tests: its admin endpoint and the
// site's port, both on loopback, each the first of three free ports (the
// tests use port+1 and port+2 for a second instance and the unused HTTPS
// port), taken from one run of six so that the two cannot overlap, and
// chosen when the test binary starts so that two test processes of this
// package do not collide.
var (
	testAdminPort = freePortRun(6)
	testHTTPPort  = testAdminPort + 3
)

// freePortRun returns the first of n consecutive loopback ports that are free
// now, below the kernel's ephemeral range: a port in that range can be taken
// between this check and Caddy's bind by the local end of any outgoing
// connection (a test client's, the store's), which once made the second
// instance fail with "address already in use".
func freePortRun(n int) int {
	low := ephemeralLow()
	for try := 0; try < 200; try++ {
		base := 10000 + rand.IntN(low-10000-n)
		var held []net.Listener
		ok := true
		for i := 0; i < n; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
		}
		for _, l := range held {
			l.Close()
		}
		if ok {
			return base
		}
	}
	panic("no run of free loopback ports")
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// net.ipv4.ip_local_port_range), 32768 where it cannot be read.
func ephemeralLow() int {
	const fallback = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return fallback
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return fallback
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < 12000 {
		return fallback
	}
	return low
}

var siteURL = fmt.Sprintf("http://127.0.0.1:%d", testHTTPPort)

var testClient = &http.Client{Timeout: 15 * time.Second}

// globalOptions is the global options block every test configuration
// starts with: the admin endpoint on adminAddr, plain HTTP on 127.0.0.1:port
// (HTTPS on port+1, unused), extra (whole lines) before the server options.
func globalOptions(adminAddr string, port int, extra string) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %d
	https_port %d
	auto_https off
	default_bind 127.0.0.1
	skip_install_trust
	grace_period 1s
%s	servers {
		protocols h1 h2c
	}
}
`, adminAddr, port, port+1, extra)
}

// siteConfig is a Caddyfile of the global options and one plain-HTTP site
// on 127.0.0.1:port whose body is site.
func siteConfig(adminAddr string, port int, extra, site string) string {
	return globalOptions(adminAddr, port, extra) + fmt.Sprintf("http://127.0.0.1:%d {\n%s\n}\n", port, site)
}

// loadSite (re)loads the in-process Caddy with one site whose body is site,
// through the admin endpoint on testAdminPort, the site on testHTTPPort.
func loadSite(t *testing.T, site string) {
	t.Helper()
	cfg := siteConfig(fmt.Sprintf("localhost:%d", testAdminPort), testHTTPPort, "", site)
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: testAdminPort, LoadRequestTimeout: 15 * time.Second})
	tc.InitServer(cfg, "caddyfile")
	if t.Failed() {
		t.FailNow()
	}
	// connections to the previous configuration's server are closing
	if tr, ok := testClient.Transport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	} else {
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	}
}

// adminDo sends a request to the admin endpoint on 127.0.0.1:port and
// returns the reply's status and body.
func adminDo(t *testing.T, port int, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// robustPorts is the in-process Caddy's admin port for the tests in this
// file: a free port picked once per test process, so two processes running
// this package's tests at once (Caddy listens with SO_REUSEPORT) never share
// a listener.
var robustPorts struct {
	once  sync.Once
	admin int
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// robustSite is the in-process Caddy loaded by loadRobustSite.
type robustSite struct {
	t     *testing.T
	port  int    // the site's port
	admin string // base URL of the admin endpoint
	url   string // base URL of the site
}

// loadRobustSite (re)loads the in-process Caddy with one site whose body is
// site, directly through caddy.Load, on this file's ports.
//
// Every load gets a fresh site port: the previous server keeps its listener
// through its grace period, and with SO_REUSEPORT a new connection to a
// shared port can still land on it and be served by the old configuration.
func loadRobustSite(t *testing.T, site string) *robustSite {
	t.Helper()
	return reloadRobustSite(t, freeLoopbackPort(t), site)
}

// reloadRobustSite loads the site on a given port, for tests that change the
// configuration under a running client.
func reloadRobustSite(t *testing.T, port int, site string) *robustSite {
	t.Helper()
	admin := robustAdminPort(t)
	cfg := robustConfig(admin, port, site)
	if err := loadCaddyfile(cfg); err != nil {
		t.Fatal(err)
	}
	testClient.CloseIdleConnections()
	return &robustSite{t: t, port: port, admin: fmt.Sprintf("http://127.0.0.1:%d", admin), url: fmt.Sprintf("http://127.0.0.1:%d", port)}
}

// robustAdminPort is the admin port of the in-process Caddy that
// loadCaddyfile loads, picked once per test process.
func robustAdminPort(t *testing.T) int {
	robustPorts.once.Do(func() { robustPorts.admin = freeLoopbackPort(t) })
	return robustPorts.admin
}

// robustConfig is a Caddyfile with one plain-HTTP site on 127.0.0.1:port
// whose body is site, and the admin endpoint on 127.0.0.1:admin.
func robustConfig(admin, port int, site string) string {
	return siteConfig(fmt.Sprintf("127.0.0.1:%d", admin), port, "\tpersist_config off\n", site)
}

// loadCaddyfile adapts a Caddyfile and loads it into the in-process Caddy,
// returning the error a failed load gives (the running config then stays).
func loadCaddyfile(cfg string) error {
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
	if err != nil {
		return fmt.Errorf("adapting: %w", err)
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		return fmt.Errorf("loading: %w", err)
	}
	return nil
}

// settledGoroutines closes the idle connections of client and of the
// tests' own client, lets the closed connections' goroutines end and
// counts the goroutines left: the baseline and the after-count of the
// tests that must leave nothing behind.
func settledGoroutines(client *http.Client) int {
	client.CloseIdleConnections()
	testClient.CloseIdleConnections()
	runtime.GC()
	time.Sleep(200 * time.Millisecond)
	return runtime.NumGoroutine()
}

// startEmulatorConfig is startEmulator for replicas configured in full:
// started for a test, stopped at its end, returned with their dial
// addresses (host:port) for a reverse_proxy block.
func startEmulatorConfig(t *testing.T, cfg emulator.ServerConfig) (*emulator.Server, []string) {
	t.Helper()
	emu, err := emulator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })
	ids := make([]string, 0, len(emu.URLs()))
	for _, u := range emu.URLs() {
		ids = append(ids, strings.TrimPrefix(u, "http://"))
	}
	return emu, ids
}
