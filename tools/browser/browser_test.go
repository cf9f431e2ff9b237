package browser

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	_ "github.com/caddyserver/caddy/v2/modules/filestorage"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/dustin/go-humanize"
	"golang.org/x/crypto/bcrypt"

	"github.com/lmwarden/caddy-lmwarden/caddymodule"
	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/internal/pagetest"
)

// browserChromium is Debian's chromium, which scripts/test installs.
const browserChromium = "/usr/bin/chromium"

// browserRefresh is the page's refresh interval in the browser tests, 2 s
// in production: the tests wait for several refreshes.
const browserRefresh = 300 * time.Millisecond

// newBrowserTab starts a headless chromium with a fresh profile and returns a
// tab context bounded by timeout.
func newBrowserTab(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	if _, err := os.Stat(browserChromium); err != nil {
		t.Skipf("browser test needs %s (apt-get install chromium): %v", browserChromium, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browserChromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	tab, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	return tab
}

// browserArtifactDir is where screenshots go: $LMWARDEN_ARTIFACTS when set.
func browserArtifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("LMWARDEN_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browserCard is what the page shows, read back from the DOM.
type browserCard struct {
	Head     map[string]browserCell `json:"head"`
	Since    browserCell            `json:"since"`
	Replicas []struct {
		ID    string                 `json:"id"`
		Cells map[string]browserCell `json:"cells"`
	} `json:"replicas"`
	Actions    bool        `json:"actions"`
	ChartPath  int         `json:"chartPath"`
	GenPath    int         `json:"genPath"`
	Points     string      `json:"points"`
	ChartEmpty bool        `json:"chartEmpty"`
	Share      browserCell `json:"share"`
	Live       string      `json:"live"`
	// the delivered-share chart: its line's path, points and hour figure
	DeliveredPath   string      `json:"deliveredPath"`
	DeliveredPoints string      `json:"deliveredPoints"`
	DeliveredEmpty  bool        `json:"deliveredEmpty"`
	DeliveredShare  browserCell `json:"deliveredShare"`
}

type browserCell struct {
	V string `json:"v"`
	T string `json:"t"`
}

const browserReadCardJS = `(() => {
  const cell = el => el ? {v: el.getAttribute("data-v") || "", t: el.textContent} : {v: "", t: ""};
  const head = {};
  document.querySelectorAll("dd[id^=h-]").forEach(dd => { head[dd.id.slice(2)] = cell(dd); });
  const replicas = [...document.querySelectorAll("#replicas tbody tr")].map(tr => {
    const cells = {};
    tr.querySelectorAll("[data-col]").forEach(td => { cells[td.dataset.col] = cell(td); });
    return {id: tr.dataset.key, cells};
  });
  return {
    head, replicas, since: cell(document.getElementById("since")),
    actions: !document.getElementById("actions").hidden,
    chartPath: (document.getElementById("p-cached").getAttribute("d") || "").length,
    genPath: (document.getElementById("p-generated").getAttribute("d") || "").length,
    points: document.getElementById("prompt-chart").getAttribute("data-points") || "",
    chartEmpty: document.getElementById("prompt-chart").classList.contains("empty"),
    share: cell(document.getElementById("share")),
    live: document.getElementById("live").textContent,
    deliveredPath: document.getElementById("p-delivered").getAttribute("d") || "",
    deliveredPoints: document.getElementById("delivered-chart").getAttribute("data-points") || "",
    deliveredEmpty: document.getElementById("delivered-chart").classList.contains("empty"),
    deliveredShare: cell(document.getElementById("delivered-share")),
  };
})()`

func browserRendered(ctx context.Context) (int, error) {
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.getAttribute("data-rendered") || "0"`))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(s)
}

// browserWaitRenders waits until the page has browserRendered n more times than now.
func browserWaitRenders(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	start, err := browserRendered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
		fmt.Sprintf(`Number(document.body.getAttribute("data-rendered") || 0) >= %d`, start+n),
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		live, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("live").textContent`))
		t.Fatalf("page did not refresh (%q): %v", live, err)
	}
}

