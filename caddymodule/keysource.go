package caddymodule

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmwarden/caddy-lmwarden/internal/card"
)

// keySource says where a request's conversation key came from.
type keySource uint8

const (
	keySrcNone        keySource = iota // no key: a per-request pick
	keySrcHeader                       // a session header
	keySrcBody                         // metadata.user_id / metadata.session_id, or prompt_cache_key
	keySrcFingerprint                  // the conversation's start
	numKeySources
)

// keySourceNames are the sources as the metric's label and the card's
// JSON name them.
var keySourceNames = [numKeySources]string{"none", "header", "body", "fingerprint"}

// keyCounts counts the requests routed to each replica by the source of
// their key. One mutex-guarded map a model: a request adds once, when its
// response ends.
type keyCounts struct {
	mu sync.Mutex
	n  map[string]*[numKeySources]uint64
}

func (k *keyCounts) add(replica string, src keySource) {
	if src >= numKeySources {
		return
	}
	k.mu.Lock()
	c := k.n[replica]
	if c == nil {
		if k.n == nil {
			k.n = make(map[string]*[numKeySources]uint64)
		}
		c = new([numKeySources]uint64)
		k.n[replica] = c
	}
	c[src]++
	k.mu.Unlock()
}

// get returns a replica's counts (zero when it has none).
func (k *keyCounts) get(replica string) (out [numKeySources]uint64) {
	k.mu.Lock()
	if c := k.n[replica]; c != nil {
		out = *c
	}
	k.mu.Unlock()
	return out
}

// row is a replica's counts as the card shows them.
func (k *keyCounts) row(replica string) card.KeySources {
	c := k.get(replica)
	return card.KeySources{Header: c[keySrcHeader], Body: c[keySrcBody], Fingerprint: c[keySrcFingerprint], None: c[keySrcNone]}
}

var descKeySource = prometheus.NewDesc("lm_warden_key_source_requests_total",
	"Requests routed to the replica by where their conversation key came from: a session header (header), the body's metadata or prompt_cache_key (body), a fingerprint of the conversation's start (fingerprint), or none.",
	[]string{"model", "replica", "source"}, nil)

// collectKeySources sends a replica's counts.
func collectKeySources(ch chan<- prometheus.Metric, m *modelState, replica string) {
	c := m.keys.get(replica)
	for src, n := range c {
		ch <- prometheus.MustNewConstMetric(descKeySource, prometheus.CounterValue, float64(n), m.name, replica, keySourceNames[src])
	}
}
