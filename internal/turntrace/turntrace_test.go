package turntrace

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 5, 23, 40, 0, 0, time.UTC)

// TestWriterLines: what a writer makes of a conversation's turns, a side
// request beside its first turn and a sub-agent: hashed keys (the same for
// one key, never the key itself), pauses from the latest end, marks, and
// a file that Read gives back in start order.
func TestWriterLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	w, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	const sess = "42eaa708-cbc4-4714-bf36-9ce29ce6f84d"
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	entries := []Entry{
		// the title request, beside the first turn: it ends first
		{Key: sess, Start: at(0), End: at(0.5), Prompt: 300, Output: 10, Side: true, Model: "qwen3-4b"},
		{Key: sess, Start: at(0.01), End: at(3), FirstByte: at(1), Prompt: 18000, Cached: 0, CachedKnown: true, Output: 200},
		{Key: sess, Start: at(7), End: at(9), Prompt: 18300, Cached: 17984, CachedKnown: true, Output: 150},
		{Key: sess + "/agent-1", Parent: sess, Start: at(9.5), End: at(11), Prompt: 9000, Output: 80, Agent: true},
		{Key: sess, Start: at(12), End: at(13), Prompt: 4000, Cached: 0, CachedKnown: true, Output: 90, Compacted: true},
	}
	for i := range entries {
		w.Add(&entries[i])
	}
	w.Flush()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "42eaa708") || strings.Contains(string(raw), "agent-1") {
		t.Fatalf("a raw key in the trace:\n%s", raw)
	}
	if n := bytes.Count(raw, []byte("\n")); n != len(entries) {
		t.Fatalf("%d lines, want %d:\n%s", n, len(entries), raw)
	}
	turns, err := Read(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	main := turns[0].Conv
	want := []struct {
		conv      string
		first     bool
		pause     int64
		cached    int64 // -1 unknown
		ttft      int64
		side, cmp bool
	}{
		{main, true, 0, -1, 0, true, false},
		{main, false, -490, 0, 990, false, false}, // started before the title ended
		{main, false, 4000, 17984, 0, false, false},
		{"", true, 0, -1, 0, false, false},
		// 12 s from the end of the conversation's latest turn at 9 s (the
		// sub-agent is a conversation of its own)
		{main, false, 3000, 0, 0, false, true},
	}
	for i, tr := range turns {
		w := want[i]
		if i == 3 {
			if tr.Conv == main || tr.Parent != main || !tr.Agent {
				t.Errorf("sub-agent: conv %s parent %s agent %v; want its own conv, parent %s", tr.Conv, tr.Parent, tr.Agent, main)
			}
		} else if tr.Conv != w.conv {
			t.Errorf("turn %d: conv %s, want %s", i, tr.Conv, w.conv)
		}
		if tr.First != w.first || tr.PauseMS != w.pause || tr.CachedOr(-1) != w.cached || tr.TTFTMS != w.ttft || tr.Side != w.side || tr.Compacted != w.cmp {
			t.Errorf("turn %d: %+v (cached %d), want %+v", i, tr, tr.CachedOr(-1), w)
		}
		if tr.Prompt != entries[i].Prompt || tr.Output != entries[i].Output || !tr.At.Equal(entries[i].Start) {
			t.Errorf("turn %d: prompt %d output %d at %v; want %d %d %v", i, tr.Prompt, tr.Output, tr.At, entries[i].Prompt, entries[i].Output, entries[i].Start)
		}
	}
	if len(main) != 16 {
		t.Errorf("conv %q: want 16 hex digits", main)
	}
	if s := w.Stats(); s.Written != uint64(len(entries)) || s.Dropped != 0 || s.Failed != 0 {
		t.Errorf("stats %+v", s)
	}
	// another writer hashes with another key: traces cannot be matched
	w2, err := Open(filepath.Join(t.TempDir(), "other.jsonl"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if w2.hash(sess) == w.hash(sess) {
		t.Error("two writers hash a key alike")
	}
}

// TestWriterRotates: past the cap the file moves to path.1 once and a new
// one starts; neither passes the cap, and no turn is lost.
func TestWriterRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	const capBytes = 2000
	w, err := Open(path, capBytes)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		e := Entry{Key: "s", Start: t0.Add(time.Duration(i) * time.Second), End: t0.Add(time.Duration(i)*time.Second + time.Millisecond), Prompt: 100, Output: 5}
		w.Add(&e)
		w.Flush()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	if len(cur) > capBytes || len(old) > capBytes || len(old) == 0 {
		t.Fatalf("sizes %d and %d, cap %d", len(cur), len(old), capBytes)
	}
	s := w.Stats()
	lines := bytes.Count(cur, []byte("\n")) + bytes.Count(old, []byte("\n"))
	if s.Rotations < 1 || s.Written != n {
		t.Fatalf("stats %+v", s)
	}
	// the older turns went with the earlier rotations
	if lines >= n || lines < 2 {
		t.Fatalf("%d lines kept of %d", lines, n)
	}
	if _, err := Read(bytes.NewReader(append(old, cur...))); err != nil {
		t.Fatal(err)
	}
}

// TestWriterClosed: a turn added after Close is dropped and counted, never
// a panic; Close twice is fine.
func TestWriterClosed(t *testing.T) {
	w, err := Open(filepath.Join(t.TempDir(), "t.jsonl"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	e := Entry{Key: "k", Start: t0, End: t0, Prompt: 1}
	w.Add(&e)
	w.Flush()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if s := w.Stats(); s.Dropped != 1 || s.Written != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "no", "such", "dir", "t.jsonl"), 0); err == nil {
		t.Error("opened a file in a missing directory")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "t.jsonl"), -1); err == nil {
		t.Error("accepted a negative cap")
	}
}

