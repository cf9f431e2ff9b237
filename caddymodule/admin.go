package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-lmwarden/internal/card"
	"github.com/lmwarden/caddy-lmwarden/internal/convkey"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves LM Warden's JSON on Caddy's admin endpoint:
//
//	GET    /lm-warden/models                          models with headline numbers
//	GET    /lm-warden/models/{model}                  the routing card
//	GET    /lm-warden/models/{model}/stats            per-second tokens, last hour
//	PUT    /lm-warden/models/{model}/affinity         {"affinity":false}
//	PUT    /lm-warden/models/{model}/admission        {"admission":false}
//	DELETE /lm-warden/models/{model}/sessions/{key}   unpin one conversation
//
// A model name containing "/" may be sent as is or path-escaped.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.lm_warden",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/lm-warden/models", Handler: caddy.AdminHandlerFunc(a.handleModels)},
		{Pattern: "/lm-warden/models/", Handler: caddy.AdminHandlerFunc(a.handleModel)},
		{Pattern: "/lm-warden/", Handler: caddy.AdminHandlerFunc(a.handleUI)},
	}
}

func apiErr(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

// handleUI serves the routing card and stats pages (internal/card).
func (adminAPI) handleUI(w http.ResponseWriter, r *http.Request) error {
	return serveUI(w, r)
}

// errUnknownModel is the admin API's answer for a model no loaded
// configuration names.
func errUnknownModel(name string) error {
	return apiErr(http.StatusNotFound, "unknown model %q", name)
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	return json.NewEncoder(w).Encode(v)
}

func (adminAPI) handleModels(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return apiErr(http.StatusMethodNotAllowed, "method not allowed")
	}
	return writeJSON(w, buildModelList(time.Now()))
}

// buildModelList is the answer of GET /lm-warden/models at now.
func buildModelList(now time.Time) ModelList {
	out := ModelList{Models: []ModelSummary{}}
	for _, m := range models() {
		s := m.router.Snapshot()
		ps := m.pollerSnapshot()
		reach := 0
		for i := range ps.Replicas {
			if ps.Replicas[i].Reachable {
				reach++
			}
		}
		out.Models = append(out.Models, ModelSummary{
			Model: m.name, Affinity: s.Affinity, SpillThreshold: s.SpillThreshold, SpillAuto: s.SpillAuto,
			StickyPct: s.StickyShare * 100, InFlight: s.InFlight, Replicas: len(s.Replicas),
			Reachable: reach, Bindings: s.Bindings, HourCachedShare: m.acct.HourCachedShare(now),
		})
	}
	return out
}

// resolveModel splits the path after /lm-warden/models/ into a live model
// and the rest ("", "stats", "affinity", "sessions/<key>").
func resolveModel(r *http.Request) (*modelState, string, error) {
	const prefix = "/lm-warden/models/"
	esc := r.URL.EscapedPath()
	if !strings.HasPrefix(esc, prefix) {
		return nil, "", apiErr(http.StatusNotFound, "not found")
	}
	rest := esc[len(prefix):]
	var best *modelState
	var bestRest string
	bestLen := -1
	for _, m := range models() {
		for _, name := range []string{url.PathEscape(m.name), m.name} {
			if (rest == name || strings.HasPrefix(rest, name+"/")) && len(name) > bestLen {
				best, bestLen = m, len(name)
				bestRest = strings.TrimPrefix(rest[len(name):], "/")
			}
		}
	}
	if best == nil {
		seg, _, _ := strings.Cut(rest, "/")
		name, _ := url.PathUnescape(seg)
		return nil, "", errUnknownModel(name)
	}
	return best, bestRest, nil
}

