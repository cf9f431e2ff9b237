package bench

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func sampleReport() *Report {
	r := &Report{Kind: "sim", Workload: DefaultWorkload()}
	for _, n := range []int{4, 8} {
		for i, m := range []string{ModeOff, ModeOn, ModeHeader} {
			r.Stages = append(r.Stages, Stage{Mode: m, Policy: "test", Sessions: n, DurationS: 180,
				SessionsPerHour: float64(100 * n), OutputTokensPerMin: float64(1000*n + i), TTFBP50S: 0.1 * float64(i+1),
				TTFBP95S: 3 * float64(n), ReplicasBusy: 2.5, PrefixHitPct: 40 + 10*float64(i), StayedPct: 100, Requests: 10 * n, Errors: i})
		}
	}
	return r
}

func TestReportTable(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| Sessions | Sessions/h off → on |",
		"| 4 | 400 → 400 | 4,000 → 4,001 | 0.10 → 0.20 | 12.0 → 12.0 | 2.50 → 2.50 | 40.0 → 50.0 | 100.0 → 100.0 | 40 (0) → 40 (1) |",
		"| 8 | header | test | 800 | 8,002 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestReportJSONRoundTrip(t *testing.T) {
	r := sampleReport()
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"stages"`, `"mode"`, `"policy"`, `"sessions"`, `"duration_s"`, `"sessions_per_hour"`, `"output_tokens_per_min"`,
		`"ttfb_p50_s"`, `"ttfb_p95_s"`, `"replicas_busy"`, `"prefix_hit_pct"`, `"stayed_pct"`, `"requests"`, `"errors"`} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("JSON lacks %s", key)
		}
	}
	back, err := ReadReport(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Stages) != len(r.Stages) || back.Stages[3] != r.Stages[3] {
		t.Errorf("round trip changed the stages")
	}
}

func TestReportFilesAndCharts(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    *Report
	}{
		{"sweep", sampleReport()},
		{"one stage", &Report{Stages: []Stage{{Mode: ModeOn, Sessions: 4, TTFBP50S: 0, TTFBP95S: 0.5}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			paths, err := tc.r.WriteFiles(dir)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"report.json", "table.md", "ttfb.png", "prefix_hits.png", "replicas_busy.png", "output_tokens.png"}
			if len(paths) != len(want) {
				t.Fatalf("wrote %v", paths)
			}
			for _, name := range want {
				p := filepath.Join(dir, name)
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasSuffix(name, ".png") {
					img, err := png.Decode(f)
					if err != nil {
						t.Errorf("%s: %v", name, err)
					} else if b := img.Bounds(); b.Dx() != 1060 || b.Dy() != 500 {
						t.Errorf("%s is %v", name, b)
					}
				}
				f.Close()
			}
		})
	}
}

func TestNiceCeil(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{{0, 1}, {3.7, 5}, {4, 5}, {12000, 20000}, {100, 100}, {0.03, 0.05}} {
		if got := niceCeil(tc.in); got != tc.want {
			t.Errorf("niceCeil(%g) = %g, want %g", tc.in, got, tc.want)
		}
	}
}

func TestReportTableHeadlineIsTheDefault(t *testing.T) {
	r := &Report{Kind: "http", Speed: 10}
	for i, m := range []string{ModeVLLMDP, ModeDefault, ModeOn} {
		r.Stages = append(r.Stages, Stage{Mode: m, Sessions: 8, SessionsPerHour: float64(100 * (i + 1)), TTFBP50S: 1, TTFBP95S: 2,
			CompletedCounts: i, CompletionP50S: 30, CompletionP95S: 40})
	}
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"| Sessions | Sessions/h vllm-dp → default |",
		"| 8 | 100 → 200 |",
		"| 8 | on | ",                                         // affinity alone in the per-stage table
		"| 0.00 / 0.00 | 0.00 / 0.00 | 0 | — | 0 |",           // no session completed: no completion time
		"| 0.00 / 0.00 | 0.00 / 0.00 | 0 | 30.0 / 40.0 | 1 |", // one did
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestReportTimeBase(t *testing.T) {
	for _, tc := range []struct {
		r    Report
		want string
	}{
		{Report{Kind: "sim"}, "engine seconds, virtual clock"},
		{Report{Kind: "http", Speed: 10}, "engine seconds, emulator 10× speed"},
		{Report{Kind: "http", Speed: 1}, "wall-clock seconds"},
	} {
		if got := tc.r.timeBase(); got != tc.want {
			t.Errorf("%+v: time base %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestIntTicks(t *testing.T) {
	for _, tc := range []struct {
		top  float64
		want string
	}{
		{5, "0 1 2 3 4 5"},
		{100, "0 20 40 60 80 100"},
		{20000, "0 5,000 10,000 15,000 20,000"},
		{1, "0 1"},
	} {
		var labels []string
		for _, tk := range intTicks(tc.top) {
			labels = append(labels, tk.Label)
		}
		if got := strings.Join(labels, " "); got != tc.want {
			t.Errorf("intTicks(%g) = %q, want %q", tc.top, got, tc.want)
		}
	}
}

func TestFnumRounds(t *testing.T) {
	for _, tc := range []struct {
		in       float64
		decimals int
		want     string
	}{
		{86.1816, 1, "86.2"},
		{85.598, 1, "85.6"},
		{0.999, 1, "1.0"},
		{3.996, 2, "4.00"},
		{99.96, 1, "100.0"},
		{1234.56, 1, "1,234.6"},
		{87.25, 2, "87.25"},
		{21068.4, 0, "21,068"},
	} {
		if got := fnum(tc.in, tc.decimals); got != tc.want {
			t.Errorf("fnum(%g, %d) = %q, want %q", tc.in, tc.decimals, got, tc.want)
		}
	}
}
