// Package demo is warden-bench's one-command demo: emulated vLLM replicas
// and Caddy with LM Warden, both in this process on loopback, driven by
// the bench workload through the stages of the reference measurement.
package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"     // the Caddyfile adapter
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile" // the http server type
	// Only the Caddy modules the demo's Caddyfiles use (the http app,
	// reverse_proxy with its selection policies, health checks and http
	// transport, which brings the headers handler), not all of Caddy's
	// standard modules: a first run then downloads and compiles far less.
	// A user's Caddy (cmd/caddy, xcaddy) keeps the standard set.
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lmwarden/caddy-lmwarden/caddymodule"
	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/internal/redisserver"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/tools/bench"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// Config is the self-contained demo: emulated replicas and Caddy with
// LM Warden, both in this process on loopback, driven by the workload.
type Config struct {
	Replicas int     // emulated replicas (default 4)
	Speed    float64 // engine seconds per wall second (default 10)
	Engine   emulator.EngineConfig
	Workload bench.Workload
	Stages   []int
	Modes    []string // default vllm-dp, on
	// StageLength and Warmup are engine time.
	StageLength, Warmup time.Duration
	// Admin is Caddy's admin address (default 127.0.0.1:2019); the routing
	// card is served there under /lm-warden/.
	Admin string
	// Listen is the proxy's address (default 127.0.0.1 on a free port).
	Listen       string
	API          bench.API
	Progress     io.Writer // progress of the stages (nil: none)
	LiveProgress bool      // rewrite one progress line in place (a terminal)
	Log          io.Writer // what the demo tells the user (nil: none)
	// Fault, when set, is injected into every stage (see bench.Fault).
	Fault *bench.Fault
	// HealthChecks adds Caddy's active health checks (GET /health every
	// poll interval) to the proxy; without them the policy's own failure
	// handling is all there is.
	HealthChecks bool
	// ResponseHeaderTimeout is the proxy's response_header_timeout, wall
	// time (default 10s): how long a turn sent to a hung replica waits.
	ResponseHeaderTimeout time.Duration
	// Instances is the number of Caddy front-ends (default 1). Beyond the
	// first, each is a process of its own (InstanceCommand), in front of
	// the same replicas; the client sends a session's turns to them in
	// turn. Only LM Warden's modes (off, on) run with more than one.
	Instances int
	// Store makes the front-ends share their bindings through a
	// redis-server the demo starts on loopback.
	Store bool
	// InstanceCommand runs one more front-end: the command and arguments
	// before the Caddyfile's path, e.g. [warden-bench, caddy-instance];
	// the process serves until its standard input closes.
	InstanceCommand []string
}

// DefaultConfig runs the reference measurement's stages, vLLM's own
// data-parallel balancer, then LM Warden as shipped (ModeDefault:
// admission and the lifecycle checks on), then with affinity alone, on
// four emulated A4000 replicas sped up ten times: 90 engine seconds
// measured after 30 of warm-up per stage, about 3 minutes of wall time in
// all.
func DefaultConfig() Config {
	return Config{
		Replicas:    4,
		Speed:       10,
		Engine:      emulator.DefaultEngineConfig(),
		Workload:    bench.DefaultWorkload(),
		Stages:      []int{4, 8, 16, 24, 32},
		Modes:       DefaultModes(),
		StageLength: 90 * time.Second,
		Warmup:      30 * time.Second,
		Admin:       "127.0.0.1:2019",
		API:         bench.APIAnthropic,
	}
}

// DefaultModes are the demo's modes: vLLM's balancer, LM Warden as
// shipped, LM Warden with affinity alone.
func DefaultModes() []string { return []string{bench.ModeVLLMDP, bench.ModeDefault, bench.ModeOn} }

