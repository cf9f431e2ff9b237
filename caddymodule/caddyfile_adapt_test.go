package caddymodule

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestCaddyfileAdaptsToSavedJSON adapts Caddyfile.example and the README's
// Caddyfile snippets and compares the JSON with testdata/adapt/*.json, so a
// change to the Caddyfile parser that changes what a configuration means
// shows here. The snippets that are fragments stand in testdata/adapt inside
// the smallest Caddyfile that holds them; the test checks that each README
// snippet is still there, word for word.
func TestCaddyfileAdaptsToSavedJSON(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := regexp.MustCompile("(?s)```caddyfile\n(.*?)```").FindAllSubmatch(readme, -1)
	cases := map[string]string{"../Caddyfile.example": "testdata/adapt/Caddyfile.example.json"}
	for i := range snippets {
		name := filepath.Join("testdata/adapt", "readme"+string(rune('1'+i)))
		cases[name+".Caddyfile"] = name + ".json"
	}
	if len(snippets) != 3 {
		t.Errorf("README has %d caddyfile snippets, testdata/adapt holds 3: add or remove readmeN.Caddyfile and its JSON", len(snippets))
	}
	words := func(b []byte) string { return strings.Join(strings.Fields(string(b)), " ") }
	for i, s := range snippets {
		path := filepath.Join("testdata/adapt", "readme"+string(rune('1'+i))+".Caddyfile")
		body, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("README snippet %d: %v", i+1, err)
			continue
		}
		if !strings.Contains(words(body), words(s[1])) {
			t.Errorf("%s no longer holds README snippet %d:\n%s", path, i+1, s[1])
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
