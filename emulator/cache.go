package emulator

// blockPool is the KV cache: numBlocks blocks of blockSize tokens with
// vLLM's prefix caching. A full block may carry the chained hash of the
// tokens up to its end; the first block with a given hash is the one found
// by lookups. Blocks referenced by no request sit in a free queue, oldest
// first: allocation takes from the front and evicts the hash of the block it
// takes, freeing appends to the back, and a cache hit on a free block takes
// it out of the queue. That makes eviction least-recently-used.
type blockPool struct {
	n       int32
	ref     []int32
	hash    []uint64 // 0 = none
	primary []bool   // this block is the one cached[hash] names
	// free queue: doubly linked over block ids; index n is the sentinel
	prev, next []int32
	inFree     []bool
	nfree      int
	cached     map[uint64]int32
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{
		n:       int32(n),
		ref:     make([]int32, n),
		hash:    make([]uint64, n),
		primary: make([]bool, n),
		prev:    make([]int32, n+1),
		next:    make([]int32, n+1),
		inFree:  make([]bool, n),
		cached:  make(map[uint64]int32, n),
	}
	p.prev[n], p.next[n] = int32(n), int32(n)
	for i := 0; i < n; i++ {
		p.pushBack(int32(i))
	}
	return p
}

func (p *blockPool) pushBack(b int32) {
	s := p.n
	last := p.prev[s]
	p.next[last], p.prev[b] = b, last
	p.next[b], p.prev[s] = s, b
	p.inFree[b] = true
	p.nfree++
}

func (p *blockPool) unlink(b int32) {
	p.next[p.prev[b]] = p.next[b]
	p.prev[p.next[b]] = p.prev[b]
	p.inFree[b] = false
	p.nfree--
}

// lookup returns the cached blocks matching the leading hashes, in order,
// appended to dst. It changes nothing.
func (p *blockPool) lookup(dst []int32, hashes []uint64) []int32 {
	for _, h := range hashes {
		b, ok := p.cached[h]
		if !ok {
			break
		}
		dst = append(dst, b)
	}
	return dst
}

// evictable counts the blocks among hits that sit in the free queue (they
// stop being allocatable once a request references them).
func (p *blockPool) evictable(hits []int32) int {
	n := 0
	for _, b := range hits {
		if p.ref[b] == 0 {
			n++
		}
	}
	return n
}

// touch references the hit blocks.
func (p *blockPool) touch(hits []int32) {
	for _, b := range hits {
		if p.ref[b] == 0 {
			p.unlink(b)
		}
		p.ref[b]++
	}
}

// allocate takes the front of the free queue, dropping its cached hash.
// The caller checks nfree first.
func (p *blockPool) allocate() int32 {
	b := p.next[p.n]
	p.unlink(b)
	if p.primary[b] {
		delete(p.cached, p.hash[b])
		p.primary[b] = false
	}
	p.hash[b] = 0
	p.ref[b] = 1
	return b
}

// free drops one reference from each block, last block first, so that the
// tail of a sequence is evicted before its head (as vLLM orders it).
func (p *blockPool) free(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		p.ref[b]--
		if p.ref[b] == 0 {
			p.pushBack(b)
		}
	}
}

// register records that block b holds the full block with hash h.
func (p *blockPool) register(b int32, h uint64) {
	if p.hash[b] != 0 {
		return
	}
	p.hash[b] = h
	if _, ok := p.cached[h]; !ok {
		p.cached[h] = b
		p.primary[b] = true
	}
}

// usage is vLLM's KV cache usage: the share of blocks not in the free queue.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.nfree)/float64(p.n)
}
