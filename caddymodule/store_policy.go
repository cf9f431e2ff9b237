package caddymodule

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// storeConfig returns the policy's store settings resolved (placeholders
// replaced, defaults filled); the zero value without a store.
func (p *Policy) storeConfig() StoreConfig {
	if p.Store == nil {
		return StoreConfig{}
	}
	return p.Store.resolved()
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

// unmarshalStore parses the policy's store block:
//
//	store redis {
//	    address         <host:port>
//	    username        <user>
//	    password        <password>
//	    db              <n>
//	    tls             [on|off]
//	    tls_server_name <name>
//	    prefix          <prefix>
//	    timeout         <duration>
//	}
func (p *Policy) unmarshalStore(d *caddyfile.Dispenser) error {
	var typ string
	if !d.AllArgs(&typ) {
		return d.Errf("store needs its type: store redis { ... }")
	}
	if typ != "redis" {
		return d.Errf("store type must be redis, got %q", typ)
	}
	sc := &StoreConfig{Type: typ}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "address":
			sc.Address, err = parseArg(d)
		case "username":
			sc.Username, err = parseArg(d)
		case "password":
			sc.Password, err = parseArg(d)
		case "db":
			var v string
			if v, err = parseArg(d); err == nil {
				n, aerr := strconv.Atoi(v)
				if aerr != nil || n < 0 {
					return d.Errf("db must be a non-negative integer, got %q", v)
				}
				sc.DB = n
			}
		case "tls":
			args := d.RemainingArgs()
			switch {
			case len(args) == 0:
				sc.TLS = true
			case len(args) == 1 && (args[0] == "on" || args[0] == "off"):
				sc.TLS = args[0] == "on"
			default:
				err = d.Errf("tls takes no argument, or on|off")
			}
		case "tls_server_name":
			sc.TLSServerName, err = parseArg(d)
		case "prefix":
			sc.Prefix, err = parseArg(d)
			if err == nil && sc.Prefix == "" {
				err = d.Errf("prefix must not be empty")
			}
		case "timeout":
			sc.Timeout, err = parseDuration(d, opt)
		default:
			err = d.Errf("unrecognized store option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	p.Store = sc
	return nil
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
