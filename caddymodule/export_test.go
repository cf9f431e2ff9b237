package caddymodule

import (
	"net/http"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// What the external tests (package caddymodule_test, which use the
// pagetest fixture and so cannot be part of this package) need to see of
// the page's internals.

type (
	ModelsView = uiModelsView
	ModelRow   = uiModelRow
	CardView   = uiCardView
	StatsView  = uiStatsView
)

const CSP = uiCSP

var Round1 = uiRound1

// LiveSource is the source of the admin endpoint's page: the loaded models.
var LiveSource PageSource = liveSource{}

// NewPageAt is NewPage on a clock stopped at now.
func NewPageAt(t testing.TB, src PageSource, now time.Time) http.Handler {
	t.Helper()
	b, err := uiEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	return uiHandler{&uiServer{bundle: b, src: src, now: func() time.Time { return now }}}
}

// PageAssetFile is an embedded asset as served.
type PageAssetFile struct {
	Body []byte
	Hash string
}

// PageAsset returns the embedded asset name (app.js, app.css).
func PageAsset(t testing.TB, name string) PageAssetFile {
	t.Helper()
	b, err := uiEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	a, ok := b.assets[name]
	if !ok {
		t.Fatalf("no embedded asset %s", name)
	}
	return PageAssetFile{Body: a.body, Hash: a.hash}
}

// LiveModelSeries registers a live model with an hour of usage up to now
// (uiLiveModel) and returns its per-second series.
func LiveModelSeries(t testing.TB, name string, now time.Time) vllmstats.Series {
	t.Helper()
	return uiLiveModel(t, name, now).acct.Series(now)
}
