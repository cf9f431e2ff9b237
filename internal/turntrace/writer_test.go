package turntrace

import (
	"bytes"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// BenchmarkWriterLine is the writer goroutine's work per turn: hashing
// two keys and building the line (no file write).
func BenchmarkWriterLine(b *testing.B) {
	w, err := Open(filepath.Join(b.TempDir(), "t.jsonl"), 0)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	e := Entry{Key: "42eaa708-cbc4-4714-bf36-9ce29ce6f84d/agent-a1b2c3", Parent: "42eaa708-cbc4-4714-bf36-9ce29ce6f84d",
		Model: "qwen3-4b", Start: t0, End: t0.Add(3 * time.Second), FirstByte: t0.Add(time.Second),
		Prompt: 18000, Cached: 17000, CachedKnown: true, Output: 200, Agent: true}
	b.ReportAllocs()
	for b.Loop() {
		conv, parent := w.hash(e.Key), w.hash(e.Parent)
		w.line = appendEntry(w.line[:0], &e, conv, parent, true, false, 1200)
	}
}

// TestLineIsTurnJSON: the writer's own encoding parses back into the Turn
// it stands for, names escaped.
func TestLineIsTurnJSON(t *testing.T) {
	for _, model := range []string{"qwen3-4b", `odd "name" \ with` + "\x01\x7f tabs\t and é"} {
		e := Entry{Key: "k", Parent: "p", Model: model, Start: t0, End: t0.Add(2500 * time.Millisecond),
			FirstByte: t0.Add(time.Second), Prompt: 100, Cached: 150, CachedKnown: true, Output: 7, Agent: true, Compacted: true}
		var conv, parent [8]byte
		conv[0], parent[7] = 0xab, 0x01
		line := appendEntry(nil, &e, conv, parent, true, true, 0)
		turns, err := Read(bytes.NewReader(line))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		c := int64(100)
		want := Turn{V: 1, Conv: "ab00000000000000", Parent: "0000000000000001", Model: model, At: t0, First: true,
			Prompt: 100, Cached: &c, Output: 7, DurMS: 2500, TTFTMS: 1000, Agent: true, Compacted: true}
		if !reflect.DeepEqual(turns[0], want) {
			t.Errorf("%s\n got %+v\nwant %+v", line, turns[0], want)
		}
	}
}

// TestWriterDropsWhenFull: with the writer's goroutine held up, Add never
// waits: what the queue cannot take is dropped and counted, the rest
// written once the goroutine goes on.
func TestWriterDropsWhenFull(t *testing.T) {
	w, err := Open(filepath.Join(t.TempDir(), "t.jsonl"), 0)
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock() // the goroutine stops at its first write
	e := Entry{Key: "k", Start: t0, End: t0, Prompt: 1}
	const n = Queue + 100
	for range n {
		w.Add(&e)
	}
	w.mu.Unlock()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s := w.Stats()
	// the goroutine may have taken one entry out before it blocked
	if s.Written+s.Dropped != n || s.Dropped < 99 || s.Dropped > 100 {
		t.Fatalf("stats %+v after %d adds with a queue of %d", s, n, Queue)
	}
}
