package caddymodule

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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

// The store's Prometheus series, read from each live model's store at
// scrape time.
var (
	descStoreConnected = prometheus.NewDesc("lm_warden_store_connected",
		"1 while the shared binding store answers; 0 while turns route with this instance's bindings alone.",
		[]string{"model"}, nil)
	descStoreErrors = prometheus.NewDesc("lm_warden_store_errors_total",
		"Calls to the shared binding store that failed or passed their deadline, and writes dropped.",
		[]string{"model"}, nil)
	descStoreFallbacks = prometheus.NewDesc("lm_warden_store_fallbacks_total",
		"Turns routed with this instance's bindings alone because the shared store was out or did not answer in time.",
		[]string{"model"}, nil)
	descStoreCommands = prometheus.NewDesc("lm_warden_store_commands_total",
		"Commands sent to the shared binding store.",
		[]string{"model"}, nil)
	descStoreOps = prometheus.NewDesc("lm_warden_store_operations_total",
		"Shared store work by kind: read (a turn's conversation looked up), claim (a new conversation written with SET NX), claim-lost (another instance had it), adopted (a binding taken from the store or another instance's move), published and received (moves), refresh (TTL).",
		[]string{"model", "kind"}, nil)
)

type storeCollector struct{}

// Describe implements prometheus.Collector.
func (storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoreConnected, descStoreErrors, descStoreFallbacks, descStoreCommands, descStoreOps} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (storeCollector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range models() {
		st := m.storeStatus()
		if st == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descStoreConnected, prometheus.GaugeValue, b2f(st.Connected), m.name)
		ch <- prometheus.MustNewConstMetric(descStoreErrors, prometheus.CounterValue, float64(st.Errors), m.name)
		ch <- prometheus.MustNewConstMetric(descStoreFallbacks, prometheus.CounterValue, float64(st.Fallbacks), m.name)
		ch <- prometheus.MustNewConstMetric(descStoreCommands, prometheus.CounterValue, float64(st.Commands), m.name)
		for _, op := range [...]struct {
			kind string
			n    uint64
		}{
			{"read", st.Reads}, {"claim", st.Claims}, {"claim-lost", st.ClaimsLost}, {"adopted", st.Adopted},
			{"published", st.MovesSent}, {"received", st.MovesReceived}, {"refresh", st.Refreshes},
		} {
			ch <- prometheus.MustNewConstMetric(descStoreOps, prometheus.CounterValue, float64(op.n), m.name, op.kind)
		}
	}
}

// registerStoreMetrics adds the store's collector to a configuration's
// registry, as registerMetrics does the router's.
func registerStoreMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(storeCollector{}); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return fmt.Errorf("registering lm_warden store metrics: %w", err)
		}
	}
	return nil
}