func (a adminAPI) handleModel(w http.ResponseWriter, r *http.Request) error {
	m, rest, err := resolveModel(r)
	if err != nil {
		return err
	}
	switch {
	case rest == "":
		if r.Method != http.MethodGet {
			return apiErr(http.StatusMethodNotAllowed, "method not allowed")
		}
		return writeJSON(w, buildCard(m, time.Now()))
	case rest == "stats":
		if r.Method != http.MethodGet {
			return apiErr(http.StatusMethodNotAllowed, "method not allowed")
		}
		return writeJSON(w, buildStats(m, time.Now()))
	case rest == "affinity":
		if r.Method != http.MethodPut && r.Method != http.MethodPost {
			return apiErr(http.StatusMethodNotAllowed, "method not allowed")
		}
		var body struct {
			Affinity *bool `json:"affinity"`
		}
		if err := decodeAdminBody(r, &body); err != nil {
			return err
		}
		if body.Affinity == nil {
			return apiErr(http.StatusBadRequest, `body must be {"affinity":true|false}`)
		}
		m.router.SetAffinity(*body.Affinity)
		return writeJSON(w, map[string]any{"model": m.name, "affinity": m.router.Affinity()})
	case rest == "admission":
		if r.Method != http.MethodPut && r.Method != http.MethodPost {
			return apiErr(http.StatusMethodNotAllowed, "method not allowed")
		}
		var body struct {
			Admission *bool `json:"admission"`
		}
		if err := decodeAdminBody(r, &body); err != nil {
			return err
		}
		if body.Admission == nil {
			return apiErr(http.StatusBadRequest, `body must be {"admission":true|false}`)
		}
		m.router.SetAdmission(*body.Admission)
		return writeJSON(w, map[string]any{"model": m.name, "admission": admissionRow(m.router.Admission())})
	case strings.HasPrefix(rest, "sessions/"):
		if r.Method != http.MethodDelete {
			return apiErr(http.StatusMethodNotAllowed, "method not allowed")
		}
		key, err := url.PathUnescape(rest[len("sessions/"):])
		if err != nil || key == "" {
			return apiErr(http.StatusBadRequest, "bad session key")
		}
		if err := noAdminBody(r); err != nil {
			return err
		}
		// a key over maxKeyLen is bound by its compact form (start ~
		// digest); given in full or in that form, it unpins the same
		// conversation. The 404 does not repeat the key (it may be long,
		// or a secret).
		if !m.unbind(key) && (len(key) <= convkey.MaxKeyLen || !m.unbind(convkey.Compact(key))) {
			return apiErr(http.StatusNotFound, "no conversation is bound to that session key (%d bytes)", len(key))
		}
		return writeJSON(w, map[string]bool{"unbound": true})
	}
	return apiErr(http.StatusNotFound, "not found: %s", r.URL.Path)
}

// maxAdminBody bounds the body of an admin write. Writes are small JSON
// objects; the bound only keeps a runaway client from filling memory.
const maxAdminBody = 1 << 20

// decodeAdminBody decodes the request's body, one JSON value and nothing
// after it but white space, into v. A body that is not exactly that gets
// 400 (so does a field v does not have), one over maxAdminBody 413; v's
// fields not in the body keep their values.
func decodeAdminBody(r *http.Request, v any) error {
	body, err := readAdminBody(r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(body))
	// a misspelt field is an error, not a write that changes nothing
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(http.StatusBadRequest, "decoding body: %v", err)
	}
	if off := dec.InputOffset(); strings.TrimSpace(body[off:]) != "" {
		return apiErr(http.StatusBadRequest, "decoding body: unexpected data after the JSON value at byte %d", off)
	}
	return nil
}

// noAdminBody refuses a body on a write that takes none.
func noAdminBody(r *http.Request) error {
	body, err := readAdminBody(r)
	if err != nil {
		return err
	}
	if strings.TrimSpace(body) != "" {
		return apiErr(http.StatusBadRequest, "this request takes no body")
	}
	return nil
}

func readAdminBody(r *http.Request) (string, error) {
	if r.Body == nil {
		return "", nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return "", apiErr(http.StatusBadRequest, "reading body: %v", err)
	}
	if len(b) > maxAdminBody {
		return "", apiErr(http.StatusRequestEntityTooLarge, "body larger than %d bytes", maxAdminBody)
	}
	return string(b), nil
}

