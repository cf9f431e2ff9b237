package card

import "testing"

// TestAdmissionCells: the card's admission line and working-set cell.
func TestAdmissionCells(t *testing.T) {
	t.Parallel()
	wait := 12.5
	cap36, eng12 := int64(36800), int64(12000)
	for _, tc := range []struct{ name, got, want string }{
		{"off", uiAdmission(AdmissionRow{}).T, "off"},
		{"inactive", uiAdmission(AdmissionRow{On: true, Why: "no replicas"}).T, "not in force: no replicas"},
		{"waiting", uiAdmission(AdmissionRow{On: true, Active: true, Waiting: 3, MeanWaitS: &wait, Refused: 2}).T, "on · 3 waiting (mean wait 12.5 s) · 2 refused"},
		{"let in by the comparison", uiAdmission(AdmissionRow{On: true, Active: true, Recent: []AdmitRow{{To: "r1", WaitS: 15.04, EvictS: 3.2}}}).T,
			"on · 0 waiting\nlet in on r1 after 15 s: evicts 3.2 s of the residents' cache"},
		{"working set", uiWorkingSet(31200, &cap36, nil, true).T, "31.2 k of 36.8 k (84.8%) · full"},
		{"working set beside the engine's", uiWorkingSet(31200, &cap36, &eng12, false).T, "31.2 k of 36.8 k (84.8%) · engine 12 k"},
		{"working set, capacity unknown", uiWorkingSet(900, nil, nil, false).T, "900 of unknown"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}
