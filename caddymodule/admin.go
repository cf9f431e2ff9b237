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

// handleUI serves the routing card and stats pages (ui_server.go).
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

// ModelList is the answer of GET /lm-warden/models.
type ModelList struct {
	Models []ModelSummary `json:"models"`
}

// ModelSummary is one entry of GET /lm-warden/models.
type ModelSummary struct {
	Model           string  `json:"model"`
	Affinity        bool    `json:"affinity"`
	SpillThreshold  int     `json:"spill_threshold"`
	SpillAuto       bool    `json:"spill_auto"`
	StickyPct       float64 `json:"sticky_pct"`
	InFlight        int     `json:"in_flight"`
	Replicas        int     `json:"replicas"`
	Reachable       int     `json:"reachable"`
	Bindings        int     `json:"bindings"`
	HourCachedShare float64 `json:"hour_cached_share"`
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

// Card is the routing card of a model (GET /lm-warden/models/{model}).
type Card struct {
	Model          string       `json:"model"`
	Affinity       bool         `json:"affinity"`
	SpillThreshold int          `json:"spill_threshold"`
	SpillAuto      bool         `json:"spill_auto"`
	MaxNumSeqs     int          `json:"max_num_seqs"`
	StickyPct      float64      `json:"sticky_pct"`
	InFlight       int          `json:"in_flight"`
	Requests       uint64       `json:"requests"`
	KeyedRequests  uint64       `json:"keyed_requests"`
	Bindings       int          `json:"bindings"`
	Since          time.Time    `json:"since"`
	Writable       bool         `json:"writable"`
	Replicas       []ReplicaRow `json:"replicas"`
	Admission      AdmissionRow `json:"admission"`
	// Warning says in plain words when the active conversations hold more
	// context than the replicas cache; "" when they do not.
	Warning string `json:"warning"`
	// Store is the shared binding store's state; absent without one.
	Store *StoreStatus `json:"store,omitempty"`
	// RecentSpills are the last turns whose replica was over the spill
	// threshold and that another replica could take, oldest first, with
	// the estimates that moved them or kept them.
	RecentSpills []SpillRow `json:"recent_spills"`
}

// SpillRow is one spill decision on the card: the turn's expected time to
// first token on its replica (stay) and on the target, its history of
// context_tokens recomputed there (move); moved says which won.
type SpillRow struct {
	At            time.Time `json:"at"`
	From          string    `json:"from"`
	To            string    `json:"to"`
	StayS         float64   `json:"stay_s"`
	MoveS         float64   `json:"move_s"`
	ContextTokens int       `json:"context_tokens"`
	Moved         bool      `json:"moved"`
}

// AdmissionRow is working-set admission's state on the card.
type AdmissionRow struct {
	On     bool   `json:"on"`     // configured on (and affinity on)
	Active bool   `json:"active"` // on and in force: the replicas' KV capacity is known
	Why    string `json:"why"`    // why it is not in force; "" when it is
	// Settings in use.
	HighWater  float64 `json:"high_water"`
	WindowS    float64 `json:"window_s"`
	WaitS      float64 `json:"wait_s"`
	QueueLimit int     `json:"queue_limit"`
	// Conversations waiting now and their estimated context in tokens.
	Waiting       int   `json:"waiting"`
	WaitingTokens int64 `json:"waiting_tokens"`
	// Since the router started: conversations that had to wait, admitted
	// when room appeared, admitted at admit_wait, refused (429) and gone
	// while waiting; the mean wait of those admitted (null before any).
	Queued            uint64   `json:"queued"`
	AdmittedAfterWait uint64   `json:"admitted_after_wait"`
	AdmittedAtLimit   uint64   `json:"admitted_at_wait_limit"`
	Refused           uint64   `json:"refused"`
	Cancelled         uint64   `json:"cancelled"`
	MeanWaitS         *float64 `json:"mean_wait_s"`
	// The replicas' working sets and KV capacities, summed (capacity 0
	// when unknown).
	WorkingSetTokens int64 `json:"working_set_tokens"`
	CapacityTokens   int64 `json:"capacity_tokens"`
	// Time-slicing: the quantum in turns (-1 off), the conversations paused
	// now, and since the router started the pauses and the turns of paused
	// conversations that waited to resume.
	RotateTurns int    `json:"rotate_turns"`
	Paused      int    `json:"paused"`
	PausedTotal uint64 `json:"paused_total"`
	QueuedTurns uint64 `json:"queued_turns"`
	// How long the turns of paused conversations waited to resume, p50 and
	// p95 of the last 128; null before any.
	PausedWaitP50S *float64 `json:"paused_wait_p50_s"`
	PausedWaitP95S *float64 `json:"paused_wait_p95_s"`
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

// ReplicaRow is one replica's row of the card.
type ReplicaRow struct {
	ID        string `json:"id"`
	Available bool   `json:"available"`
	// Out says why the replica is not available: "poll failure", "proxy
	// errors", "health check", "unavailable"; empty when it is.
	Out []string `json:"out"`
	// CooldownUntil is when its proxy-error cool-down ends, if one runs.
	CooldownUntil *time.Time `json:"cooldown_until"`
	// ProxyFailures counts requests that failed at the replica (no
	// connection, no response headers in time, 5xx, stream cut).
	ProxyFailures uint64 `json:"proxy_failures"`
	Reachable     bool   `json:"reachable"`
	LastError     string `json:"last_error"`
	// Engine is the engine whose metric names the replica's /metrics was
	// read as (vllm, sglang, llamacpp, tgi): configured or detected; "" until
	// known. MetricsUnread says why its last /metrics, answered with 200,
	// gave no figures (the replica stays available, its figures unknown).
	Engine        string     `json:"engine"`
	MetricsUnread string     `json:"metrics_unread,omitempty"`
	LastSeen      *time.Time `json:"last_seen"`
	Held          int        `json:"held"`
	// The router's counters, by their json names: sticky (turns that
	// stayed, including those that stayed over the threshold),
	// stayed_overloaded, spill_declined (stayed over the threshold because
	// moving was not expected to bring the first token sooner), placed,
	// spill_accepted, client_pinned, re_placed, restarted (placed anew
	// because their start changed: compacted or cleared), side (side
	// requests: another start under a bound conversation's key, a session
	// title, a summary, a probe, which moved no conversation),
	// cold_replaced (placed here because their replica no longer held
	// their cache), affinity_off, no_key, cold_marked (bindings here found
	// cold: the replica restarted since their last turn) and ended
	// (bindings dropped because the client ended the session); see
	// placement.Counters.
	placement.Counters
	// PrefillRate is the prefill rate learned from the turns here, in
	// tokens per second; null before one was learned.
	PrefillRate *float64 `json:"prefill_rate"`
	// Cached tokens of the sticky turns here: predicted by the binding
	// (the previous turn's prompt minus one block) and delivered by the
	// engine (capped at the prediction), and the delivered share; the
	// share is null before a sticky turn was measured.
	PredictedCached uint64   `json:"predicted_cached_tokens"`
	DeliveredCached uint64   `json:"delivered_cached_tokens"`
	DeliveredShare  *float64 `json:"delivered_share"`
	// The engine's own figures: null when it has not exported them (or has
	// not been polled yet), which is unknown, not 0.
	Running       *int     `json:"running"`
	Waiting       *int     `json:"waiting"`
	KVUsage       *float64 `json:"kv_usage"`
	PrefixHitRate *float64 `json:"prefix_hit_rate"`
	// PrefixIdle is true when the engine exports the prefix counters but
	// looked up no prompt token in the window: the windowed rate is
	// unknown (idle), not 0 %.
	PrefixIdle         bool       `json:"prefix_idle"`
	PrefixHitRateTotal *float64   `json:"prefix_hit_rate_total"`
	Bindings           int        `json:"bindings"`
	Active             int        `json:"active"`
	Paused             int        `json:"paused"` // of the bindings, paused at a turn boundary
	Tokens             TokenCount `json:"tokens"`
	// Admission: the context its active conversations hold (each counted
	// at what conversations grow to), its KV capacity in tokens (null when
	// unknown), and whether it reached its high-water mark and takes no
	// new conversation until below the low-water mark.
	WorkingSetTokens int64  `json:"working_set_tokens"`
	KVCapacityTokens *int64 `json:"kv_capacity_tokens"`
	Full             bool   `json:"full"`
	// The working set's check against the engine: the KV the engine
	// reports in use (kv_cache_usage_perc × capacity; null when unknown),
	// the share of their predicted cache the turns returning here found
	// lately (null before one), and the share of recent polls that found
	// a turn in flight here (admission takes it for idle below 0.8).
	EngineKVTokens *int64   `json:"engine_kv_tokens"`
	RecentHits     *float64 `json:"recent_hits"`
	Busy           float64  `json:"busy"`
}

// TokenCount is prompt tokens split by where they came from, and generated
// tokens, as the replicas reported them.
type TokenCount struct {
	Cached    uint64 `json:"cached"`
	Computed  uint64 `json:"computed"`
	Generated uint64 `json:"generated"`
}

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
			StayS: sc.Stay.Seconds(), MoveS: sc.Move.Seconds(), ContextTokens: sc.Context, Moved: sc.Moved})
	}
	for _, r := range s.Replicas {
		row := ReplicaRow{
			ID: r.ID, Available: r.Available, Out: r.Out.Names(), ProxyFailures: r.ProxyFailures, Held: r.InFlight,
			Counters: r.Counters, Bindings: r.Bindings, Active: r.Active, Paused: r.Paused,
			PredictedCached: r.PredictedTokens, DeliveredCached: r.DeliveredTokens,
			WorkingSetTokens: r.WorkingSet, Full: r.Full,
		}
		if r.Capacity > 0 {
			row.KVCapacityTokens = optional(r.Capacity)
		}
		if r.PrefillRate > 0 {
			row.PrefillRate = optional(r.PrefillRate)
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

// Stats is the per-second token series of a model
// (GET /lm-warden/models/{model}/stats).
type Stats struct {
	Model           string    `json:"model"`
	Start           time.Time `json:"start"`
	StepS           float64   `json:"step_s"`
	HourCachedShare float64   `json:"hour_cached_share"`
	// HourDeliveredShare is the share of the cached tokens predicted for
	// sticky turns that the engine delivered over the hour; null when
	// nothing was predicted.
	HourDeliveredShare *float64                `json:"hour_delivered_share"`
	Sum                Series                  `json:"sum"`
	Replicas           map[string]Series       `json:"replicas"`
	Totals             TokenCount              `json:"totals"`
	ReplicaTotals      map[string]ReplicaTotal `json:"replica_totals"`
}

// Series holds tokens per step, oldest first: prompt tokens cached and
// computed, generated tokens, and the cached tokens predicted for sticky
// turns and delivered of them.
type Series struct {
	Cached    []uint64 `json:"cached"`
	Computed  []uint64 `json:"computed"`
	Generated []uint64 `json:"generated"`
	Predicted []uint64 `json:"predicted"`
	Delivered []uint64 `json:"delivered"`
}

// ReplicaTotal is one replica's token counts since the router started.
type ReplicaTotal struct {
	TokenCount
	Requests   uint64 `json:"requests"`
	Unmeasured uint64 `json:"unmeasured"`
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