// browserExpectCard checks that the DOM shows exactly the admin card: raw values
// in data-v and the humanised text.
func browserExpectCard(t *testing.T, got browserCard, want caddymodule.Card) {
	t.Helper()
	fnum := func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
	pctText := func(f float64) string { return humanize.FormatFloat("#,###.#", f*100) + "%" }
	// An unknown figure is null in the JSON and "unknown" on the card.
	optNum := func(f *float64) string {
		if f == nil {
			return "null"
		}
		return fnum(*f)
	}
	optPct := func(f *float64) string {
		if f == nil {
			return "unknown"
		}
		return pctText(*f)
	}
	optInt := func(n *int) (raw, text string) {
		if n == nil {
			return "null", "unknown"
		}
		return strconv.Itoa(*n), humanize.Comma(int64(*n))
	}
	check := func(what string, c browserCell, v, text string) {
		t.Helper()
		if c.V != v || c.T != text {
			t.Errorf("%s shows v=%q t=%q, admin JSON says v=%q t=%q", what, c.V, c.T, v, text)
		}
	}
	aff := "off"
	if want.Affinity {
		aff = "on"
	}
	spillText := strconv.Itoa(want.SpillThreshold)
	if want.SpillAuto {
		spillText += " (auto)"
	}
	check("affinity", got.Head["affinity"], strconv.FormatBool(want.Affinity), aff)
	check("spill threshold", got.Head["spill"], strconv.Itoa(want.SpillThreshold), spillText)
	check("sticky", got.Head["sticky"], fnum(want.StickyPct), humanize.FtoaWithDigits(want.StickyPct, 1)+"%")
	check("in flight", got.Head["in_flight"], strconv.Itoa(want.InFlight), humanize.Comma(int64(want.InFlight)))
	check("requests", got.Head["requests"], strconv.FormatUint(want.Requests, 10), humanize.Comma(int64(want.Requests)))
	check("bindings", got.Head["bindings"], strconv.Itoa(want.Bindings), humanize.Comma(int64(want.Bindings)))
	if !strings.HasPrefix(got.Since.T, "counters since "+want.Since.UTC().Format("2006-01-02 15:04:05 UTC")) {
		t.Errorf("since line %q, admin since %v", got.Since.T, want.Since)
	}
	if got.Actions != want.Writable {
		t.Errorf("actions shown %v, writable %v", got.Actions, want.Writable)
	}
	if len(got.Replicas) != len(want.Replicas) {
		t.Fatalf("%d rows, admin JSON has %d replicas", len(got.Replicas), len(want.Replicas))
	}
	for i, w := range want.Replicas {
		g := got.Replicas[i]
		if g.ID != w.ID {
			t.Errorf("row %d is %q, admin JSON %q", i, g.ID, w.ID)
			continue
		}
		c := g.Cells
		check(w.ID+" held", c["held"], strconv.Itoa(w.Held), humanize.Comma(int64(w.Held)))
		check(w.ID+" sticky", c["sticky"], strconv.FormatUint(w.Sticky, 10), humanize.Comma(int64(w.Sticky)))
		check(w.ID+" spill-accepted", c["spill_accepted"], strconv.FormatUint(w.SpillAccepted, 10), humanize.Comma(int64(w.SpillAccepted)))
		check(w.ID+" client-pinned", c["client_pinned"], strconv.FormatUint(w.ClientPinned, 10), humanize.Comma(int64(w.ClientPinned)))
		runRaw, runText := optInt(w.Running)
		waitRaw, waitText := optInt(w.Waiting)
		check(w.ID+" running/waiting", c["run_wait"], "["+runRaw+","+waitRaw+"]", runText+" / "+waitText)
		check(w.ID+" KV", c["kv"], optNum(w.KVUsage), optPct(w.KVUsage))
		check(w.ID+" prefix hit rate", c["hit"], optNum(w.PrefixHitRate), optPct(w.PrefixHitRate))
		check(w.ID+" bindings", c["bindings"], strconv.Itoa(w.Bindings), fmt.Sprintf("%d (%d recent)", w.Bindings, w.Active))
		// the engine the metrics name and the figures it does not give
		// follow the availability
		engine := ""
		if w.Engine != "" {
			engine += " · " + w.Engine
		}
		if w.MetricsUnread != "" {
			engine += " · figures unknown: " + w.MetricsUnread
		}
		switch {
		case w.Reachable && w.Available:
			check(w.ID+" status", c["state"], "available", "available"+engine)
		case w.Reachable && len(w.Out) == 0:
			check(w.ID+" status", c["state"], "out", "out: marked unavailable by the proxy"+engine)
		case w.Reachable:
			check(w.ID+" status", c["state"], "out", "out: "+strings.Join(w.Out, ", ")+engine)
		case c["state"].V != "unreachable" || !strings.HasPrefix(c["state"].T, "unreachable") ||
			!strings.HasSuffix(w.LastError, strings.TrimPrefix(strings.SplitN(c["state"].T, " · ", 2)[0], "unreachable: ")):
			t.Errorf("%s status %+v, admin JSON last error %q", w.ID, c["state"], w.LastError)
		}
	}
}

