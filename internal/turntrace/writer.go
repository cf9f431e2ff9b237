package turntrace

import (
	"bufio"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Entry is what the request path hands a Writer for one finished turn:
// the raw keys (hashed by the writer's goroutine, never written) and the
// figures. It holds no pointer the request keeps using.
type Entry struct {
	Key, Parent string
	Model       string
	Start, End  time.Time
	FirstByte   time.Time // zero when the answer was not streamed
	Prompt      int64
	Cached      int64
	CachedKnown bool
	Output      int64
	Agent       bool
	Side        bool
	Compacted   bool

	flushed chan struct{} // Flush's mark: closed once the lines before it are in the file
}

// Queue is how many turns wait for the writer's goroutine before further
// ones are dropped (and counted): far more than the turns that end in the
// time a write takes.
const Queue = 4096

// Writer appends turns to a trace file from one goroutine of its own, so
// the request path only copies an Entry into a channel. When the file
// reaches its size cap it is renamed to the same path with ".1" appended
// (replacing an older one) and a new file is started: the trace keeps
// going and never takes more than twice the cap on disk.
type Writer struct {
	path string
	max  atomic.Int64 // the size cap in bytes; 0 = none
	key  []byte       // HMAC key of the conversation hashes

	ch   chan Entry
	quit chan struct{}
	done chan struct{}
	once sync.Once

	closed                atomic.Bool
	written, full, failed atomic.Uint64
	rotations             atomic.Uint64

	// the goroutine's own
	f    *os.File
	bw   *bufio.Writer
	size int64
	ends map[[8]byte]time.Time // hashed conversation key -> end of its latest turn
	mac  hash.Hash
	kb   []byte // the key being hashed
	sum  [sha256.Size]byte
	line []byte
	err  error // the last write error, logged once by the caller (Err)
	mu   sync.Mutex
}

// Open opens (appending, creating it with mode 0600) the trace file at
// path and starts the writer's goroutine. maxSize is the size cap in
// bytes, 0 for none.
func Open(path string, maxSize int64) (*Writer, error) {
	if maxSize < 0 {
		return nil, fmt.Errorf("trace size cap %d: must not be negative", maxSize)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	w := &Writer{path: path, key: key, ch: make(chan Entry, Queue), quit: make(chan struct{}),
		done: make(chan struct{}), ends: make(map[[8]byte]time.Time), mac: hmac.New(sha256.New, key)}
	w.max.Store(maxSize)
	if err := w.open(); err != nil {
		return nil, err
	}
	go w.run()
	return w, nil
}

func (w *Writer) open() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening trace file: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening trace file: %w", err)
	}
	w.f, w.size = f, fi.Size()
	if w.bw == nil {
		w.bw = bufio.NewWriterSize(f, 32<<10)
	} else {
		w.bw.Reset(f)
	}
	return nil
}

// Path returns the trace file's path.
func (w *Writer) Path() string { return w.path }

// SetMaxSize changes the size cap (a reloaded configuration's).
func (w *Writer) SetMaxSize(n int64) { w.max.Store(max(n, 0)) }

// Add queues one turn for writing without blocking: when the queue is
// full, or the writer closed, the turn is dropped and counted (Dropped).
func (w *Writer) Add(e *Entry) {
	if w.closed.Load() {
		w.full.Add(1)
		return
	}
	select {
	case w.ch <- *e:
	default:
		w.full.Add(1)
	}
}

// Stats are a writer's counts.
type Stats struct {
	Written   uint64 // turns written
	Dropped   uint64 // turns dropped: the queue was full or the writer closed
	Failed    uint64 // turns lost to a write error
	Rotations uint64 // times the file reached its cap and was rotated
}

// Stats returns the writer's counts.
func (w *Writer) Stats() Stats {
	return Stats{Written: w.written.Load(), Dropped: w.full.Load(), Failed: w.failed.Load(), Rotations: w.rotations.Load()}
}

// Err returns the last write error, nil when none.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Close writes the turns queued so far, closes the file and stops the
// goroutine. Turns added after Close are dropped. It is safe to call more
// than once.
func (w *Writer) Close() error {
	w.once.Do(func() {
		w.closed.Store(true)
		close(w.quit)
	})
	<-w.done
	return w.Err()
}

// Flush waits until every turn queued before it is in the file. For
// tests, and for reading a trace while the module runs.
func (w *Writer) Flush() {
	done := make(chan struct{})
	select {
	case w.ch <- Entry{flushed: done}:
	case <-w.done:
		return
	}
	select {
	case <-done:
	case <-w.done:
	}
}

func (w *Writer) run() {
	defer close(w.done)
	for {
		select {
		case e := <-w.ch:
			w.write(&e)
		case <-w.quit:
			for {
				select {
				case e := <-w.ch:
					w.write(&e)
					continue
				default:
				}
				break
			}
			w.mu.Lock()
			w.setErr(w.bw.Flush())
			w.setErr(w.f.Close())
			w.mu.Unlock()
			return
		}
	}
}

