package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/dustin/go-humanize"
)

// The routing card and the stats page.
//
// The admin module routes GET /lm-warden/ and /lm-warden/ui/… here. The page is
// one HTML shell (web/index.html, a template that only fills in relative asset
// paths and the model name as data attributes) plus app.js and app.css, all
// embedded. The browser never formats a number: it polls small view documents
// that this file builds in Go from the admin JSON documents (the very bytes
// GET /lm-warden/models… returns at that moment), with every value carried
// twice, raw ("v") and humanised with go-humanize ("t").
//
//	/lm-warden/                      all models (the same shell)
//	/lm-warden/ui/                   all models
//	/lm-warden/ui/-/models.json      models view
//	/lm-warden/ui/-/app.js, app.css  assets (?v=<hash> → cached for a year)
//	/lm-warden/ui/{model}            routing card and stats of one model
//	/lm-warden/ui/{model}/view.json  card view
//	/lm-warden/ui/{model}/stats.json chart view (?replica=<id> for one replica)
//
// Caddy's admin endpoint rejects browser requests whose Origin (or Referer)
// is not an allowed origin, and every no-cors request: the shell therefore
// loads its assets with crossorigin="anonymous" and the responses keep a
// same-origin Referrer-Policy.

//go:embed web
var uiFiles embed.FS

// uiCSP is the Content-Security-Policy of every page response: nothing
// inline, nothing from elsewhere.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// uiAsset is one embedded file, ready to serve plain or gzipped.
type uiAsset struct {
	ctype string
	body  []byte
	gz    []byte
	hash  string // first 16 hex digits of the SHA-256 of body
}

func newUIAsset(ctype string, body []byte) *uiAsset {
	sum := sha256.Sum256(body)
	a := &uiAsset{ctype: ctype, body: body, hash: hex.EncodeToString(sum[:8])}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	_, _ = zw.Write(body)
	_ = zw.Close()
	if buf.Len() < len(body) {
		a.gz = buf.Bytes()
	}
	return a
}

// serve writes the asset with its validators; cacheFor > 0 makes it
// immutable for that long, otherwise the browser revalidates every time.
func (a *uiAsset) serve(w http.ResponseWriter, r *http.Request, cacheFor time.Duration) {
	h := w.Header()
	uiSecurityHeaders(h)
	h.Set("Content-Type", a.ctype)
	h.Set("Vary", "Accept-Encoding")
	if cacheFor > 0 {
		h.Set("Cache-Control", fmt.Sprintf("public, max-age=%d, immutable", int(cacheFor.Seconds())))
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	body, etag := a.body, `"`+a.hash+`"`
	if a.gz != nil && uiAcceptsGzip(r) {
		body, etag = a.gz, `"`+a.hash+`-gz"`
		h.Set("Content-Encoding", "gzip")
	}
	h.Set("ETag", etag)
	if match := r.Header.Get("If-None-Match"); match != "" && strings.Contains(match, etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

func uiAcceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(name), "gzip") {
			return strings.TrimSpace(strings.ReplaceAll(q, " ", "")) != "q=0"
		}
	}
	return false
}

func uiSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// Caddy's admin endpoint checks the Referer of same-origin requests that
	// carry no Origin (fetch GET, scripts), so it must not be stripped.
	h.Set("Referrer-Policy", "same-origin")
}

// uiBundle holds the parsed shell template and the static assets.
type uiBundle struct {
	shell  *template.Template
	assets map[string]*uiAsset // by file name under web/
}

func loadUIBundle(files fs.FS) (*uiBundle, error) {
	b := &uiBundle{assets: map[string]*uiAsset{}}
	for name, ctype := range map[string]string{
		"app.js":  "text/javascript; charset=utf-8",
		"app.css": "text/css; charset=utf-8",
	} {
		body, err := fs.ReadFile(files, "web/"+name)
		if err != nil {
			return nil, fmt.Errorf("reading embedded %s: %w", name, err)
		}
		b.assets[name] = newUIAsset(ctype, body)
	}
	shell, err := template.ParseFS(files, "web/index.html")
	if err != nil {
		return nil, fmt.Errorf("parsing embedded index.html: %w", err)
	}
	b.shell = shell
	return b, nil
}

// uiRefresh is how often the page polls its view documents.
var uiRefresh = 2 * time.Second

// uiShellData fills web/index.html.
type uiShellData struct {
	Refresh int64  // milliseconds between refreshes
	Page    string // "models" or "card"
	Model   string
	Title   string
	Base    string // relative path from the current URL to /lm-warden/ui/
	JSVer   string
	CSSVer  string
}