func browserReadCard(t *testing.T, ctx context.Context) browserCard {
	t.Helper()
	got, err := chromedp.Run(ctx, chromedp.Evaluate[browserCard](browserReadCardJS))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// browserPerf is what the browser measured for the page load.
type browserPerf struct {
	Resources []struct {
		Name     string  `json:"name"`
		Transfer float64 `json:"transfer"`
		Encoded  float64 `json:"encoded"`
		Decoded  float64 `json:"decoded"`
	} `json:"resources"`
	DOMContentLoaded float64 `json:"dcl"`
	Load             float64 `json:"load"`
	FirstRender      float64 `json:"firstRender"`
}

const browserPerfJS = `(() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const res = [nav, ...performance.getEntriesByType("resource")].map(e => ({
    name: e.name, transfer: e.transferSize, encoded: e.encodedBodySize, decoded: e.decodedBodySize}));
  const mark = performance.getEntriesByName("lmw-first-render")[0];
  return {resources: res, dcl: nav.domContentLoadedEventEnd, load: nav.loadEventEnd, firstRender: mark ? mark.startTime : -1};
})()`

// browserLogPerf logs the page's weight and timing: the bytes of the first load
// (HTML, CSS, JS and the first view documents) and when the first numbers
// were on screen.
func browserLogPerf(t *testing.T, ctx context.Context) browserPerf {
	t.Helper()
	p, err := chromedp.Run(ctx, chromedp.Evaluate[browserPerf](browserPerfJS))
	if err != nil {
		t.Fatal(err)
	}
	var transfer, encoded, decoded float64
	seen := map[string]bool{}
	for _, r := range p.Resources {
		base := r.Name
		if i := strings.IndexByte(base, '?'); i >= 0 && !strings.Contains(base, "stats.json") {
			base = base[:i]
		}
		if seen[base] { // count each document once (the first fetch)
			continue
		}
		seen[base] = true
		transfer += r.Transfer
		encoded += r.Encoded
		decoded += r.Decoded
		t.Logf("page weight: %-60s %6.0f B body (%6.0f B decoded), %6.0f B on the wire", r.Name, r.Encoded, r.Decoded, r.Transfer)
	}
	t.Logf("page weight: total %.0f B on the wire, %.0f B bodies as sent, %.0f B decoded", transfer, encoded, decoded)
	t.Logf("render time: DOMContentLoaded %.1f ms, load %.1f ms, first numbers on screen %.1f ms", p.DOMContentLoaded, p.Load, p.FirstRender)
	return p
}

func browserScreenshot(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if len(buf) < 1000 || !bytes.HasPrefix(buf, []byte("\x89PNG")) {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(buf))
	}
	path := filepath.Join(browserArtifactDir(t), name)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(buf))
	return path
}