// Demo starts the emulator and Caddy, runs the stages and returns the
// report. Caddy is stopped and the emulator closed before it returns.
func Run(ctx context.Context, cfg Config) (*bench.Report, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 4
	}
	if cfg.Speed <= 0 {
		cfg.Speed = 10
	}
	if cfg.Admin == "" {
		cfg.Admin = "127.0.0.1:2019"
	}
	if len(cfg.Modes) == 0 {
		cfg.Modes = DefaultModes()
	}
	// The reference measurement's layout is one vLLM server with one
	// engine per replica (data_parallel_size N): vLLM's own balancer picks
	// the engine, and LM Warden pins its pick with X-data-parallel-rank.
	// Caddy's own policies need one address per replica, so a run with
	// them uses one single-engine server per replica instead, and cannot
	// include vllm-dp.
	dp := true
	for _, m := range cfg.Modes {
		if m != bench.ModeVLLMDP && m != bench.ModeOff && m != bench.ModeOn && m != bench.ModeAdmit && m != bench.ModeDefault {
			dp = false
		}
	}
	if cfg.Fault != nil {
		// a fault stops or hangs one replica: one server per replica (an
		// engine of a data-parallel server cannot fail on its own)
		dp = false
	}
	if !dp {
		for _, m := range cfg.Modes {
			if m == bench.ModeVLLMDP && cfg.Fault != nil {
				return nil, fmt.Errorf("demo: a fault needs one server per replica; %s needs one data-parallel server: leave it out of --modes", bench.ModeVLLMDP)
			}
			if m == bench.ModeVLLMDP {
				return nil, fmt.Errorf("demo: %s needs one data-parallel server and Caddy's own policies one server per replica; run them in separate demos", bench.ModeVLLMDP)
			}
		}
	}
	if cfg.ResponseHeaderTimeout <= 0 {
		cfg.ResponseHeaderTimeout = 10 * time.Second
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	scfg := emulator.ServerConfig{Replicas: cfg.Replicas, Speed: cfg.Speed, Model: cfg.Workload.Model, Engine: cfg.Engine}
	dpSize := 1
	if dp && cfg.Replicas > 1 {
		scfg.DataParallel, dpSize = cfg.Replicas, cfg.Replicas
	}
	srv, err := emulator.NewServer(scfg)
	if err != nil {
		return nil, fmt.Errorf("starting the emulator: %w", err)
	}
	defer srv.Close()
	listen := cfg.Listen
	if listen == "" {
		if listen, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	px := &demoProxy{
		admin:     cfg.Admin,
		listen:    listen,
		model:     cfg.Workload.Model,
		maxSeqs:   cfg.Engine.MaxNumSeqs,
		dpSize:    dpSize,
		poll:      max(100*time.Millisecond, time.Duration(float64(time.Second)/cfg.Speed)),
		speed:     cfg.Speed,
		upstreams: srv.URLs(),
		health:    cfg.HealthChecks,
		rht:       cfg.ResponseHeaderTimeout,
	}
	if cfg.Fault != nil && cfg.Fault.Replica >= cfg.Replicas {
		return nil, fmt.Errorf("fault %s: there are %d replicas", cfg.Fault, cfg.Replicas)
	}
	if cfg.Instances > 1 || cfg.Store {
		for _, m := range cfg.Modes {
			if m != bench.ModeOff && m != bench.ModeOn {
				return nil, fmt.Errorf("demo: several front-ends or a shared store run LM Warden's modes (off, on) only, not %s", m)
			}
		}
	}
	if cfg.Store {
		rds, err := redisserver.Start()
		if err != nil {
			return nil, fmt.Errorf("demo: the shared store: %w", err)
		}
		defer rds.Close()
		px.store = rds.Addr
		logf("shared binding store: redis-server on %s", rds.Addr)
	}
	var peer *bench.PeerProxy
	for _, m := range cfg.Modes {
		if peers.Is(m) && peer == nil {
			// the peer routers' policies run in a proxy of the bench's
			// own behind Caddy (Caddy → peer proxy → replicas), never in
			// the module
			peer = &bench.PeerProxy{Replicas: srv.URLs(), PollInterval: px.poll, Clock: bench.SpeedClock(cfg.Speed),
				Config: peers.Config{BlockSize: cfg.Engine.BlockSize, NumGPUBlocks: cfg.Engine.NumGPUBlocks,
					PrefillTokensPerSecond: bench.PrefillRate(cfg.Engine), Seed: cfg.Workload.Seed}}
			if err := peer.Start("127.0.0.1:0"); err != nil {
				return nil, err
			}
			defer peer.Close()
			px.peer = strings.TrimPrefix(peer.URL(), "http://")
			logf("peer routers' policies: the bench's proxy on %s", peer.URL())
		}
	}
	if peers.Is(cfg.Modes[0]) {
		if err := peer.SetMode(ctx, cfg.Modes[0]); err != nil {
			return nil, err
		}
	}
	if err := px.load(cfg.Modes[0]); err != nil {
		return nil, err
	}
	defer caddy.Stop() //nolint:errcheck // best effort on the way out
	targets := []string{"http://" + listen}
	others, err := startInstances(ctx, cfg, px)
	defer func() {
		for _, o := range others {
			o.stop()
		}
	}()
	if err != nil {
		return nil, err
	}
	for _, o := range others {
		targets = append(targets, "http://"+o.px.listen)
		logf("LM Warden front-end %d: http://%s — routing card: http://%s/lm-warden/", len(targets), o.px.listen, o.px.admin)
	}
	var metrics []string
	for _, u := range srv.URLs() {
		metrics = append(metrics, u+"/metrics")
	}
	if dpSize > 1 {
		logf("emulator: one data-parallel server with %d engines (%s), %g× speed: %s", dpSize, emulator.DefaultModel, cfg.Speed, strings.Join(srv.URLs(), " "))
	} else {
		logf("emulator: %d replicas (%s), %g× speed: %s", cfg.Replicas, emulator.DefaultModel, cfg.Speed, strings.Join(srv.URLs(), " "))
	}
	logf("LM Warden (Caddy): http://%s — routing card: http://%s/lm-warden/ (open it while the stages run)", listen, cfg.Admin)
	total := time.Duration(len(cfg.Stages)*len(cfg.Modes)) * time.Duration(float64(cfg.StageLength+cfg.Warmup)/cfg.Speed)
	logf("stages %v × %v, %v + %v warm-up each in engine time: about %v of wall time", cfg.Stages, cfg.Modes, cfg.StageLength, cfg.Warmup, total.Round(time.Second))

	var onStage func(context.Context)
	if f := cfg.Fault; f != nil {
		logf("fault in every stage: %s (engine time after the warm-up); health checks %v; response_header_timeout %v", f, cfg.HealthChecks, cfg.ResponseHeaderTimeout)
		onStage = func(ctx context.Context) {
			if err := f.Inject(ctx, srv, cfg.Warmup, cfg.Speed, func(s string) { logf("%s", s) }); err != nil {
				logf("%v", err)
			}
		}
	}
	rep, err := bench.RunHTTP(ctx, bench.HTTPConfig{
		OnStage:  onStage,
		Client:   bench.Client{BaseURL: "http://" + listen, Targets: multi(targets), API: cfg.API, Token: "demo-token"},
		Workload: cfg.Workload,
		Count:    emulator.CountTokens,
		Stages:   cfg.Stages,
		Modes:    cfg.Modes,
		SetMode: func(ctx context.Context, mode string) error {
			for _, o := range others {
				if err := o.px.setMode(ctx, mode); err != nil {
					return err
				}
			}
			if peers.Is(mode) {
				if err := peer.SetMode(ctx, mode); err != nil {
					return err
				}
			}
			return px.setMode(ctx, mode)
		},
		EndSession: func(ctx context.Context, id string) {
			if peers.Is(px.mode) {
				peer.EndSession(ctx, id)
				return
			}
			px.endSession(ctx, id)
		},
		Policy:       bench.PolicyOf,
		StageLength:  cfg.StageLength,
		Warmup:       cfg.Warmup,
		Speed:        cfg.Speed,
		Metrics:      metrics,
		Progress:     cfg.Progress,
		LiveProgress: cfg.LiveProgress,
		Drain:        10 * time.Second,
	})
	if rep != nil {
		rep.Kind = "demo"
	}
	return rep, err
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr, nil
}

// demoProxy is the in-process Caddy of the demo.
type demoProxy struct {
	admin, listen, model string
	maxSeqs              int
	dpSize               int // engines behind the one upstream (1: one upstream per replica)
	poll                 time.Duration
	speed                float64
	upstreams            []string
	mode                 string
	health               bool
	rht                  time.Duration
	store                string // the shared store's address; "" for none
	peer                 string // the peer proxy's address, for the peer modes
	remote               bool   // another process: only its affinity is switched
}

// Caddyfile renders the demo's configuration for a mode.
func (p *demoProxy) Caddyfile(mode string) string {
	var ups []string
	for _, u := range p.upstreams {
		ups = append(ups, strings.TrimPrefix(u, "http://"))
	}
	var b strings.Builder
	// The routing card is for a browser, which sends Sec-Fetch-Mode and
	// so makes Caddy check the request's origin: a typed-in URL has none
	// (the empty origin), the page's own requests the admin address's.
	fmt.Fprintf(&b, "{\n\tadmin %s {\n\t\torigins %s\n\t}\n\tpersist_config off\n\tauto_https off\n\tlog {\n\t\tlevel ERROR\n\t}\n}\n\n", p.admin, adminOrigins(p.admin))
	fmt.Fprintf(&b, "http://%s {\n\tbind 127.0.0.1\n", p.listen)
	switch mode {
	case bench.ModeDefault:
		// LM Warden as shipped: none of affinity, admission or restart
		// detection is written, so each has its default (on).
		fmt.Fprintf(&b, "\tlm_warden\n\treverse_proxy %s {\n", strings.Join(ups, " "))
		fmt.Fprintf(&b, "\t\tlb_policy lm_warden {\n\t\t\tmodel %s\n\t\t\tmax_num_seqs %d\n\t\t\tpoll_interval %s\n", p.model, p.maxSeqs, p.poll)
		p.policyTail(&b)
	case bench.ModeOff, bench.ModeOn, bench.ModeAdmit, bench.ModeLifecycle:
		aff, adm := "on", "off"
		if mode == bench.ModeOff {
			aff = "off"
		}
		if mode == bench.ModeAdmit {
			adm = "on"
		}
		// restart detection is LM Warden's default; the modes other than
		// lifecycle go without it, as the sim's modes of those names
		restart := "off"
		if mode == bench.ModeLifecycle {
			restart = "on"
		}
		fmt.Fprintf(&b, "\tlm_warden {\n\t\trestart_detection %s\n\t}\n\treverse_proxy %s {\n", restart, strings.Join(ups, " "))
		fmt.Fprintf(&b, "\t\tlb_policy lm_warden {\n\t\t\tmodel %s\n\t\t\taffinity %s\n\t\t\tadmission %s\n\t\t\tmax_num_seqs %d\n\t\t\tpoll_interval %s\n", p.model, aff, adm, p.maxSeqs, p.poll)
		p.policyTail(&b)
	case bench.ModeVLLMDP:
		// No selection: the one data-parallel server's balancer picks.
		fmt.Fprintf(&b, "\treverse_proxy %s {\n", strings.Join(ups, " "))
	case bench.ModeHeader:
		fmt.Fprintf(&b, "\treverse_proxy %s {\n\t\tlb_policy header X-Claude-Code-Session-Id\n", strings.Join(ups, " "))
	default:
		if peers.Is(mode) {
			// the peer proxy picks the replica with the mode's policy
			fmt.Fprintf(&b, "\treverse_proxy %s {\n", p.peer)
			break
		}
		fmt.Fprintf(&b, "\treverse_proxy %s {\n\t\tlb_policy %s\n", strings.Join(ups, " "), mode)
	}
	if p.health {
		fmt.Fprintf(&b, "\t\thealth_uri /health\n\t\thealth_interval %s\n\t\thealth_timeout %s\n", p.poll, p.poll*4/5)
	}
	fmt.Fprintf(&b, "\t\ttransport http {\n\t\t\tdial_timeout 3s\n\t\t\tresponse_header_timeout %s\n\t\t}\n", p.rht)
	b.WriteString("\t\tflush_interval -1\n\t}\n}\n")
	return b.String()
}

// adminOrigins are the origins Caddy's admin endpoint at addr accepts for
// the routing card: addr itself, the same port on localhost when addr is a
// loopback address, and the empty origin of a typed-in URL.
func adminOrigins(addr string) string {
	o := []string{addr}
	if host, port, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() || host == "localhost" {
			for _, h := range []string{"localhost", "127.0.0.1", "[::1]"} {
				if hp := h + ":" + port; hp != addr {
					o = append(o, hp)
				}
			}
		}
	}
	return strings.Join(o, " ") + ` ""`
}

