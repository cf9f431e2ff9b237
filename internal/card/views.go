package card

import (
	"fmt"
	"math"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// The view documents: what the page renders, built in Go from the admin
// documents (source.go). The browser never formats a number: every value
// is carried twice, raw ("v") and humanised with go-humanize ("t").

// uiVal is one displayed value: V is the raw value from the admin JSON, T
// the text the page shows.
// The view documents' types by name, for the tests of the packages that
// serve the page.
type (
	ModelsView = uiModelsView
	ModelRow   = uiModelRow
	CardView   = uiCardView
	StatsView  = uiStatsView
)

type uiVal struct {
	V any    `json:"v"`
	T string `json:"t"`
	// H is the cell's tooltip, for detail that would widen the table.
	H string `json:"h,omitempty"`
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
	Model    string `json:"model"`
	Writable bool   `json:"writable"`
	Warning  string `json:"warning"` // "" when none
	// Head holds the figures above the table; a key that is absent (the
	// store without a shared store) hides its line.
	Head     map[string]uiVal `json:"head"`
	Since    uiVal            `json:"since"`
	Columns  []uiColumn       `json:"columns"`
	Replicas []uiReplicaRow   `json:"replicas"`
}

// uiColumn is one column of the card's replica table. The page draws the
// table's head and every row's cells from the view's list, in its order.
// A column whose key is the json name of a placement.Counters field shows
// that counter (uiCounterCells); others have a cell of their own in
// buildCardView.
type uiColumn struct {
	Key   string `json:"key"`   // the cell's key in uiReplicaRow.Cells
	Label string `json:"label"` // the column's heading
	Title string `json:"title,omitempty"`
	Group string `json:"group"` // the heading above a run of columns
	// Doc is the column's row in the README's table of counters
	// (markdown), when it says more than Title; the page does not send it.
	Doc string `json:"-"`
}

// uiReplicaColumns are the replica table's columns after the replica's
// name, in the order an operator reads them in an incident: whether the
// replica can be chosen, how loaded it is, how well its cache serves, and
// what the router decided. The README's table of the card's counters is
// written from this list and placement.Counters (TestREADMECounters).
var uiReplicaColumns = []uiColumn{
	{Key: "state", Label: "Status", Group: "Status",
		Title: "available, or out and why (poll failure, proxy errors with the cool-down's end or while its probe is unanswered, health check); unreachable when its metrics cannot be read",
		Doc:   "whether the replica can be chosen now: *available*; *out* and why (poll failure, proxy errors with the cool-down's end or while its probe is unanswered, health check, marked unavailable; see *When a replica fails*); *unreachable* when the last 3 polls failed, with the last error and when it was last seen (`reachable`, `last_error`, `last_seen`, `out`, `cooldown_until`, `proxy_failures` in the JSON); then the engine its metrics name and, when some are missing, which figures it does not give"},
	{Key: "held", Label: "Held", Group: "Load", Title: "requests in flight through this router on the replica"},
	{Key: "run_wait", Label: "Running / waiting", Group: "Load", Title: "the engine's num_requests_running / num_requests_waiting",
		Doc: "vLLM's `num_requests_running` / `num_requests_waiting`; the tooltip gives the wait they mean for a turn: the router's expected time to first token of the recent turns here against the time they met from routing (`expected_ttft_s`, `measured_ttft_s` in the JSON)"},
	{Key: "kv", Label: "KV in use", Group: "Load", Title: "the engine's KV cache usage",
		Doc: "vLLM's `kv_cache_usage_perc` (or the legacy `gpu_cache_usage_perc`), 0–100 %"},
	{Key: "working_set", Label: "Working set / KV", Group: "Load",
		Title: "context held by the conversations admission counts on the replica (each at what conversations grow to) against its KV cache; full while it takes no new conversation",
		Doc:   "the context of the conversations admission counts on this replica (a turn within the admission window, each at what conversations grow to) against its KV cache in tokens, and the KV its engine reports in use (\"engine 12 k\"; `engine_kv_tokens` in the JSON, beside `recent_hits` and `busy`); \"full\" while it takes no new conversation (see *Working-set admission*)"},
	{Key: "hit", Label: "Prefix hit rate", Group: "Cache", Title: "cached / queried prompt tokens over the last minute, the engine's counters",
		Doc: "Δ`prefix_cache_hits` / Δ`prefix_cache_queries` over the last minute (and since start in the JSON), \"idle\" for a minute without queries; a counter that drops is a replica restart: a new baseline, never negative traffic"},
	{Key: "delivered", Label: "Delivered / predicted", Group: "Cache",
		Title: "cached tokens the engine delivered on sticky turns, as a share of what the bindings predicted",
		Doc:   "cached tokens the engine delivered on this replica's sticky turns (each capped at its prediction) as a share of what their bindings predicted, with both token counts"},
	{Key: "bindings", Label: "Bindings (recent)", Group: "Decisions",
		Title: "conversations bound to the replica (of those, with a turn within the last 10 minutes; and paused at a turn boundary, whose next turn waits until room comes round again: time-slicing)",
		Doc:   "conversations bound to this replica (of those, with a turn within the last 10 minutes: `active` in the JSON, used when placing new ones; and those paused at a turn boundary, whose next turn waits until room comes round again, see *Time-slicing*: \"12 (3 recent, 2 paused)\", `paused` per replica and `admission.paused` / `paused_total` / `queued_turns` / `rotate_turns` in the JSON); its tooltip counts the requests routed here by where their conversation key came from: a session header, the body (`metadata.user_id`, `prompt_cache_key`), a fingerprint of the conversation's start, or none (\"keyed by 40 header · 2 body\"; `keyed_by` in the JSON, `lm_warden_key_source_requests_total`)"},
	{Key: "sticky", Label: "Sticky", Group: "Decisions", Title: "turns that stayed on their replica",
		Doc: "turns that stayed on their replica, spill-declined included (`stayed_overloaded` in the JSON: of those, turns that stayed although the replica was over the threshold)"},
	{Key: "spill_accepted", Label: "Spill-accepted", Group: "Decisions", Title: "conversations moved here from a replica over the spill threshold"},
	{Key: "spill_declined", Label: "Spill-declined", Group: "Decisions",
		Title: "turns that stayed over the spill threshold: moving was not expected to bring their first token sooner",
		Doc:   "of the sticky turns, those over the threshold that stayed because moving was not expected to bring their first token sooner (the count's text adds the last estimates)"},
	{Key: "client_pinned", Label: "Client-pinned", Group: "Decisions", Title: "requests a client pinned here"},
	{Key: "restarted", Label: "Restarted", Group: "Decisions", Title: "conversations placed anew because their start changed (compacted, cleared)"},
	{Key: "side", Label: "Side", Group: "Decisions", Title: "side requests: another start under a bound conversation's key (a session title, a summary, a probe), routed without moving the conversation"},
	{Key: "cold_replaced", Label: "Cold-replaced", Group: "Decisions", Title: "conversations placed anew because their replica no longer held their cache"},
	{Key: "ended", Label: "Ended", Group: "Decisions", Title: "bindings dropped because the client ended the session"},
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
	// Delivered is the share of predicted cached tokens delivered on
	// sticky turns per step of DeliveredStepS (about a minute); null
	// where no sticky turn was checked. DeliveredShare is the hour's.
	Delivered      []*float64 `json:"delivered"`
	DeliveredStepS float64    `json:"delivered_step_s"`
	DeliveredShare uiVal      `json:"delivered_share"`
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
			"admission":    uiAdmission(doc.Admission),
		},
		Warning: doc.Warning,
		Since: uiVal{V: doc.Since, T: "counters since " + doc.Since.UTC().Format("2006-01-02 15:04:05 UTC") +
			" (" + humanize.RelTime(doc.Since, now, "ago", "from now") + ")"},
		Columns:  uiReplicaColumns,
		Replicas: make([]uiReplicaRow, 0, len(doc.Replicas)),
	}
	if doc.Store != nil {
		v.Head["store"] = uiStore(doc.Store)
	}
	for _, r := range doc.Replicas {
		ok := r.Reachable && r.Available
		state := uiReplicaState(r, now)
		v.Replicas = append(v.Replicas, uiReplicaRow{
			ID: r.ID,
			OK: ok,
			Cells: uiCounterCells(r.Counters, map[string]uiVal{
				"held":           uiCount(r.Held),
				"spill_declined": uiSpillDeclined(r.SpillDeclined, r.ID, doc.RecentSpills),
				"run_wait":       {V: []*int{r.Running, r.Waiting}, T: uiOptCount(r.Running) + " / " + uiOptCount(r.Waiting), H: uiTTFT(r.ExpectedTTFTS, r.MeasuredTTFTS)},
				"kv":             uiOptPct(r.KVUsage),
				"hit":            uiHit(r),
				"delivered":      uiDelivered(r.DeliveredShare, r.DeliveredCached, r.PredictedCached),
				"bindings":       uiBindings(r),
				"working_set":    uiWorkingSet(r.WorkingSetTokens, r.KVCapacityTokens, r.EngineKVTokens, r.Full),
				"state":          state,
			}),
		})
	}
	return v
}

