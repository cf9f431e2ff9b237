package caddymodule

// Admission on the Caddy side: a held request waits for its ticket in the
// handler, a refused one gets 429 with a Retry-After, and the operator is told when
// the active conversations outgrow the caches. The router decides
// (placement); the metrics are in metrics.go.

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// heldTurn is a request that admission holds: the ticket the router gave
// the policy, kept in the request's routeState. The policy never waits on
// it: while the ticket waits it chooses no upstream, and the handler holds
// the request (wait) and then runs the proxy again, whose policy takes the
// decision the router made (settle) and maps it to its upstream. Nothing
// is left behind: a ticket whose client left is cancelled, and a decision
// nobody used gives its slot back (drop).
type heldTurn struct {
	m     *modelState
	tk    *placement.Ticket
	req   placement.Request // as routed, for admitted
	start time.Time
	qid   uint64        // in m.queue
	state atomic.Uint32 // heldWaiting, heldSettled or heldCancelled
	// what settle took; read and written in the request's goroutine only
	dec    placement.Decision
	err    error
	waited time.Duration
	used   bool // the policy routed to dec, or released it
}

const (
	heldWaiting uint32 = iota
	heldSettled
	heldCancelled
)

// hold starts holding a request the router gave tk for.
func (m *modelState) hold(tk *placement.Ticket, req placement.Request, now time.Time) *heldTurn {
	return &heldTurn{m: m, tk: tk, req: req, start: now, qid: m.queue.enter(now)}
}

// ready reports, without waiting, whether the router has decided on the
// ticket; one past its deadline (admit_wait) is placed at once.
func (ht *heldTurn) ready(now time.Time) bool {
	if ht.state.Load() != heldWaiting {
		return true
	}
	select {
	case <-ht.tk.Ready():
		return true
	default:
	}
	if now.Before(ht.tk.Deadline()) {
		return false
	}
	ht.tk.Force(now)
	<-ht.tk.Ready() // closed by Force
	return true
}

// wait holds the request until the router admits its ticket, the ticket's
// deadline (admit_wait) passes and it is placed anyway, or its client goes
// away (the ticket is then cancelled and ctx's error returned); then it
// settles the ticket.
func (ht *heldTurn) wait(ctx context.Context) error {
	if ctx.Err() != nil {
		ht.cancel(time.Now())
		return ctx.Err()
	}
	if ht.state.Load() == heldWaiting {
		timer := time.NewTimer(time.Until(ht.tk.Deadline()))
		defer timer.Stop()
		select {
		case <-ht.tk.Ready():
		case <-timer.C:
			ht.tk.Force(time.Now())
			<-ht.tk.Ready()
		case <-ctx.Done():
			ht.cancel(time.Now())
			return ctx.Err()
		}
	}
	_, err := ht.settle(time.Now())
	return err
}

// settle takes the router's decision on a ready ticket, once: the wait
// leaves the queue display and goes into the wait histograms, and with a
// shared store the conversation placed is claimed there. Later calls
// return what the first returned.
func (ht *heldTurn) settle(now time.Time) (placement.Decision, error) {
	if !ht.state.CompareAndSwap(heldWaiting, heldSettled) {
		if ht.state.Load() == heldCancelled {
			return placement.Decision{}, context.Canceled
		}
		return ht.dec, ht.err
	}
	ht.waited = now.Sub(ht.start)
	outcome := "admitted"
	if ht.tk.Forced() {
		outcome = "wait_limit"
	}
	ht.m.queue.leave(ht.qid, true, now, ht.waited)
	ht.observe(outcome, ht.waited)
	d, err := ht.tk.Decision()
	if err == nil {
		d, err = ht.m.admitted(ht.req, d)
	}
	ht.dec, ht.err = d, err
	return d, err
}

// cancel takes a waiting ticket out of the queue (its client left); a
// ticket admitted meanwhile gives its slot back. It does nothing to a
// ticket settled already. Safe from any goroutine.
func (ht *heldTurn) cancel(now time.Time) {
	if !ht.state.CompareAndSwap(heldWaiting, heldCancelled) {
		return
	}
	if !ht.tk.Cancel() {
		// admitted as the client left
		if d, err := ht.tk.Decision(); err == nil {
			d.Release()
		}
	}
	waited := now.Sub(ht.start)
	ht.m.queue.leave(ht.qid, false, now, waited)
	ht.observe("cancelled", waited)
}

