package card_test

// The page's tests over the pagetest fixture. They are an external test
// package because pagetest imports card; the dot import is the one the Go
// FAQ names for that case, and export_test.go lends them the unexported
// view types and the page on a stopped clock.

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	. "github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/internal/pagetest"
)

func ptr[T any](v T) *T { return &v }

func uiGet(t *testing.T, h http.Handler, path string, hdr ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func uiReadAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestUIShellRoutes(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 19, 0, 0, 0, time.UTC)
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	tests := []struct {
		path, page, model, base string
	}{
		{"/lm-warden/", "models", "", "ui/"},
		{"/lm-warden/ui/", "models", "", "./"},
		{"/lm-warden/ui/qwen3-4b", "card", "qwen3-4b", "./"},
		{"/lm-warden/ui/qwen3-4b/", "card", "qwen3-4b", "../"},
		{"/lm-warden/ui/Qwen%2FQwen3-4B", "card", "Qwen/Qwen3-4B", "./"},
		{"/lm-warden/ui/Qwen/Qwen3-4B", "card", "Qwen/Qwen3-4B", "../"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			resp := uiGet(t, h, tc.path)
			body := uiReadAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("content type %q", ct)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe") {
				t.Errorf("CSP %q", csp)
			}
			if rp := resp.Header.Get("Referrer-Policy"); rp != "same-origin" {
				t.Errorf("Referrer-Policy %q", rp)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" || resp.Header.Get("ETag") == "" {
				t.Errorf("Cache-Control %q, ETag %q", cc, resp.Header.Get("ETag"))
			}
			for _, want := range []string{
				`data-page="` + tc.page + `"`,
				`data-model="` + tc.model + `"`,
				`data-base="` + tc.base + `"`,
				`data-refresh="2000"`,
				`href="` + tc.base + `-/app.css?v=`,
				`src="` + tc.base + `-/app.js?v=`,
			} {
				if !strings.Contains(body, want) {
					t.Errorf("page lacks %s", want)
				}
			}
		})
	}
}

func TestUIAssets(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	for name, ctype := range map[string]string{"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		t.Run(name, func(t *testing.T) {
			a := PageAsset(t, name)
			resp := uiGet(t, h, "/lm-warden/ui/-/"+name+"?v="+a.Hash)
			body := uiReadAll(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctype {
				t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if body != string(a.Body) {
				t.Error("body differs from the embedded file")
			}
			if cc := resp.Header.Get("Cache-Control"); !strings.Contains(cc, "immutable") {
				t.Errorf("versioned asset Cache-Control %q", cc)
			}
			if cc := uiGet(t, h, "/lm-warden/ui/-/"+name+"?v=stale").Header.Get("Cache-Control"); cc != "no-cache" {
				t.Errorf("stale version Cache-Control %q", cc)
			}

			gz := uiGet(t, h, "/lm-warden/ui/-/"+name, "Accept-Encoding", "gzip, br")
			if gz.Header.Get("Content-Encoding") != "gzip" {
				t.Fatalf("no gzip: %v", gz.Header)
			}
			zr, err := gzip.NewReader(gz.Body)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := io.ReadAll(zr)
			if err != nil || !bytes.Equal(plain, a.Body) {
				t.Errorf("gzip body does not decode to the asset: %v", err)
			}

			etag := gz.Header.Get("ETag")
			if again := uiGet(t, h, "/lm-warden/ui/-/"+name, "Accept-Encoding", "gzip", "If-None-Match", etag); again.StatusCode != http.StatusNotModified {
				t.Errorf("revalidation status %d", again.StatusCode)
			}
		})
	}
	if resp := uiGet(t, h, "/lm-warden/ui/-/nope.js"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown asset status %d", resp.StatusCode)
	}
}

func uiDecodeView[T any](t *testing.T, h http.Handler, path string) (T, *http.Response) {
	t.Helper()
	var v T
	resp := uiGet(t, h, path)
	body := uiReadAll(t, resp)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s Cache-Control %q", path, cc)
		}
	}
	return v, resp
}

func TestUIModelsView(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	v, resp := uiDecodeView[ModelsView](t, h, "/lm-warden/ui/-/models.json")
	if resp.StatusCode != http.StatusOK || len(v.Models) != 1 {
		t.Fatalf("status %d, %d models", resp.StatusCode, len(v.Models))
	}
	m := v.Models[0]
	want := map[string]string{
		"affinity": "on", "spill": "8 (auto)", "sticky": "100%", "in_flight": "3",
		"replicas": "4 of 4 reachable", "bindings": "12", "share": "78.0%",
	}
	for k, w := range want {
		if got := m.Cells[k].T; got != w {
			t.Errorf("%s = %q, want %q", k, got, w)
		}
	}
	if m.Href != "qwen3-4b" {
		t.Errorf("href %q", m.Href)
	}
}