func (w *Writer) setErr(err error) {
	if err != nil {
		w.err = err
	}
}

// sweepAt bounds the conversations whose last end the writer keeps: past
// it, those quiet for longer than forgetAfter are forgotten (their next
// turn is written as a first one).
const (
	sweepAt     = 1 << 16
	forgetAfter = 6 * time.Hour
)

// write turns one entry into a line; the goroutine's only. In steady
// state it allocates nothing: the hashes are fixed-size keys, the line is
// built in a reused buffer.
func (w *Writer) write(e *Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e.flushed != nil {
		w.setErr(w.bw.Flush())
		close(e.flushed)
		return
	}
	conv := w.hash(e.Key)
	var parent [8]byte
	if e.Parent != "" {
		parent = w.hash(e.Parent)
	}
	last, seen := w.ends[conv]
	var pause int64
	if seen {
		pause = e.Start.Sub(last).Milliseconds()
	}
	if !seen || e.End.After(last) {
		if !seen && len(w.ends) >= sweepAt {
			w.sweep(e.End)
		}
		w.ends[conv] = e.End
	}
	w.line = appendEntry(w.line[:0], e, conv, parent, e.Parent != "", !seen, pause)
	if m := w.max.Load(); m > 0 && w.size > 0 && w.size+int64(len(w.line)) > m {
		if err := w.rotate(); err != nil {
			w.failed.Add(1)
			w.setErr(err)
			return
		}
	}
	if _, err := w.bw.Write(w.line); err != nil {
		w.failed.Add(1)
		w.setErr(err)
		return
	}
	w.size += int64(len(w.line))
	w.written.Add(1)
	if len(w.ch) == 0 {
		// nothing else waiting: the line goes to the file now, so a
		// reader sees turns within a moment of their end
		w.setErr(w.bw.Flush())
	}
}

// sweep forgets the conversations quiet for longer than forgetAfter, and
// all of them when that leaves too many.
func (w *Writer) sweep(now time.Time) {
	for k, end := range w.ends {
		if now.Sub(end) > forgetAfter {
			delete(w.ends, k)
		}
	}
	if len(w.ends) >= sweepAt {
		clear(w.ends)
	}
}

// appendEntry appends e's line: the fields of Turn, in its order, with
// the same names and omissions (Read parses it with encoding/json).
func appendEntry(b []byte, e *Entry, conv, parent [8]byte, hasParent, first bool, pause int64) []byte {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, Version, 10)
	b = append(b, `,"conv":"`...)
	b = hex.AppendEncode(b, conv[:])
	b = append(b, '"')
	if hasParent {
		b = append(b, `,"parent":"`...)
		b = hex.AppendEncode(b, parent[:])
		b = append(b, '"')
	}
	if e.Model != "" {
		b = append(b, `,"model":`...)
		b = appendString(b, e.Model)
	}
	b = append(b, `,"at":"`...)
	b = e.Start.UTC().Round(time.Millisecond).AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if first {
		b = append(b, `,"first":true`...)
	}
	b = append(b, `,"pause_ms":`...)
	b = strconv.AppendInt(b, pause, 10)
	b = append(b, `,"prompt":`...)
	b = strconv.AppendInt(b, e.Prompt, 10)
	if e.CachedKnown {
		b = append(b, `,"cached":`...)
		b = strconv.AppendInt(b, min(max(e.Cached, 0), e.Prompt), 10)
	}
	b = append(b, `,"output":`...)
	b = strconv.AppendInt(b, max(e.Output, 0), 10)
	b = append(b, `,"dur_ms":`...)
	b = strconv.AppendInt(b, max(e.End.Sub(e.Start).Milliseconds(), 0), 10)
	if !e.FirstByte.IsZero() {
		b = append(b, `,"ttft_ms":`...)
		b = strconv.AppendInt(b, max(e.FirstByte.Sub(e.Start).Milliseconds(), 0), 10)
	}
	for _, m := range [...]struct {
		on   bool
		name string
	}{{e.Agent, `,"agent":true`}, {e.Side, `,"side":true`}, {e.Compacted, `,"compacted":true`}} {
		if m.on {
			b = append(b, m.name...)
		}
	}
	return append(b, "}\n"...)
}

// appendString appends s as a JSON string: quotes, backslashes and
// control characters escaped, the rest as it is.
func appendString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c == 0x7f:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// rotate renames the full file to path.1 and starts a new one.
func (w *Writer) rotate() error {
	if err := w.bw.Flush(); err != nil {
		return err
	}
	if err := w.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(w.path, w.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rotating trace file: %w", err)
	}
	w.rotations.Add(1)
	return w.open()
}

// hash is the conversation key's keyed hash: HMAC-SHA256, its first 8
// bytes (written in hex).
func (w *Writer) hash(key string) [8]byte {
	w.mac.Reset()
	w.kb = append(w.kb[:0], key...)
	w.mac.Write(w.kb)
	var out [8]byte
	copy(out[:], w.mac.Sum(w.sum[:0]))
	return out
}
