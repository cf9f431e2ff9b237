package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressLines checks both progress forms: on a terminal one line is
// rewritten in place every call; elsewhere (a log, a pipe) plain lines
// ending in a newline, at most one per PlainProgressEvery.
func TestProgressLines(t *testing.T) {
	for _, live := range []bool{true, false} {
		var out bytes.Buffer
		r := &httpRun{cfg: HTTPConfig{Progress: &out, LiveProgress: live, Speed: 1}, t0: time.Now()}
		r.turns = []TurnRecord{{Start: 0, FirstToken: time.Second}}
		w := Window{From: 0, To: time.Minute}
		for range 3 {
			r.progress("on 8", 0, w, 0)
		}
		got := out.String()
		if live {
			if strings.Count(got, "\r") != 3 || strings.Contains(got, "\n") {
				t.Errorf("live progress %q: want three \\r-led updates and no newline", got)
			}
			continue
		}
		if strings.Contains(got, "\r") || strings.Count(got, "\n") != 1 || !strings.HasPrefix(got, "on 8") {
			t.Errorf("plain progress %q: want one line without \\r", got)
		}
		if !strings.Contains(got, "requests 1") || !strings.Contains(got, "TTFB p50 1") {
			t.Errorf("plain progress %q lacks the stage's figures", got)
		}
	}
}
