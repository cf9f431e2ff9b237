package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// simExposition is what llm-d-inference-sim v0.10.2 printed next to the
// routing card (vllmstats/testdata/sim_v0.10.2_excerpt.txt): prefix-cache
// counters without _total, no engine label, a two-label cache_config_info.
// hits and queries replace the prefix counters; prefix false leaves them out.
func simExposition(hits, queries int, prefix bool) string {
	s := `vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1
vllm:kv_cache_usage_perc{model_name="qwen3-4b"} 0.1079
vllm:num_requests_running{model_name="qwen3-4b"} 1
vllm:num_requests_waiting{model_name="qwen3-4b"} 0
`
	if prefix {
		s += fmt.Sprintf("vllm:prefix_cache_hits{model_name=\"qwen3-4b\"} %d\nvllm:prefix_cache_queries{model_name=\"qwen3-4b\"} %d\n", hits, queries)
	}
	return s + `vllm:prompt_tokens_total{model_name="qwen3-4b"} 553416
vllm:generation_tokens_total{model_name="qwen3-4b"} 7365
`
}

// simReplica serves a settable /metrics text and /v1/models on loopback: it
// stands for the simulator's HTTP server.
type simReplica struct {
	addr string
	mu   sync.Mutex
	text string
	n    int // /metrics served
}

func newSimReplica(t *testing.T, text string) *simReplica {
	t.Helper()
	s := &simReplica{text: text}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			s.mu.Lock()
			text := s.text
			s.n++
			s.mu.Unlock()
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			fmt.Fprint(w, text)
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"qwen3-4b","object":"model","max_model_len":32768,"parent":null}]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	s.addr = l.Addr().String()
	return s
}

// set serves text from now on and returns how many scrapes were served
// before, so a caller can wait for two more (one whole poll after the change).
func (s *simReplica) set(text string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.text = text
	return s.n
}

func (s *simReplica) served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// adminMetrics reads the admin /metrics, parsed with expfmt.
func adminMetrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	var text string
	adminJSON(t, "/metrics", &text)
	return parseExposition(t, "admin /metrics", strings.NewReader(text))
}

// parseExposition parses Prometheus text exposition with expfmt, failing
// the test (naming what) when it does not parse.
func parseExposition(t *testing.T, what string, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return fams
}

