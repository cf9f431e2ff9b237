package caddymodule

import (
	"math"
	"sync"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// The Retry-After of a refusal (the admission queue full) is how long the
// refused client can expect to wait for room: what the conversations
// admitted from the queue lately waited, or at least as long as the one
// waiting longest now has; with neither known, the time a turn takes on
// these replicas (room appears when one ends). It is at least
// minRetryAfter and at most admit_wait (by then a waiting conversation is
// let in) and maxRetryAfter.
//
// A refusal that named admit_wait or 60 s sent clients away for a minute
// while the queue cleared in seconds: a client retries only once its
// Retry-After has passed.

const (
	// minRetryAfter is the shortest Retry-After, in seconds: a refusal
	// comes only with the queue full, and a retry sooner than this mostly
	// meets it full again.
	minRetryAfter = 3
	// recentWaits is how many of the latest admissions from the queue the
	// estimate reads, and waitHorizon how old they may be.
	recentWaits = 16
	waitHorizon = 2 * time.Minute
)

// queueClock keeps what the estimate reads: when each of the latest
// admissions from the queue happened and how long it waited, and when
// each conversation waiting now started to.
type queueClock struct {
	mu      sync.Mutex
	at      [recentWaits]time.Time
	waited  [recentWaits]time.Duration
	n, next int
	seq     uint64
	waiting map[uint64]time.Time
}

// enter records a conversation starting to wait at start; leave (with
// the id enter returned) records it leaving, admitted (after waited) or
// not.
func (q *queueClock) enter(start time.Time) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.waiting == nil {
		q.waiting = make(map[uint64]time.Time)
	}
	q.seq++
	q.waiting[q.seq] = start
	return q.seq
}

func (q *queueClock) leave(id uint64, admitted bool, now time.Time, waited time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.waiting, id)
	if !admitted {
		return
	}
	q.at[q.next], q.waited[q.next] = now, waited
	q.next = (q.next + 1) % recentWaits
	q.n = min(q.n+1, recentWaits)
}

// expect returns the wait a conversation refused at now can expect: the
// mean wait of the admissions within waitHorizon, but no less than the
// oldest waiting conversation has waited so far; ok is false when
// neither is known.
func (q *queueClock) expect(now time.Time) (d time.Duration, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var sum time.Duration
	k := 0
	for i := 0; i < q.n; i++ {
		if now.Sub(q.at[i]) <= waitHorizon {
			sum += q.waited[i]
			k++
		}
	}
	if k > 0 {
		d, ok = sum/time.Duration(k), true
	}
	for _, start := range q.waiting {
		if w := now.Sub(start); w > d && k > 0 {
			d = w
		}
	}
	return d, ok
}

// retryAfter is the Retry-After, in seconds, of a request refused at now
// (see the top of this file).
func (m *modelState) retryAfter(a placement.AdmissionSnapshot, now time.Time) int {
	est, ok := m.queue.expect(now)
	if !ok {
		est = m.turnTime()
		m.queue.mu.Lock()
		for _, start := range m.queue.waiting {
			est = max(est, now.Sub(start))
		}
		m.queue.mu.Unlock()
	}
	return retrySeconds(est, a.Wait)
}

// retrySeconds bounds an expected wait to a Retry-After: whole seconds,
// rounded up, at least minRetryAfter, at most admitWait (when set) and
// maxRetryAfter.
func retrySeconds(est, admitWait time.Duration) int {
	secs := int(math.Ceil(est.Seconds()))
	if admitWait > 0 {
		secs = min(secs, int(math.Ceil(admitWait.Seconds())))
	}
	return min(maxRetryAfter, max(minRetryAfter, secs))
}

// turnTime is the mean time a turn takes on the model's replicas as the
// router learned it, or placement.DefaultTurnTime before any was.
func (m *modelState) turnTime() time.Duration {
	var sum time.Duration
	n := 0
	for _, r := range m.router.Snapshot().Replicas {
		if r.TurnTime > 0 {
			sum += r.TurnTime
			n++
		}
	}
	if n == 0 {
		return placement.DefaultTurnTime
	}
	return sum / time.Duration(n)
}