// policyTail ends the lm_warden policy's block: the times scaled to the
// emulator's speed, the data-parallel size and the store.
func (p *demoProxy) policyTail(b *strings.Builder) {
	// Admission's times are the engine's: at speed × they pass that much
	// faster (as the poll interval does).
	fmt.Fprintf(b, "\t\t\tadmit_window %s\n\t\t\tadmit_wait %s\n", p.scaled(placement.DefaultAdmitWindow), p.scaled(placement.DefaultAdmitWait))
	fmt.Fprintf(b, "\t\t\tfail_after %d\n", p.failAfter())
	if p.dpSize > 1 {
		fmt.Fprintf(b, "\t\t\tdata_parallel_size %d\n", p.dpSize)
	}
	if p.store != "" {
		fmt.Fprintf(b, "\t\t\tstore redis {\n\t\t\t\taddress %s\n\t\t\t\tprefix lmwdemo:\n\t\t\t}\n", p.store)
	}
	b.WriteString("\t\t}\n")
}

// failAfter is the demo's fail_after: as many failed polls as span the
// wall time the defaults give a deployment (fail_after 3 at poll_interval
// 1s). The demo's poll interval is the engine's second in wall time (100 ms
// at 10×), and each poll's timeout four fifths of it, but the host's stalls
// are not sped up: on a loaded laptop a /metrics answer that takes 80 ms
// is a busy CPU, not a replica gone, and three of them in a row took every
// engine of the data-parallel server out at once and re-placed its
// conversations. The demo's faults do not depend on it: a stopped replica
// refuses the poll's connection and is out at once, and a hung one still
// answers its polls and is taken out by its proxy errors.
func (p *demoProxy) failAfter() int {
	if p.poll <= 0 {
		return caddymodule.DefaultFailAfter
	}
	wall := caddymodule.DefaultFailAfter * caddymodule.DefaultPollInterval
	return max(caddymodule.DefaultFailAfter, int((wall+p.poll-1)/p.poll))
}

