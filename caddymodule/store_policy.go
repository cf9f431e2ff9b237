package caddymodule

import (
	"go.uber.org/zap"
)

// storeConfig returns the policy's store settings resolved (placeholders
// replaced, defaults filled); the zero value without a store.
func (p *Policy) storeConfig() StoreConfig {
	if p.Store == nil {
		return StoreConfig{}
	}
	return p.Store.Resolved()
}

// applyStore gives the model's shared state this policy's store; the
// lm_warden app calls it when the configuration starts.
func (p *Policy) applyStore() {
	var cfg *StoreConfig
	if p.Store != nil {
		c := p.storeConfig()
		cfg = &c
	}
	if err := p.m.configureStore(cfg, p.logger); err != nil && p.logger != nil {
		p.logger.Error("shared binding store not started: bindings stay this instance's own",
			zap.String("model", p.Model), zap.Error(err))
	}
}
