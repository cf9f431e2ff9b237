package placement

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// numbersDoc is the page listing every number the router decides with.
const numbersDoc = "../docs/numbers.md"

// notANumber reports whether a constant of the package names something
// other than a figure a decision reads: bit flags, enumerations, a sentinel.
func notANumber(name string) bool {
	for _, p := range []string{"flag", "ticket", "Reason", "Cause"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return name == "NumReasons" || name == "nilIdx"
}

// packageConstants returns the names of the package's constants (test
// files left out) that are numbers.
func packageConstants(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fs := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fs, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, s := range g.Specs {
					for _, n := range s.(*ast.ValueSpec).Names {
						if !notANumber(n.Name) {
							names = append(names, n.Name)
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// docTable returns the rows (cells trimmed) of the table under heading in
// doc.
func docTable(t *testing.T, doc, heading string) [][]string {
	t.Helper()
	_, after, ok := strings.Cut(doc, "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", numbersDoc, heading)
	}
	after, _, _ = strings.Cut(after, "\n## ")
	var rows [][]string
	for _, line := range strings.Split(after, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatalf("%s: section %q has no table", numbersDoc, heading)
	}
	return rows[1:] // past the header
}

// TestNumbersDocumented holds docs/numbers.md to the code: every named
// number of the package has its row (value, unit, origin, kind), every row
// names a constant that exists, every inline figure listed is still in its
// file, and the count of tuned numbers the page gives is its rows' count.
func TestNumbersDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(numbersDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	kinds := []string{"engine", "design", "prior", "limit", "bookkeeping", "derived", "tuned"}
	tuned := map[string]int{}

	var listed []string
	for _, row := range docTable(t, doc, "Named constants") {
		if len(row) != 6 {
			t.Fatalf("row %q: want constant, value, unit, what, origin, kind", row)
		}
		name := strings.Trim(row[0], "`")
		listed = append(listed, name)
		if !slices.Contains(kinds, row[5]) {
			t.Errorf("%s: kind %q, want one of %v", name, row[5], kinds)
		}
		if row[4] == "" || row[2] == "" {
			t.Errorf("%s: no unit or origin", name)
		}
		if row[5] == "tuned" {
			tuned["named"]++
		}
	}
	slices.Sort(listed)
	if got := packageConstants(t); !slices.Equal(got, listed) {
		t.Errorf("constants of the package %v\nlisted in %s %v", got, numbersDoc, listed)
	}

	for _, row := range docTable(t, doc, "Inline figures") {
		if len(row) != 5 {
			t.Fatalf("row %q: want file, expression, what, origin, kind", row)
		}
		file, expr := strings.Trim(row[0], "`"), strings.Trim(row[1], "`")
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("row %q: %v", row, err)
		}
		if !strings.Contains(string(src), expr) {
			t.Errorf("%s no longer has %q: the page is stale", file, expr)
		}
		if !slices.Contains(kinds, row[4]) {
			t.Errorf("%s: kind %q, want one of %v", expr, row[4], kinds)
		}
		if row[4] == "tuned" {
			tuned["inline"]++
		}
	}

	m := regexp.MustCompile(`Tuned numbers: \*\*(\d+)\*\* \((\d+) named, (\d+) inline\)`).FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("%s gives no count of tuned numbers", numbersDoc)
	}
	want := fmt.Sprintf("%d %d %d", tuned["named"]+tuned["inline"], tuned["named"], tuned["inline"])
	if got := strings.Join(m[1:], " "); got != want {
		t.Errorf("the page counts tuned numbers as %q (all, named, inline); its rows say %q", got, want)
	}
}
