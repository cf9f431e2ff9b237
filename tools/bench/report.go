package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/dustin/go-humanize"
)

// Report is the result of a run: every stage under every mode, plus what
// produced it. It is written as JSON with the stages under "stages".
type Report struct {
	Kind     string   `json:"kind"`            // "sim" or "http"
	Speed    float64  `json:"speed,omitempty"` // engine seconds per wall second
	Workload Workload `json:"workload"`
	Stages   []Stage  `json:"stages"`
	// Trace is what a replayed trace recorded (sim --trace), nil otherwise.
	Trace *TraceSummary `json:"trace,omitempty"`
}

// WriteJSON writes the report, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadReport decodes a report written by WriteJSON.
func ReadReport(rd io.Reader) (*Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("reading report: %w", err)
	}
	return &r, nil
}

// Find returns the stage of a mode and session count.
func (r *Report) Find(mode string, sessions int) (Stage, bool) {
	for _, s := range r.Stages {
		if s.Mode == mode && s.Sessions == sessions {
			return s, true
		}
	}
	return Stage{}, false
}

// Modes lists the report's modes in first-seen order.
func (r *Report) Modes() []string {
	var modes []string
	seen := map[string]bool{}
	for _, s := range r.Stages {
		if !seen[s.Mode] {
			seen[s.Mode] = true
			modes = append(modes, s.Mode)
		}
	}
	return modes
}

// SessionCounts lists the stages' session counts, ascending.
func (r *Report) SessionCounts() []int {
	seen := map[int]bool{}
	var ns []int
	for _, s := range r.Stages {
		if !seen[s.Sessions] {
			seen[s.Sessions] = true
			ns = append(ns, s.Sessions)
		}
	}
	sort.Ints(ns)
	return ns
}