// load adapts the mode's Caddyfile and (re)loads Caddy with it.
func (p *demoProxy) load(mode string) error {
	cfgJSON, warns, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(p.Caddyfile(mode)), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		return fmt.Errorf("adapting the %s configuration: %w", mode, err)
	}
	for _, w := range warns {
		if strings.Contains(w.Message, "fmt") {
			continue
		}
		return fmt.Errorf("adapting the %s configuration: %s", mode, w.String())
	}
	if err := caddy.Load(cfgJSON, false); err != nil {
		return fmt.Errorf("loading Caddy (%s): %w", mode, err)
	}
	p.mode = mode
	return nil
}

// setMode switches the router: between affinity off and on through LM
// Warden's admin bench.API (bindings and counters stay), else by a config reload.
func (p *demoProxy) setMode(ctx context.Context, mode string) error {
	if mode == p.mode {
		return nil
	}
	lmw := func(m string) bool { return bench.PolicyOf(m) == "lm_warden" }
	// restart detection is the handler's setting: only a reload switches it
	sameHandler := bench.ChecksLifecycle(mode) == bench.ChecksLifecycle(p.mode)
	if lmw(mode) && lmw(p.mode) && sameHandler {
		err := p.put(ctx, "affinity", mode != bench.ModeOff)
		if err == nil {
			err = p.put(ctx, "admission", bench.Admits(mode))
		}
		if err == nil || p.remote {
			p.mode = mode
			return err
		}
	}
	return p.load(mode)
}

// scaled is an engine-time duration in wall time.
func (p *demoProxy) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) / p.speed)
}

// endSession tells LM Warden a session's client went away at a stage's
// end (its binding is dropped through the admin API), as the sim does, so
// the next stage's placement and admission do not count it. A session
// that was never bound (the other policies) is not an error.
func (p *demoProxy) endSession(ctx context.Context, id string) {
	if bench.PolicyOf(p.mode) != "lm_warden" {
		return
	}
	u := fmt.Sprintf("http://%s/lm-warden/models/%s/sessions/%s", p.admin, p.model, url.PathEscape(id))
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u, nil)
	if err != nil {
		return
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// put sets the router's affinity or admission through LM Warden's admin
// API.
func (p *demoProxy) put(ctx context.Context, what string, on bool) error {
	body, _ := json.Marshal(map[string]bool{what: on})
	url := fmt.Sprintf("http://%s/lm-warden/models/%s/%s", p.admin, p.model, what)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("switching %s: %w", what, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("switching %s: status %d: %s", what, resp.StatusCode, msg)
	}
	return nil
}
