// Package card is the routing card and the stats page on Caddy's admin
// endpoint: the admin API's documents, the view documents built from them
// and the embedded page that renders those.
package card

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/klauspost/compress/gzhttp"
)

// The admin module (caddymodule) routes GET /lm-warden/ and /lm-warden/ui/…
// to a Server over the running models. The page is
// one HTML shell (web/index.html, a template that only fills in relative asset
// paths and the model name as data attributes) plus app.js and app.css, all
// embedded. The browser polls small view documents (views.go) built from
// the admin documents (documents.go) read as Go values through a Source.
//
//	/lm-warden/                      all models (the same shell)
//	/lm-warden/ui/                   all models
//	/lm-warden/ui/-/models.json      models view
//	/lm-warden/ui/-/app.js, app.css  assets (?v=<hash> → cached for a year)
//	/lm-warden/ui/{model}            routing card and stats of one model
//	/lm-warden/ui/{model}/view.json  card view
//	/lm-warden/ui/{model}/stats.json chart view (?replica=<id> for one replica)
//
// Files are served by net/http's ServeContent (conditional requests, ranges,
// HEAD) and compressed by klauspost/compress's gzhttp, the compression
// library Caddy itself builds on.
//
// The page is internal: caddymodule names the documents for the admin
// API's users (type aliases), and New serves the page over any Source for
// its tests and the browser tests (the pagetest package's fixed documents).
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

func uiSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// Caddy's admin endpoint checks the Referer of same-origin requests that
	// carry no Origin (fetch GET, scripts), so it must not be stripped.
	h.Set("Referrer-Policy", "same-origin")
}

// uiCompress gzips responses of at least 1 KiB for clients that accept it
// (the shell, the assets, the chart's view; small views go plain). Its ETag
// stays the same for both encodings, which is why the page's ETags are weak:
// the gzipped and plain bodies are the same document. zstd is left off so
// every browser gets the encoding it has always been sent.
var uiCompress, uiCompressErr = gzhttp.NewWrapper(gzhttp.MinSize(1024), gzhttp.EnableZstd(false))

// uiAsset is one embedded file.
type uiAsset struct {
	name  string
	ctype string
	body  []byte
	hash  string // first 16 hex digits of the SHA-256 of body
}

func newUIAsset(name, ctype string, body []byte) *uiAsset {
	sum := sha256.Sum256(body)
	return &uiAsset{name: name, ctype: ctype, body: body, hash: hex.EncodeToString(sum[:8])}
}

// serve writes the asset through http.ServeContent, which answers
// If-None-Match, Range and HEAD; cacheFor > 0 makes it immutable for that
// long, otherwise the browser revalidates every time.
func (a *uiAsset) serve(w http.ResponseWriter, r *http.Request, cacheFor time.Duration) {
	h := w.Header()
	uiSecurityHeaders(h)
	h.Set("Content-Type", a.ctype)
	if cacheFor > 0 {
		h.Set("Cache-Control", fmt.Sprintf("public, max-age=%d, immutable", int(cacheFor.Seconds())))
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	h.Set("ETag", `W/"`+a.hash+`"`)
	http.ServeContent(w, r, a.name, time.Time{}, bytes.NewReader(a.body))
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
		b.assets[name] = newUIAsset(name, ctype, body)
	}
	shell, err := template.ParseFS(files, "web/index.html")
	if err != nil {
		return nil, fmt.Errorf("parsing embedded index.html: %w", err)
	}
	b.shell = shell
	return b, nil
}

// Refresh is how often the page polls its view documents where its server
// was built without a refresh of its own (the admin endpoint's). It is the
// browser's pace, not part of routing, and the admin endpoint's page
// belongs to no one site's configuration, so it is no setting; a test may
// change it before the page is served (it is read without a lock).
var Refresh = 2 * time.Second

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

// Server serves the page from src; now is the clock of the views.
type Server struct {
	bundle  *uiBundle
	src     Source
	now     func() time.Time
	refresh time.Duration // 0 → Refresh
}

