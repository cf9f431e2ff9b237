package card

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestUIAssetsStrictCSP checks the embedded files for what a strict CSP
// would block: inline scripts, inline styles, event-handler attributes,
// eval, and anything loaded from another origin.
func TestUIAssetsStrictCSP(t *testing.T) {
	t.Parallel()
	banned := map[string]*regexp.Regexp{
		"inline script":   regexp.MustCompile(`<script(\s[^>]*)?>[^<\s]`),
		"style element":   regexp.MustCompile(`<style`),
		"style attribute": regexp.MustCompile(`\sstyle=`),
		"event handler":   regexp.MustCompile(`\son[a-z]+=`),
		"eval":            regexp.MustCompile(`\beval\(|new Function\(|setTimeout\(["']|setInterval\(["']`),
		"innerHTML":       regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write`),
		"remote origin":   regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/|@import`),
	}
	for _, name := range []string{"index.html", "app.js", "app.css"} {
		b, err := uiFiles.ReadFile("web/" + name)
		if err != nil {
			t.Fatal(err)
		}
		for _, tag := range regexp.MustCompile(`<script[^>]*>`).FindAll(b, -1) {
			if !bytes.Contains(tag, []byte(" src=")) {
				t.Errorf("%s has a script without src: %s", name, tag)
			}
		}
		if strings.HasSuffix(name, ".css") && bytes.Contains(b, []byte("url(")) {
			t.Errorf("%s loads a url()", name)
		}
		for what, re := range banned {
			if loc := re.FindIndex(b); loc != nil {
				t.Errorf("%s has %s: %q", name, what, b[loc[0]:min(loc[1]+20, len(b))])
			}
		}
	}
}

func TestUINiceCeil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want float64 }{
		{0, 1}, {0.3, 1}, {1, 1}, {1.5, 2}, {2, 2}, {3, 5}, {7, 10}, {10, 10}, {11, 20}, {4999, 5000}, {5001, 10000},
	} {
		if got := uiNiceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestUISpillDeclinedTooltip: the declined-spill cell shows the count
// only; the last estimates for turns from that replica go to its tooltip,
// so spills do not widen the card.
func TestUISpillDeclinedTooltip(t *testing.T) {
	t.Parallel()
	recent := []SpillRow{
		{From: "r0", To: "r1", StayS: 9.1, MoveS: 3.04, ContextTokens: 12000, Moved: true},
		{From: "r1", To: "r2", StayS: 1, MoveS: 2},
		{From: "r0", To: "r3", StayS: 0.5, MoveS: 4.2, EvictS: 1.2, ContextTokens: 800},
	}
	for _, tc := range []struct {
		id, text, tip string
	}{
		{"r0", "3", "moved to r1: stay 9.1 s, move 3 s (12,000 tokens)\nstayed, not to r3: stay 0.5 s, move 4.2 s (800 tokens; evicts 1.2 s)"},
		{"r2", "3", ""},
	} {
		v := uiSpillDeclined(3, tc.id, recent)
		if v.T != tc.text || v.H != tc.tip {
			t.Errorf("%s: text %q tooltip %q, want %q and %q", tc.id, v.T, v.H, tc.text, tc.tip)
		}
	}
}

func TestUITTFT(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		expected, measured *float64
		tip                string
	}{
		{nil, nil, ""},
		{f(0.42), nil, ""},
		{f(0.42), f(0.451), "time to first token of the recent turns: expected 0.42 s, measured 0.45 s"},
	} {
		if got := uiTTFT(tc.expected, tc.measured); got != tc.tip {
			t.Errorf("uiTTFT: %q, want %q", got, tc.tip)
		}
	}
}
