package caddymodule

import (
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
	"github.com/lmwarden/caddy-lmwarden/placement"
)

// StoreConfig configures the store a model's bindings are shared through
// between front-ends (Caddy instances in front of the same replicas); see
// the bindstore package.
type StoreConfig = bindstore.Config

// StoreStatus is the shared store's state on the routing card.
type StoreStatus = bindstore.Status

// route routes one turn: through the model's router alone, or, with a
// shared store, through the router as the store's local cache. A new
// conversation that fits no replica's KV cache gets a ticket to wait on
// (working-set admission); once admitted, finish its routing with
// admitted.
func (m *modelState) route(req placement.Request) (placement.Decision, *placement.Ticket, error) {
	if s := m.store.Load(); s != nil && req.Key != "" {
		return s.Route(req)
	}
	return m.router.Admit(req)
}

// admitted finishes routing a request that waited for admission: with a
// shared store, the conversation it placed is claimed there (another
// front-end may have placed it meanwhile: the turn then follows that).
func (m *modelState) admitted(req placement.Request, dec placement.Decision) (placement.Decision, error) {
	if s := m.store.Load(); s != nil && req.Key != "" && dec.Reason == placement.ReasonPlaced {
		return s.ClaimPlaced(req, dec)
	}
	return dec, nil
}

// configureStore applies a (re)loaded configuration's store: kept when its
// settings did not change, replaced (the old one closed) when they did,
// closed when the configuration has none.
func (m *modelState) configureStore(cfg *StoreConfig, logger *zap.Logger) error {
	m.storeMu.Lock()
	defer m.storeMu.Unlock()
	old := m.store.Load()
	if old != nil && cfg != nil && old.Config() == *cfg {
		old.Reconfigured()
		return nil
	}
	var s *bindstore.Store
	if cfg != nil {
		var err error
		if s, err = bindstore.New(m.name, *cfg, m.router, logger); err != nil {
			return err
		}
	}
	m.store.Store(s)
	if old != nil {
		old.Close()
	}
	return nil
}

// closeStore closes the model's store, if any; the model is going away.
func (m *modelState) closeStore() {
	m.storeMu.Lock()
	defer m.storeMu.Unlock()
	if s := m.store.Swap(nil); s != nil {
		s.Close()
	}
}

// storeStatus is the card's view of the store; nil without one.
func (m *modelState) storeStatus() *StoreStatus {
	if s := m.store.Load(); s != nil {
		return s.Status()
	}
	return nil
}

// unbind forgets a conversation's binding here and, with a shared store,
// in the store and at the other front-ends (the admin API's unpin). It
// reports whether a binding existed here or in the store.
func (m *modelState) unbind(key string) bool {
	found := m.router.Unbind(key)
	if s := m.store.Load(); s != nil && s.Unbind(key) {
		return true
	}
	return found
}

// ended tells the store that a conversation's session ended here: its
// binding is dropped everywhere.
func (m *modelState) ended(key string) {
	if s := m.store.Load(); s != nil {
		s.Ended(key)
	}
}
