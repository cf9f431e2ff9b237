package card

import "testing"

func TestUIDeliveredSeries(t *testing.T) {
	t.Parallel()
	f := func(x float64) *float64 { return &x }
	tests := []struct {
		name                 string
		predicted, delivered []uint64
		stepS                float64
		want                 []*float64
		wantStep             float64
	}{
		{"empty", nil, nil, 10, []*float64{}, 60},
		{"fewer steps than a minute", []uint64{5, 5}, []uint64{5, 5}, 10, []*float64{}, 60},
		{"10 s steps by six from the end", []uint64{9, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0},
			[]uint64{0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 10, []*float64{f(0.5), nil}, 60},
		{"minute steps kept", []uint64{4, 0, 3}, []uint64{1, 0, 3}, 60, []*float64{f(0.25), nil, f(1)}, 60},
		{"longer steps kept", []uint64{3}, []uint64{2}, 120, []*float64{f(0.667)}, 120},
		{"7 s steps by nine", make([]uint64, 20), make([]uint64, 20), 7, []*float64{nil, nil}, 63},
		{"unknown step", []uint64{2}, []uint64{1}, 0, []*float64{f(0.5)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, step := uiDeliveredSeries(tc.predicted, tc.delivered, tc.stepS)
			if step != tc.wantStep || len(got) != len(tc.want) {
				t.Fatalf("%d points of %v s, want %d of %v", len(got), step, len(tc.want), tc.wantStep)
			}
			for i := range got {
				if (got[i] == nil) != (tc.want[i] == nil) || got[i] != nil && *got[i] != *tc.want[i] {
					t.Errorf("point %d: %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
