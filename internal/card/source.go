package card

import (
	"errors"
	"time"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// Source is what the routing card page reads: the admin API's documents
// as Go values. Errors are caddy.APIError values with the admin API's status
// (404 for an unknown model or replica); New renders them as the admin
// endpoint does.
type Source interface {
	// Models is GET /lm-warden/models.
	Models(now time.Time) ModelList
	// Card is GET /lm-warden/models/{model}.
	Card(model string, now time.Time) (Card, error)
	// Chart is the hour before now of one replica ("" = all) in at most
	// points steps.
	Chart(model string, now time.Time, points int, replica string) (Chart, error)
}

// Chart is the chart of a model or one of its replicas, with what the
// page shows beside it.
type Chart struct {
	vllmstats.Chart
	// Replicas are the replicas with recorded usage, sorted: the chart's
	// choices.
	Replicas []string
	// HourCachedShare is the model's cached share of prompt tokens over the
	// hour, the figure the models list and the card show.
	HourCachedShare float64
}

// ErrUnknownReplica is the error of a Source's Chart for a replica without
// recorded usage.
var ErrUnknownReplica = errors.New("no such replica")
