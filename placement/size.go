package placement

import (
	"math"
	"sync"
	"sync/atomic"
)

// SizeRate learns how many request bytes a prompt token takes, from the
// turns whose request size and engine-counted prompt are both known, so
// that a new conversation is sized by the engine's own tokenizer before
// the engine has counted it. The rate is the ratio of the sums over every
// turn observed: a model's tokenizer and its clients' request format do
// not change while it runs. Before any turn is observed, the caller's
// prior applies. Safe for concurrent use; Rate is one atomic load.
type SizeRate struct {
	mu            sync.Mutex
	bytes, tokens float64
	rate          atomic.Uint64 // math.Float64bits of bytes/tokens; 0 before any turn
}

// Observe records one turn whose request took bytes and whose prompt the
// engine counted as tokens. A turn missing either is ignored.
func (s *SizeRate) Observe(bytes, tokens int64) {
	if bytes <= 0 || tokens <= 0 {
		return
	}
	s.mu.Lock()
	s.bytes += float64(bytes)
	s.tokens += float64(tokens)
	s.rate.Store(math.Float64bits(s.bytes / s.tokens))
	s.mu.Unlock()
}

// Rate is the bytes per prompt token learned so far, or prior before any
// turn was observed.
func (s *SizeRate) Rate(prior float64) float64 {
	if r := math.Float64frombits(s.rate.Load()); r > 0 {
		return r
	}
	return prior
}
