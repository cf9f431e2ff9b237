package caddymodule

// Admission on the Caddy side: a held request waits for its ticket, a
// refused one gets 429 with a Retry-After, and the operator is told when
// the active conversations outgrow the caches. The router decides
// (placement); the metrics are in metrics.go.

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// await holds a new conversation's first request until the router admits
// it, its deadline (admit_wait) passes, or its client goes away, and
// returns how long it held it. Nothing is left behind: the timer is
// stopped, and a ticket admitted while its client left gives its slot back.
func (m *modelState) await(ctx context.Context, tk *placement.Ticket) (placement.Decision, time.Duration, error) {
	start := time.Now()
	qid := m.queue.enter(start)
	timer := time.NewTimer(time.Until(tk.Deadline()))
	defer timer.Stop()
	outcome := "admitted"
	select {
	case <-tk.Ready():
	case <-timer.C:
		tk.Force(time.Now())
		<-tk.Ready()
	case <-ctx.Done():
		if !tk.Cancel() {
			// admitted as the client left
			if d, err := tk.Decision(); err == nil {
				d.Release()
			}
		}
		outcome = "cancelled"
	}
	waited := time.Since(start)
	if outcome == "admitted" && tk.Forced() {
		outcome = "wait_limit"
	}
	m.queue.leave(qid, outcome != "cancelled", start.Add(waited), waited)
	h := admissionWait
	if tk.Paused() {
		h = pausedWait
	}
	h.WithLabelValues(m.name, outcome).Observe(waited.Seconds())
	if outcome == "cancelled" {
		return placement.Decision{}, waited, ctx.Err()
	}
	d, err := tk.Decision()
	return d, waited, err
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
