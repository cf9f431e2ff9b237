package placement

import "time"

// Defaults applied to zero Config fields (withDefaults).
const (
	DefaultMaxNumSeqs   = 256
	DefaultIdleTTL      = time.Hour
	DefaultActiveWindow = 10 * time.Minute
	DefaultMaxBindings  = 100000

	// The passive failure signal (health.go).
	DefaultFailCooldown = 5 * time.Second

	// DefaultSpillMargin is how much sooner a moved turn must be expected
	// to get its first token than a staying one (spill.go). It pays for
	// what the estimate leaves out: the conversation's cache left behind
	// on its replica, and the next turn's risk.
	DefaultSpillMargin = time.Second

	// Working-set admission (see the package doc, "Admission"), chosen
	// from a sweep of the simulation: docs/admission.md in the repository
	// has the table.
	DefaultHighWater = 1.0
	// DefaultAdmitWindow is the active window: a conversation quiet for
	// longer is counted neither as active nor in its replica's working
	// set. At a minute, every shape of the simulation decided within the
	// seeds' spread of what it decides at 10.
	DefaultAdmitWindow = DefaultActiveWindow
	DefaultAdmitWait   = 5 * time.Minute
	DefaultAdmitQueue  = 1024
)

// Config holds a Router's policy settings. Zero fields take the defaults.
type Config struct {
	// AffinityOff turns conversation affinity off: every request goes to
	// the least-loaded replica. The zero value means affinity on.
	AffinityOff bool
	// MaxNumSeqs is the model's max_num_seqs per replica (default 256).
	MaxNumSeqs int
	// SpillThreshold is the running count above which a replica is over
	// the threshold. Zero or negative means auto: max(1, MaxNumSeqs/4).
	SpillThreshold int
	// IdleTTL is how long a binding lives without a turn (default 1h).
	IdleTTL time.Duration
	// ActiveWindow is how recently a conversation must have had a turn to
	// count as active on its replica (default 10m).
	ActiveWindow time.Duration
	// MaxBindings caps the number of bound conversations; the least
	// recently used is evicted beyond it (default 100000).
	MaxBindings int
	// SpillWaiting, when positive, also moves a conversation whose replica
	// has at least this many requests waiting in vLLM's queue (polled) to
	// the best replica with an empty queue that is not over the threshold.
	// vLLM queues requests it has no KV blocks for, so under KV pressure a
	// replica's running count stays far below the threshold while its
	// queue grows; this catches that case. Zero (the default) turns it off.
	SpillWaiting int
	// SpillMargin is how much sooner a turn over the threshold must be
	// expected to get its first token on another replica, its history
	// recomputed there, than on its own for it to move (see the package
	// doc, "Spill cost"; default DefaultSpillMargin).
	SpillMargin time.Duration
	// FailCooldown is how long a replica stays out after a request to it
	// failed (Decision.Failed); after it, one request is sent there and
	// the replica stays out for others until that one is answered (see
	// Decision.Failed). Default DefaultFailCooldown.
	FailCooldown time.Duration
	// AbandonAfter: a replica is out as for a proxy failure once a run of
	// turns it left without response headers until their clients gave up
	// spans two clients while other replicas answered (Decision.Abandoned),
	// and holds at least AbandonAfter turns. 0 (the default) asks for no
	// more turns than the two clients' (the fewest that are not one
	// client's impatience); -1 turns the rule off.
	AbandonAfter int

	// Working-set admission (see the package doc, "Admission"); on unless
	// AdmissionOff, in force while every replica's KV capacity is known.
	AdmissionOff bool
	// KVTokens, when positive, is every replica's KV capacity in tokens,
	// overriding Load.KVTokens.
	KVTokens int
	// HighWater is the share of a replica's KV capacity its working set
	// may fill with new conversations (default DefaultHighWater).
	HighWater float64
	// AdmitWindow is the longest a conversation counts in its replica's
	// working set after its last turn ended (default DefaultAdmitWindow).
	AdmitWindow time.Duration
	// AdmitWait is how long a new conversation waits for room before it
	// is admitted on the best replica anyway (default DefaultAdmitWait).
	AdmitWait time.Duration
	// AdmitQueue is the most conversations that may wait; beyond it Admit
	// refuses new ones with ErrQueueFull (default DefaultAdmitQueue).
	AdmitQueue int
	// RotateTurns, when positive, is a quantum for turn-boundary
	// time-slicing: while a paused conversation waits first in the queue,
	// one that has run this many turns since it was admitted is paused at
	// the end of its turn for it. 0 (the default): no quantum, a
	// conversation is paused only when its replica's conversations outgrow
	// the KV cache; negative: time-slicing off, nothing is paused.
	RotateTurns int
}

func (c Config) withDefaults() Config {
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.SpillThreshold < 0 {
		c.SpillThreshold = 0
	}
	if c.SpillMargin <= 0 {
		c.SpillMargin = DefaultSpillMargin
	}
	if c.IdleTTL <= 0 {
		c.IdleTTL = DefaultIdleTTL
	}
	if c.ActiveWindow <= 0 {
		c.ActiveWindow = DefaultActiveWindow
	}
	if c.MaxBindings <= 0 {
		c.MaxBindings = DefaultMaxBindings
	}
	if c.SpillWaiting < 0 {
		c.SpillWaiting = 0
	}
	if c.FailCooldown <= 0 {
		c.FailCooldown = DefaultFailCooldown
	}
	if c.KVTokens < 0 {
		c.KVTokens = 0
	}
	if c.HighWater <= 0 {
		c.HighWater = DefaultHighWater
	}
	if c.AdmitWindow <= 0 {
		c.AdmitWindow = DefaultAdmitWindow
	}
	if c.AdmitWait <= 0 {
		c.AdmitWait = DefaultAdmitWait
	}
	if c.AdmitQueue <= 0 {
		c.AdmitQueue = DefaultAdmitQueue
	}
	return c
}

func (c Config) threshold() int {
	if c.SpillThreshold > 0 {
		return c.SpillThreshold
	}
	return max(1, c.MaxNumSeqs/4)
}
