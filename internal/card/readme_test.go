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
	readmeCountersBegin = "<!-- replica-counters: written from the card's column list by `go test ./internal/card -run TestREADMECounters -update-readme`; the Prometheus rows after them are written by hand -->\n"
	readmeCountersEnd   = "<!-- /replica-counters -->\n"
)

// readmeCounters is the head of the README's table of counters: the replica
// table's columns, in the page's order, and the counters the JSON has
// without a column. The table goes on with the Prometheus series, rows
// written by hand whose where cell is Prometheus.
func readmeCounters() string {
	var b strings.Builder
	b.WriteString("| counter | where | meaning |\n|---|---|---|\n")
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

// generatedRows splits the README's table of counters into the rows
// written from the column list (the header, then every row whose where cell
// is card or JSON) and the rows after them.
func generatedRows(table string) (generated, rest string) {
	lines := strings.SplitAfter(table, "\n")
	n := 0
	for n < len(lines) {
		cells := strings.Split(lines[n], "|")
		if n >= 2 && (len(cells) < 4 || (strings.TrimSpace(cells[2]) != "card" && strings.TrimSpace(cells[2]) != "JSON")) {
			break
		}
		n++
	}
	return strings.Join(lines[:n], ""), strings.Join(lines[n:], "")
}

// TestREADMECounters checks the README's table of the replica table's
// counters against the column list and placement.Counters; with
// -update-readme it rewrites those rows, keeping the Prometheus rows that
// follow them. Every row after the generated ones must be a Prometheus row.
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
	got, rest := generatedRows(readme[i+len(readmeCountersBegin) : j])
	for _, line := range strings.SplitAfter(rest, "\n") {
		if cells := strings.Split(line, "|"); line != "" && (len(cells) < 4 || strings.TrimSpace(cells[2]) != "Prometheus") {
			t.Errorf("README.md's table of counters: a row after the generated ones is not a Prometheus row: %q", line)
		}
	}
	want := readmeCounters()
	if got == want {
		return
	}
	if *updateREADME {
		if err := os.WriteFile("../../README.md", []byte(readme[:i+len(readmeCountersBegin)]+want+rest+readme[j:]), 0o644); err != nil {
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
