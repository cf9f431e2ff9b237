// Package turntrace defines LM Warden's turn trace: one JSON object per
// line for every turn the module served, with the sizes and timing a
// replay needs and nothing of what was said. The Caddy module writes it
// (the lm_warden handler's trace option, see Writer); warden-bench sim
// --trace replays it (see Read). docs/trace.md describes the format.
//
// A line looks like
//
//	{"v":1,"conv":"3f9a0c1d2b4e5f60","at":"2026-12-05T23:40:01.123Z","pause_ms":4210,"prompt":18250,"cached":17984,"output":212,"dur_ms":3120,"ttft_ms":410}
//
// Conversation keys are never written as sent: conv (and parent) are a
// keyed hash (HMAC-SHA256 under a key drawn at random when the writer
// starts, its first 64 bits in hex), so the turns of one conversation
// share a conv while the session IDs cannot be read back or matched
// against another trace.
package turntrace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// Version is the format version every line carries in "v".
const Version = 1

// Turn is one line of a trace: one request the module routed and a
// replica answered with a success and a usage object.
type Turn struct {
	V int `json:"v"`
	// Conv is the conversation's hashed key (a sub-agent's key includes
	// its agent ID, so a sub-agent is a conversation of its own).
	Conv string `json:"conv"`
	// Parent is the hashed key of the conversation a sub-agent was
	// started from (with Agent).
	Parent string `json:"parent,omitempty"`
	// Model is the model the turn was routed for (the policy's model).
	Model string `json:"model,omitempty"`
	// At is when the request reached the module (UTC).
	At time.Time `json:"at"`
	// First marks the conversation's first turn in this trace: no turn of
	// it had ended before. PauseMS is then 0.
	First bool `json:"first,omitempty"`
	// PauseMS is the time from the end of the conversation's latest turn
	// that had ended when this one finished to this turn's start, in
	// milliseconds: the client's pause (tool runs, the person typing).
	// Negative when the two overlapped: this turn started before that
	// one ended (a side request beside a turn).
	PauseMS int64 `json:"pause_ms"`
	// Prompt is every prompt token of the turn, cached or not.
	Prompt int64 `json:"prompt"`
	// Cached is the part of the prompt the engine read from its prefix
	// cache; absent when the response did not say.
	Cached *int64 `json:"cached,omitempty"`
	// Output is the tokens generated.
	Output int64 `json:"output"`
	// DurMS is the turn's time from its start to its response's end;
	// TTFTMS to its first streamed bytes (absent when not streamed).
	DurMS  int64 `json:"dur_ms"`
	TTFTMS int64 `json:"ttft_ms,omitempty"`
	// Agent marks a sub-agent's turn (its key came with an agent
	// header).
	Agent bool `json:"agent,omitempty"`
	// Side marks a side request: a start other than its conversation's
	// (a title, a summary, a permission check), routed without moving the
	// conversation.
	Side bool `json:"side,omitempty"`
	// Compacted marks the turn where the conversation went on with a new
	// start: after a compaction, a /clear or a model switch (the module's
	// restart detection tells these apart from side requests, not from
	// each other).
	Compacted bool `json:"compacted,omitempty"`
}

// CachedOr returns the cached tokens, or def when unknown.
func (t *Turn) CachedOr(def int64) int64 {
	if t.Cached == nil {
		return def
	}
	return *t.Cached
}

// Validate reports what makes a turn unusable.
func (t *Turn) Validate() error {
	switch {
	case t.V != Version:
		return fmt.Errorf("version %d, want %d", t.V, Version)
	case t.Conv == "":
		return errors.New("no conv")
	case t.At.IsZero():
		return errors.New("no at")
	case t.Prompt < 1:
		return fmt.Errorf("prompt %d: must be at least 1", t.Prompt)
	case t.Output < 0:
		return fmt.Errorf("output %d: must not be negative", t.Output)
	case t.Cached != nil && (*t.Cached < 0 || *t.Cached > t.Prompt):
		return fmt.Errorf("cached %d: must be within [0, prompt %d]", *t.Cached, t.Prompt)
	case t.DurMS < 0 || t.TTFTMS < 0:
		return fmt.Errorf("negative duration (dur_ms %d, ttft_ms %d)", t.DurMS, t.TTFTMS)
	}
	return nil
}

// maxLine bounds one line of a trace; the module's lines are under 400
// bytes.
const maxLine = 64 << 10

// Read parses a trace: one Turn per non-empty line. A line that is not a
// valid turn is an error naming its line number. The turns come back
// ordered by At (a module writes a turn when it ends, so a file is in
// end order); turns with the same At keep the file's order.
func Read(r io.Reader) ([]Turn, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	var out []Turn
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var t Turn
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("trace line %d: more than one JSON value", line)
		}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("trace line %d: longer than %d bytes", line+1, maxLine)
		}
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}