// drop ends the hold when the request ends: a waiting ticket is
// cancelled, a decision settled but not used is released.
func (ht *heldTurn) drop(now time.Time) {
	ht.cancel(now)
	if ht.state.Load() == heldSettled && !ht.used && ht.err == nil {
		ht.used = true
		ht.dec.Release()
	}
}

func (ht *heldTurn) observe(outcome string, waited time.Duration) {
	h := admissionWait
	if ht.tk.Paused() {
		h = pausedWait
	}
	h.WithLabelValues(ht.m.name, outcome).Observe(waited.Seconds())
}

// maxRetryAfter is the longest Retry-After a refused request gets, in
// seconds: the longest clients wait and retry. Claude Code 2.1.332
// retries a 429 or 529 after 60 s and gives up at once on 61 s; the
// Anthropic Python SDK honours at most 60 s (longer: its own backoff of at
// most 8 s), the OpenAI Node SDK at most 60 s, the OpenAI Python SDK 120 s
// (longer: no retry).
const maxRetryAfter = 60

// refuse answers a request the admission queue had no room for: 429 with
// Retry-After and an error in the request's API format, or the error for
// handle_errors routes (ErrorResponse as for the handler's other errors).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, st *routeState) error {
	a := st.model.router.Admission()
	secs := st.model.retryAfter(a, time.Now())
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	are := "are"
	if a.Waiting == 1 {
		are = "is"
	}
	msg := fmt.Sprintf("model %s is at capacity: %d conversation%s %s waiting for room in the replicas' KV caches (admit_queue %d); retry in %d s",
		st.model.name, a.Waiting, plural(a.Waiting), are, a.QueueLimit, secs)
	err := caddyhttp.Error(http.StatusTooManyRequests, fmt.Errorf("%s", msg))
	if h.ErrorResponse == "caddy" || hasErrorRoutes(r) {
		return err
	}
	writeAPIError(w, st.api, http.StatusTooManyRequests, msg)
	if h.logger != nil {
		h.logger.Debug("admission queue full: request refused", zap.String("key", st.key),
			zap.String("model", st.model.name), zap.Int("waiting", a.Waiting), zap.Int("retry_after_s", secs))
	}
	return nil
}

// overcommitMessage says, in plain words, that the active conversations
// hold more context than the replicas cache; "" when they do not.
func overcommitMessage(a placement.AdmissionSnapshot) string {
	if !a.Overcommitted() {
		return ""
	}
	msg := fmt.Sprintf("active conversations hold %s tokens; the replicas cache %s: expect low cache hits",
		shortTokens(a.WorkingSetTokens+a.WaitingTokens), shortTokens(a.CapacityTokens))
	switch {
	case a.Active && a.Waiting > 0:
		msg += fmt.Sprintf(", admission is holding %d conversation%s", a.Waiting, plural(a.Waiting))
	case !a.Active && a.On:
		msg += "; admission is not in force: " + a.Why
	case !a.On:
		msg += "; admission is off"
	}
	return msg
}

func shortTokens(n int64) string {
	v, unit := humanize.ComputeSI(float64(n))
	return strconv.FormatFloat(math.Round(v), 'f', -1, 64) + unit
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// checkOvercommit logs when the active conversations come to hold more
// than the replicas cache, once per episode, and when that ends.
func (m *modelState) checkOvercommit(a placement.AdmissionSnapshot) {
	msg := overcommitMessage(a)
	m.mu.Lock()
	was := m.overcommitted
	m.overcommitted = msg != ""
	l := m.logger
	m.mu.Unlock()
	switch {
	case msg != "" && !was:
		l.Warn(msg, zap.String("model", m.name), zap.Int64("working_set_tokens", a.WorkingSetTokens),
			zap.Int64("waiting_tokens", a.WaitingTokens), zap.Int64("capacity_tokens", a.CapacityTokens),
			zap.Int("waiting", a.Waiting))
	case msg == "" && was:
		l.Info("active conversations fit the replicas' KV caches again", zap.String("model", m.name),
			zap.Int64("working_set_tokens", a.WorkingSetTokens), zap.Int64("capacity_tokens", a.CapacityTokens))
	}
}