// replicaGauge returns the value of an lm_warden gauge for one replica in the
// admin /metrics, parsed with expfmt; false when it has no sample.
func replicaGauge(t *testing.T, name, replica string) (float64, bool) {
	t.Helper()
	fams := adminMetrics(t)
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "replica" && l.GetValue() == replica {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// TestCardReadsCountersWithoutTotal runs real Caddy in front of a replica
// serving the simulator's exposition: the card's prefix hit rate (admin JSON,
// card view and Prometheus gauge) follows the counters, windowed and since
// start; with the series removed it is unknown everywhere, not 0 %.
func TestCardReadsCountersWithoutTotal(t *testing.T) {
	sim := newSimReplica(t, simExposition(355216, 553416, true))
	loadSite(t, fmt.Sprintf(`
	lm_warden
	reverse_proxy %s {
		%s
	}`, sim.addr, policyBlock("simx", "")))

	// afterPolls waits until the replica has served two more scrapes than n:
	// a poll round that started after the change has then ended.
	afterPolls := func(n int) {
		t.Helper()
		waitFor(t, "two polls", func() bool { return sim.served() >= n+2 })
		waitFor(t, "the round to publish", func() bool { return cardRow(getCard(t, "simx"), sim.addr).LastSeen != nil })
	}
	afterPolls(0)

	steps := []struct {
		hits, queries int
		// rates since the first poll, which is also the windowed rate while
		// the test runs inside the 60 s window
		want float64
	}{
		{355216 + 838, 553416 + 1000, 0.838},        // Δh 838 / Δq 1000
		{355216 + 838 + 1000, 553416 + 2000, 0.919}, // Δh 1838 / Δq 2000
	}
	for i, st := range steps {
		afterPolls(sim.set(simExposition(st.hits, st.queries, true)))
		var row ReplicaRow
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			row = cardRow(getCard(t, "simx"), sim.addr)
			if row.PrefixHitRateTotal != nil && *row.PrefixHitRateTotal == st.want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("step %d: hit rate since start %v, want %v (row %+v)", i, fmtOpt(row.PrefixHitRateTotal), st.want, row)
			}
		}
		if row.PrefixHitRate == nil || *row.PrefixHitRate != st.want {
			t.Fatalf("step %d: windowed hit rate %v, want %v", i, row.PrefixHitRate, st.want)
		}
		if row.KVUsage == nil || *row.KVUsage != 0.1079 || row.Running == nil || *row.Running != 1 || row.Waiting == nil || *row.Waiting != 0 {
			t.Fatalf("step %d: other figures %+v", i, row)
		}
		view := cardView(t, "simx", sim.addr)
		if want := fmt.Sprintf("%.1f%%", st.want*100); view["hit"].T != want || view["hit"].V != st.want {
			t.Fatalf("step %d: card shows %+v, want %s", i, view["hit"], want)
		}
		if v, ok := replicaGauge(t, "lm_warden_replica_prefix_hit_ratio", sim.addr); !ok || v != st.want {
			t.Fatalf("step %d: lm_warden_replica_prefix_hit_ratio %v (present %v), want %v", i, v, ok, st.want)
		}
	}

	// The engine stops exporting the prefix series: unknown, not 0 %.
	afterPolls(sim.set(simExposition(0, 0, false)))
	waitFor(t, "the hit rate to become unknown", func() bool {
		return cardRow(getCard(t, "simx"), sim.addr).PrefixHitRate == nil
	})
	var raw string
	adminJSON(t, "/lm-warden/models/simx", &raw)
	if !strings.Contains(raw, `"prefix_hit_rate":null`) || !strings.Contains(raw, `"prefix_hit_rate_total":null`) {
		t.Fatalf("admin JSON does not say null: %s", raw)
	}
	row := cardRow(getCard(t, "simx"), sim.addr)
	if row.PrefixHitRateTotal != nil || row.KVUsage == nil || !row.Reachable {
		t.Fatalf("row %+v", row)
	}
	view := cardView(t, "simx", sim.addr)
	if view["hit"].T != "unknown" || view["hit"].V != nil {
		t.Fatalf("card shows %+v for a missing series", view["hit"])
	}
	if view["kv"].T != "10.8%" {
		t.Fatalf("KV cell %+v", view["kv"])
	}
	if v, ok := replicaGauge(t, "lm_warden_replica_prefix_hit_ratio", sim.addr); ok {
		t.Fatalf("lm_warden_replica_prefix_hit_ratio has a sample %v for a missing series", v)
	}
	if _, ok := replicaGauge(t, "lm_warden_replica_kv_usage_ratio", sim.addr); !ok {
		t.Fatal("the KV gauge went with the prefix series")
	}
}

func fmtOpt(f *float64) string {
	if f == nil {
		return "null"
	}
	return fmt.Sprint(*f)
}

// cardView returns the cells of one replica's row in the routing card's view
// document, as the page receives it.
func cardView(t *testing.T, model, replica string) map[string]struct {
	V any    `json:"v"`
	T string `json:"t"`
} {
	t.Helper()
	var v struct {
		Replicas []struct {
			ID    string `json:"id"`
			Cells map[string]struct {
				V any    `json:"v"`
				T string `json:"t"`
			} `json:"cells"`
		} `json:"replicas"`
	}
	adminJSON(t, "/lm-warden/ui/"+model+"/view.json", &v)
	for _, r := range v.Replicas {
		if r.ID == replica {
			return r.Cells
		}
	}
	t.Fatalf("no row %s in the card view", replica)
	return nil
}