// uiCounterFields maps the json name of each placement.Counters field to
// its index.
var uiCounterFields = func() map[string]int {
	t := reflect.TypeFor[placement.Counters]()
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		m[t.Field(i).Tag.Get("json")] = i
	}
	return m
}()

// uiCounterCells adds to cells, for every column named after a counter
// (its json name) that cells has no rendering of its own for, the
// counter as a count.
func uiCounterCells(n placement.Counters, cells map[string]uiVal) map[string]uiVal {
	v := reflect.ValueOf(n)
	for _, c := range uiReplicaColumns {
		if _, done := cells[c.Key]; done {
			continue
		}
		if i, ok := uiCounterFields[c.Key]; ok {
			cells[c.Key] = uiCount(v.Field(i).Uint())
		}
	}
	return cells
}

// uiReplicaState renders whether a replica can be chosen: "available";
// "out: proxy errors until 12:00:05" (the causes the router gives, or
// "marked unavailable by the proxy"); "unreachable: <last error> · last
// seen 1 minute ago", with the causes it is out for beside; then the
// engine the replica's metrics name and which figures it does not give.
func uiReplicaState(r ReplicaRow, now time.Time) uiVal {
	v := uiReplicaAvailability(r, now)
	if r.Engine != "" {
		v.T += " · " + r.Engine
	}
	if r.MetricsUnread != "" {
		v.T += " · figures unknown: " + r.MetricsUnread
	}
	return v
}

