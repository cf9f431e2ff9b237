package caddymodule

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/internal/card"
)

// The page's view of the running models.
//
// The page (internal/card) renders the same documents the admin JSON API
// writes (ModelList, Card in admin.go) and the accountant's chart, read as
// Go values through card.Source: no request to the admin endpoint, no JSON
// in between. liveSource reads the models the loaded configuration holds.

// liveSource reads the live models (lookupModel, models in state.go).
type liveSource struct{}

func (liveSource) Models(now time.Time) ModelList { return buildModelList(now) }

func (liveSource) Card(model string, now time.Time) (Card, error) {
	m, ok := lookupModel(model)
	if !ok {
		return Card{}, errUnknownModel(model)
	}
	return buildCard(m, now), nil
}

func (liveSource) Chart(model string, now time.Time, points int, replica string) (card.Chart, error) {
	m, ok := lookupModel(model)
	if !ok {
		return card.Chart{}, errUnknownModel(model)
	}
	c, ok := m.acct.Chart(now, points, replica)
	if !ok {
		return card.Chart{}, caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("%w %q in model %q", card.ErrUnknownReplica, replica, model)}
	}
	ch := card.Chart{Chart: c, Replicas: m.acct.Replicas()}
	if replica == "" {
		ch.HourCachedShare = m.acct.HourCachedShare(now)
	}
	return ch, nil
}

// uiDefault is the page server the admin routes use, built on first use.
var uiDefault = sync.OnceValues(func() (*card.Server, error) { return card.NewServer(liveSource{}, 0, time.Now) })

// serveUI serves GET /lm-warden/ and /lm-warden/ui/… on Caddy's admin
// endpoint from the live models.
func serveUI(w http.ResponseWriter, r *http.Request) error {
	s, err := uiDefault()
	if err != nil {
		return err
	}
	return s.Serve(w, r)
}