// uiDataSource returns the admin JSON document at path (for example
// "/lm-warden/models/qwen3-4b"), its HTTP status and body.
type uiDataSource func(ctx context.Context, path string) (status int, body []byte, err error)

// uiServer serves the page. fetch reads admin JSON in-process; now is the
// clock used for relative times.
type uiServer struct {
	bundle  *uiBundle
	fetch   uiDataSource
	now     func() time.Time
	refresh time.Duration // 0 → uiRefresh
}

// uiPrefix and uiRoot are the two paths the page is served under.
const (
	uiRoot   = "/lm-warden/"
	uiPrefix = "/lm-warden/ui/"
)

// ServeHTTP serves the page, its assets and its view documents. Errors are
// caddy.APIError values, the admin endpoint's own error shape.
func (s *uiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	path := r.URL.EscapedPath()
	switch {
	case path == uiRoot || path == strings.TrimSuffix(uiRoot, "/"):
		return s.serveShell(w, r, uiShellData{Page: "models", Title: "LM Warden", Base: "ui/"})
	case path == uiPrefix || path == strings.TrimSuffix(uiPrefix, "/"):
		return s.serveShell(w, r, uiShellData{Page: "models", Title: "LM Warden", Base: "./"})
	case !strings.HasPrefix(path, uiPrefix):
		return uiNotFound(path)
	}
	rest := strings.TrimPrefix(path, uiPrefix)
	if name, ok := strings.CutPrefix(rest, "-/"); ok {
		return s.serveStatic(w, r, name)
	}
	raw, doc := rest, ""
	for _, suffix := range []string{"/view.json", "/stats.json"} {
		if m, ok := strings.CutSuffix(rest, suffix); ok {
			raw, doc = m, suffix[1:]
			break
		}
	}
	raw = strings.TrimSuffix(raw, "/")
	model, err := url.PathUnescape(raw)
	if err != nil || model == "" {
		return uiNotFound(path)
	}
	switch doc {
	case "view.json":
		return s.serveCardView(w, r, model)
	case "stats.json":
		return s.serveStatsView(w, r, model, r.URL.Query().Get("replica"))
	}
	base := strings.Repeat("../", strings.Count(rest, "/"))
	if base == "" {
		base = "./"
	}
	return s.serveShell(w, r, uiShellData{Page: "card", Model: model, Title: model + " · LM Warden", Base: base})
}

func uiNotFound(path string) error {
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no page at %s", path)}
}

func (s *uiServer) serveShell(w http.ResponseWriter, r *http.Request, d uiShellData) error {
	d.Refresh = uiRefresh.Milliseconds()
	if s.refresh > 0 {
		d.Refresh = s.refresh.Milliseconds()
	}
	d.JSVer = s.bundle.assets["app.js"].hash
	d.CSSVer = s.bundle.assets["app.css"].hash
	var buf bytes.Buffer
	if err := s.bundle.shell.Execute(&buf, d); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("rendering page: %w", err)}
	}
	newUIAsset("text/html; charset=utf-8", buf.Bytes()).serve(w, r, 0)
	return nil
}

func (s *uiServer) serveStatic(w http.ResponseWriter, r *http.Request, name string) error {
	if name == "models.json" {
		return s.serveModelsView(w, r)
	}
	a, ok := s.bundle.assets[name]
	if !ok {
		return uiNotFound(uiPrefix + "-/" + name)
	}
	var cacheFor time.Duration
	if v := r.URL.Query().Get("v"); v != "" && v == a.hash {
		cacheFor = 365 * 24 * time.Hour
	}
	a.serve(w, r, cacheFor)
	return nil
}

// load fetches and decodes one admin document, passing its errors through.
func (s *uiServer) load(ctx context.Context, path string, into any) error {
	status, body, err := s.fetch(ctx, path)
	if err != nil {
		var apiErr caddy.APIError
		if errors.As(err, &apiErr) && apiErr.HTTPStatus != 0 {
			return apiErr
		}
		if status < 400 {
			status = http.StatusBadGateway
		}
		return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf("reading %s: %w", path, err)}
	}
	if status != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(body))
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf("%s: %s", path, msg)}
	}
	if err := json.Unmarshal(body, into); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusBadGateway, Err: fmt.Errorf("decoding %s: %w", path, err)}
	}
	return nil
}

