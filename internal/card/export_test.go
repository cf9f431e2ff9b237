package card

import (
	"net/http"
	"testing"
	"time"
)

// What the external tests (package card_test, which use the pagetest
// fixture and so cannot be part of this package) need to see of the
// page's internals.

const CSP = uiCSP

var Round1 = uiRound1

// NewPageAt is the page over src on a clock stopped at now.
func NewPageAt(t testing.TB, src Source, now time.Time) http.Handler {
	t.Helper()
	s, err := NewServer(src, 0, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	return uiHandler{s}
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