func admissionRow(a placement.AdmissionSnapshot) AdmissionRow {
	row := AdmissionRow{
		On: a.On, Active: a.Active, Why: a.Why, HighWater: a.HighWater,
		WindowS: a.Window.Seconds(), WaitS: a.Wait.Seconds(), QueueLimit: a.QueueLimit,
		Waiting: a.Waiting, WaitingTokens: a.WaitingTokens, Queued: a.Queued,
		AdmittedAfterWait: a.AdmittedAfterWait, AdmittedAtLimit: a.AdmittedAtLimit,
		Refused: a.Refused, Cancelled: a.Cancelled,
		WorkingSetTokens: a.WorkingSetTokens, CapacityTokens: a.CapacityTokens,
		RotateTurns: a.RotateTurns, Paused: a.Paused, PausedTotal: a.PausedTotal, QueuedTurns: a.QueuedTurns,
		Recent: make([]AdmitRow, 0, len(a.Recent)),
	}
	for _, c := range a.Recent {
		row.Recent = append(row.Recent, AdmitRow{At: c.At.UTC(), To: c.To, WaitS: c.Wait.Seconds(), EvictS: c.Evict.Seconds()})
	}
	if a.Resumed > 0 {
		row.PausedWaitP50S = optional(a.PausedWaitP50.Seconds())
		row.PausedWaitP95S = optional(a.PausedWaitP95.Seconds())
	}
	if n := a.AdmittedAfterWait + a.AdmittedAtLimit; n > 0 {
		row.MeanWaitS = optional(a.WaitedTotal.Seconds() / float64(n))
	}
	return row
}

// The admin API's documents, defined with the page that renders them
// (internal/card).
type (
	ModelList    = card.ModelList
	ModelSummary = card.ModelSummary
	Card         = card.Card
	SpillRow     = card.SpillRow
	AdmitRow     = card.AdmitRow
	AdmissionRow = card.AdmissionRow
	ReplicaRow   = card.ReplicaRow
	TokenCount   = card.TokenCount
	Stats        = card.Stats
	Series       = card.Series
	ReplicaTotal = card.ReplicaTotal
)

func optional[T any](v T) *T { return &v }

// engineLoad returns the engine's running, waiting and KV figures from the
// load the router routes with (the one copy of them): nil for a figure the
// engine did not export, and for all of them before its first good poll.
func engineLoad(l placement.Load) (running, waiting *int, kv *float64) {
	if l.Seen.IsZero() {
		return nil, nil, nil
	}
	if !l.RunningUnknown {
		running = optional(l.Running)
	}
	if !l.WaitingUnknown {
		waiting = optional(l.Waiting)
	}
	if !l.KVUnknown {
		kv = optional(l.KVUsage)
	}
	return running, waiting, kv
}