// writeUIJSON writes a view document, gzipped when the client takes it and
// the document is big enough to gain (the chart's series are).
func writeUIJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("encoding view: %w", err)}
	}
	h := w.Header()
	uiSecurityHeaders(h)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Vary", "Accept-Encoding")
	if len(body) >= 1024 && uiAcceptsGzip(r) {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		_, _ = zw.Write(body)
		if err := zw.Close(); err == nil {
			h.Set("Content-Encoding", "gzip")
			body = buf.Bytes()
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	_, err = w.Write(body)
	return err
}

func (s *uiServer) serveModelsView(w http.ResponseWriter, r *http.Request) error {
	var doc ModelList
	if err := s.load(r.Context(), "/lm-warden/models", &doc); err != nil {
		return err
	}
	return writeUIJSON(w, r, buildModelsView(doc))
}

func (s *uiServer) serveCardView(w http.ResponseWriter, r *http.Request, model string) error {
	var doc Card
	if err := s.load(r.Context(), "/lm-warden/models/"+url.PathEscape(model), &doc); err != nil {
		return err
	}
	return writeUIJSON(w, r, buildCardView(doc, s.now()))
}

func (s *uiServer) serveStatsView(w http.ResponseWriter, r *http.Request, model, replica string) error {
	var doc Stats
	if err := s.load(r.Context(), "/lm-warden/models/"+url.PathEscape(model)+"/stats", &doc); err != nil {
		return err
	}
	v, err := buildStatsView(doc, replica)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
	}
	return writeUIJSON(w, r, v)
}

// The page reads the admin documents (ModelList, Card, Stats in admin.go)
// through the same types the admin API writes them with.

// Views: what the page renders. Every value is a uiVal: raw and humanised.

// uiVal is one displayed value: V is the raw value from the admin JSON, T
// the text the page shows.
type uiVal struct {
	V any    `json:"v"`
	T string `json:"t"`
}

type uiModelsView struct {
	Models []uiModelRow `json:"models"`
}

type uiModelRow struct {
	Model string           `json:"model"`
	Href  string           `json:"href"` // relative to /lm-warden/ui/
	Cells map[string]uiVal `json:"cells"`
}

type uiCardView struct {
	Model    string           `json:"model"`
	Writable bool             `json:"writable"`
	Head     map[string]uiVal `json:"head"`
	Since    uiVal            `json:"since"`
	Replicas []uiReplicaRow   `json:"replicas"`
}

type uiReplicaRow struct {
	ID    string           `json:"id"`
	OK    bool             `json:"ok"`
	Cells map[string]uiVal `json:"cells"`
}

type uiStatsView struct {
	Model     string           `json:"model"`
	Replica   string           `json:"replica"` // "" = all replicas
	Replicas  []string         `json:"replicas"`
	End       time.Time        `json:"end"`
	StepS     float64          `json:"step_s"`   // seconds per point
	Cached    []float64        `json:"cached"`   // prompt tokens/s read from the prefix cache
	Computed  []float64        `json:"computed"` // prompt tokens/s computed
	Generated []float64        `json:"generated"`
	PromptMax uiVal            `json:"prompt_max"` // y-axis top of the prompt chart
	GenMax    uiVal            `json:"gen_max"`
	Share     uiVal            `json:"share"` // the hour's cached share of prompt tokens
	Totals    map[string]uiVal `json:"totals"`
	HasData   bool             `json:"has_data"`
}

// uiCount renders a counter with thousands separators: 1,234,567.
func uiCount[T int | uint64](n T) uiVal {
	return uiVal{V: n, T: humanize.Comma(int64(n))}
}

// uiPct renders a 0–1 fraction as a percentage with one decimal, kept even
// when it is zero so a column of them lines up: 84.0%, 83.7%.
func uiPct(f float64) uiVal {
	return uiVal{V: f, T: humanize.FormatFloat("#,###.#", f*100) + "%"}
}

// uiUnknown is shown for a figure the engine did not export.
const uiUnknown = "unknown"

// uiOptPct renders a fraction as a percentage, or unknown (value null) when nil.
func uiOptPct(f *float64) uiVal {
	if f == nil {
		return uiVal{V: nil, T: uiUnknown}
	}
	return uiPct(*f)
}

// uiOptCount renders a count with thousands separators, or unknown when nil.
func uiOptCount(n *int) string {
	if n == nil {
		return uiUnknown
	}
	return humanize.Comma(int64(*n))
}

