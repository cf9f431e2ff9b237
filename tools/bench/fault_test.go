package bench

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseFault(t *testing.T) {
	tests := []struct {
		in   string
		want Fault
		err  string
	}{
		{"kill:replica=1,at=30s,for=25s", Fault{FaultKill, 1, 30 * time.Second, 25 * time.Second}, ""},
		{"hang:replica=2", Fault{FaultHang, 2, 30 * time.Second, 25 * time.Second}, ""},
		{"kill", Fault{FaultKill, 0, 30 * time.Second, 25 * time.Second}, ""},
		{"restart:replica=1,at=5s", Fault{FaultRestart, 1, 5 * time.Second, 0}, ""},
		{"restart", Fault{FaultRestart, 0, 30 * time.Second, 0}, ""},
		{"restart:for=3s", Fault{}, "no duration"},
		{"explode:replica=1", Fault{}, "kind"},
		{"kill:replica=-1", Fault{}, "negative"},
		{"kill:for=0s", Fault{}, "positive"},
		{"kill:at", Fault{}, "key=value"},
		{"kill:when=3s", Fault{}, "unknown key"},
	}
	for _, tt := range tests {
		got, err := ParseFault(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: error %v, want one with %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%q: %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if again, err := ParseFault(got.String()); err != nil || again != got {
			t.Errorf("%q does not read back: %+v, %v", got.String(), again, err)
		}
	}
}

type recordTarget struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordTarget) add(s string) error {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
	return nil
}
func (r *recordTarget) Stop(i int) error    { return r.add("stop") }
func (r *recordTarget) Restart(i int) error { return r.add("restart") }
func (r *recordTarget) SetRequestsHang(i int, on bool) error {
	if on {
		return r.add("hang")
	}
	return r.add("unhang")
}

// Inject applies the fault and always lifts it, also when the stage ends
// first.
func TestFaultInjectLiftsOnStageEnd(t *testing.T) {
	for _, tc := range []struct {
		f    Fault
		want string
	}{
		{Fault{FaultKill, 0, 10 * time.Millisecond, time.Hour}, "stop,restart"},
		{Fault{FaultHang, 0, 10 * time.Millisecond, 10 * time.Millisecond}, "hang,unhang"},
		{Fault{FaultRestart, 0, 10 * time.Millisecond, 0}, "stop,restart"},
	} {
		var rt recordTarget
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		if err := tc.f.Inject(ctx, &rt, 0, 1, nil); err != nil {
			t.Fatal(err)
		}
		cancel()
		if got := strings.Join(rt.calls, ","); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.f, got, tc.want)
		}
	}
}
