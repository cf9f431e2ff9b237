package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// SimDetail is what happened inside the engines during one simulated
// stage's measured window: the numbers behind a stage's TTFB, for finding
// out whether turns wait in a queue, get preempted or recompute their
// prefix.
type SimDetail struct {
	Mode     string
	Sessions int
	Replicas []SimReplicaDetail
	// Turns that got their first token in the window, and of those:
	Turns int
	// QueueS is the mean engine time from arrival to first schedule;
	// PrefillS from first schedule to the first token (prefill, including
	// time lost to preemption).
	QueueS, PrefillS float64
	// PromptTokens and CachedTokens are means per turn.
	PromptTokens, CachedTokens float64
	// Preempted is the share of turns preempted at least once.
	Preempted float64
	// Restarted and ColdReplaced count the turns LM Warden placed anew by
	// load because their conversation's start changed (compaction) or its
	// replica's cache was found gone (placement.ReasonRestarted,
	// ReasonColdReplaced).
	Restarted, ColdReplaced int
}

// SimReplicaDetail is one replica's averages over the window, sampled at
// every poll.
type SimReplicaDetail struct {
	ID                   string
	Running, Waiting, KV float64 // means over the polls
	Preemptions          uint64  // during the window
	Turns                int     // turns started here in the window
	BusyShare            float64 // engine time in steps / window length
}

type simDetailAcc struct {
	d       SimDetail
	polls   int
	pre0    []uint64
	busy0   []time.Duration
	started bool
	queue   float64
	prefill float64
	prompt  float64
	cached  float64
	preN    int
}

// WriteSimDetail prints a stage's detail as a few aligned lines.
func WriteSimDetail(w io.Writer, d SimDetail) error {
	_, err := fmt.Fprintf(w, "%-4s %2d sessions: %d turns, queue %.2fs, prefill %.2fs, prompt %.0f cached %.0f (%.0f%%), preempted %.0f%%\n",
		d.Mode, d.Sessions, d.Turns, d.QueueS, d.PrefillS, d.PromptTokens, d.CachedTokens, 100*safeDiv(d.CachedTokens, d.PromptTokens), 100*d.Preempted)
	if err != nil {
		return err
	}
	if d.Restarted > 0 || d.ColdReplaced > 0 {
		if _, err := fmt.Fprintf(w, "    placed anew: %d restarted conversations, %d cold bindings\n", d.Restarted, d.ColdReplaced); err != nil {
			return err
		}
	}
	for _, r := range d.Replicas {
		if _, err := fmt.Fprintf(w, "    %-10s running %5.2f waiting %5.2f KV %5.1f%% busy %5.1f%% preemptions %4d turns %3d\n",
			r.ID, r.Running, r.Waiting, 100*r.KV, 100*r.BusyShare, r.Preemptions, r.Turns); err != nil {
			return err
		}
	}
	return nil
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func (s *simulator) detailStart(mode string, n int) {
	if s.cfg.Detail == nil {
		return
	}
	a := &simDetailAcc{d: SimDetail{Mode: mode, Sessions: n}}
	for _, e := range s.engines {
		a.d.Replicas = append(a.d.Replicas, SimReplicaDetail{ID: e.id})
	}
	s.detail = a
}

// detailPoll samples the engines at a poll inside the window.
func (s *simulator) detailPoll() {
	w := s.win
	a := s.detail
	if a == nil || s.now < w.From || s.now > w.To {
		return
	}
	if !a.started {
		a.started = true
		for _, e := range s.engines {
			st := e.e.Stats()
			a.pre0 = append(a.pre0, st.Preemptions)
			a.busy0 = append(a.busy0, st.Busy)
		}
	}
	a.polls++
	for i, e := range s.engines {
		r := &a.d.Replicas[i]
		r.Running += float64(e.e.Running())
		r.Waiting += float64(e.e.Waiting())
		r.KV += e.e.KVUsage()
	}
}

// detailTurn adds a turn whose first token came inside the window.
func (s *simulator) detailTurn(t *simTurn) {
	w := s.win
	a := s.detail
	if a == nil || !w.contains(t.rec.FirstToken) {
		return
	}
	r := t.req
	a.d.Turns++
	a.queue += (r.Scheduled - r.Arrival).Seconds()
	a.prefill += (r.FirstToken - r.Scheduled).Seconds()
	a.prompt += float64(len(r.Prompt))
	a.cached += float64(max(r.CachedTokens, 0))
	if r.Preemptions > 0 {
		a.preN++
	}
	a.d.Replicas[t.rep].Turns++
	switch t.dec.Reason {
	case placement.ReasonRestarted:
		a.d.Restarted++
	case placement.ReasonColdReplaced:
		a.d.ColdReplaced++
	}
}

func (s *simulator) detailEnd() {
	w := s.win
	a := s.detail
	if a == nil {
		return
	}
	s.detail = nil
	if a.polls > 0 {
		for i, e := range s.engines {
			r := &a.d.Replicas[i]
			p := float64(a.polls)
			r.Running, r.Waiting, r.KV = r.Running/p, r.Waiting/p, r.KV/p
			st := e.e.Stats()
			// A replica restarted inside the window counts from zero
			// again: only what it did since the restart is known.
			pre, busy := a.pre0[i], a.busy0[i]
			if st.Preemptions < pre || st.Busy < busy {
				pre, busy = 0, 0
			}
			r.Preemptions = st.Preemptions - pre
			// A step that straddles the window's edge counts whole, which
			// can push a saturated engine a hair past 100 %.
			r.BusyShare = min((st.Busy-busy).Seconds()/w.Seconds(), 1)
		}
	}
	if n := float64(a.d.Turns); n > 0 {
		a.d.QueueS, a.d.PrefillS = a.queue/n, a.prefill/n
		a.d.PromptTokens, a.d.CachedTokens = a.prompt/n, a.cached/n
		a.d.Preempted = float64(a.preN) / n
	}
	s.cfg.Detail(a.d)
}
