// Package pagetest provides a fixed set of admin documents to serve the
// routing card page from, the way net/http/httptest provides servers: the
// page's own tests and the headless-browser tests render the same card.
//
// The card is the one of the reference measurement (4 × RTX A4000,
// Qwen3-4B, vLLM data-parallel 4; docs/reference-measurement.md): model
// qwen3-4b, affinity on, spill threshold 8 (auto), 4 replicas with sticky
// counts 38/21/19/29 and prefix hit rates 82.2/86.0/69.0/80.0 %, and an
// hour of per-second token usage with traffic over its last half hour,
// recorded into a real vllmstats.Accountant so the chart's steps are summed
// by the same code as in production.
package pagetest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// Model is the fixture's one model.
const Model = "qwen3-4b"

// Fixture is a card.Source of values a test controls. It also
// answers the admin JSON paths the page reads and writes (ServeHTTP), the
// way the admin API does, so the page's actions work against it. It is safe
// for concurrent use.
type Fixture struct {
	mu    sync.Mutex
	doc   card.Card
	stats card.Stats
	acct  *vllmstats.Accountant
}

// New returns the reference card as of now, its hour of usage ending at now.
func New(now time.Time) *Fixture {
	since := now.Add(-2 * time.Hour).Truncate(time.Second)
	f := &Fixture{doc: card.Card{
		Model: Model, Affinity: true, SpillThreshold: 8, SpillAuto: true, MaxNumSeqs: 32,
		StickyPct: 100, InFlight: 3, Requests: 1234567, KeyedRequests: 1200, Bindings: 12,
		Since: since, Writable: true,
	}}
	sticky := []uint64{38, 21, 19, 29}
	hits := []float64{0.822, 0.860, 0.690, 0.800}
	f.stats = card.Stats{Model: Model, Start: now.Add(-3600 * time.Second), StepS: 1,
		HourCachedShare: 0.78, Replicas: map[string]card.Series{}}
	sum := newSeries()
	for i := range 4 {
		id := fmt.Sprintf("127.0.0.1:800%d", i+1)
		f.doc.Replicas = append(f.doc.Replicas, card.ReplicaRow{
			ID: id, Available: true, Reachable: true, LastSeen: &now, Held: i % 2,
			Counters: placement.Counters{Sticky: sticky[i], Placed: 4, SpillAccepted: uint64(i)},
			Running:  ptr(i % 2), Waiting: ptr(0), KVUsage: ptr(0.41 + float64(i)/10),
			PrefixHitRate: ptr(hits[i]), PrefixHitRateTotal: ptr(hits[i] - 0.02), Bindings: 3, Active: 2,
			Tokens: card.TokenCount{Cached: 123, Computed: 45, Generated: 67},
		})
		s := newSeries()
		for j := 1800; j < 3600; j++ { // traffic over the last half hour
			s.Cached[j] = uint64(700 + 100*i + j%50)
			s.Computed[j] = uint64(200 + 10*i)
			s.Generated[j] = uint64(40 + i)
			sum.Cached[j] += s.Cached[j]
			sum.Computed[j] += s.Computed[j]
			sum.Generated[j] += s.Generated[j]
		}
		f.stats.Replicas[id] = s
	}
	f.stats.Sum = sum
	// Series index j is the second now.Unix()-3599+j: index 3599 is the
	// second in progress.
	f.acct = vllmstats.NewAccountant()
	for id, ser := range f.stats.Replicas {
		for j := range ser.Cached {
			if ser.Cached[j]+ser.Computed[j]+ser.Generated[j] == 0 {
				continue
			}
			f.acct.Record(id, vllmstats.Usage{
				PromptTokens: int64(ser.Cached[j] + ser.Computed[j]), CachedTokens: int64(ser.Cached[j]),
				CompletionTokens: int64(ser.Generated[j]), Measured: true, CachedMeasured: true,
			}, time.Unix(now.Unix()-3599+int64(j), 0))
		}
	}
	// Sticky turns checked against their bindings' predictions: one every
	// 10 s per replica over the last half hour, replica i delivering
	// 100 − 2.5·i % of what was predicted, except one minute in which
	// the last replica delivered nothing (as after a restart).
	for i, id := range slices.Sorted(maps.Keys(f.stats.Replicas)) {
		for j := 1800; j < 3600; j += 10 {
			delivered := 1000 - 25*i
			if i == 3 && j >= DeliveryDip && j < DeliveryDip+60 {
				delivered = 0
			}
			f.acct.RecordDelivery(id, 1000, delivered, time.Unix(now.Unix()-3599+int64(j), 0))
		}
	}
	return f
}