// uiPrefix and uiRoot are the two paths the page is served under.
const (
	uiRoot   = "/lm-warden/"
	uiPrefix = "/lm-warden/ui/"
)

// ServeHTTP serves the page, its assets and its view documents, compressed
// when the client takes it. Errors are caddy.APIError values, the admin
// endpoint's own error shape, returned before anything is written.
func (s *Server) Serve(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed", r.Method)}
	}
	if uiCompressErr != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: uiCompressErr}
	}
	var err error
	uiCompress(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err = s.route(w, r)
	})).ServeHTTP(w, r)
	return err
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) error {
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
	switch now := s.now(); doc {
	case "view.json":
		c, err := s.src.Card(model, now)
		if err != nil {
			return err
		}
		return writeUIJSON(w, buildCardView(c, now))
	case "stats.json":
		replica := r.URL.Query().Get("replica")
		ch, err := s.src.Chart(model, now, uiChartPoints, replica)
		if err != nil {
			return err
		}
		return writeUIJSON(w, buildStatsView(model, replica, ch))
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

func (s *Server) serveShell(w http.ResponseWriter, r *http.Request, d uiShellData) error {
	refresh := s.refresh
	if refresh <= 0 {
		refresh = Refresh
	}
	d.Refresh = refresh.Milliseconds()
	d.JSVer = s.bundle.assets["app.js"].hash
	d.CSSVer = s.bundle.assets["app.css"].hash
	var buf bytes.Buffer
	if err := s.bundle.shell.Execute(&buf, d); err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("rendering page: %w", err)}
	}
	newUIAsset("index.html", "text/html; charset=utf-8", buf.Bytes()).serve(w, r, 0)
	return nil
}

func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request, name string) error {
	if name == "models.json" {
		return writeUIJSON(w, buildModelsView(s.src.Models(s.now())))
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

// writeUIJSON writes a view document; uiCompress gzips it when the client
// takes it and it is big enough to gain (the chart's series are).
func writeUIJSON(w http.ResponseWriter, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: fmt.Errorf("encoding view: %w", err)}
	}
	h := w.Header()
	uiSecurityHeaders(h)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	_, err = w.Write(body)
	return err
}

// uiEmbedded is the bundle of the embedded files, parsed on first use.
var uiEmbedded = sync.OnceValues(func() (*uiBundle, error) { return loadUIBundle(uiFiles) })

// NewServer returns the page over src, under the same paths as on Caddy's
// admin endpoint (/lm-warden/ and /lm-warden/ui/…); refresh is how often
// the page polls (0: Refresh) and now its views' clock. Its errors are
// caddy.APIError values, as the admin endpoint renders them.
func NewServer(src Source, refresh time.Duration, now func() time.Time) (*Server, error) {
	b, err := uiEmbedded()
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	return &Server{bundle: b, src: src, now: now, refresh: refresh}, nil
}

// New returns the page over src as an http.Handler (see NewServer) that
// renders its errors as the admin endpoint renders a caddy.APIError: its
// status and {"error": "..."}. The page's actions write to
// /lm-warden/models/…, which it does not serve.
func New(src Source, refresh time.Duration) http.Handler {
	s, err := NewServer(src, refresh, time.Now)
	if err != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { writeAdminError(w, err) })
	}
	return uiHandler{s}
}

// uiHandler is a Server as an http.Handler, writing its errors.
type uiHandler struct{ s *Server }

func (h uiHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.s.Serve(w, r); err != nil {
		writeAdminError(w, err)
	}
}

// writeAdminError renders err the way Caddy's admin endpoint does: the status
// of a caddy.APIError (500 for any other error) and the error as JSON.
func writeAdminError(w http.ResponseWriter, err error) {
	var apiErr caddy.APIError
	if !errors.As(err, &apiErr) {
		apiErr = caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	if apiErr.Message == "" && apiErr.Err != nil {
		apiErr.Message = apiErr.Err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(apiErr.HTTPStatus)
	_ = json.NewEncoder(w).Encode(apiErr)
}
