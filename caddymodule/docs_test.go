package caddymodule

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The tests in this file keep README.md and docs/*.md true to the code:
// their Caddyfiles load, the README's option list is the parser's, its
// counters are the collector's, every bench table names its command and
// every relative link resolves. docs/contributing.md ("Docs that stay
// true") states the conventions they check.

// docPages returns README.md and docs/*.md, by path relative to this
// package, with their text.
func docPages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, "../README.md")
	pages := make(map[string]string, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages[p] = string(b)
	}
	return pages
}

// sortedKeys returns m's keys in order, so that failures come out in a
// stable order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// fence is one fenced code block of a Markdown page.
type fence struct {
	info string   // the info string after the opening backticks
	line int      // the 1-based line of the opening fence
	body []string // the lines between the fences
}

// fences returns the page's fenced code blocks (``` fences, as the docs
// write them).
func fences(page string) []fence {
	var out []fence
	var cur *fence
	for i, line := range strings.Split(page, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &fence{info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), line: i + 1}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body = append(cur.body, line)
		}
	}
	return out
}

// caddyfileWrappers are the contexts a Caddyfile snippet of the docs is
// tried in, in order: as a whole Caddyfile, as global options, inside a
// site, inside a reverse_proxy of a site.
var caddyfileWrappers = []struct{ name, before, after string }{
	{"whole Caddyfile", "", ""},
	{"global options", "{\n", "\n}\n"},
	{"site", "localhost:8080 {\n", "\n}\n"},
	{"reverse_proxy", "localhost:8080 {\n\treverse_proxy 127.0.0.1:8000 127.0.0.1:8001 {\n", "\n\t}\n}\n"},
}

// TestDocsCaddyfilesAdapt adapts every ```caddyfile block of README.md and
// docs/*.md with Caddy's Caddyfile adapter (this package's modules
// registered), as a whole Caddyfile or, for a fragment, in the first
// context of caddyfileWrappers that takes it. A block that imports a
// snippet gets the snippets defined by the page's earlier blocks before it.
// A block that loads in none fails with each context's error.
func TestDocsCaddyfilesAdapt(t *testing.T) {
	t.Parallel()
	adapter := caddyconfig.GetAdapter("caddyfile")
	pages := docPages(t)
	count := 0
	for _, path := range sortedKeys(pages) {
		var defined []string // snippets "(name) { … }" of earlier blocks of the page
		for _, f := range fences(pages[path]) {
			if f.info != "caddyfile" {
				continue
			}
			count++
			snippet := strings.Join(f.body, "\n")
			prefix := ""
			if !strings.HasPrefix(strings.TrimSpace(snippet), "{") && strings.Contains(snippet, "import ") {
				prefix = strings.Join(defined, "\n")
			}
			defined = append(defined, snippetDefinitions(f.body)...)
			t.Run(fmt.Sprintf("%s:%d", filepath.Base(path), f.line), func(t *testing.T) {
				var errs []string
				for _, w := range caddyfileWrappers {
					body := prefix + "\n" + w.before + snippet + w.after
					if w.before == "{\n" {
						body = w.before + snippet + w.after + prefix
					}
					if _, _, err := adapter.Adapt([]byte(body), map[string]any{"filename": path}); err != nil {
						errs = append(errs, w.name+": "+err.Error())
						continue
					}
					return
				}
				t.Errorf("%s:%d: the Caddyfile block adapts in no context:\n%s\n\n%s", path, f.line, strings.Join(errs, "\n"), snippet)
			})
		}
	}
	if count == 0 {
		t.Fatal("README.md and docs/*.md hold no ```caddyfile block")
	}
}

// snippetDefinitions returns the Caddyfile snippets a block defines at its
// top level, "(name) {" to its closing "}", for the page's later blocks to
// import.
func snippetDefinitions(lines []string) []string {
	var out []string
	start := -1
	for i, line := range lines {
		switch {
		case start < 0 && strings.HasPrefix(line, "(") && strings.HasSuffix(strings.TrimSpace(line), "{"):
			start = i
		case start >= 0 && line == "}":
			out = append(out, strings.Join(lines[start:i+1], "\n"))
			start = -1
		}
	}
	return out
}

// TestDocsCaddyfileFences: a block that holds Caddy configuration is fenced
// ```caddyfile (or ```caddy-d for the README's syntax blocks), never plain
// or under another name, so TestDocsCaddyfilesAdapt sees it.
func TestDocsCaddyfileFences(t *testing.T) {
	t.Parallel()
	directive := regexp.MustCompile(`^\s*(reverse_proxy|lb_policy|lm_warden)\b.*\{\s*$`)
	pages := docPages(t)
	for _, path := range sortedKeys(pages) {
		for _, f := range fences(pages[path]) {
			if f.info == "caddyfile" || f.info == "caddy-d" {
				continue
			}
			for _, line := range f.body {
				if directive.MatchString(line) {
					t.Errorf("%s:%d: a block holding %q is fenced %q: fence Caddyfiles as caddyfile", path, f.line, strings.TrimSpace(line), f.info)
					break
				}
			}
		}
	}
}

// caddyfileOptions reads caddyfile.go with go/parser and returns the
// options each Caddyfile unmarshaller accepts: the string cases of its
// switch on the option's name (`switch opt := d.Val(); opt`), by the
// function's name ("Handler.UnmarshalCaddyfile", "Policy.UnmarshalCaddyfile",
// "Policy.unmarshalStore"), and for each option whose case calls another
// such function of the file, that function's name (the nested block).
func caddyfileOptions(t reporter, src string) (options map[string][]string, nested map[string]map[string]string) {
	t.Helper()
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "caddyfile.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	funcName := func(fd *ast.FuncDecl) string {
		if fd.Recv == nil || len(fd.Recv.List) == 0 {
			return fd.Name.Name
		}
		typ := fd.Recv.List[0].Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if id, ok := typ.(*ast.Ident); ok {
			return id.Name + "." + fd.Name.Name
		}
		return fd.Name.Name
	}
	// optionSwitch reports whether s switches on the option's name: its
	// init assigns d.Val().
	optionSwitch := func(s *ast.SwitchStmt) bool {
		as, ok := s.Init.(*ast.AssignStmt)
		if !ok || len(as.Rhs) != 1 {
			return false
		}
		call, ok := as.Rhs[0].(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Val"
	}
	options = map[string][]string{}
	calls := map[string]map[string]string{} // func → option → method it calls
	byMethod := map[string]string{}         // method name → func name
	for _, decl := range file.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		name := funcName(fd)
		byMethod[fd.Name.Name] = name
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			s, ok := n.(*ast.SwitchStmt)
			if !ok || !optionSwitch(s) {
				return true
			}
			for _, stmt := range s.Body.List {
				cc := stmt.(*ast.CaseClause)
				for _, e := range cc.List {
					lit, ok := e.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					opt, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					options[name] = append(options[name], opt)
					for _, body := range cc.Body {
						ast.Inspect(body, func(n ast.Node) bool {
							if call, ok := n.(*ast.CallExpr); ok {
								if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
									if calls[name] == nil {
										calls[name] = map[string]string{}
									}
									calls[name][opt] = sel.Sel.Name
								}
							}
							return true
						})
					}
				}
			}
			return false
		})
	}
	nested = map[string]map[string]string{}
	for fn, byOpt := range calls {
		for opt, method := range byOpt {
			if target, ok := byMethod[method]; ok && len(options[target]) > 0 {
				if nested[fn] == nil {
					nested[fn] = map[string]string{}
				}
				nested[fn][opt] = target
			}
		}
	}
	if len(options) == 0 {
		t.Fatal("caddyfile.go: no switch on the option's name found")
	}
	return options, nested
}

// optionTree is the options of one block of a syntax block or of a bullet
// list, with the nested blocks by the option that opens them.
type optionTree struct {
	options []string
	nested  map[string]*optionTree
}

// syntaxOptions reads a ```caddy-d syntax block: its first line opens the
// directive's block; every line inside names an option as its first word,
// and a line ending in { opens a nested block of that option.
func syntaxOptions(lines []string) (directive string, tree *optionTree) {
	tree = &optionTree{nested: map[string]*optionTree{}}
	stack := []*optionTree{}
	cur := (*optionTree)(nil)
	for _, line := range lines {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur == nil {
			directive = strings.TrimSpace(strings.SplitN(trimmed, "[", 2)[0])
			directive = strings.TrimSpace(strings.TrimSuffix(directive, "{"))
			cur = tree
			continue
		}
		if trimmed == "}" {
			if len(stack) > 0 {
				cur, stack = stack[len(stack)-1], stack[:len(stack)-1]
			}
			continue
		}
		opt := strings.Fields(trimmed)[0]
		cur.options = append(cur.options, opt)
		if strings.HasSuffix(trimmed, "{") {
			child := &optionTree{nested: map[string]*optionTree{}}
			cur.nested[opt] = child
			stack = append(stack, cur)
			cur = child
		}
	}
	return directive, tree
}

// bulletOption matches an option's bullet: "- `name` — …", indented by two
// spaces per nesting level.
var bulletOption = regexp.MustCompile("^((?:  )*)- `([a-z_]+)`")

// bulletOptions reads the bullets after a syntax block, up to the next
// heading or syntax block: each top-level bullet naming an option in
// backticks, and bullets indented under it as its nested block's.
func bulletOptions(lines []string) *optionTree {
	tree := &optionTree{nested: map[string]*optionTree{}}
	var last string
	for _, line := range lines {
		if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "```") {
			break
		}
		m := bulletOption.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch len(m[1]) / 2 {
		case 0:
			tree.options = append(tree.options, m[2])
			last = m[2]
		case 1:
			if last == "" {
				continue
			}
			if tree.nested[last] == nil {
				tree.nested[last] = &optionTree{nested: map[string]*optionTree{}}
			}
			tree.nested[last].options = append(tree.nested[last].options, m[2])
		}
	}
	return tree
}

// setDiff returns what a has that b has not, and duplicates in a.
func setDiff(a, b []string) (missing, dup []string) {
	seen := map[string]bool{}
	for _, x := range a {
		if seen[x] {
			dup = append(dup, x)
		}
		seen[x] = true
		if !slices.Contains(b, x) {
			missing = append(missing, x)
		}
	}
	return missing, dup
}

// compareOptions reports every option of the parser's function fn that
// the syntax block or the bullets lack, and every one they name that the
// parser has not, recursing into nested blocks.
func compareOptions(t reporter, where, fn string, parsed map[string][]string, nested map[string]map[string]string, syntax, bullets *optionTree) {
	t.Helper()
	want := parsed[fn]
	for _, c := range []struct {
		name string
		got  []string
	}{{"syntax block", syntax.options}, {"bullets", bullets.options}} {
		missing, dup := setDiff(want, c.got)
		for _, o := range missing {
			t.Errorf("%s: option %q of caddyfile.go's %s is not in the README's %s", where, o, fn, c.name)
		}
		extra, _ := setDiff(c.got, want)
		for _, o := range extra {
			t.Errorf("%s: the README's %s names %q, which caddyfile.go's %s does not parse", where, c.name, o, fn)
		}
		_, dup = setDiff(c.got, nil)
		for _, o := range dup {
			t.Errorf("%s: the README's %s names %q twice", where, c.name, o)
		}
	}
	for opt, target := range nested[fn] {
		s, b := syntax.nested[opt], bullets.nested[opt]
		if s == nil {
			t.Errorf("%s: option %q opens a block (%s) that the README's syntax block does not show", where, opt, target)
			s = &optionTree{}
		}
		if b == nil {
			t.Errorf("%s: option %q opens a block (%s) whose options have no bullets under %q's bullet", where, opt, target, opt)
			b = &optionTree{}
		}
		compareOptions(t, where+" › "+opt, target, parsed, nested, s, b)
	}
	for opt := range syntax.nested {
		if _, ok := nested[fn][opt]; !ok {
			t.Errorf("%s: the README's syntax block opens a block under %q, which caddyfile.go's %s does not read as one", where, opt, fn)
		}
	}
}

// readmeDirectives maps the directive that opens a README syntax block to
// the caddyfile.go function that parses it.
var readmeDirectives = map[string]string{
	"lm_warden":           "Handler.UnmarshalCaddyfile",
	"lb_policy lm_warden": "Policy.UnmarshalCaddyfile",
}

// TestREADMEOptionsMatchCaddyfile: for the handler and the policy, the
// options of the README's ```caddy-d syntax block, the bullets after it
// and the `case "…"` options of caddyfile.go's UnmarshalCaddyfile (read
// with go/parser) are the same sets, nested blocks (store) included.
func TestREADMEOptionsMatchCaddyfile(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("caddyfile.go")
	if err != nil {
		t.Fatal(err)
	}
	testREADMEOptions(t, string(src), docPages(t)["../README.md"])
}

func testREADMEOptions(t reporter, src, readme string) {
	t.Helper()
	parsed, nested := caddyfileOptions(t, src)
	lines := strings.Split(readme, "\n")
	seen := map[string]bool{}
	for _, f := range fences(readme) {
		if f.info != "caddy-d" {
			continue
		}
		directive, syntax := syntaxOptions(f.body)
		fn, ok := readmeDirectives[directive]
		if !ok {
			t.Errorf("README.md:%d: a syntax block for %q, which names no parser", f.line, directive)
			continue
		}
		seen[directive] = true
		after := lines[f.line+len(f.body)+1:]
		compareOptions(t, fmt.Sprintf("README.md:%d (%s)", f.line, directive), fn, parsed, nested, syntax, bulletOptions(after))
	}
	for directive, fn := range readmeDirectives {
		if !seen[directive] {
			t.Errorf("README.md has no ```caddy-d syntax block for %s (parsed by %s)", directive, fn)
		}
	}
}

// TestREADMEOptionsTestFailsWithoutBullet runs the option check on a copy
// of caddyfile.go with one more handler option and one more store option:
// the check must name both as missing from the syntax blocks and the
// bullets.
func TestREADMEOptionsTestFailsWithoutBullet(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("caddyfile.go")
	if err != nil {
		t.Fatal(err)
	}
	// addCase puts a case for opt before the first case of the function
	// declared by decl.
	addCase := func(s, decl, opt string) string {
		i := strings.Index(s, decl)
		if i < 0 {
			t.Fatalf("caddyfile.go no longer declares %q", decl)
		}
		j := strings.Index(s[i:], "\t\tcase \"")
		if j < 0 {
			t.Fatalf("caddyfile.go's %q has no case", decl)
		}
		return s[:i+j] + "\t\tcase \"" + opt + "\":\n\t\t\terr = nil\n" + s[i+j:]
	}
	s := addCase(string(src), "func (h *Handler) UnmarshalCaddyfile(", "new_handler_option")
	s = addCase(s, "func (p *Policy) unmarshalStore(", "new_store_option")
	rec := &recordingT{t: t}
	testREADMEOptions(rec, s, docPages(t)["../README.md"])
	for _, want := range []string{
		`option "new_handler_option" of caddyfile.go's Handler.UnmarshalCaddyfile is not in the README's syntax block`,
		`option "new_handler_option" of caddyfile.go's Handler.UnmarshalCaddyfile is not in the README's bullets`,
		`option "new_store_option" of caddyfile.go's Policy.unmarshalStore is not in the README's bullets`,
	} {
		if !rec.has(want) {
			t.Errorf("the option check did not report %q; it reported:\n%s", want, strings.Join(rec.errs, "\n"))
		}
	}
}

// reporter is what the option check reports to: a *testing.T, or a
// recordingT when the check is expected to fail.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
	Fatal(args ...any)
}

// recordingT collects the errors of a check that is expected to fail,
// without failing the test; Fatal (the source does not parse) is the
// test's own failure.
type recordingT struct {
	t    *testing.T
	errs []string
}

func (r *recordingT) Helper()           { r.t.Helper() }
func (r *recordingT) Fatal(args ...any) { r.t.Helper(); r.t.Fatal(args...) }
func (r *recordingT) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recordingT) has(s string) bool {
	for _, e := range r.errs {
		if strings.Contains(e, s) {
			return true
		}
	}
	return false
}

// TestREADMEShape: the README stays the short page a newcomer reads, with
// a Caddyfile that works near its top.
func TestREADMEShape(t *testing.T) {
	t.Parallel()
	readme := docPages(t)["../README.md"]
	if n := strings.Count(readme, "\n"); n > 300 {
		t.Errorf("README.md has %d lines; keep it at most 300 and move the rest to docs/", n)
	}
	first := 0
	for _, f := range fences(readme) {
		if f.info == "caddyfile" {
			first = f.line
			break
		}
	}
	if first == 0 || first > 100 {
		t.Errorf("README.md's first Caddyfile block starts at line %d; it belongs within the first 100", first)
	}
}

// declaredMetrics returns the lm_warden_* series the package's code
// declares: the names given to prometheus.NewDesc and the Name of the
// histograms' options, read with go/parser.
func declaredMetrics(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var names []string
	name := func(e ast.Expr) {
		if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(s, "lm_warden_") {
				names = append(names, s)
			}
		}
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "NewDesc" && len(n.Args) > 0 {
					name(n.Args[0])
				}
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Name" {
					name(n.Value)
				}
			}
			return true
		})
	}
	if len(names) == 0 {
		t.Fatal("no lm_warden_* series declared in the package")
	}
	return names
}

// TestREADMEMetricsMatchCollector: the README's table of counters names
// every lm_warden_* series the module declares, and no series it does not.
func TestREADMEMetricsMatchCollector(t *testing.T) {
	t.Parallel()
	readme := docPages(t)["../README.md"]
	i := strings.Index(readme, "<!-- replica-counters:")
	j := strings.Index(readme, "<!-- /replica-counters -->")
	if i < 0 || j < i {
		t.Fatal("README.md has no table of counters (<!-- replica-counters: … <!-- /replica-counters -->)")
	}
	var inTable []string
	for _, m := range regexp.MustCompile("`(lm_warden_[a-z_]+)").FindAllStringSubmatch(readme[i:j], -1) {
		inTable = append(inTable, m[1])
	}
	declared := declaredMetrics(t)
	missing, _ := setDiff(declared, inTable)
	for _, m := range missing {
		t.Errorf("the module declares %s; the README's table of counters does not name it", m)
	}
	extra, _ := setDiff(inTable, declared)
	for _, m := range extra {
		t.Errorf("the README's table of counters names %s, which the module does not declare", m)
	}
}

// headingAnchor is the anchor GitHub gives a Markdown heading: lower case,
// punctuation but - and _ dropped, spaces as -.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// prose returns the page's lines outside fenced code blocks, with inline
// code spans blanked, by 1-based line number (0 for lines in a fence).
func prose(page string) []string {
	lines := strings.Split(page, "\n")
	out := make([]string, len(lines))
	inFence := false
	code := regexp.MustCompile("`[^`]*`")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if !inFence {
			out[i] = code.ReplaceAllString(line, "``")
		}
	}
	return out
}

// anchors returns the anchors of a page's headings (a repeated heading's
// later anchors get -1, -2 … as on GitHub).
func anchors(page string) map[string]bool {
	out := map[string]bool{}
	for _, line := range prose(page) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		a := headingAnchor(strings.TrimLeft(line, "#"))
		for n, try := 0, a; ; n++ {
			if !out[try] {
				out[try] = true
				break
			}
			try = a + "-" + strconv.Itoa(n+1)
		}
	}
	return out
}

// TestDocsLinksResolve: every relative link of README.md and docs/*.md
// names a file that exists, and its #anchor a heading of that page.
func TestDocsLinksResolve(t *testing.T) {
	t.Parallel()
	pages := docPages(t)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// Anchors of a heading hold backticked text whole; read them from the
	// raw headings.
	rawAnchors := map[string]map[string]bool{}
	for path, page := range pages {
		a := map[string]bool{}
		for _, line := range strings.Split(page, "\n") {
			if strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "#!") {
				a[headingAnchor(strings.TrimLeft(line, "#"))] = true
			}
		}
		for k := range anchors(page) {
			a[k] = true
		}
		rawAnchors[filepath.Clean(path)] = a
	}
	checked := 0
	for _, path := range sortedKeys(pages) {
		for n, line := range prose(pages[path]) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				resolved := filepath.Clean(path)
				if file != "" {
					resolved = filepath.Join(filepath.Dir(path), file)
					if _, err := os.Stat(resolved); err != nil {
						t.Errorf("%s:%d: link %q: %v", path, n+1, target, err)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				a, ok := rawAnchors[resolved]
				if !ok {
					t.Errorf("%s:%d: link %q: an anchor into a page that is not README.md or docs/*.md", path, n+1, target)
					continue
				}
				if !a[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", path, n+1, target, resolved, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found in README.md and docs/*.md")
	}
}

// benchHeader matches a table header that names a measured figure.
var benchHeader = regexp.MustCompile(`(?i)sessions|tok/min|ttfb|hits|req/s|allocations|benchmark|round \d`)

// numericCell matches a cell that holds a figure.
var numericCell = regexp.MustCompile(`^[*~≈±−-]*[0-9]`)

// benchScripts are the scripts that print bench tables.
const benchScripts = `scripts/(overhead|llmd-sim)`

// benchCommand matches code that names the command that printed a table:
// warden-bench, go run, go test, a script, vllm serve for the measurements
// made on real engines, or warden-bench's subcommand alone.
var benchCommand = regexp.MustCompile("`[^`]*(warden-bench|go run|go test|" + benchScripts + "|vllm serve)[^`]*`|`(sim|demo|run)( |`)")

// benchCommandReach is how many lines above a bench table its command may
// be: the command, or a bench table that carries it (the same run's next
// table), within this many lines of the table, in the same section.
const benchCommandReach = 12

// TestDocsBenchTablesNameTheirCommand: a bench table of README.md or
// docs/*.md (its header names a measured figure, or most of its cells are
// figures) has the command that printed it in code within
// benchCommandReach lines above it in its section, or follows, as close,
// a bench table of the same section that has (docs/contributing.md).
func TestDocsBenchTablesNameTheirCommand(t *testing.T) {
	t.Parallel()
	pages := docPages(t)
	tables := 0
	separator := regexp.MustCompile(`^\|[\s:|-]+\|$`)
	fencedCommand := regexp.MustCompile(`warden-bench|go run|go test|` + benchScripts + `|vllm serve`)
	for _, path := range sortedKeys(pages) {
		lines := strings.Split(pages[path], "\n")
		inFence := false
		carrier := -1 // the last line in this section that names a command, or a named bench table's last line
		for i := 0; i < len(lines); i++ {
			line := lines[i]
			switch {
			case strings.HasPrefix(strings.TrimSpace(line), "```"):
				inFence = !inFence
				continue
			case inFence:
				if fencedCommand.MatchString(line) {
					carrier = i
				}
				continue
			case strings.HasPrefix(line, "#"):
				carrier = -1
				if benchCommand.MatchString(line) {
					carrier = i
				}
				continue
			case benchCommand.MatchString(line):
				carrier = i
			}
			if !strings.HasPrefix(line, "|") || i+1 >= len(lines) || !separator.MatchString(lines[i+1]) {
				continue
			}
			end := i + 2
			cells, figures := 0, 0
			for ; end < len(lines) && strings.HasPrefix(lines[end], "|"); end++ {
				for _, c := range strings.Split(strings.Trim(lines[end], "|"), "|") {
					cells++
					if numericCell.MatchString(strings.TrimSpace(c)) {
						figures++
					}
				}
			}
			if benchHeader.MatchString(line) || (cells > 0 && 2*figures >= cells) {
				tables++
				if carrier < 0 || i-carrier > benchCommandReach {
					t.Errorf("%s:%d: a bench table with no command in code (`warden-bench …`, `go run …`, `go test …`, `scripts/…`) within %d lines above it in its section:\n%s", path, i+1, benchCommandReach, line)
				} else {
					carrier = end - 1
				}
			}
			i = end - 1
		}
	}
	if tables == 0 {
		t.Fatal("no bench table found in README.md and docs/*.md")
	}
}

// TestDocsStartWithTheirQuestion: every page of docs/ says first what it
// answers: its title is a question, or the line under it is.
func TestDocsStartWithTheirQuestion(t *testing.T) {
	t.Parallel()
	pages := docPages(t)
	for _, path := range sortedKeys(pages) {
		if filepath.Base(path) == "README.md" {
			continue
		}
		var lines []string
		for _, l := range strings.Split(pages[path], "\n") {
			if strings.TrimSpace(l) != "" {
				lines = append(lines, strings.TrimSpace(l))
			}
			if len(lines) == 2 {
				break
			}
		}
		asks := func(l string) bool { return strings.HasSuffix(strings.TrimRight(l, "*_"), "?") }
		if len(lines) == 0 || !strings.HasPrefix(lines[0], "# ") || !(asks(lines[0]) || (len(lines) > 1 && asks(lines[1]))) {
			t.Errorf("%s: start with the question the page answers (its title, or the line under it)", path)
		}
	}
}

// readmeJSONExceptions are the options whose name in Caddy's JSON is not
// theirs, as the README says.
var readmeJSONExceptions = map[string][]string{"trace": {"trace_file", "trace_max_size"}}

// TestREADMEOptionsNameTheirJSON: every option of the README's syntax
// blocks is a field of that name in Caddy's JSON (the json tags of
// Handler, Policy and the store's config), but the exceptions the README
// names.
func TestREADMEOptionsNameTheirJSON(t *testing.T) {
	t.Parallel()
	tags := func(v any) map[string]bool {
		out := map[string]bool{}
		ty := reflect.TypeOf(v)
		for i := range ty.NumField() {
			if name, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
				out[name] = true
			}
		}
		return out
	}
	types := map[string]map[string]bool{
		"lm_warden":           tags(Handler{}),
		"lb_policy lm_warden": tags(Policy{}),
		"store":               tags(StoreConfig{}),
	}
	readme := docPages(t)["../README.md"]
	checked := 0
	for _, f := range fences(readme) {
		if f.info != "caddy-d" {
			continue
		}
		directive, tree := syntaxOptions(f.body)
		check := func(block string, opts []string) {
			for _, o := range opts {
				checked++
				names, ok := readmeJSONExceptions[o]
				if !ok {
					names = []string{o}
				}
				for _, n := range names {
					if !types[block][n] {
						t.Errorf("README.md:%d: option %q of %s has no JSON field %q", f.line, o, block, n)
					}
				}
			}
		}
		check(directive, tree.options)
		for opt, sub := range tree.nested {
			check(opt, sub.options)
		}
	}
	if checked < 30 {
		t.Errorf("checked %d options; the README's syntax blocks hold more", checked)
	}
	if !strings.Contains(readme, "`trace_file` and `trace_max_size`") {
		t.Error("the README does not name trace's JSON fields")
	}
}
