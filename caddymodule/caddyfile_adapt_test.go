package caddymodule

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// savedSnippets names the pages whose Caddyfile blocks are also adapted to
// saved JSON, by the prefix of their files in testdata/adapt: block N of a
// page stands in <prefix>N.Caddyfile (a fragment inside the smallest
// Caddyfile that holds it) beside <prefix>N.json.
var savedSnippets = []struct{ page, prefix string }{
	{"../README.md", "readme"},
	{"../docs/failures.md", "failures"},
	{"../docs/front-ends.md", "front-ends"},
}

// TestCaddyfileAdaptsToSavedJSON adapts Caddyfile.example and the
// Caddyfile blocks of the README, docs/failures.md and docs/front-ends.md
// and compares the JSON with testdata/adapt/*.json, so a change to the
// Caddyfile parser that changes what a configuration means shows here. The
// test checks that each block is still in its testdata file, word for word.
// (TestDocsCaddyfilesAdapt checks that every block of every page adapts.)
func TestCaddyfileAdaptsToSavedJSON(t *testing.T) {
	t.Parallel()
	cases := map[string]string{"../Caddyfile.example": "testdata/adapt/Caddyfile.example.json"}
	words := func(b []byte) string { return strings.Join(strings.Fields(string(b)), " ") }
	for _, src := range savedSnippets {
		page, err := os.ReadFile(src.page)
		if err != nil {
			t.Fatal(err)
		}
		snippets := regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllSubmatch(page, -1)
		saved, err := filepath.Glob(filepath.Join("testdata/adapt", src.prefix+"[0-9]*.Caddyfile"))
		if err != nil {
			t.Fatal(err)
		}
		if len(snippets) != len(saved) {
			t.Errorf("%s has %d caddyfile blocks, testdata/adapt holds %d %sN.Caddyfile: add or remove one and its JSON", src.page, len(snippets), len(saved), src.prefix)
		}
		for i, s := range snippets {
			name := filepath.Join("testdata/adapt", src.prefix+strconv.Itoa(i+1))
			cases[name+".Caddyfile"] = name + ".json"
			body, err := os.ReadFile(name + ".Caddyfile")
			if err != nil {
				t.Errorf("%s block %d: %v", src.page, i+1, err)
				continue
			}
			if !strings.Contains(words(body), words(s[1])) {
				t.Errorf("%s.Caddyfile no longer holds %s block %d:\n%s", name, src.page, i+1, s[1])
			}
		}
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	for in, want := range cases {
		t.Run(filepath.Base(in), func(t *testing.T) {
			body, err := os.ReadFile(in)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := adapter.Adapt(body, map[string]any{"filename": in})
			if err != nil {
				t.Fatal(err)
			}
			wantJSON, err := os.ReadFile(want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(bytes.TrimSpace(got), bytes.TrimSpace(wantJSON)) {
				t.Errorf("%s adapts to\n%s\nwant (%s)\n%s", in, got, want, wantJSON)
			}
		})
	}
}