// uiTokenCount renders a token count with an SI prefix: 1.2 k, 3.4 M.
func uiTokenCount(n uint64) uiVal {
	if n < 10000 {
		return uiVal{V: n, T: humanize.Comma(int64(n))}
	}
	return uiVal{V: n, T: humanize.SIWithDigits(float64(n), 1, "")}
}

// uiRate renders tokens per second with an SI prefix: 1.2 ktok/s.
func uiRate(f float64) uiVal {
	return uiVal{V: f, T: humanize.SIWithDigits(f, 1, "tok/s")}
}

func buildModelsView(doc ModelList) uiModelsView {
	v := uiModelsView{Models: make([]uiModelRow, 0, len(doc.Models))}
	for _, m := range doc.Models {
		v.Models = append(v.Models, uiModelRow{
			Model: m.Model,
			Href:  url.PathEscape(m.Model),
			Cells: map[string]uiVal{
				"affinity":  uiOnOff(m.Affinity),
				"spill":     uiSpill(m.SpillThreshold, m.SpillAuto),
				"sticky":    uiVal{V: m.StickyPct, T: humanize.FtoaWithDigits(m.StickyPct, 1) + "%"},
				"in_flight": uiCount(m.InFlight),
				"replicas":  {V: m.Replicas, T: fmt.Sprintf("%d of %d reachable", m.Reachable, m.Replicas)},
				"bindings":  uiCount(m.Bindings),
				"share":     uiPct(m.HourCachedShare),
			},
		})
	}
	return v
}

func uiOnOff(on bool) uiVal {
	if on {
		return uiVal{V: true, T: "on"}
	}
	return uiVal{V: false, T: "off"}
}

func uiSpill(n int, auto bool) uiVal {
	t := humanize.Comma(int64(n))
	if auto {
		t += " (auto)"
	}
	return uiVal{V: n, T: t}
}

func buildCardView(doc Card, now time.Time) uiCardView {
	v := uiCardView{
		Model:    doc.Model,
		Writable: doc.Writable,
		Head: map[string]uiVal{
			"affinity":     uiOnOff(doc.Affinity),
			"spill":        uiSpill(doc.SpillThreshold, doc.SpillAuto),
			"sticky":       {V: doc.StickyPct, T: humanize.FtoaWithDigits(doc.StickyPct, 1) + "%"},
			"in_flight":    uiCount(doc.InFlight),
			"requests":     uiCount(doc.Requests),
			"keyed":        uiCount(doc.KeyedRequests),
			"bindings":     uiCount(doc.Bindings),
			"max_num_seqs": uiCount(doc.MaxNumSeqs),
		},
		Since: uiVal{V: doc.Since, T: "counters since " + doc.Since.UTC().Format("2006-01-02 15:04:05 UTC") +
			" (" + humanize.RelTime(doc.Since, now, "ago", "from now") + ")"},
		Replicas: make([]uiReplicaRow, 0, len(doc.Replicas)),
	}
	for _, r := range doc.Replicas {
		state := uiVal{V: "reachable", T: "reachable"}
		ok := r.Reachable && r.Available
		switch {
		case !r.Reachable:
			msg := r.LastError
			if msg == "" {
				msg = "unreachable"
			}
			if r.LastSeen != nil {
				msg += " · last seen " + humanize.RelTime(*r.LastSeen, now, "ago", "from now")
			}
			state = uiVal{V: "unreachable", T: msg}
		case !r.Available && len(r.Out) == 0:
			state = uiVal{V: "unavailable", T: "reachable, marked unavailable by the proxy"}
		case !r.Available:
			state = uiVal{V: "unavailable", T: "reachable, out: " + strings.Join(r.Out, ", ")}
		}
		if !r.Reachable && len(r.Out) > 0 {
			state.T += " · out: " + strings.Join(r.Out, ", ")
		}
		v.Replicas = append(v.Replicas, uiReplicaRow{
			ID: r.ID,
			OK: ok,
			Cells: map[string]uiVal{
				"held":           uiCount(r.Held),
				"sticky":         uiCount(r.Sticky),
				"spill_accepted": uiCount(r.SpillAccepted),
				"client_pinned":  uiCount(r.ClientPinned),
				"run_wait":       {V: []*int{r.Running, r.Waiting}, T: uiOptCount(r.Running) + " / " + uiOptCount(r.Waiting)},
				"kv":             uiOptPct(r.KVUsage),
				"hit":            uiOptPct(r.PrefixHitRate),
				"bindings":       {V: r.Bindings, T: humanize.Comma(int64(r.Bindings)) + " (" + humanize.Comma(int64(r.Active)) + " active)"},
				"state":          state,
			},
		})
	}
	return v
}