func TestReadErrors(t *testing.T) {
	good := `{"v":1,"conv":"a","at":"2026-12-05T23:40:00Z","pause_ms":0,"prompt":10,"output":1,"dur_ms":5}`
	for _, c := range []struct{ name, in, want string }{
		{"not json", "hello", "line 1"},
		{"version", strings.Replace(good, `"v":1`, `"v":2`, 1), "version 2"},
		{"no conv", strings.Replace(good, `"conv":"a"`, `"conv":""`, 1), "no conv"},
		{"no at", strings.Replace(good, `"at":"2026-12-05T23:40:00Z",`, ``, 1), "no at"},
		{"prompt", strings.Replace(good, `"prompt":10`, `"prompt":0`, 1), "prompt 0"},
		{"cached over", strings.Replace(good, `"output":1`, `"output":1,"cached":11`, 1), "cached 11"},
		{"unknown field", strings.Replace(good, `"output":1`, `"output":1,"text":"hi"`, 1), "unknown field"},
		{"two values", good + " {}", "more than one"},
		{"second line", good + "\n[]", "line 2"},
		{"too long", good + "\n" + strings.Repeat(" ", maxLine+1), "longer than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Read(strings.NewReader(c.in))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
	turns, err := Read(strings.NewReader("\n" + good + "\n\n"))
	if err != nil || len(turns) != 1 {
		t.Fatalf("%d turns, %v", len(turns), err)
	}
}

func FuzzRead(f *testing.F) {
	f.Add(`{"v":1,"conv":"a","at":"2026-12-05T23:40:00Z","pause_ms":0,"prompt":10,"cached":3,"output":1,"dur_ms":5,"side":true}`)
	f.Add("{}\n{\"v\":1}")
	f.Fuzz(func(t *testing.T, in string) {
		turns, err := Read(strings.NewReader(in))
		if err != nil {
			return
		}
		for i := range turns {
			if err := turns[i].Validate(); err != nil {
				t.Fatalf("Read returned an invalid turn: %v", err)
			}
			if i > 0 && turns[i].At.Before(turns[i-1].At) {
				t.Fatal("not in start order")
			}
		}
	})
}