// WriteTable prints the reference measurement's table: one row per session
// count with "base → LM Warden" pairs, LM Warden being its defaults
// (ModeDefault) when the run has them, else affinity on; then, when the run
// has other modes, one row per stage.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	modes := r.Modes()
	has := func(m string) bool {
		for _, x := range modes {
			if x == m {
				return true
			}
		}
		return false
	}
	// The headline pairs vLLM's own balancer with LM Warden as shipped
	// (affinity on, as the reference measurement did, when the run has no
	// default mode); without vLLM's balancer, LM Warden's affinity off.
	base := ModeVLLMDP
	if !has(base) {
		base = ModeOff
	}
	lmw := ModeDefault
	if !has(lmw) {
		lmw = ModeOn
	}
	if has(base) && has(lmw) {
		fmt.Fprintf(&b, "| Sessions | Sessions/h %[1]s → %[2]s | Output tok/min %[1]s → %[2]s | TTFB p50 %[1]s → %[2]s (s) | TTFB p95 %[1]s → %[2]s (s) | Replicas busy %[1]s → %[2]s | Prefix hits %[1]s → %[2]s (%%) | Stayed on replica %[1]s → %[2]s (%%) | Requests (errors) %[1]s → %[2]s |\n", base, lmw)
		b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range r.SessionCounts() {
			off, ok1 := r.Find(base, n)
			on, ok2 := r.Find(lmw, n)
			if !ok1 || !ok2 {
				continue
			}
			fmt.Fprintf(&b, "| %d | %s → %s | %s → %s | %s → %s | %s → %s | %s → %s | %s → %s | %s → %s | %s → %s |\n", n,
				fnum(off.SessionsPerHour, 0), fnum(on.SessionsPerHour, 0),
				fnum(off.OutputTokensPerMin, 0), fnum(on.OutputTokensPerMin, 0),
				fsec(off.TTFBP50S), fsec(on.TTFBP50S),
				fsec(off.TTFBP95S), fsec(on.TTFBP95S),
				fnum(off.ReplicasBusy, 2), fnum(on.ReplicasBusy, 2),
				fhit(off), fhit(on),
				fnum(off.StayedPct, 1), fnum(on.StayedPct, 1),
				freq(off), freq(on))
		}
	}
	if len(modes) > 2 || !has(base) || !has(lmw) {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("| Sessions | Mode | Policy | Sessions/h | Output tok/min | TTFB p50 (s) | TTFB p95 (s) | Replicas busy | Prefix hits (%) | Stayed (%) | Requests (errors) |\n")
		b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, n := range r.SessionCounts() {
			for _, m := range modes {
				s, ok := r.Find(m, n)
				if !ok {
					continue
				}
				fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, s.Mode, s.Policy,
					fnum(s.SessionsPerHour, 0), fnum(s.OutputTokensPerMin, 0), fsec(s.TTFBP50S), fsec(s.TTFBP95S),
					fnum(s.ReplicasBusy, 2), fhit(s), fnum(s.StayedPct, 1), freq(s))
			}
		}
	}
	r.writeTurnTable(&b)
	r.writeExpectTable(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeTurnTable adds the figures that tell first turns from later ones:
// TTFB of each, the first turns' wait at the router (admission), and the
// conversations' completion time (first request sent to last answer).
func (r *Report) writeTurnTable(b *strings.Builder) {
	if len(r.Stages) == 0 {
		return
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	b.WriteString("| Sessions | Mode | TTFB first turn p50 / p95 (s) | TTFB later turns p50 / p95 (s) | Router wait, first turn p50 / p95 (s) | Router wait, later turns p95 / max (s) | Idle while held (replica·s) | Completion p50 / p95 (s) | Completed |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range r.SessionCounts() {
		for _, m := range r.Modes() {
			s, ok := r.Find(m, n)
			if !ok {
				continue
			}
			fmt.Fprintf(b, "| %d | %s | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s | %d |\n", n, s.Mode,
				fsec(s.TTFBFirstP50S), fsec(s.TTFBFirstP95S), fsec(s.TTFBLaterP50S), fsec(s.TTFBLaterP95S),
				fsec(s.WaitFirstP50S), fsec(s.WaitFirstP95S), fsec(s.WaitLaterP95S), fsec(s.WaitLaterMaxS),
				fnum(s.IdleWhileHeldS, 0), fcompletion(s), s.CompletedCounts)
		}
	}
}

// writeExpectTable adds, for the stages whose router gave each turn its
// expected time to first token (LM Warden's modes), how far that estimate
// was from the time measured: the cost model's own error.
func (r *Report) writeExpectTable(b *strings.Builder) {
	var rows []Stage
	for _, n := range r.SessionCounts() {
		for _, m := range r.Modes() {
			if s, ok := r.Find(m, n); ok && s.ExpectTurns > 0 {
				rows = append(rows, s)
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n| Sessions | Mode | Turns | Expected TTFT's error p50 / p95 (s) | Later than expected (%) |\n")
	b.WriteString("|---|---|---|---|---|\n")
	for _, s := range rows {
		fmt.Fprintf(b, "| %d | %s | %d | %s / %s | %s |\n", s.Sessions, s.Mode, s.ExpectTurns,
			fsec(s.ExpectErrP50S), fsec(s.ExpectErrP95S), fnum(s.ExpectLatePct, 1))
	}
}

func fnum(v float64, decimals int) string {
	if decimals == 0 {
		return humanize.Comma(int64(v + 0.5))
	}
	// CommafWithDigits cuts digits off (86.18 → "86.1"): round first
	p := math.Pow10(decimals)
	return humanize.CommafWithDigits(math.Round(v*p)/p, decimals)
}

// fhit renders a stage's prefix hit percentage, "unknown" when the replicas
// did not export the prefix counters.
func fhit(s Stage) string {
	if s.PrefixHitUnknown {
		return "unknown"
	}
	return fnum(s.PrefixHitPct, 1)
}

func fsec(v float64) string {
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// fcompletion renders a stage's completion p50 / p95, "—" when no session
// completed in it (there is no time to show, not a time of 0).
func fcompletion(s Stage) string {
	if s.CompletedCounts == 0 {
		return "—"
	}
	return fsec(s.CompletionP50S) + " / " + fsec(s.CompletionP95S)
}

func freq(s Stage) string { return fmt.Sprintf("%d (%d)", s.Requests, s.Errors) }

// WriteFiles writes report.json, table.md and the charts into dir (created
// when missing) and returns the paths written.
func (r *Report) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating output directory: %w", err)
	}
	var paths []string
	write := func(name string, fn func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := fn(f); err != nil {
			f.Close()
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		paths = append(paths, p)
		return nil
	}
	if err := write("report.json", r.WriteJSON); err != nil {
		return paths, err
	}
	if err := write("table.md", r.WriteTable); err != nil {
		return paths, err
	}
	for _, c := range r.Charts() {
		if err := write(c.File, c.Render); err != nil {
			return paths, err
		}
	}
	return paths, nil
}
