package caddymodule

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/internal/turntrace"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// The turn trace (the handler's trace option): one line per turn a
// replica answered, written by a turntrace.Writer off the request path.
// The request path only copies the turn's figures into the writer's
// queue; with no trace configured it checks one pointer.

// DefaultTraceMaxSize is the trace file's size cap when trace names none:
// at about 250 bytes a line, some 400,000 turns.
const DefaultTraceMaxSize = 100 << 20

// traceFiles holds one writer per trace file, reference counted as the
// models are (modelStates): a reload that keeps the file keeps its writer
// (its queue, its conversations' last ends and its hash key, so one
// conversation keeps its hash across the reload); the writer closes when
// the last configuration naming the file is cleaned up.
var traceFiles = caddy.NewUsagePool()

// traceFile is a traceFiles entry.
type traceFile struct{ *turntrace.Writer }

// Destruct flushes and closes the file.
func (f traceFile) Destruct() error { return f.Close() }

// unmarshalTrace reads `trace <file> [<max_size>]`.
func (h *Handler) unmarshalTrace(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	h.TraceFile = d.Val()
	if d.NextArg() {
		n, err := humanize.ParseBytes(d.Val())
		if err != nil || n == 0 || n > 1<<40 {
			return d.Errf("trace: expected a size cap such as 100MiB, got %q", d.Val())
		}
		h.TraceMaxSize = int64(n)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// provisionTrace opens (or shares) the trace file and registers its
// metrics.
func (h *Handler) provisionTrace(ctx caddy.Context) error {
	if h.TraceFile == "" {
		return nil
	}
	if h.TraceMaxSize < 0 {
		return fmt.Errorf("trace_max_size must not be negative, got %d", h.TraceMaxSize)
	}
	path, err := filepath.Abs(h.TraceFile)
	if err != nil {
		return fmt.Errorf("trace_file: %w", err)
	}
	size := h.TraceMaxSize
	if size == 0 {
		size = DefaultTraceMaxSize
	}
	val, _, err := traceFiles.LoadOrNew(path, func() (caddy.Destructor, error) {
		w, err := turntrace.Open(path, size)
		if err != nil {
			return nil, err
		}
		return traceFile{w}, nil
	})
	if err != nil {
		return fmt.Errorf("trace_file: %w", err)
	}
	tf := val.(traceFile)
	tf.SetMaxSize(size)
	h.trace, h.tracePath = tf.Writer, path
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(traceCollector{}); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return fmt.Errorf("registering lm_warden trace metrics: %w", err)
			}
		}
	}
	if h.logger != nil {
		h.logger.Info("lm_warden: writing the turn trace", zap.String("file", path), zap.Int64("max_size", size))
	}
	return nil
}

// Cleanup lets go of the trace file: it closes when no loaded
// configuration names it any more. h.trace is left as it is: requests of
// this configuration still streaming read it, and a turn they add to a
// closed writer is dropped and counted.
func (h *Handler) Cleanup() error {
	if h.trace == nil {
		return nil
	}
	_, err := traceFiles.Delete(h.tracePath)
	return err
}

// traceTurn queues the finished turn of rw for the trace: a routed
// request with a conversation key that its replica answered with a
// success and a usage object. Only the figures are copied; the writer's
// goroutine hashes the keys and writes the line.
func (h *Handler) traceTurn(rw *responseWatcher, u *vllmstats.Usage, now time.Time) {
	st := rw.st
	if !st.routed || st.key == "" || !u.Measured || rw.status < 200 || rw.status >= 300 || rw.arrived.IsZero() {
		return
	}
	e := turntrace.Entry{
		Key: st.key, Start: rw.arrived, End: now, FirstByte: st.firstAt,
		Prompt: u.PromptTokens, Cached: u.CachedTokens, CachedKnown: u.CachedMeasured,
		Output: max(u.CompletionTokens, 0),
		Side:   st.dec.Reason == placement.ReasonSide, Compacted: st.dec.Reason == placement.ReasonRestarted,
	}
	if st.parent != "" {
		e.Parent, e.Agent = st.parent, true
	}
	if st.model != nil {
		e.Model = st.model.name
	}
	h.trace.Add(&e)
}

// traceCollector exposes every open trace file's counts.
type traceCollector struct{}

var (
	descTraceTurns = prometheus.NewDesc("lm_warden_trace_turns_total",
		"Turns written to the trace file.", []string{"file"}, nil)
	descTraceDropped = prometheus.NewDesc("lm_warden_trace_dropped_total",
		"Turns not written to the trace file: its writer's queue was full (queue_full) or a write failed (write_error).",
		[]string{"file", "reason"}, nil)
	descTraceRotations = prometheus.NewDesc("lm_warden_trace_rotations_total",
		"Times the trace file reached its size cap and was moved to FILE.1.", []string{"file"}, nil)
)

// Describe implements prometheus.Collector.
func (traceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTraceTurns
	ch <- descTraceDropped
	ch <- descTraceRotations
}

// Collect implements prometheus.Collector.
func (traceCollector) Collect(ch chan<- prometheus.Metric) {
	traceFiles.Range(func(key, val any) bool {
		path, _ := key.(string)
		tf, ok := val.(traceFile)
		if !ok {
			return true
		}
		s := tf.Stats()
		ch <- prometheus.MustNewConstMetric(descTraceTurns, prometheus.CounterValue, float64(s.Written), path)
		ch <- prometheus.MustNewConstMetric(descTraceDropped, prometheus.CounterValue, float64(s.Dropped), path, "queue_full")
		ch <- prometheus.MustNewConstMetric(descTraceDropped, prometheus.CounterValue, float64(s.Failed), path, "write_error")
		ch <- prometheus.MustNewConstMetric(descTraceRotations, prometheus.CounterValue, float64(s.Rotations), path)
		return true
	})
}

// Interface guards
var (
	_ caddy.CleanerUpper   = (*Handler)(nil)
	_ prometheus.Collector = traceCollector{}
)