// uiSpillDeclined renders a replica's declined spills with, in the tooltip,
// the estimates of the last spill decisions for turns from it: "moved to
// r2: stay 9.1 s, move 3.0 s (12,000 tokens)", with "; evicts 1.2 s"
// inside the parentheses when the move pushes resident conversations'
// caches out.
func uiSpillDeclined(n uint64, id string, recent []SpillRow) uiVal {
	v := uiCount(n)
	for _, c := range recent {
		if c.From != id {
			continue
		}
		verb := "stayed, not to "
		if c.Moved {
			verb = "moved to "
		}
		if v.H != "" {
			v.H += "\n"
		}
		v.H += verb + c.To + ": stay " + humanize.FtoaWithDigits(c.StayS, 1) + " s, move " +
			humanize.FtoaWithDigits(c.MoveS, 1) + " s (" + humanize.Comma(int64(c.ContextTokens)) + " tokens"
		if c.EvictS > 0 {
			v.H += "; evicts " + humanize.FtoaWithDigits(c.EvictS, 1) + " s"
		}
		v.H += ")"
	}
	return v
}

// uiReplicaAvailability is the first part of the status: available, out
// and why, or unreachable and since when.
func uiReplicaAvailability(r ReplicaRow, now time.Time) uiVal {
	if !r.Reachable {
		msg := "unreachable"
		if r.LastError != "" {
			msg += ": " + uiShortError(r.LastError)
		}
		if r.LastSeen != nil {
			msg += " · last seen " + humanize.RelTime(*r.LastSeen, now, "ago", "from now")
		}
		if len(r.Out) > 0 {
			msg += " · out: " + strings.Join(r.Out, ", ")
		}
		return uiVal{V: "unreachable", T: msg}
	}
	switch {
	case r.Available:
		return uiVal{V: "available", T: "available"}
	case len(r.Out) == 0:
		return uiVal{V: "out", T: "out: marked unavailable by the proxy"}
	}
	return uiVal{V: "out", T: "out: " + strings.Join(r.Out, ", ")}
}