func TestUICardView(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 19, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		change func(*Card)
		head   map[string]string
		row    int
		cells  map[string]string
		ok     bool
	}{
		{
			name: "reference card",
			head: map[string]string{"affinity": "on", "spill": "8 (auto)", "sticky": "100%", "in_flight": "3",
				"requests": "1,234,567", "bindings": "12", "max_num_seqs": "32"},
			row: 0,
			cells: map[string]string{"held": "0", "sticky": "38", "spill_accepted": "0", "client_pinned": "0",
				"run_wait": "0 / 0", "kv": "41.0%", "hit": "82.2%", "bindings": "3 (2 recent)", "state": "available",
				"delivered": "none yet", "restarted": "0", "cold_replaced": "0", "ended": "0"},
			ok: true,
		},
		{
			name: "conversation lifecycle",
			change: func(c *Card) {
				r := &c.Replicas[0]
				r.Restarted, r.ColdReplaced, r.Ended = 2, 1, 1234
				r.PredictedCached, r.DeliveredCached, r.DeliveredShare = 12300, 12000, ptr(12000.0/12300)
			},
			row: 0,
			cells: map[string]string{"delivered": "97.6% (12 k of 12.3 k)", "restarted": "2", "cold_replaced": "1",
				"ended": "1,234"},
			ok: true,
		},
		{
			name: "shared store connected",
			change: func(c *Card) {
				c.Store = &bindstore.Status{Type: "redis", Address: "10.0.0.9:6379", Connected: true, Errors: 1234, Fallbacks: 5}
			},
			head: map[string]string{"store": "redis 10.0.0.9:6379 · connected · 1,234 errors · 5 fallbacks"},
			row:  0, cells: map[string]string{}, ok: true,
		},
		{
			name: "shared store out",
			change: func(c *Card) {
				c.Store = &bindstore.Status{Type: "redis", Address: "10.0.0.9:6379", Errors: 3, Fallbacks: 40}
			},
			head: map[string]string{"store": "redis 10.0.0.9:6379 · unreachable, routing with this instance's bindings · 3 errors · 40 fallbacks"},
			row:  0, cells: map[string]string{}, ok: true,
		},
		{
			name:  "third replica",
			row:   2,
			cells: map[string]string{"sticky": "19", "spill_accepted": "2", "kv": "61.0%", "hit": "69.0%"},
			ok:    true,
		},
		{
			name: "affinity off, fixed threshold, replica down",
			change: func(c *Card) {
				c.Affinity, c.SpillAuto, c.SpillThreshold, c.StickyPct = false, false, 4, 97.53
				c.Replicas[1].Reachable = false
				c.Replicas[1].LastError = "dial tcp 127.0.0.1:8002: connection refused"
				seen := now.Add(-90 * time.Second)
				c.Replicas[1].LastSeen = &seen
				c.Replicas[1].Running, c.Replicas[1].Waiting = ptr(12), ptr(3)
			},
			head: map[string]string{"affinity": "off", "spill": "4", "sticky": "97.5%"},
			row:  1,
			cells: map[string]string{"state": "unreachable: dial tcp 127.0.0.1:8002: connection refused · last seen 1 minute ago",
				"run_wait": "12 / 3"},
			ok: false,
		},
		{
			name: "unreachable, the poll's request left out",
			change: func(c *Card) {
				c.Replicas[2].Reachable, c.Replicas[2].Available = false, false
				c.Replicas[2].LastError = `Get "http://127.0.0.1:8003/metrics": dial tcp 127.0.0.1:8003: connect: connection refused`
				c.Replicas[2].Out = []string{"poll failure"}
			},
			row:   2,
			cells: map[string]string{"state": "unreachable: dial tcp 127.0.0.1:8003: connect: connection refused · last seen now · out: poll failure"},
			ok:    false,
		},
		{
			name:   "reachable but taken out by the proxy",
			change: func(c *Card) { c.Replicas[3].Available = false },
			row:    3,
			cells:  map[string]string{"state": "out: marked unavailable by the proxy"},
			ok:     false,
		},
		{
			name: "out for proxy errors",
			change: func(c *Card) {
				c.Replicas[3].Available = false
				c.Replicas[3].Out = []string{"proxy errors until 19:00:05"}
			},
			row:   3,
			cells: map[string]string{"state": "out: proxy errors until 19:00:05"},
			ok:    false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := pagetest.New(now)
			if tc.change != nil {
				f.Edit(tc.change)
			}
			h := f.Handler(NewPageAt(t, f, now))
			v, resp := uiDecodeView[CardView](t, h, "/lm-warden/ui/qwen3-4b/view.json")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			for k, w := range tc.head {
				if got := v.Head[k].T; got != w {
					t.Errorf("head %s = %q, want %q", k, got, w)
				}
			}
			r := v.Replicas[tc.row]
			if r.OK != tc.ok {
				t.Errorf("row %d ok = %v", tc.row, r.OK)
			}
			for k, w := range tc.cells {
				if got := r.Cells[k].T; got != w {
					t.Errorf("row %d %s = %q, want %q", tc.row, k, got, w)
				}
			}
			if want := "counters since 2026-11-30 17:00:00 UTC (2 hours ago)"; v.Since.T != want {
				t.Errorf("since %q, want %q", v.Since.T, want)
			}
			if !v.Writable {
				t.Error("writable lost")
			}
			// the store line only with a store
			if _, has := v.Head["store"]; has != (tc.head["store"] != "") {
				t.Errorf("store line shown %v, want %v", has, tc.head["store"] != "")
			}
			// every column the page draws has its cell in every row
			if len(v.Columns) == 0 || v.Columns[0].Key != "state" {
				t.Errorf("columns %+v: want the status first", v.Columns)
			}
			for _, c := range v.Columns {
				if _, ok := r.Cells[c.Key]; !ok || c.Label == "" || c.Group == "" {
					t.Errorf("column %+v: cell present %v", c, ok)
				}
			}
		})
	}
}

