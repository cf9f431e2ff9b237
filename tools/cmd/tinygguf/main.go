// Command tinygguf writes a tiny llama model with random weights as a GGUF
// file, for running a real llama.cpp llama-server in tests without
// downloading a model:
//
//	tinygguf -vocab models/ggml-vocab-llama-spm.gguf -o tiny.gguf
//
// The tokenizer (every tokenizer.* key) is copied from a vocab-only GGUF,
// such as the ggml-vocab-llama-spm.gguf that llama.cpp's source ships; the
// architecture keys and the tensors (F16 matrices, F32 norms, drawn from a
// seeded normal distribution) are written here, following the GGUF format
// (ggml/include/gguf.h, docs/gguf.md: version 3, little-endian, 32-byte
// aligned data). The text it generates is noise; its prompt processing
// costs what a model of its size costs, which is what prefix caching saves.
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
)

// GGUF metadata value types (gguf.h, enum gguf_type).
const (
	tUint8 uint32 = iota
	tInt8
	tUint16
	tInt16
	tUint32
	tInt32
	tFloat32
	tBool
	tString
	tArray
	tUint64
	tInt64
	tFloat64
)

// ggml tensor types (ggml.h, enum ggml_type).
const (
	ggmlF32 uint32 = 0
	ggmlF16 uint32 = 1
)

const alignment = 32

// kv is one metadata pair, its value kept as the raw bytes of its type.
type kv struct {
	key  string
	typ  uint32
	body []byte // the encoded value, after the type
}

func main() {
	vocab := flag.String("vocab", "", "vocab-only GGUF to copy the tokenizer from (required)")
	out := flag.String("o", "tiny.gguf", "output file")
	embd := flag.Int("embd", 512, "embedding length")
	layers := flag.Int("layers", 6, "blocks")
	heads := flag.Int("heads", 8, "attention heads")
	ff := flag.Int("ff", 1024, "feed-forward length")
	ctx := flag.Int("ctx", 32768, "context length (training)")
	seed := flag.Uint64("seed", 1, "random seed of the weights")
	flag.Parse()
	if *vocab == "" {
		fmt.Fprintln(os.Stderr, "tinygguf: -vocab is required")
		os.Exit(2)
	}
	if err := run(*vocab, *out, *embd, *layers, *heads, *ff, *ctx, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "tinygguf:", err)
		os.Exit(1)
	}
}

func run(vocabPath, outPath string, embd, layers, heads, ff, ctx int, seed uint64) error {
	if embd <= 0 || layers <= 0 || heads <= 0 || ff <= 0 || ctx <= 0 || embd%heads != 0 {
		return fmt.Errorf("bad shape: embd %d layers %d heads %d ff %d ctx %d (embd must divide by heads)", embd, layers, heads, ff, ctx)
	}
	f, err := os.Open(vocabPath)
	if err != nil {
		return err
	}
	defer f.Close()
	meta, err := readMeta(bufio.NewReader(f))
	if err != nil {
		return fmt.Errorf("%s: %w", vocabPath, err)
	}
	var tok []kv
	nVocab := 0
	for _, m := range meta {
		if strings.HasPrefix(m.key, "tokenizer.") {
			tok = append(tok, m)
			if m.key == "tokenizer.ggml.tokens" && m.typ == tArray && len(m.body) >= 12 {
				nVocab = int(binary.LittleEndian.Uint64(m.body[4:12]))
			}
		}
	}
	if nVocab == 0 {
		return fmt.Errorf("%s has no tokenizer.ggml.tokens", vocabPath)
	}

	u32 := func(k string, v uint32) kv { return kv{k, tUint32, binary.LittleEndian.AppendUint32(nil, v)} }
	f32 := func(k string, v float32) kv {
		return kv{k, tFloat32, binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))}
	}
	str := func(k, v string) kv { return kv{k, tString, appendString(nil, v)} }
	head := []kv{
		str("general.architecture", "llama"),
		str("general.name", fmt.Sprintf("tiny-random-llama-%dx%d", layers, embd)),
		u32("general.alignment", alignment),
		u32("general.file_type", 1), // mostly F16
		u32("llama.context_length", uint32(ctx)),
		u32("llama.embedding_length", uint32(embd)),
		u32("llama.block_count", uint32(layers)),
		u32("llama.feed_forward_length", uint32(ff)),
		u32("llama.attention.head_count", uint32(heads)),
		u32("llama.attention.head_count_kv", uint32(heads)),
		u32("llama.rope.dimension_count", uint32(embd/heads)),
		f32("llama.attention.layer_norm_rms_epsilon", 1e-5),
		u32("llama.vocab_size", uint32(nVocab)),
	}
	meta = append(head, tok...)

	type tensor struct {
		name string
		dims []uint64 // ggml order: ne0 (row length) first
		typ  uint32
	}
	var ts []tensor
	mat := func(name string, ne0, ne1 int) {
		ts = append(ts, tensor{name, []uint64{uint64(ne0), uint64(ne1)}, ggmlF16})
	}
	vec := func(name string, n int) { ts = append(ts, tensor{name, []uint64{uint64(n)}, ggmlF32}) }
	mat("token_embd.weight", embd, nVocab)
	vec("output_norm.weight", embd)
	for i := range layers {
		p := fmt.Sprintf("blk.%d.", i)
		vec(p+"attn_norm.weight", embd)
		mat(p+"attn_q.weight", embd, embd)
		mat(p+"attn_k.weight", embd, embd)
		mat(p+"attn_v.weight", embd, embd)
		mat(p+"attn_output.weight", embd, embd)
		vec(p+"ffn_norm.weight", embd)
		mat(p+"ffn_gate.weight", embd, ff)
		mat(p+"ffn_up.weight", embd, ff)
		mat(p+"ffn_down.weight", ff, embd)
	}
	// output.weight is absent: llama.cpp ties it to token_embd.

	o, err := os.Create(outPath)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(o, 1<<20)
	var hdr []byte
	hdr = append(hdr, "GGUF"...)
	hdr = binary.LittleEndian.AppendUint32(hdr, 3)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(len(ts)))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(len(meta)))
	for _, m := range meta {
		hdr = appendString(hdr, m.key)
		hdr = binary.LittleEndian.AppendUint32(hdr, m.typ)
		hdr = append(hdr, m.body...)
	}
	size := func(t tensor) uint64 {
		n := uint64(1)
		for _, d := range t.dims {
			n *= d
		}
		if t.typ == ggmlF16 {
			return 2 * n
		}
		return 4 * n
	}
	var off uint64
	for _, t := range ts {
		hdr = appendString(hdr, t.name)
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(t.dims)))
		for _, d := range t.dims {
			hdr = binary.LittleEndian.AppendUint64(hdr, d)
		}
		hdr = binary.LittleEndian.AppendUint32(hdr, t.typ)
		hdr = binary.LittleEndian.AppendUint64(hdr, off)
		off += pad(size(t))
	}
	hdr = append(hdr, make([]byte, pad(uint64(len(hdr)))-uint64(len(hdr)))...)
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	buf := make([]byte, 0, 1<<16)
	for _, t := range ts {
		n := size(t)
		written := uint64(0)
		for written < n {
			buf = buf[:0]
			for len(buf) < cap(buf)-4 && written+uint64(len(buf)) < n {
				if t.typ == ggmlF32 {
					// norms near 1, as a trained model's are
					buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(1+0.05*rng.NormFloat64())))
				} else {
					buf = binary.LittleEndian.AppendUint16(buf, f16(float32(0.02*rng.NormFloat64())))
				}
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
			written += uint64(len(buf))
		}
		if _, err := w.Write(make([]byte, pad(n)-n)); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}