// TestBrowserPageFixture renders the page from fixture admin documents in a
// real browser: the numbers, the chart, the actions, the narrow layout.
func TestBrowserPageFixture(t *testing.T) {
	ctx := newBrowserTab(t, 60*time.Second)
	now := time.Now()
	f := pagetest.New(now)
	ts := httptest.NewServer(f.Handler(card.New(f, browserRefresh)))
	t.Cleanup(ts.Close)

	// The models list links to the card.
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/lm-warden/")); err != nil {
		t.Fatal(err)
	}
	browserWaitRenders(t, ctx, 1)
	row, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#models tbody tr > *")].map(c => c.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"qwen3-4b", "on", "8 (auto)", "100%", "3", "4 of 4 reachable", "12", "78.0%"}; strings.Join(row, "|") != strings.Join(want, "|") {
		t.Errorf("models row %q, want %q", row, want)
	}
	browserFollow(t, ctx, `#models a`, "/lm-warden/ui/qwen3-4b")
	browserWaitRenders(t, ctx, 1)
	browserExpectCard(t, browserReadCard(t, ctx), browserFixtureCard(t, f))

	// The affinity toggle writes through the admin JSON and the card follows.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("toggle-affinity"))); err != nil {
		t.Fatal(err)
	}
	browserWaitRenders(t, ctx, 2)
	aff := browserFixtureCard(t, f).Affinity
	if got := browserReadCard(t, ctx); aff || got.Head["affinity"].T != "off" {
		t.Errorf("after the toggle: admin affinity %v, page %q", aff, got.Head["affinity"].T)
	}

	// Read-only admin: no actions.
	f.Edit(func(c *caddymodule.Card) { c.Writable = false })
	browserWaitRenders(t, ctx, 1)
	if browserReadCard(t, ctx).Actions {
		t.Error("actions shown while the admin API is read-only")
	}

	// The delivered share per minute: a line from the first checked
	// minute on (none before the fixture's traffic), and the hour's figure
	// as the view document gives it.
	var all struct {
		Delivered      []*float64 `json:"delivered"`
		DeliveredShare struct {
			T string `json:"t"`
		} `json:"delivered_share"`
	}
	browserGetAdmin(t, ts.URL+"/lm-warden/ui/qwen3-4b/stats.json", &all)
	got := browserReadCard(t, ctx)
	if got.DeliveredEmpty || got.DeliveredPoints != strconv.Itoa(len(all.Delivered)) || got.DeliveredShare.T != all.DeliveredShare.T {
		t.Errorf("delivered chart: empty %v, %s points (view %d), hour %q (view %q)", got.DeliveredEmpty,
			got.DeliveredPoints, len(all.Delivered), got.DeliveredShare.T, all.DeliveredShare.T)
	}
	if moves := strings.Count(got.DeliveredPath, "M"); moves != 1 || strings.Count(got.DeliveredPath, "L") < 20 {
		t.Errorf("delivered line %q: want one unbroken line over the checked minutes", got.DeliveredPath)
	}

	// Per-replica chart.
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("replica-pick"), "127.0.0.1:8001"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("replica-pick").dispatchEvent(new Event("change"))`)); err != nil {
		t.Fatal(err)
	}
	// The share the page's view document gives for the replica.
	var one struct {
		Share struct {
			T string `json:"t"`
		} `json:"share"`
	}
	browserGetAdmin(t, ts.URL+"/lm-warden/ui/qwen3-4b/stats.json?replica=127.0.0.1:8001", &one)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](fmt.Sprintf(`document.getElementById("share").textContent === %q`, one.Share.T),
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Errorf("per-replica share %q never shown: %v", one.Share.T, err)
	}

	// A narrow window wraps each replica into a block: nothing scrolls
	// sideways and every status is on screen.
	browserExpectFits(t, ctx, 420)
	browserScreenshot(t, ctx, "routing-card-fixture-narrow.png")
}

// browserScreenshots is where TestBrowserCardWidths writes the README's
// screenshots of the card (routing-card.png at 1,280 px and
// routing-card-1920.png); go test runs in the package's directory, so a
// relative path starts there:
//
//	cd tools && go test ./browser -run TestBrowserCardWidths -screenshots ../../docs
var browserScreenshots = flag.String("screenshots", "", "directory to write the card's screenshots at 1,280 and 1,920 px into, relative to tools/browser (../../docs)")

// browserLayout is where the card's parts are in the window.
type browserLayout struct {
	ViewportW float64 `json:"vw"`
	DocW      float64 `json:"docW"`   // the page's scroll width
	TableW    float64 `json:"tableW"` // the replica table's scroll width
	TableBoxW float64 `json:"tableBoxW"`
	Status    []struct {
		Left, Right, Top, Bottom, Width float64
		Text                            string
	} `json:"status"`
	StoreShown bool `json:"storeShown"`
}

const browserLayoutJS = `(() => {
  const sc = document.querySelector(".scroll");
  const status = [...document.querySelectorAll('#replicas tbody td[data-col="state"]')].map(td => {
    const r = td.getBoundingClientRect();
    return {Left: r.left, Right: r.right, Top: r.top, Bottom: r.bottom, Width: r.width, Text: td.textContent};
  });
  return {vw: window.innerWidth, docW: document.documentElement.scrollWidth, tableW: sc.scrollWidth,
    tableBoxW: sc.clientWidth, status, storeShown: !document.getElementById("h-store").parentNode.hidden};
})()`

// browserExpectFits sets the window to width and checks that neither the
// page nor the replica table scrolls sideways and that every replica's
// status cell lies inside the window (its bounding box, as chromium laid
// it out).
func browserExpectFits(t *testing.T, ctx context.Context, width int64) browserLayout {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, 1000)); err != nil {
		t.Fatal(err)
	}
	browserWaitRenders(t, ctx, 1)
	l, err := chromedp.Run(ctx, chromedp.Evaluate[browserLayout](browserLayoutJS))
	if err != nil {
		t.Fatal(err)
	}
	if l.DocW > l.ViewportW || l.TableW > l.TableBoxW {
		t.Errorf("%d px: the page is %v px wide in a %v px window, the table %v px in %v px: it scrolls sideways",
			width, l.DocW, l.ViewportW, l.TableW, l.TableBoxW)
	}
	if len(l.Status) == 0 {
		t.Fatalf("%d px: no status cells", width)
	}
	for _, st := range l.Status {
		if st.Width <= 0 || st.Left < 0 || st.Right > l.ViewportW {
			t.Errorf("%d px: status %q at x %.0f–%.0f, outside the %v px window", width, st.Text, st.Left, st.Right, l.ViewportW)
		}
	}
	return l
}

// TestBrowserCardWidths lays the card out at 1,280 and 1,920 px with 4 and
// 8 replicas (data-parallel names, one replica out for proxy errors, one
// unreachable with a long error, full working sets): the status column is
// on screen without scrolling and nothing scrolls sideways; without a
// shared store there is no store line. With -screenshots it writes the
// README's screenshots.
func TestBrowserCardWidths(t *testing.T) {
	ctx := newBrowserTab(t, 90*time.Second)
	now := time.Now()
	for _, n := range []int{4, 8} {
		f := pagetest.New(now)
		f.Edit(func(c *caddymodule.Card) { browserBusyCard(c, n, now) })
		ts := httptest.NewServer(f.Handler(card.New(f, browserRefresh)))
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/lm-warden/ui/qwen3-4b")); err != nil {
			t.Fatal(err)
		}
		browserWaitRenders(t, ctx, 1)
		browserExpectCard(t, browserReadCard(t, ctx), browserFixtureCard(t, f))
		for _, w := range []int64{1280, 1920} {
			l := browserExpectFits(t, ctx, w)
			if l.StoreShown {
				t.Errorf("%d px: a store line without a shared store", w)
			}
			t.Logf("%d replicas at %d px: table %v px of %v, status cells x %.0f–%.0f", n, w, l.TableW, l.TableBoxW, l.Status[0].Left, l.Status[0].Right)
			name := fmt.Sprintf("routing-card-%d-%dr.png", w, n)
			path := browserScreenshot(t, ctx, name)
			if *browserScreenshots != "" && n == 4 {
				out := map[int64]string{1280: "routing-card.png", 1920: "routing-card-1920.png"}[w]
				buf, _ := os.ReadFile(path)
				if err := os.WriteFile(filepath.Join(*browserScreenshots, out), buf, 0o644); err != nil {
					t.Fatal(err)
				}
				t.Logf("wrote %s", filepath.Join(*browserScreenshots, out))
			}
		}
		// Below the table's width each replica wraps into a block.
		browserExpectFits(t, ctx, 900)
		ts.Close()
	}
}

// browserBusyCard turns the fixture's card into n data-parallel engines
// under load: working sets near or at their KV cache, delivered shares, one
// engine out for proxy errors and one unreachable.
func browserBusyCard(c *caddymodule.Card, n int, now time.Time) {
	base := c.Replicas
	c.Replicas = nil
	for i := range n {
		r := base[i%len(base)]
		r.ID = fmt.Sprintf("10.0.0.7:8000#%d", i)
		capTok := int64(36800)
		r.KVCapacityTokens = &capTok
		r.WorkingSetTokens = 29000 + int64(i)*1100
		r.Full = r.WorkingSetTokens >= capTok
		r.Held, r.Running, r.Waiting = 3+i%4, browserPtr(3+i%4), browserPtr(i%3)
		r.Bindings, r.Active = 3+i, 2+i%3
		r.PredictedCached, r.DeliveredCached = 1234000, 1203000-uint64(i)*9000
		share := float64(r.DeliveredCached) / float64(r.PredictedCached)
		r.DeliveredShare = &share
		r.Sticky, r.Restarted, r.ColdReplaced, r.Ended = 1234+uint64(i)*17, uint64(i%3), uint64(i%2), 12
		c.Replicas = append(c.Replicas, r)
	}
	until := now.Add(20 * time.Second)
	c.Replicas[1].Available, c.Replicas[1].Out = false, []string{"proxy errors until " + until.UTC().Format("15:04:05")}
	c.Replicas[1].CooldownUntil = &until
	last := &c.Replicas[n-1]
	seen := now.Add(-90 * time.Second)
	last.Reachable, last.Available, last.LastSeen = false, false, &seen
	last.LastError = "Get \"http://10.0.0.7:8000/metrics\": dial tcp 10.0.0.7:8000: connect: connection refused"
	last.Out = []string{"poll failure"}
	last.Running, last.Waiting, last.KVUsage, last.PrefixHitRate = nil, nil, nil, nil
	c.Bindings, c.InFlight = 4*n, 3*n
}

func browserPtr[T any](v T) *T { return &v }

// browserFollow clicks the link sel and waits for the page at path to load.
func browserFollow(t *testing.T, ctx context.Context, sel, path string) {
	t.Helper()
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("following %s: %v", sel, err)
	}
	if resp == nil || resp.Status != http.StatusOK || !strings.HasSuffix(resp.URL, path) {
		t.Fatalf("following %s: %+v", sel, resp)
	}
}

// browserFixtureCard is the fixture's card as the admin API would give it now.
func browserFixtureCard(t *testing.T, f *pagetest.Fixture) caddymodule.Card {
	t.Helper()
	c, err := f.Card(pagetest.Model, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// browserLoadCaddyfile adapts caddyfile and runs it in this process until
// the test ends.
func browserLoadCaddyfile(t *testing.T, caddyfile string) {
	t.Helper()
	cfgJSON, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	for _, w := range warnings {
		t.Logf("Caddyfile: %s", w.String())
	}
	if err := caddy.Load(cfgJSON, true); err != nil {
		t.Fatalf("loading Caddy: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// browserFreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func browserFreePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// browserConversation sends the turns of one coding-agent browserConversation through the
// proxy, each turn resending the whole history, as Claude Code does.
func browserConversation(ctx context.Context, client *http.Client, url, session string, turns int, sent *atomic.Uint64) error {
	system := strings.Repeat("You are a careful coding agent working in a Go repository. ", 60)
	msgs := []map[string]string{{"role": "system", "content": system},
		{"role": "user", "content": "Session " + session + ": " + strings.Repeat("read the package and list its exported names. ", 40)}}
	for turn := range turns {
		body, _ := json.Marshal(map[string]any{"model": "qwen3-4b", "messages": msgs, "max_tokens": 48})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", session)
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("session %s turn %d: %w", session, turn, err)
		}
		sent.Add(1)
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) == 0 {
			return fmt.Errorf("session %s turn %d: status %d: %v", session, turn, resp.StatusCode, err)
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": out.Choices[0].Message.Content},
			map[string]string{"role": "user", "content": strings.Repeat("now fix the failing test in turn "+strconv.Itoa(turn)+". ", 20)})
	}
	return nil
}

func browserGetAdmin(t *testing.T, url string, into any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, into); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// browserStableCard reads the admin card until two reads a poll interval apart
// agree on every number the page shows: the traffic has stopped and the
// poller has caught up.
func browserStableCard(t *testing.T, url string, settle time.Duration) caddymodule.Card {
	t.Helper()
	key := func(c caddymodule.Card) string {
		c.Since = time.Time{}
		c.Replicas = slices.Clone(c.Replicas)
		for i := range c.Replicas {
			// the poll time, and the busy share, a mean over polls that
			// moves at every poll while nothing is in flight
			c.Replicas[i].LastSeen = nil
			c.Replicas[i].Busy = 0
		}
		b, _ := json.Marshal(c)
		return string(b)
	}
	var prev caddymodule.Card
	browserGetAdmin(t, url, &prev)
	deadline := time.Now().Add(settle)
	for time.Now().Before(deadline) {
		time.Sleep(700 * time.Millisecond)
		var cur caddymodule.Card
		browserGetAdmin(t, url, &cur)
		idle := cur.InFlight == 0
		for _, r := range cur.Replicas {
			idle = idle && r.Running != nil && *r.Running == 0 && r.Waiting != nil && *r.Waiting == 0 && r.Reachable
		}
		if idle && key(cur) == key(prev) {
			return cur
		}
		prev = cur
	}
	t.Fatalf("admin card never settled: %+v", prev)
	return prev
}

// browserTraffic is how long the workers keep starting conversations:
// LMWARDEN_BROWSER_TRAFFIC (a duration up to 30m), or 0 for one each.
func browserTraffic(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("LMWARDEN_BROWSER_TRAFFIC")
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > 30*time.Minute {
		t.Fatalf("LMWARDEN_BROWSER_TRAFFIC=%q: want a duration up to 30m", v)
	}
	return d
}

// TestBrowserRoutingCard runs Caddy with the module in front of four
// emulated replicas, drives conversations through it, freezes the traffic
// and checks in chromium that the page shows what the admin JSON says.
func TestBrowserRoutingCard(t *testing.T) {
	// Restored after Caddy has stopped (cleanups run last-in first-out).
	refresh := card.Refresh
	t.Cleanup(func() { card.Refresh = refresh })
	card.Refresh = browserRefresh
	long := browserTraffic(t)
	ctx := newBrowserTab(t, 150*time.Second+long)

	emu, err := emulator.NewServer(emulator.ServerConfig{Replicas: 4, Speed: 1, Model: "qwen3-4b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close() })

	adminPort, httpPort, authPort := browserFreePort(t), browserFreePort(t), browserFreePort(t)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var upstreams []string
	for _, u := range emu.URLs() {
		upstreams = append(upstreams, strings.TrimPrefix(u, "http://"))
	}
	// Browsers send Sec-Fetch-Mode on every request, so Caddy's admin
	// endpoint checks Origin (or Referer); a typed-in URL has neither. The
	// empty origin "" lets such a navigation open the page. The second
	// site mounts the page behind basic auth, as the README shows; its
	// origin is allowed so the page's writes pass the origin check.
	caddyfile := fmt.Sprintf(`{
	admin 127.0.0.1:%[1]d {
		origins 127.0.0.1:%[1]d localhost:%[1]d http://127.0.0.1:%[5]d ""
	}
	persist_config off
	auto_https off
	storage file_system %[3]s
}

