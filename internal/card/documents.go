package card

import (
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// The admin API's documents: what GET /lm-warden/models, …/{model} and
// …/{model}/stats answer (caddymodule builds them from the running models
// and names them too), and what the page renders.

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
	Store *bindstore.Status `json:"store,omitempty"`
	// RecentSpills are the last turns whose replica was over the spill
	// threshold and that another replica could take, oldest first, with
	// the estimates that moved them or kept them.
	RecentSpills []SpillRow `json:"recent_spills"`
}

// SpillRow is one spill decision on the card: the turn's expected time to
// first token on its replica (stay) and the move's cost: its time to first
// token on the target, its history of context_tokens recomputed there,
// plus the recompute it forces on the target's resident conversations
// (evict_s, part of move_s); moved says which won.
type SpillRow struct {
	At            time.Time `json:"at"`
	From          string    `json:"from"`
	To            string    `json:"to"`
	StayS         float64   `json:"stay_s"`
	MoveS         float64   `json:"move_s"`
	EvictS        float64   `json:"evict_s"`
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
	// Time-slicing: the quantum in turns (0 none, -1 time-slicing off), the
	// conversations paused now, and since the router started the pauses and
	// the turns of paused conversations that waited to resume.
	RotateTurns int    `json:"rotate_turns"`
	Paused      int    `json:"paused"`
	PausedTotal uint64 `json:"paused_total"`
	QueuedTurns uint64 `json:"queued_turns"`
	// How long the turns of paused conversations waited to resume, p50 and
	// p95 of the last 128; null before any.
	PausedWaitP50S *float64 `json:"paused_wait_p50_s"`
	PausedWaitP95S *float64 `json:"paused_wait_p95_s"`
	// Recent are the last new conversations let in once their wait
	// outgrew the recompute their coming in forces on the resident
	// conversations (the two compared, in seconds), oldest first.
	Recent []AdmitRow `json:"recent"`
}

// AdmitRow is one admission the comparison of waiting with coming in
// decided: the conversation had waited wait_s on the replica to, where
// its coming in costs the resident conversations evict_s of recompute.
type AdmitRow struct {
	At     time.Time `json:"at"`
	To     string    `json:"to"`
	WaitS  float64   `json:"wait_s"`
	EvictS float64   `json:"evict_s"`
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
	// ExpectedTTFTS and MeasuredTTFTS are the recent means of the turns'
	// expected time to first token here (X-LM-Warden-Expect) and of the
	// time they met from routing, in seconds; null before a turn had
	// both.
	ExpectedTTFTS *float64 `json:"expected_ttft_s"`
	MeasuredTTFTS *float64 `json:"measured_ttft_s"`
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
	// KeyedBy counts the requests routed here by where their conversation
	// key came from.
	KeyedBy KeySources `json:"keyed_by"`
}

// KeySources counts requests by where their conversation key came from: a
// session header, the body (metadata or prompt_cache_key), a fingerprint
// of the conversation's start, or none (a per-request pick).
type KeySources struct {
	Header      uint64 `json:"header"`
	Body        uint64 `json:"body"`
	Fingerprint uint64 `json:"fingerprint"`
	None        uint64 `json:"none"`
}

// TokenCount is prompt tokens split by where they came from, and generated
// tokens, as the replicas reported them.
type TokenCount struct {
	Cached    uint64 `json:"cached"`
	Computed  uint64 `json:"computed"`
	Generated uint64 `json:"generated"`
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