func buildCard(m *modelState, now time.Time) Card {
	s := m.router.Snapshot()
	ps := m.pollerSnapshot()
	totals := m.acct.Totals()
	c := Card{
		Model: m.name, Affinity: s.Affinity, SpillThreshold: s.SpillThreshold, SpillAuto: s.SpillAuto,
		MaxNumSeqs: s.MaxNumSeqs, StickyPct: s.StickyShare * 100, InFlight: s.InFlight,
		Requests: s.Requests, KeyedRequests: s.KeyedRequests, Bindings: s.Bindings,
		Since: s.Since.UTC(), Writable: true, Replicas: make([]ReplicaRow, 0, len(s.Replicas)),
		Admission: admissionRow(s.Admission), Warning: overcommitMessage(s.Admission),
		Store: m.storeStatus(), RecentSpills: make([]SpillRow, 0, len(s.RecentSpills)),
	}
	for _, sc := range s.RecentSpills {
		c.RecentSpills = append(c.RecentSpills, SpillRow{At: sc.At.UTC(), From: sc.From, To: sc.To,
			StayS: sc.Stay.Seconds(), MoveS: sc.Move.Seconds(), EvictS: sc.Evict.Seconds(), ContextTokens: sc.Context, Moved: sc.Moved})
	}
	for _, r := range s.Replicas {
		row := ReplicaRow{
			ID: r.ID, Available: r.Available, Out: r.Out.Names(), ProxyFailures: r.ProxyFailures, Held: r.InFlight,
			Counters: r.Counters, Bindings: r.Bindings, Active: r.Active, Paused: r.Paused,
			PredictedCached: r.PredictedTokens, DeliveredCached: r.DeliveredTokens,
			WorkingSetTokens: r.WorkingSet, Full: r.Full, KeyedBy: m.keys.row(r.ID),
		}
		if r.Capacity > 0 {
			row.KVCapacityTokens = optional(r.Capacity)
		}
		if r.PrefillRate > 0 {
			row.PrefillRate = optional(r.PrefillRate)
		}
		if r.TTFTTurns > 0 {
			row.ExpectedTTFTS = optional(r.ExpectedTTFT.Seconds())
			row.MeasuredTTFTS = optional(r.MeasuredTTFT.Seconds())
		}
		if r.EngineKV >= 0 {
			row.EngineKVTokens = optional(r.EngineKV)
		}
		if r.MeasuredTurns > 0 {
			row.RecentHits = optional(r.Hits)
		}
		row.Busy = r.Busy
		if r.PredictedTokens > 0 {
			row.DeliveredShare = optional(r.DeliveredShare())
		}
		if row.Out == nil {
			row.Out = []string{}
		}
		if !r.CooldownUntil.IsZero() {
			t := r.CooldownUntil.UTC()
			row.CooldownUntil = &t
		}
		if st, ok := ps.Replica(r.ID); ok {
			row.Reachable = st.Reachable
			row.LastError = st.LastError
			if !st.LastSeen.IsZero() {
				t := st.LastSeen.UTC()
				row.LastSeen = &t
			}
			if st.Dialect != vllmstats.DialectAuto {
				row.Engine = st.Dialect.String()
			}
			row.MetricsUnread = st.Unread
			if st.HitRateKnown {
				if st.HitRateWindowKnown {
					row.PrefixHitRate = optional(st.HitRateWindow)
				} else {
					row.PrefixIdle = true
				}
				if st.QueriesSinceStart > 0 {
					row.PrefixHitRateTotal = optional(st.HitRateTotal)
				}
			}
		}
		row.Running, row.Waiting, row.KVUsage = engineLoad(r.Load)
		if t, ok := totals[r.ID]; ok {
			row.Tokens = TokenCount{Cached: t.Cached, Computed: t.Computed, Generated: t.Generated}
		}
		c.Replicas = append(c.Replicas, row)
	}
	return c
}

func seriesOf(b vllmstats.Buckets) Series {
	s := Series{Cached: b.Cached, Computed: b.Computed, Generated: b.Generated, Predicted: b.Predicted, Delivered: b.Delivered}
	for _, v := range []*[]uint64{&s.Cached, &s.Computed, &s.Generated, &s.Predicted, &s.Delivered} {
		if *v == nil {
			*v = []uint64{}
		}
	}
	return s
}

func buildStats(m *modelState, now time.Time) Stats {
	ser := m.acct.Series(now)
	st := Stats{
		Model: m.name, Start: ser.Start.UTC(), StepS: ser.Step.Seconds(),
		HourCachedShare: ser.HourCachedShare, HourDeliveredShare: ser.HourDeliveredShare, Sum: seriesOf(ser.Sum),
		Replicas:      make(map[string]Series, len(ser.Replicas)),
		ReplicaTotals: make(map[string]ReplicaTotal),
	}
	for id, b := range ser.Replicas {
		st.Replicas[id] = seriesOf(b)
	}
	for id, t := range m.acct.Totals() {
		st.Totals.Cached += t.Cached
		st.Totals.Computed += t.Computed
		st.Totals.Generated += t.Generated
		st.ReplicaTotals[id] = ReplicaTotal{
			TokenCount: TokenCount{Cached: t.Cached, Computed: t.Computed, Generated: t.Generated},
			Requests:   t.Requests, Unmeasured: t.Unmeasured,
		}
	}
	return st
}

// Interface guards
var _ caddy.AdminRouter = adminAPI{}
