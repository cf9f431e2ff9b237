// Package placement decides which replica of a model serves each turn of a
// conversation. It is pure (no I/O, no HTTP) and safe for concurrent use: one
// Router per model.
//
// # Inputs
//
// The Router knows a set of replicas (SetReplicas, SetAvailable), the polled
// load of each (UpdateLoad: running, waiting, KV usage) and, fresher than any
// poll, the requests it routed itself that are still in flight: every
// successful Route holds one in-flight slot on the chosen replica until its
// Decision is released.
//
// Throughout, the running count of a replica is
//
//	running = max(in-flight through this router, polled running − finished)
//
// where finished counts this router's requests that were in flight at the
// replica's last poll and have ended since: the poll counted them, and they
// are gone (without it, a replica whose only turn just ended looks busy
// until the next poll, and a new conversation doubles up elsewhere). Polled
// numbers are used only while Load.Reachable is true. A replica is
// over the spill threshold when running > SpillThreshold, measured before the
// request being routed is counted. With the default threshold (auto =
// max(1, MaxNumSeqs/4)) a replica at exactly the threshold still takes sticky
// turns; one more and its conversations may spill.
//
// A replica is available when added. It is out of placement while any Cause
// holds: SetAvailable(false) (CauseAdmin), SetPollDown (CausePoll: its polls
// fail), SetHealthDown (CauseHealth: the proxy's health checks), or a
// cool-down after Decision.Failed (CauseProxy: a request to it failed;
// Config.FailCooldown, then until a request sent there is answered).
// Going out for a poll failure or a health check marks its bindings: their
// next turn is re-placed (ReasonReplaced) even if the replica is back by
// then, so it regains conversations by load. When no
// replica is left but some are out only for CausePoll or CauseProxy, those
// are used (a setup whose polls can never succeed keeps serving), and a
// bound conversation's turn goes to its own replica, where its cache is.
// Load.Reachable only decides whether the polled numbers are trusted. A
// replica named in Request.Exclude is treated as unavailable for that request.
//
// # Rules
//
// Route applies, in order:
//
//  1. Client pin: Request.Pin names a known, available, not excluded replica →
//     that replica, ReasonClientPinned. With affinity on and a key, the
//     conversation is (re)bound there, so the next turn follows the cache the
//     pinned turn leaves. A pin to an unknown or unavailable replica is ignored.
//
//  2. Affinity off → ReasonAffinityOff; no key → ReasonNoKey. Both pick per
//     request, like vLLM's own balancer: the least
//
//     waiting×4 + running
//
//     (waiting is the polled queue), ties broken by fewer in-flight, then
//     round-robin. Nothing is bound; existing bindings are kept for when
//     affinity comes back on.
//
//     Before rules 3–5, the binding itself is checked. A Request.Start
//     (the conversation's start fingerprint) that differs from the one the
//     binding recorded is a side request at first (a session title, a
//     summary, a probe, a call to another model under the same key):
//     ReasonSide, routed to the conversation's replica while it is usable
//     and not over the threshold, else to the least loaded (as rule 2),
//     without moving, refreshing or re-binding the conversation and not
//     counted as keyed. The binding remembers the last two such starts of
//     requests that are not Request.Lone (a single message: a title
//     request, a classifier's call, however often retried); one
//     that arrives again before a request with the conversation's own start
//     (which forgets them) means the conversation was compacted or cleared
//     and goes on with it: ReasonRestarted, kept on its replica while that
//     one is usable (a key is not a credential: another client's start
//     under it must not move the conversation), the replaced start
//     remembered so that a request that brings it back, with history,
//     gives it back and is routed as the conversation's turn; only a
//     conversation whose replica is not usable, marked for a move or cold
//     is re-bound to the replica its earlier request with that start went
//     to when that one is usable and not over the threshold, else placed
//     by score (not counted as keyed).
//     A binding whose own start never came a second time was placed by a
//     side request that came first (Claude Code sends a session's title
//     request before its first turn): the recurring start replaces it on
//     the same replica as a sticky turn, with no restart.
//     A binding with no start recorded learns it; Start 0 checks nothing. A binding marked cold (ColdReplica: the replica
//     restarted since the conversation's last turn) whose replica is usable
//     is placed by score and re-bound, ReasonColdReplaced. A turn that
//     found its cache gone (Feedback) marks nothing: it computed its prompt
//     on its replica, which holds it again.
//
//  3. Key bound to an available replica that is not over the threshold →
//     ReasonSticky.
//
//  4. Key bound to a replica over the threshold → the target is the
//     other replica not over the threshold where the move costs least
//     (see "Spill cost"; the best placement score among equals), or, when
//     every other one is over it, the cheapest of those. If moving pays (see
//     "Spill cost"), the conversation is re-bound there, ReasonSpilled
//     (counted as spill-accepted at the target). Otherwise, or with no
//     target at all, the turn stays: ReasonSpillDeclined when the target
//     was not over the threshold, else ReasonStayedOverloaded. Being over
//     the threshold is necessary for a move, not sufficient.
//
//     With Config.SpillWaiting = k > 0, a replica whose polled waiting
//     queue holds at least k requests also loses its conversations, but
//     only to the best replica with an empty queue that is not over the
//     threshold, and only when moving pays (ReasonSpilled); otherwise the
//     turn is sticky. It is off by default; see "Overload" below.
//
//  5. Key bound to a replica that was removed, is unavailable, out or
//     excluded, or whose binding was marked when its replica went out →
//     placed anew and re-bound, ReasonReplaced.
//
//  6. New key (never seen, expired or evicted) → ReasonPlaced. When
//     Request.Parent is bound to an available replica that is not over the
//     threshold, the new conversation goes there (a sub-agent shares its
//     parent's system prompt and tools); otherwise it is placed by score.
//
// # Placement score
//
// Rules 4, 5 and 6 choose among candidate replicas by comparing, in order
// (under admission a new conversation first by what its coming in costs,
// in seconds: see "Admission"):
//
//  1. not over the threshold before over it;
//  2. fewer running (as defined above);
//  3. fewer active conversations held (bindings used within ActiveWindow);
//  4. lower KV cache usage (polled, 0–1);
//  5. exact ties: round-robin — the scan starts one replica further on each
//     decision, and the first of equals wins, so a burst of new conversations
//     on an idle model spreads evenly.
//
// Each placement scans all replicas once: linear in their number.
//
// # Unknown figures
//
// An engine may not export every figure (Load.WaitingUnknown,
// Load.KVUnknown). An unknown figure is no information, not a 0, so it can
// never make a replica look emptier than it is:
//
//   - KV usage decides criterion 4 only between two replicas whose KV usage
//     is known; otherwise the tie goes to rule 5 (round-robin).
//   - The per-request pick compares waiting×4 + running only when both
//     queues are known, and running alone otherwise.
//   - With SpillWaiting, an unknown queue neither makes a replica spill its
//     conversations nor qualifies it as a replica with an empty queue.
//   - An unknown running count is left at 0 by the caller: running is then
//     the router's own in-flight count, which it measures itself.
//
// # Spill cost
//
// A move costs the conversation its cache: the target recomputes its whole
// history, and its next turn finds the cache only there. So a turn moves
// only when it is expected to get its first token sooner on the target, in
// seconds:
//
//	stay = wait(bound)
//	move = wait(target) + recomputed / rate(target)
//	       + turn time(target)    when free KV (1 − KV usage) × capacity < recomputed
//	       + evicted / rate(target)
//	move when stay > move + Config.SpillMargin (default 1 s)
//
// wait(p) is the turn's wait for a place in p's batch, then for the long
// prefills ahead of it: no place is waited for while p runs fewer than
// MaxNumSeqs (with requests waiting in the engine, fewer than it runs now:
// its KV allows no more); beyond that, one turn time per batch of turns
// ahead ((load + 1 − batch) × turn time ÷ batch, load = max(in flight,
// polled running + waiting)). The long prefills are the new conversations
// and moved histories routed to p, drained at its rate since; a turn that
// ends there (answered, refused or failed) leaves only what was routed
// there after it, as the engine prefills in arrival order. recomputed is
// the conversation's prompt as the engine counted it on its last turn
// (Feedback; else Request.Tokens) less what a new conversation finds cached
// on the target (the system prompt). A target without room for it in its
// KV cache makes the moved turn wait for blocks to free: a turn time.
// evicted is the recompute the move forces on the conversations resident
// on the target: the tokens by which their working set (admission's
// figure: those in flight and those expected back within their resident
// time) and the moved history exceed the target's high-water mark; they
// return and compute again what was pushed out. A free KV share or
// capacity that is unknown adds nothing, nor does a working set while
// admission is not in force.
//
// rate(p) is p's prefill rate, learned from finished turns (Turn.FirstToken:
// computed tokens ÷ time to first token). A queue or the engine's step
// overhead only makes a turn look slower, so a faster turn sets the rate and
// a slower one pulls it a tenth of the way (meanWeight) times the share of
// its time that its prefill at the present rate explains: a turn that
// computed a few tokens teaches next to nothing. Before
// any turn taught it, DefaultPrefillRate (2,000 tokens/s) applies, which
// makes moves look costlier, never cheaper. The turn time is the mean place
// a finished turn held in its replica's batch: its decode (Turn.Duration −
// Turn.FirstToken) and its computed tokens at that rate, not the queue
// before it, which the turns ahead already count (DefaultTurnTime, 10 s,
// before one finished). The margin is the one hysteresis: it keeps noise
// in the polled queues from moving conversations between replicas that
// queue about as deep (a factor of 1.5 on the target's estimate besides
// it, as SGLang's gateway compares loads, moved no shape beyond the seeds'
// spread, and is gone). The same estimate decides spills under admission
// (where the target must also fit the conversation) and with SpillWaiting.
//
// Every decision carries the same estimate for the replica it chose
// (Decision.Expect): the wait there, then the prefill of what the turn is
// expected to find uncached (beyond its conversation's last prompt where
// it stays, else beyond the replica's system prompt). The Caddy module
// answers with it (X-LM-Warden-Expect), warden-bench measures it against
// the time to first token the turn met, and ReplicaSnapshot.ExpectedTTFT
// and MeasuredTTFT keep both for the card. Decision.Stay and Decision.Move
// carry the two estimates for every turn over the threshold that had a
// target; Snapshot.RecentSpills keeps the last eight such decisions and
// ReplicaSnapshot.SpillDeclined counts those that stayed.
//
// # Overload
//
// When the conversations in flight hold more context than the replicas' KV
// caches, vLLM runs only the requests it has KV blocks for, far fewer than
// the default threshold, and queues the rest: the running count never
// crosses the threshold, no spill happens and every replica is equally
// full, whatever the policy. SpillWaiting reacts to the queue instead; it
// is off by default. docs/overload.md in the repository has the measured
// figures and the commands that regenerate them.
//
// # Admission
//
// Working-set admission keeps the conversations placed on a replica within
// its KV cache, so that their prefixes survive between turns. It is on
// unless Config.AdmissionOff (and needs affinity), and in force while every
// replica polled so far exported its KV capacity (Load.KVTokens, from
// vllm:cache_config_info) or Config.KVTokens gives it; otherwise it stays
// out of the way and AdmissionSnapshot.Why says why.
//
// A replica's working set is the context its resident conversations hold:
// those with a turn in flight there, and those whose last turn ended
// recently — within twice their longest pause between turns, or, before
// they paused, twice what conversations pause (the 90th percentile of
// recent pauses); at most AdmitWindow, and AdmitWindow before any pause
// was seen.
// Each counts with its own part (its context as the engine counted it on
// its last turn, prompt + completion, minus what new conversations find
// cached on the replica: the system prompt, held once), but at least what
// conversations grow to: the 90th percentile of the last 128 turns' own
// parts. A new conversation counts with Request.Tokens (estimated from the
// request) until the engine reports its first turn.
//
// Rule 6 then places a new conversation only on a replica where it fits:
// the replica holds nothing yet, it sits idle (nothing in flight through
// the Router, nothing waiting in the engine, the engine's KV gauge under
// HighWater, and a turn in flight at fewer than 80 % of the recent polls:
// the engine is the ground truth, the working set a prediction), or its
// KV holds what its conversations need at the same time, now and on
// average, within HighWater × capacity. Now: the new conversation's first
// request beside the turns in flight there at their present sizes (it runs
// beside them; where they do not fit together the engine preempts one). On
// average: each resident conversation and the new one counted at its size
// times the share of the time it has a turn in flight, turn/(turn +
// pause), with the replica's mean turn time and the conversation's longest
// pause (the 90th percentile of recent pauses before it paused), plus one
// standard deviation of that sum (conversations in flight independently),
// at most all of them whole. Without pauses every share is 1 and this is the working set
// plus the conversation under the mark; with long pauses a new
// conversation runs beside paused ones now, at the price of re-prefills
// where their caches are evicted, instead of losing its compute time
// waiting. Queueing in an overloaded engine lengthens the turns and so
// raises every share.
//
// In seconds: each replica is a candidate whose cost is what the new
// conversation's coming in costs the conversations resident there — 0
// where it fits as above; where only the deviation overflows (the mean
// fits), the recompute of what the overflow pushes out of their caches,
// at the replica's rate, once per turn and pause, for as long as
// conversations run (the 90th percentile of their ages at their turns'
// ends), provided the engine queues nothing and the conversations at
// their present sizes fit beside its first request; unbounded where the
// mean overflows (the KV runs short every cycle), the engine queues, or
// the turns in flight leave its first request no room. Waiting is the
// other candidate: its cost is the new conversation's further wait,
// estimated by its wait so far (0 for a request that just came). It comes
// in on the cheapest replica (the best by score among equals) when that
// costs no more than waiting; Decision.Wait and Decision.Evict then carry
// both figures where the cost was not 0 (AdmissionSnapshot.Recent keeps
// the last eight). ReplicaSnapshot.Full shows the
// working set at the mark, until it falls below (HighWater −
// AdmitHysteresis) × capacity.
// Where it fits nowhere, Admit returns a Ticket: the request waits, in
// arrival order (a later new conversation never overtakes an earlier one;
// it may overtake a paused conversation's turn that fits nowhere, see
// timeslice.go), until room
// appears — a turn ends or a conversation goes quiet (AdmitWaiting, called
// periodically, notices that), a binding is dropped, a replica joins — or
// until it has waited AdmitWait, when it is placed on the best replica
// anyway. Beyond AdmitQueue waiting, Admit refuses new conversations with
// ErrQueueFull. Route never queues: it places a conversation that fits
// nowhere on the best replica at once. Turns of bound conversations wait
// only when their conversation was paused (below); sub-agents
// (Request.Parent bound) never wait; spills go only to replicas where the
// conversation fits, and re-placements prefer them. A conversation that
// fits no replica even empty (over every replica's mark) would wait for
// ever: it comes in at once where it costs least, the recompute of all the
// KV in use there (AdmissionSnapshot.Oversized).
//
// Time-slicing (timeslice.go). Conversations that never end never make
// room, and they grow: admission alone lets them outgrow the caches. At
// the end of a turn, a conversation that has run two turns since it was
// admitted (it paid a prefill to come in) is paused when its replica's
// conversations need more KV at once than it holds, by their actual sizes
// (the demand above, each at its context now, not what conversations grow
// to), or when the engine queues requests while other conversations stay
// there, and only when staying costs at least what pausing does, in
// seconds: staying costs the resident conversations the recompute of the
// overflow, as for a newcomer's coming in, and the engine's queue its
// wait (a turn time per request held for KV, at every turn and pause,
// while conversations run); pausing costs the conversation
// its context computed again (its wait to resume is the others' gain).
// There is no quantum by default: a conversation that fits runs
// on, whoever waits (Config.RotateTurns sets one). A paused conversation
// leaves its replica's working set; its next turn waits in the same
// queue, in the same order, as a new conversation's first request, and
// resumes on its
// replica when it fits there under the low mark (HighWater −
// AdmitHysteresis; some of its cache may be left), else on the replica
// with the most room, or at AdmitWait anyway, so no conversation waits
// longer than that. When nothing is over and nothing waits, nothing is
// paused.
//
// The working set is tracked whether admission is on or off (turns held,
// pauses learnt), so it means the same in both and SetAdmission(true)
// starts from it. ReplicaSnapshot has it beside the engine's figures
// (EngineKV, Hits, Busy), and AdmissionSnapshot.Overcommitted needs an
// engine to confirm the pressure (Strained: requests waiting, or returning
// turns finding less than HitsLow of their cache, over at least eight).
//
// # Bindings
//
// A binding maps a conversation key to a replica. It expires after IdleTTL
// without a turn (checked when the key is looked up, a few of the oldest on
// every Route, and all of them by Sweep), and the least recently used binding
// is evicted when MaxBindings is reached. Keys are stored as 64-bit hashes
// (hash/maphash with a per-Router seed) in a compact, pointer-free entry of
// 40 bytes plus its map slot — about 81 bytes per binding measured at a
// million bindings, so the default cap of 100,000 costs about 8 MB. Two
// distinct keys share a binding only on a 64-bit collision, about 3·10⁻⁸ for
// a million live keys — harmless, since it only misplaces a cache. The
// Router's notion of "now" for Bound and Snapshot is the latest time passed to
// Route or Sweep.
//
// # Releasing
//
// A Decision is a small value. Release gives its in-flight slot back exactly
// once, even when called on several copies or concurrently: the Router keeps
// a table of slots, each holding the replica and a 64-bit token; Route stores
// a fresh token in a free slot and the Decision carries the slot pointer and
// the token; Release succeeds only for the copy that swaps the token out
// (atomic compare-and-swap), so later calls — and calls on copies after the
// slot was reused for another decision — see a different token and do
// nothing. Slots are recycled, so routing does not allocate in steady state.
//
// # Counters
//
// Per replica, since the Router was created (Reconfigure keeps them): Sticky
// (turns that stayed with their conversation's replica, including those that
// stayed over the threshold), StayedOverloaded (the subset that stayed only
// because every other replica was over the threshold too), Placed (new
// conversations), SpillAccepted (conversations moved here from a replica over
// the threshold), SpillDeclined (turns that stayed over the threshold
// because moving did not pay; counted in Sticky too), ClientPinned,
// Replaced (conversations moved here because their replica went away),
// Restarted and ColdReplaced (conversations placed here by those rules),
// Side (side requests routed here), ColdMarked (bindings here found cold), Ended
// (bindings dropped by End), MeasuredTurns, PredictedTokens and
// DeliveredTokens (the sticky turns Feedback checked: cached tokens
// predicted, and delivered capped at the prediction), AffinityOff and NoKey (per-request picks),
// InFlight (held now), Bindings (conversations bound here) and Active (of
// those, used within ActiveWindow). For the model: Requests (all routed),
// KeyedRequests (requests with affinity on whose key had a live binding and
// that carried no honoured pin), StickyRequests (of those, the ones that
// stayed), StickyShare = StickyRequests / KeyedRequests, InFlight, Bindings,
// Expired (bindings that aged out) and Evicted (bindings dropped at
// MaxBindings). Decision.Previous names the replica a conversation moved
// away from, for logging.
package placement
