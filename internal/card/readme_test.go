package card

import (
	"flag"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

var updateREADME = flag.Bool("update-readme", false, "rewrite the README's table of the replica table's counters")

const (
	readmeCountersBegin = "<!-- replica-counters: written from the card's column list by `go test ./internal/card -run TestREADMECounters -update-readme` -->\n"
	readmeCountersEnd   = "<!-- /replica-counters -->\n"
)

// readmeCounters is the README's table of the replica table's columns, in
// the page's order, and of the counters the JSON has without a column.
func readmeCounters() string {
	var b strings.Builder
	b.WriteString("| column | where | meaning |\n|---|---|---|\n")
	inColumns := map[string]bool{}
	for _, c := range uiReplicaColumns {
		inColumns[c.Key] = true
		doc := c.Doc
		if doc == "" {
			doc = c.Title
		}
		b.WriteString("| " + c.Label + " | card | " + doc + " |\n")
	}
	t := reflect.TypeFor[placement.Counters]()
	for i := range t.NumField() {
		f := t.Field(i)
		if name := f.Tag.Get("json"); !inColumns[name] {
			b.WriteString("| `" + name + "` | JSON | " + f.Tag.Get("doc") + " |\n")
		}
	}
	return b.String()
}

// TestREADMECounters checks the README's table of the replica table's
// counters against the column list and placement.Counters; with
// -update-readme it rewrites the table.
func TestREADMECounters(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	i := strings.Index(readme, readmeCountersBegin)
	j := strings.Index(readme, readmeCountersEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q … %q block", readmeCountersBegin, readmeCountersEnd)
	}
	got, want := readme[i+len(readmeCountersBegin):j], readmeCounters()
	if got == want {
		return
	}
	if *updateREADME {
		if err := os.WriteFile("../../README.md", []byte(readme[:i+len(readmeCountersBegin)]+want+readme[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's table of the replica counters is not the column list's; run go test ./internal/card -run TestREADMECounters -update-readme\nwant:\n%s", want)
}

// TestCountersHaveAColumnOrADoc: every counter is on the card or says in
// its doc tag what it counts, and every column key names a cell.
func TestCountersHaveAColumnOrADoc(t *testing.T) {
	t.Parallel()
	keys := map[string]bool{}
	for _, c := range uiReplicaColumns {
		keys[c.Key] = true
	}
	tp := reflect.TypeFor[placement.Counters]()
	for i := range tp.NumField() {
		f := tp.Field(i)
		if name := f.Tag.Get("json"); name == "" || (!keys[name] && f.Tag.Get("doc") == "") {
			t.Errorf("placement.Counters.%s: no json name, or neither a column nor a doc tag", f.Name)
		}
	}
	row := buildCardView(Card{Replicas: []ReplicaRow{{ID: "r"}}}, time.Unix(1_800_000_000, 0)).Replicas[0]
	for _, c := range uiReplicaColumns {
		if _, ok := row.Cells[c.Key]; !ok {
			t.Errorf("column %q has no cell", c.Key)
		}
	}
}
