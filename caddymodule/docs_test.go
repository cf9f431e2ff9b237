package caddymodule

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

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
	s := strings.Replace(string(src), "\t\tcase \"body_keys\":", "\t\tcase \"new_handler_option\":\n\t\t\terr = nil\n\t\tcase \"body_keys\":", 1)
	s = strings.Replace(s, "\t\tcase \"tls_server_name\":", "\t\tcase \"new_store_option\":\n\t\t\terr = nil\n\t\tcase \"tls_server_name\":", 1)
	if s == string(src) {
		t.Fatal("caddyfile.go no longer has the cases this test adds options beside")
	}
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