// DeliveryDip is the series index (second) where the minute starts in
// which the fixture's last replica delivered none of its predicted cached
// tokens.
const DeliveryDip = 3000

func newSeries() card.Series {
	return card.Series{Cached: make([]uint64, 3600), Computed: make([]uint64, 3600), Generated: make([]uint64, 3600)}
}

func ptr[T any](v T) *T { return &v }

// Edit changes the card under the fixture's lock.
func (f *Fixture) Edit(change func(*card.Card)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.doc)
}

// Stats is the per-second hour the chart is recorded from (GET
// /lm-warden/models/qwen3-4b/stats). The series are shared: read them only.
func (f *Fixture) Stats() card.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

func (f *Fixture) modelList() card.ModelList {
	c := f.doc
	return card.ModelList{Models: []card.ModelSummary{{
		Model: c.Model, Affinity: c.Affinity, SpillThreshold: c.SpillThreshold, SpillAuto: c.SpillAuto,
		StickyPct: c.StickyPct, InFlight: c.InFlight, Replicas: len(c.Replicas), Reachable: len(c.Replicas),
		Bindings: c.Bindings, HourCachedShare: f.stats.HourCachedShare,
	}}}
}

// notFound is the admin API's 404.
func notFound(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err, Message: err.Error()}
}

// Models implements card.Source.
func (f *Fixture) Models(time.Time) card.ModelList {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.modelList()
}

// Card implements card.Source.
func (f *Fixture) Card(model string, _ time.Time) (card.Card, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if model != f.doc.Model {
		return card.Card{}, notFound("unknown model %q", model)
	}
	return f.doc, nil
}

// Chart implements card.Source from the fixture's accountant.
func (f *Fixture) Chart(model string, now time.Time, points int, replica string) (card.Chart, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if model != f.doc.Model {
		return card.Chart{}, notFound("unknown model %q", model)
	}
	c, ok := f.acct.Chart(now, points, replica)
	if !ok {
		return card.Chart{}, notFound("no such replica %q in model %q", replica, model)
	}
	ids := slices.Sorted(maps.Keys(f.stats.Replicas))
	return card.Chart{Chart: c, Replicas: ids, HourCachedShare: f.stats.HourCachedShare}, nil
}

// ServeHTTP answers the admin JSON paths the page reads and writes: the
// models list, the card, its stats, the affinity switch and unpinning.
func (f *Fixture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	base := "/lm-warden/models/" + Model
	switch p := r.URL.Path; {
	case p == "/lm-warden/models" && r.Method == http.MethodGet:
		_ = enc.Encode(f.modelList())
	case p == base && r.Method == http.MethodGet:
		_ = enc.Encode(f.doc)
	case p == base+"/stats" && r.Method == http.MethodGet:
		_ = enc.Encode(f.stats)
	case p == base+"/affinity" && r.Method == http.MethodPut:
		var body struct {
			Affinity bool `json:"affinity"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = enc.Encode(map[string]string{"error": err.Error()})
			return
		}
		f.doc.Affinity = body.Affinity
		_ = enc.Encode(body)
	case strings.HasPrefix(p, base+"/sessions/") && r.Method == http.MethodDelete:
		_ = enc.Encode(map[string]bool{"unbound": true})
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = enc.Encode(map[string]string{"error": "unknown model or path " + p})
	}
}

// Handler puts page (card.New over the fixture, or any page
// handler) and the fixture's admin JSON behind one handler, as the admin
// endpoint does.
func (f *Fixture) Handler(page http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/lm-warden/models", f)
	mux.Handle("/lm-warden/models/", f)
	mux.Handle("/lm-warden/", page)
	return mux
}