func pad(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// f16 converts to IEEE half precision, rounding to nearest; values below
// the normal range flush to zero (the weights here are far from it).
func f16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int((b>>23)&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp <= 0:
		return sign
	case exp >= 31:
		return sign | 0x7c00
	}
	h := sign | uint16(exp)<<10 | uint16(mant>>13)
	if mant&0x1000 != 0 { // round half up
		h++
	}
	return h
}

// readMeta reads a GGUF header's metadata (versions 2 and 3), keeping each
// value's encoded bytes.
func readMeta(r *bufio.Reader) ([]kv, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, err
	}
	if string(magic[:]) != "GGUF" {
		return nil, errors.New("not a GGUF file")
	}
	var version uint32
	var nTensors, nKV uint64
	for _, p := range []any{&version, &nTensors, &nKV} {
		if err := binary.Read(r, binary.LittleEndian, p); err != nil {
			return nil, err
		}
	}
	if version < 2 || version > 3 {
		return nil, fmt.Errorf("GGUF version %d (want 2 or 3)", version)
	}
	if nKV > 1<<20 {
		return nil, fmt.Errorf("%d metadata keys", nKV)
	}
	out := make([]kv, 0, nKV)
	for range nKV {
		key, err := readString(r, nil)
		if err != nil {
			return nil, err
		}
		var typ uint32
		if err := binary.Read(r, binary.LittleEndian, &typ); err != nil {
			return nil, err
		}
		body, err := readValue(r, typ, []byte{}) // non-nil: keep strings' length
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", key, err)
		}
		out = append(out, kv{string(key), typ, body})
	}
	return out, nil
}

// readString reads a GGUF string, appending its encoding (length and bytes)
// to raw, and returns the bytes alone when raw is nil.
func readString(r io.Reader, raw []byte) ([]byte, error) {
	var n uint64
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return nil, err
	}
	if n > 1<<30 {
		return nil, fmt.Errorf("string of %d bytes", n)
	}
	s := make([]byte, n)
	if _, err := io.ReadFull(r, s); err != nil {
		return nil, err
	}
	if raw == nil {
		return s, nil
	}
	return append(binary.LittleEndian.AppendUint64(raw, n), s...), nil
}

var fixedSize = map[uint32]int{
	tUint8: 1, tInt8: 1, tBool: 1, tUint16: 2, tInt16: 2,
	tUint32: 4, tInt32: 4, tFloat32: 4, tUint64: 8, tInt64: 8, tFloat64: 8,
}

// readValue reads one value of type typ, appending its encoding to raw.
func readValue(r io.Reader, typ uint32, raw []byte) ([]byte, error) {
	if n, ok := fixedSize[typ]; ok {
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		return append(raw, b...), nil
	}
	switch typ {
	case tString:
		return readString(r, raw)
	case tArray:
		var et uint32
		var n uint64
		if err := binary.Read(r, binary.LittleEndian, &et); err != nil {
			return nil, err
		}
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return nil, err
		}
		if n > 1<<24 {
			return nil, fmt.Errorf("array of %d values", n)
		}
		raw = binary.LittleEndian.AppendUint32(raw, et)
		raw = binary.LittleEndian.AppendUint64(raw, n)
		var err error
		for range n {
			if raw, err = readValue(r, et, raw); err != nil {
				return nil, err
			}
		}
		return raw, nil
	}
	return nil, fmt.Errorf("unknown value type %d", typ)
}
