package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// The page's view of the running models.
//
// The page (ui_server.go) renders the same documents the admin JSON API
// writes (ModelList, Card in admin.go) and the accountant's chart, read as
// Go values through PageSource: no request to the admin endpoint, no JSON
// in between. liveSource reads the models the loaded configuration holds;
// NewPage serves the same page over any other source (the pagetest
// package's fixed documents, or a program embedding the page).

// PageSource is what the routing card page reads: the admin API's documents
// as Go values. Errors are caddy.APIError values with the admin API's status
// (404 for an unknown model or replica); NewPage renders them as the admin
// endpoint does.
type PageSource interface {
	// Models is GET /lm-warden/models.
	Models(now time.Time) ModelList
	// Card is GET /lm-warden/models/{model}.
	Card(model string, now time.Time) (Card, error)
	// Chart is the hour before now of one replica ("" = all) in at most
	// points steps.
	Chart(model string, now time.Time, points int, replica string) (PageChart, error)
}

// PageChart is the chart of a model or one of its replicas, with what the
// page shows beside it.
type PageChart struct {
	vllmstats.Chart
	// Replicas are the replicas with recorded usage, sorted: the chart's
	// choices.
	Replicas []string
	// HourCachedShare is the model's cached share of prompt tokens over the
	// hour, the figure the models list and the card show.
	HourCachedShare float64
}

// errUIUnknownReplica is returned for a replica without recorded usage.
var errUIUnknownReplica = errors.New("no such replica")

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

func (liveSource) Chart(model string, now time.Time, points int, replica string) (PageChart, error) {
	m, ok := lookupModel(model)
	if !ok {
		return PageChart{}, errUnknownModel(model)
	}
	c, ok := m.acct.Chart(now, points, replica)
	if !ok {
		return PageChart{}, caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("%w %q in model %q", errUIUnknownReplica, replica, model)}
	}
	ch := PageChart{Chart: c, Replicas: m.acct.Replicas()}
	if replica == "" {
		ch.HourCachedShare = m.acct.HourCachedShare(now)
	}
	return ch, nil
}