http://127.0.0.1:%[2]d {
	lm_warden
	reverse_proxy %[4]s {
		lb_policy lm_warden {
			model qwen3-4b
			max_num_seqs 32
			poll_interval 250ms
			poll_timeout 200ms
		}
		flush_interval -1
	}
}

http://127.0.0.1:%[5]d {
	basic_auth {
		ops %[6]s
	}
	handle /lm-warden/* {
		reverse_proxy 127.0.0.1:%[1]d
	}
	respond 404
}
`, adminPort, httpPort, t.TempDir(), strings.Join(upstreams, " "), authPort, hash)
	browserLoadCaddyfile(t, caddyfile)
	admin := fmt.Sprintf("http://127.0.0.1:%d", adminPort)
	site := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	cardURL := admin + "/lm-warden/models/qwen3-4b"

	// A typed-in URL, cold cache: the card with all its assets.
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(admin+"/lm-warden/ui/qwen3-4b"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusOK {
		t.Fatalf("GET /lm-warden/ui/qwen3-4b in the browser: %d", resp.Status)
	}
	browserWaitRenders(t, ctx, 1)
	browserLogPerf(t, ctx)

	// Traffic: 8 workers, each running conversations of 4 turns; one
	// conversation each unless LMWARDEN_BROWSER_TRAFFIC asks for a longer
	// run (for the README screenshot). Bounded in count and time.
	tctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+long)
	defer cancel()
	client := &http.Client{Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	var sent atomic.Uint64
	errs := make(chan error, 8)
	stopAt := time.Now().Add(long)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 1000; n++ {
				if err := browserConversation(tctx, client, site, fmt.Sprintf("conv-%02d-%d", i, n), 4, &sent); err != nil {
					errs <- err
					return
				}
				if time.Now().After(stopAt) {
					return
				}
			}
		}()
	}
	// The page refreshes while the traffic runs; a screenshot of it under load.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	liveShot := ""
	for caught := false; !caught; {
		select {
		case <-done:
			caught = true
			t.Log("the traffic ended before a refresh showed requests in flight")
		case <-time.After(250 * time.Millisecond):
			if time.Now().Before(stopAt.Add(-10 * time.Second)) {
				continue // a long run is shown near its end, with the hour's chart filled in
			}
			if v := browserReadCard(t, ctx).Head["in_flight"].V; v != "0" && v != "" {
				caught = true
				liveShot = browserScreenshot(t, ctx, "routing-card-live.png")
			}
		}
	}
	<-done
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The windowed prefix hit rate settles a window (60 s) after a run
	// longer than the window.
	settle := 20 * time.Second
	if long > 0 {
		settle += 70 * time.Second
	}
	want := browserStableCard(t, cardURL, settle)
	if want.Requests != sent.Load() {
		t.Errorf("admin card counts %d requests, sent %d", want.Requests, sent.Load())
	}

	// The numbers equal the admin JSON read at the same moment.
	var before, after caddymodule.Card
	browserGetAdmin(t, cardURL, &before)
	browserWaitRenders(t, ctx, 1)
	got := browserReadCard(t, ctx)
	browserGetAdmin(t, cardURL, &after)
	if want.Requests != before.Requests || before.Requests != after.Requests {
		t.Fatalf("traffic did not stay frozen: %d, %d, %d requests", want.Requests, before.Requests, after.Requests)
	}
	browserExpectCard(t, got, after)
	if !strings.HasPrefix(got.Live, "live") {
		t.Errorf("live indicator %q", got.Live)
	}

	// The chart has data, and the headline is the admin's hour share.
	var stats caddymodule.Stats
	browserGetAdmin(t, cardURL+"/stats", &stats)
	if got.ChartEmpty || got.ChartPath < 100 || got.GenPath < 100 || got.Points == "" || got.Points == "0" {
		t.Errorf("chart has no data: path %d/%d chars, %s points, empty=%v", got.ChartPath, got.GenPath, got.Points, got.ChartEmpty)
	}
	if wantShare := humanize.FormatFloat("#,###.#", stats.HourCachedShare*100) + "%"; got.Share.T != wantShare {
		t.Errorf("cached share shows %q, admin JSON %q", got.Share.T, wantShare)
	}
	if stats.HourCachedShare <= 0 {
		t.Errorf("no cached tokens in the hour after repeated turns: %+v", stats.Totals)
	}
	for _, doc := range []string{"/lm-warden/ui/qwen3-4b/view.json", "/lm-warden/ui/qwen3-4b/stats.json"} {
		req, _ := http.NewRequest(http.MethodGet, admin+doc, nil)
		req.Header.Set("Accept-Encoding", "gzip") // and read it as sent
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		t.Logf("page weight: %s with traffic: %d B body per refresh (%s)", doc, len(b), r.Header.Get("Content-Encoding"))
	}

	path := browserScreenshot(t, ctx, "routing-card.png")
	if liveShot != "" {
		path = liveShot
	}
	// LMWARDEN_SCREENSHOT_OUT receives the screenshot under load when there
	// is one (the README's docs/routing-card.png), else the frozen one.
	if out := os.Getenv("LMWARDEN_SCREENSHOT_OUT"); out != "" {
		buf, _ := os.ReadFile(path)
		if err := os.WriteFile(out, buf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot copied to %s", out)
	}

	// The models list, reached from the card's header, links back.
	browserFollow(t, ctx, `.brand`, "/lm-warden/ui/")
	browserWaitRenders(t, ctx, 1)
	row, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("#models tbody tr > *")].map(c => c.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	if len(row) != 8 || row[0] != "qwen3-4b" || row[5] != "4 of 4 reachable" {
		t.Errorf("models row %q", row)
	}
	browserFollow(t, ctx, `#models a`, "/lm-warden/ui/qwen3-4b")
	browserWaitRenders(t, ctx, 1)

	// The actions go through Caddy's origin check and take effect.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("toggle-affinity"))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("h-affinity").textContent === "off"`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		msg, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("action-msg").textContent`))
		t.Fatalf("affinity toggle: %v (%s)", err, msg)
	}
	var offCard caddymodule.Card
	browserGetAdmin(t, cardURL, &offCard)
	if offCard.Affinity {
		t.Error("admin JSON still says affinity on after the toggle")
	}
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.ID("unpin-key"), "conv-00-0"),
		chromedp.Click(chromedp.CSS(`#unpin button`))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("action-msg").textContent.startsWith("unpinned conv-00-0")`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		msg, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("action-msg").textContent`))
		t.Fatalf("unpin: %v (%s)", err, msg)
	}
	var unpinned caddymodule.Card
	browserGetAdmin(t, cardURL, &unpinned)
	if unpinned.Bindings != offCard.Bindings-1 {
		t.Errorf("bindings %d after unpinning, %d before", unpinned.Bindings, offCard.Bindings)
	}

	// Behind auth: the public site asks for a password, serves only the
	// page and its JSON, and the page works there, writes included.
	authSite := fmt.Sprintf("http://127.0.0.1:%d", authPort)
	for path, status := range map[string]int{"/lm-warden/": http.StatusUnauthorized, "/config/": http.StatusUnauthorized} {
		r, err := http.Get(authSite + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != status {
			t.Errorf("GET %s without a password: %d", path, r.StatusCode)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, authSite+"/config/", nil)
	req.SetBasicAuth("ops", "s3cret")
	if r, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if r.Body.Close(); r.StatusCode != http.StatusNotFound {
		t.Errorf("GET /config/ through the public site: %d", r.StatusCode)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{
		"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:s3cret")),
	}}); err != nil {
		t.Fatal(err)
	}
	resp, err = chromedp.Run(ctx, chromedp.NavigateResponse(authSite+"/lm-warden/ui/qwen3-4b"))
	if err != nil || resp.Status != http.StatusOK {
		t.Fatalf("the card behind auth: %v %+v", err, resp)
	}
	browserWaitRenders(t, ctx, 2)
	var authCard caddymodule.Card
	browserGetAdmin(t, cardURL, &authCard)
	browserExpectCard(t, browserReadCard(t, ctx), authCard)
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.ID("toggle-affinity"))); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("h-affinity").textContent === "on"`,
		chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		msg, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("action-msg").textContent`))
		t.Fatalf("affinity toggle behind auth: %v (%s)", err, msg)
	}
}