// uiShortError drops the request Go's HTTP client names at the start of
// its errors (`Get "http://10.0.0.5:8000/metrics": `): the row already
// says which replica it is.
func uiShortError(msg string) string {
	if rest, ok := strings.CutPrefix(msg, "Get \""); ok {
		if i := strings.Index(rest, "\": "); i >= 0 {
			return rest[i+3:]
		}
	}
	return msg
}

// uiAdmission renders admission's state for the card's head: "on · 3
// waiting (mean wait 12 s)", "off", "not in force: <why>".
func uiAdmission(a AdmissionRow) uiVal {
	switch {
	case !a.On:
		return uiVal{V: "off", T: "off"}
	case !a.Active:
		return uiVal{V: "inactive", T: "not in force: " + a.Why}
	}
	t := "on · " + humanize.Comma(int64(a.Waiting)) + " waiting"
	if a.MeanWaitS != nil {
		t += " (mean wait " + humanize.FtoaWithDigits(*a.MeanWaitS, 1) + " s)"
	}
	if a.Refused > 0 {
		t += " · " + humanize.Comma(int64(a.Refused)) + " refused"
	}
	if a.Paused > 0 || a.PausedTotal > 0 {
		t += " · " + humanize.Comma(int64(a.Paused)) + " paused (" + humanize.Comma(int64(a.PausedTotal)) + " pauses"
		if a.RotateTurns > 0 {
			t += ", a quantum of " + humanize.Comma(int64(a.RotateTurns)) + " turns"
		}
		if a.PausedWaitP50S != nil {
			t += "; waited " + humanize.FtoaWithDigits(*a.PausedWaitP50S, 1) + " s p50, " + humanize.FtoaWithDigits(*a.PausedWaitP95S, 1) + " s p95"
		}
		t += ")"
	}
	for _, c := range a.Recent {
		t += "\nlet in on " + c.To + " after " + humanize.FtoaWithDigits(c.WaitS, 1) + " s: evicts " +
			humanize.FtoaWithDigits(c.EvictS, 1) + " s of the residents' cache"
	}
	return uiVal{V: a.Waiting, T: t}
}

// uiWorkingSet renders a replica's working set against its KV capacity
// and the KV its engine reports in use: "31.2 k of 36.8 k (85%) · engine
// 12 k", with "full" while it takes no new conversation.
func uiWorkingSet(ws int64, capacity, engine *int64, full bool) uiVal {
	t := uiTokenCount(uint64(max(ws, 0))).T
	if capacity == nil {
		return uiVal{V: ws, T: t + " of unknown"}
	}
	t += " of " + uiTokenCount(uint64(*capacity)).T + " (" + uiPct(float64(ws)/float64(*capacity)).T + ")"
	if engine != nil {
		t += " · engine " + uiTokenCount(uint64(max(*engine, 0))).T
	}
	if full {
		t += " · full"
	}
	return uiVal{V: ws, T: t}
}

// uiChartPoints is how many points the chart draws for the hour.
const uiChartPoints = 360

// buildStatsView turns a chart's steps into tokens/s. The share is the
// model's hour share for all replicas (the figure of the models list), the
// share over the chart's steps for one replica.
// uiDelivered renders the delivered share of the predicted cached tokens,
// e.g. "97.5% (12 k of 12.3 k)"; "none yet" before a sticky turn was measured.
func uiDelivered(share *float64, delivered, predicted uint64) uiVal {
	if share == nil {
		return uiVal{V: nil, T: "none yet"}
	}
	return uiVal{V: *share, T: uiPct(*share).T + " (" +
		uiTokenCount(delivered).T + " of " + uiTokenCount(predicted).T + ")"}
}