func TestUIStatsView(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	st := f.Stats()

	all, resp := uiDecodeView[StatsView](t, h, "/lm-warden/ui/qwen3-4b/stats.json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// 3599 finished seconds → 359 points of 10 s; the 9 oldest seconds are dropped.
	if len(all.Cached) != 359 || all.StepS != 10 || !all.HasData {
		t.Fatalf("points %d, step %v, has data %v", len(all.Cached), all.StepS, all.HasData)
	}
	if all.Share.T != "78.0%" || len(all.Replicas) != 4 {
		t.Errorf("share %q, replicas %v", all.Share.T, all.Replicas)
	}
	// Point 0 covers seconds 9..18 (idle), the last point seconds 3589..3598.
	if all.Cached[0] != 0 || all.Computed[0] != 0 {
		t.Errorf("idle point %v %v", all.Cached[0], all.Computed[0])
	}
	var wantCached, wantComputed, wantGen float64
	for j := 3589; j < 3599; j++ {
		wantCached += float64(st.Sum.Cached[j])
		wantComputed += float64(st.Sum.Computed[j])
		wantGen += float64(st.Sum.Generated[j])
	}
	last := len(all.Cached) - 1
	if all.Cached[last] != Round1(wantCached/10) || all.Computed[last] != Round1(wantComputed/10) || all.Generated[last] != Round1(wantGen/10) {
		t.Errorf("last point %v/%v/%v, want %v/%v/%v", all.Cached[last], all.Computed[last], all.Generated[last],
			wantCached/10, wantComputed/10, wantGen/10)
	}
	if all.PromptMax.V.(float64) < all.Cached[last]+all.Computed[last] {
		t.Errorf("axis top %v below the data", all.PromptMax.V)
	}

	gz := uiGet(t, h, "/lm-warden/ui/qwen3-4b/stats.json", "Accept-Encoding", "gzip")
	if gz.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("stats view not gzipped: %v", gz.Header)
	}
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	var unzipped StatsView
	if err := json.NewDecoder(zr).Decode(&unzipped); err != nil || len(unzipped.Cached) != len(all.Cached) {
		t.Errorf("gzipped stats view: %v, %d points", err, len(unzipped.Cached))
	}

	one, resp := uiDecodeView[StatsView](t, h, "/lm-warden/ui/qwen3-4b/stats.json?replica=127.0.0.1:8001")
	if resp.StatusCode != http.StatusOK || one.Replica != "127.0.0.1:8001" {
		t.Fatalf("status %d, replica %q", resp.StatusCode, one.Replica)
	}
	if one.Cached[last] >= all.Cached[last] || one.Cached[last] == 0 {
		t.Errorf("one replica's cached rate %v vs all %v", one.Cached[last], all.Cached[last])
	}
	var c, p uint64
	for j := 9; j < 3599; j++ {
		c += st.Replicas["127.0.0.1:8001"].Cached[j]
		p += st.Replicas["127.0.0.1:8001"].Computed[j]
	}
	if got, want := one.Share.V.(float64), float64(c)/float64(c+p); got != want {
		t.Errorf("replica share %v, want %v", got, want)
	}

	if _, resp := uiDecodeView[StatsView](t, h, "/lm-warden/ui/qwen3-4b/stats.json?replica=nope"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown replica status %d", resp.StatusCode)
	}
}