// uiChartPoints is how many points the chart draws for the hour.
const uiChartPoints = 360

// errUIUnknownReplica is returned for a replica the stats document does not know.
var errUIUnknownReplica = errors.New("no such replica")

// buildStatsView turns the per-second buckets into tokens/s over
// uiChartPoints equal slices of the window. The newest bucket is the second
// in progress and is left out, so the right edge does not dip.
func buildStatsView(doc Stats, replica string) (uiStatsView, error) {
	series := doc.Sum
	if replica != "" {
		s, ok := doc.Replicas[replica]
		if !ok {
			return uiStatsView{}, fmt.Errorf("%w %q in model %q", errUIUnknownReplica, replica, doc.Model)
		}
		series = s
	}
	step := doc.StepS
	if step <= 0 {
		step = 1
	}
	n := min(len(series.Cached), len(series.Computed), len(series.Generated))
	if n > 1 {
		n-- // the second in progress
	}
	per := max(1, (n+uiChartPoints-1)/uiChartPoints)
	points := n / per
	off := n - points*per // the oldest buckets that do not fill a point
	v := uiStatsView{
		Model:     doc.Model,
		Replica:   replica,
		Replicas:  make([]string, 0, len(doc.Replicas)),
		End:       doc.Start.Add(time.Duration(float64(n) * step * float64(time.Second))),
		StepS:     float64(per) * step,
		Cached:    make([]float64, points),
		Computed:  make([]float64, points),
		Generated: make([]float64, points),
	}
	for id := range doc.Replicas {
		v.Replicas = append(v.Replicas, id)
	}
	slices.Sort(v.Replicas)
	var sumC, sumP, promptMax, genMax float64
	var tot TokenCount
	for i := range points {
		var c, p, g uint64
		for j := off + i*per; j < off+(i+1)*per; j++ {
			c += series.Cached[j]
			p += series.Computed[j]
			g += series.Generated[j]
		}
		tot.Cached += c
		tot.Computed += p
		tot.Generated += g
		secs := float64(per) * step
		v.Cached[i] = uiRound1(float64(c) / secs)
		v.Computed[i] = uiRound1(float64(p) / secs)
		v.Generated[i] = uiRound1(float64(g) / secs)
		promptMax = math.Max(promptMax, v.Cached[i]+v.Computed[i])
		genMax = math.Max(genMax, v.Generated[i])
		sumC += float64(c)
		sumP += float64(p)
	}
	share := doc.HourCachedShare
	if replica != "" {
		share = 0
		if sumC+sumP > 0 {
			share = sumC / (sumC + sumP)
		}
	}
	v.Share = uiPct(share)
	v.PromptMax = uiRate(uiNiceCeil(promptMax))
	v.GenMax = uiRate(uiNiceCeil(genMax))
	v.HasData = promptMax > 0 || genMax > 0
	v.Totals = map[string]uiVal{
		"cached":    uiTokenCount(tot.Cached),
		"computed":  uiTokenCount(tot.Computed),
		"generated": uiTokenCount(tot.Generated),
	}
	return v, nil
}

func uiRound1(f float64) float64 { return math.Round(f*10) / 10 }

// uiNiceCeil rounds f up to 1, 2 or 5 times a power of ten (at least 1).
func uiNiceCeil(f float64) float64 {
	if f <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(f)))
	for _, m := range []float64{1, 2, 5, 10} {
		if f <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// uiDefault is the page server the admin routes use, built on first use.
var uiDefault = struct {
	once sync.Once
	srv  *uiServer
	err  error
}{}

func init() {
	uiHandler = caddy.AdminHandlerFunc(serveUI)
}

// serveUI serves GET /lm-warden/ and /lm-warden/ui/… on Caddy's admin
// endpoint, reading the admin JSON in-process through serveAdminJSON.
func serveUI(w http.ResponseWriter, r *http.Request) error {
	uiDefault.once.Do(func() {
		b, err := loadUIBundle(uiFiles)
		if err != nil {
			uiDefault.err = err
			return
		}
		uiDefault.srv = &uiServer{bundle: b, fetch: serveAdminJSON, now: time.Now}
	})
	if uiDefault.err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: uiDefault.err}
	}
	return uiDefault.srv.ServeHTTP(w, r)
}