// uiTTFT renders a replica's expected and measured time to first token
// for the running / waiting cell's tooltip: "time to first token of the
// recent turns: expected 0.42 s, measured 0.45 s"; "" before a turn had
// both.
func uiTTFT(expected, measured *float64) string {
	if expected == nil || measured == nil {
		return ""
	}
	return fmt.Sprintf("time to first token of the recent turns: expected %.2f s, measured %.2f s", *expected, *measured)
}

func buildStatsView(model, replica string, ch Chart) uiStatsView {
	points := min(len(ch.Cached), len(ch.Computed), len(ch.Generated))
	secs := ch.Step.Seconds()
	if secs <= 0 {
		secs = 1
	}
	v := uiStatsView{
		Model:     model,
		Replica:   replica,
		Replicas:  ch.Replicas,
		End:       ch.End.UTC(),
		StepS:     secs,
		Cached:    make([]float64, points),
		Computed:  make([]float64, points),
		Generated: make([]float64, points),
	}
	if v.Replicas == nil {
		v.Replicas = []string{}
	}
	var promptMax, genMax float64
	var tot TokenCount
	for i := range points {
		c, p, g := ch.Cached[i], ch.Computed[i], ch.Generated[i]
		tot.Cached += c
		tot.Computed += p
		tot.Generated += g
		v.Cached[i] = uiRound1(float64(c) / secs)
		v.Computed[i] = uiRound1(float64(p) / secs)
		v.Generated[i] = uiRound1(float64(g) / secs)
		promptMax = math.Max(promptMax, v.Cached[i]+v.Computed[i])
		genMax = math.Max(genMax, v.Generated[i])
	}
	share := ch.HourCachedShare
	if replica != "" {
		share = ch.CachedShare
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
	v.Delivered, v.DeliveredStepS = uiDeliveredSeries(ch.Predicted, ch.Delivered, secs)
	v.DeliveredShare = uiDeliveredHour(ch.Predicted, ch.Delivered, ch.DeliveredShare)
	return v
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

// uiStore renders the shared binding store's state, e.g. "redis
// 10.0.0.9:6379 · connected · 0 errors · 0 fallbacks". Without a store the
// card has no store line.
func uiStore(st *bindstore.Status) uiVal {
	state := "connected"
	if !st.Connected {
		state = "unreachable, routing with this instance's bindings"
	}
	return uiVal{V: st, T: fmt.Sprintf("%s %s · %s · %s errors · %s fallbacks", st.Type, st.Address, state,
		humanize.Comma(int64(st.Errors)), humanize.Comma(int64(st.Fallbacks)))}
}

// uiHit renders the windowed prefix hit rate: a percentage, "idle" when the
// engine looked nothing up in the window, unknown when it does not say.
func uiHit(r ReplicaRow) uiVal {
	if r.PrefixIdle {
		return uiVal{V: nil, T: "idle"}
	}
	return uiOptPct(r.PrefixHitRate)
}

// uiBindings renders a replica's bindings: "12 (3 recent)", and "12 (3
// recent, 2 paused)" while time-slicing holds some of them.
func uiBindings(r ReplicaRow) uiVal {
	t := humanize.Comma(int64(r.Bindings)) + " (" + humanize.Comma(int64(r.Active)) + " recent"
	if r.Paused > 0 {
		t += ", " + humanize.Comma(int64(r.Paused)) + " paused"
	}
	return uiVal{V: r.Bindings, T: t + ")", H: uiKeyedBy(r.KeyedBy)}
}

// uiKeyedBy is the Bindings cell's tooltip: the sources that keyed the
// requests routed here, with their counts ("" before any request). A
// column of its own would widen the table past a 1280 px window.
func uiKeyedBy(k KeySources) string {
	var parts []string
	for _, p := range []struct {
		n    uint64
		name string
	}{{k.Header, "header"}, {k.Body, "body"}, {k.Fingerprint, "fingerprint"}, {k.None, "none"}} {
		if p.n > 0 {
			parts = append(parts, strconv.FormatUint(p.n, 10)+" "+p.name)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "requests keyed by " + strings.Join(parts, " · ")
}