func TestUIErrors(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	tests := []struct {
		method, path string
		status       int
		msg          string
	}{
		{http.MethodGet, "/lm-warden/ui/nope/view.json", http.StatusNotFound, "unknown model"},
		{http.MethodGet, "/lm-warden/ui/nope/stats.json", http.StatusNotFound, "unknown model"},
		{http.MethodGet, "/lm-warden/elsewhere", http.StatusNotFound, "no page"},
		{http.MethodPost, "/lm-warden/ui/qwen3-4b", http.StatusMethodNotAllowed, "not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
			var e struct {
				Error string `json:"error"`
			}
			_ = json.Unmarshal(rec.Body.Bytes(), &e)
			if rec.Code != tc.status || !strings.Contains(e.Error, tc.msg) {
				t.Errorf("status %d, error %q", rec.Code, e.Error)
			}
		})
	}
}

// TestUIAcceptsGzip checks which Accept-Encoding headers get the chart's
// view gzipped.
func TestUIAcceptsGzip(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"", false}, {"gzip", true}, {"br, gzip;q=0.5", true}, {"gzip;q=0", false}, {"deflate", false}, {"GZIP", true},
	} {
		resp := uiGet(t, h, "/lm-warden/ui/qwen3-4b/stats.json", "Accept-Encoding", tc.in)
		if got := resp.Header.Get("Content-Encoding") == "gzip"; got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v", tc.in, got)
		}
	}
}

// FuzzUIPath feeds arbitrary paths to the page server: it never panics and
// answers a page, a view, an asset or a JSON error.
func FuzzUIPath(f *testing.F) {
	for _, p := range []string{"/lm-warden/", "/lm-warden/ui/", "/lm-warden/ui/qwen3-4b", "/lm-warden/ui/qwen3-4b/view.json",
		"/lm-warden/ui/qwen3-4b/stats.json?replica=127.0.0.1:8001", "/lm-warden/ui/-/app.js?v=x", "/lm-warden/ui/%2F/view.json",
		"/lm-warden/ui/a%zz", "/lm-warden/ui//stats.json", "/lm-warden/ui/-/models.json"} {
		f.Add(p)
	}
	now := time.Now()
	fx := pagetest.New(now)
	h := fx.Handler(NewPageAt(f, fx, now))
	f.Fuzz(func(t *testing.T, path string) {
		u, err := url.ParseRequestURI(path)
		if err != nil || !strings.HasPrefix(u.Path, "/lm-warden/") {
			return
		}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL = u
		req.RequestURI = path
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusNotModified, http.StatusNotFound, http.StatusBadRequest,
			http.StatusMovedPermanently, http.StatusTemporaryRedirect: // the mux cleans paths
		default:
			t.Fatalf("%q: status %d: %s", path, rec.Code, rec.Body.String())
		}
	})
}

// TestUIAssetRanges checks what net/http's ServeContent answers for the
// assets: byte ranges (never compressed), HEAD, and a weak ETag shared by
// the plain and gzipped bodies.
func TestUIAssetRanges(t *testing.T) {
	t.Parallel()
	now := time.Now()
	f := pagetest.New(now)
	h := f.Handler(NewPageAt(t, f, now))
	a := PageAsset(t, "app.js")

	part := uiGet(t, h, "/lm-warden/ui/-/app.js", "Range", "bytes=0-9", "Accept-Encoding", "gzip")
	body := uiReadAll(t, part)
	if part.StatusCode != http.StatusPartialContent || body != string(a.Body[:10]) || part.Header.Get("Content-Encoding") != "" ||
		part.Header.Get("Content-Range") != fmt.Sprintf("bytes 0-9/%d", len(a.Body)) {
		t.Errorf("range: status %d, encoding %q, range %q, body %q", part.StatusCode,
			part.Header.Get("Content-Encoding"), part.Header.Get("Content-Range"), body)
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/lm-warden/ui/-/app.css", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Security-Policy") != CSP {
		t.Errorf("HEAD: status %d, %d body bytes, CSP %q", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Security-Policy"))
	}

	plain := uiGet(t, h, "/lm-warden/ui/-/app.js")
	gz := uiGet(t, h, "/lm-warden/ui/-/app.js", "Accept-Encoding", "gzip")
	if et := plain.Header.Get("ETag"); et != `W/"`+a.Hash+`"` || gz.Header.Get("ETag") != et || plain.Header.Get("Content-Encoding") != "" {
		t.Errorf("ETags plain %q gzip %q", et, gz.Header.Get("ETag"))
	}
	if again := uiGet(t, h, "/lm-warden/ui/-/app.js", "If-None-Match", plain.Header.Get("ETag")); again.StatusCode != http.StatusNotModified {
		t.Errorf("plain revalidation status %d", again.StatusCode)
	}
}
