// Command warden-bench measures what LM Warden's affinity buys, column for
// column like the reference measurement (docs/reference-measurement.md): a one-command demo (emulated replicas and Caddy
// with LM Warden in-process), a virtual-clock simulation, and a load
// harness against any base URL (a real vLLM, or LM Warden in front of it).
//
//	warden-bench demo [--full] [--compare] [flags]
//	warden-bench sim  [--preset 4gpu|7gpu|seqs8|waves|fleet|llmd-sim|h100] [--compare] [flags]
//	warden-bench sim  --trace FILE [--replicas N --kv-blocks N ...]
//	warden-bench run  --url URL --metrics URL[,URL...] [flags]
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/placement"
	"github.com/lmwarden/caddy-lmwarden/tools/bench"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/demo"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "sim":
		err = runSim(os.Args[2:])
	case "run":
		err = runHTTP(ctx, os.Args[2:])
	case "caddy-instance":
		// a further front-end of "demo --instances N"
		if len(os.Args) != 3 {
			err = errors.New("caddy-instance takes the Caddyfile's path")
			break
		}
		err = demo.ServeInstance(os.Args[2])
	case "-h", "--help", "help":
		usage(os.Stdout)
		return
	default:
		usage(os.Stderr)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "warden-bench:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `warden-bench: the reference measurement of LM Warden (4 × RTX A4000, Qwen3-4B,
vLLM data-parallel 4; docs/reference-measurement.md), column for column.

  warden-bench demo   emulator + Caddy with LM Warden in-process; stages 4-32, vLLM's own balancer then LM Warden
  warden-bench sim    the same experiment on a virtual clock (engine model x real router), in seconds;
                      with --trace FILE, a trace of your own traffic (the handler's trace option) under every mode, peers included
  warden-bench run    drive any base URL (vLLM, or LM Warden in front of it) and poll the replicas

Run "warden-bench <command> -h" for its flags.
`)
}

// common holds the flags every command shares.
type common struct {
	w           bench.Workload
	think       time.Duration
	stages      string
	modes       string
	compare     bool
	stageLength time.Duration
	warmup      time.Duration
	out         string
}

func addCommon(fs *flag.FlagSet, c *common, w bench.Workload, stageLength, warmup time.Duration, modes string) {
	c.w = w
	fs.Uint64Var(&c.w.Seed, "seed", w.Seed, "workload seed: the same seed sends the same prompts")
	fs.IntVar(&c.w.SystemTokens, "system-tokens", w.SystemTokens, "tokens of the system prompt shared by all sessions")
	fs.IntVar(&c.w.FirstTokens, "first-tokens", w.FirstTokens, "tokens of a session's first message")
	fs.IntVar(&c.w.Turns, "turns", w.Turns, "turns per session, the first included")
	fs.IntVar(&c.w.TurnTokens, "turn-tokens", w.TurnTokens, "new tokens of every later turn")
	fs.IntVar(&c.w.OutputTokens, "output-tokens", w.OutputTokens, "max_tokens of every turn")
	fs.Float64Var(&c.w.Jitter, "jitter", w.Jitter, "per-session variation of message sizes (fraction)")
	fs.DurationVar(&c.w.Think, "think", w.Think, "mean client pause between turns, engine time (0: none)")
	fs.StringVar(&c.w.Model, "model", w.Model, "model name sent in requests (and LM Warden's model)")
	fs.StringVar(&c.stages, "stages", "4,8,16,24,32", "concurrent sessions of each stage, comma-separated")
	fs.StringVar(&c.modes, "modes", modes, "routing modes run per stage: vllm-dp, off, on (affinity alone), admit, lifecycle (sim and demo), default (LM Warden as shipped: affinity, admission and lifecycle checks on), least_conn, round_robin, header; other routers' policies reimplemented: vllm-router (sticky_least_loaded), smg (cache_aware), llm-d (endpoint picker), dynamo (KV router), thunderagent (Dynamo's program scheduler), kubeai (PrefixHash), production-stack (session); run them alone in run (the bench's proxy serves them)")
	fs.BoolVar(&c.compare, "compare", false, "run all modes: vllm-dp, off, on, admit, lifecycle (sim), default, least_conn, round_robin, header")
	fs.DurationVar(&c.stageLength, "stage-length", stageLength, "measured length of a stage, engine time")
	fs.DurationVar(&c.warmup, "warmup", warmup, "warm-up before each stage's measurement, engine time")
	fs.Float64Var(&c.w.CompactShare, "compact-share", w.CompactShare, "share of sessions that compact their history into a summary (the same session ID, the history replaced by a summary)")
	fs.IntVar(&c.w.CompactAfter, "compact-after", cmp.Or(w.CompactAfter, 3), "compacting sessions compact after this many turns")
	fs.IntVar(&c.w.CompactTokens, "compact-tokens", cmp.Or(w.CompactTokens, 800), "tokens of the summary that replaces a compacted history")
	fs.StringVar(&c.out, "out", "warden-bench-out", "directory for report.json, table.md and the PNG charts")
	fs.BoolVar(&c.w.Interactive, "interactive", w.Interactive, "pauses of a person at the keyboard instead of --think: irregular, 2 s to 3 min (log-uniform), and a tenth of them 5-15 min (the conversation goes quiet without ending)")
	fs.DurationVar(&c.w.Waves, "waves", w.Waves, "start sessions in waves this far apart, engine time: all at their first turn when a stage begins, each next one at the next wave (0: staggered, back to back)")
}

const presetHelp = "4gpu (4 × A4000, Qwen3-4B, 14k-token sessions), 7gpu (7 × RTX 5090, 27B, 58k-token sessions, 16 vs 26 sessions), seqs8 (4gpu with max_num_seqs 8), waves (4gpu with sessions starting in waves a minute apart) fleet (7gpu with agents that run 60 turns, grow toward the 131k context and compact at Claude Code's threshold, 40-minute stages), llmd-sim (4 replicas of llm-d-inference-sim as docs/other-engines.md runs it: 20 ms + 100 us per uncached token, 4 ms per output token, max_num_seqs 8, 2048 blocks) or h100 (4 × H100 80 GB, Qwen3-32B FP8, the 7gpu agents with 3 s pauses, 8/16/24 sessions)"

// httpModes checks the modes of a run over HTTP: the lifecycle mode needs
// Caddy configurations the demo writes (restart detection off for on,
// on for lifecycle), so run, which drives a router it did not configure,
// refuses it (its --compare leaves it out).
func (c *common) httpModes(modes []string, lifecycle bool) ([]string, error) {
	out := modes[:0:0]
	for _, m := range modes {
		if m != bench.ModeLifecycle || lifecycle {
			out = append(out, m)
		} else if !c.compare {
			return nil, errors.New("mode lifecycle runs in warden-bench sim and demo only")
		}
	}
	return out, nil
}

func (c *common) parse() (stages []int, modes []string, err error) {
	for _, s := range strings.Split(c.stages, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, nil, fmt.Errorf("bad --stages entry %q", s)
		}
		stages = append(stages, n)
	}
	if c.w.CompactShare == 0 {
		c.w.CompactAfter, c.w.CompactTokens = 0, 0
	}
	if c.compare {
		return stages, bench.CompareModes, nil
	}
	for _, m := range strings.Split(c.modes, ",") {
		m = strings.TrimSpace(m)
		ok := false
		for _, x := range append(bench.CompareModes, bench.PeerModes...) {
			ok = ok || x == m
		}
		if !ok {
			return nil, nil, fmt.Errorf("unknown mode %q (vllm-dp, off, on, admit, lifecycle, default, least_conn, round_robin, header, or a peer: %s)", m, strings.Join(bench.PeerModes, ", "))
		}
		modes = append(modes, m)
	}
	return stages, modes, nil
}

func finish(rep *bench.Report, out string) error {
	fmt.Println()
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	paths, err := rep.WriteFiles(out)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("wrote", strings.Join(paths, " "))
	return nil
}

func runDemo(ctx context.Context, args []string) error {
	d := demo.DefaultConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	// a preset's replicas, engine and workload; its stage lengths stay
	// the demo's (wall time)
	preset := presetArg(args)
	sc, err := bench.SimPreset(preset)
	if err != nil {
		return err
	}
	d.Replicas, d.Engine, d.Workload = sc.Replicas, sc.Engine, sc.Workload
	fs.String("preset", preset, presetHelp)
	var c common
	addCommon(fs, &c, d.Workload, d.StageLength, d.Warmup, strings.Join(d.Modes, ","))
	fs.IntVar(&d.Engine.MaxNumSeqs, "max-num-seqs", d.Engine.MaxNumSeqs, "max_num_seqs per replica")
	full := fs.Bool("full", false, "3-minute stages after a 1-minute warm-up (about 6 minutes at 10x for the three default modes)")
	fs.Float64Var(&d.Speed, "speed", d.Speed, "emulator speed: engine seconds per wall second")
	fs.IntVar(&d.Replicas, "replicas", d.Replicas, "emulated replicas")
	fs.StringVar(&d.Admin, "admin", d.Admin, "Caddy's admin address (the routing card is at /lm-warden/)")
	fs.StringVar(&d.Listen, "listen", "", "proxy address (default: a free port on 127.0.0.1)")
	api := fs.String("api", "anthropic", "client API: anthropic or openai")
	fault := fs.String("fault", "", "inject a fault into every stage: kill|hang:replica=N,at=D,for=D (engine time after the warm-up), e.g. kill:replica=1,at=30s,for=25s")
	fs.BoolVar(&d.HealthChecks, "health-checks", false, "add Caddy's active health checks (GET /health) to the proxy")
	fs.DurationVar(&d.ResponseHeaderTimeout, "response-header-timeout", 10*time.Second, "the proxy's response_header_timeout (wall time)")
	fs.IntVar(&d.Instances, "instances", 1, "Caddy front-ends in front of the replicas (beyond the first, processes of this program); a session's turns go to them in turn")
	fs.BoolVar(&d.Store, "store", false, "share the front-ends' bindings through a redis-server started on loopback (needs redis-server in PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if d.Instances < 1 {
		return errors.New("--instances must be at least 1")
	}
	if d.Instances > 1 {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		d.InstanceCommand = []string{self, "caddy-instance"}
		if !set(fs, "modes") {
			c.modes = bench.ModeOn
		}
	}
	if *fault != "" {
		f, err := bench.ParseFault(*fault)
		if err != nil {
			return err
		}
		d.Fault = &f
	}
	stages, modes, err := c.parse()
	if err == nil {
		modes, err = c.httpModes(modes, true)
	}
	if err != nil {
		return err
	}
	if c.compare {
		// vLLM's balancer needs the one-server layout, Caddy's policies
		// one server per replica: --compare runs the latter.
		modes = modes[:0:0]
		for _, m := range bench.CompareModes {
			if m != bench.ModeVLLMDP {
				modes = append(modes, m)
			}
		}
	}
	d.Workload, d.Stages, d.Modes = c.w, stages, modes
	d.StageLength, d.Warmup = c.stageLength, c.warmup
	if *full {
		d.StageLength, d.Warmup = 3*time.Minute, time.Minute
	}
	d.API = bench.API(*api)
	d.Progress, d.Log, d.LiveProgress = os.Stderr, os.Stderr, isTerminal(os.Stderr)
	rep, err := demo.Run(ctx, d)
	if rep != nil && len(rep.Stages) > 0 {
		if ferr := finish(rep, c.out); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// presetArg returns the --preset argument, 4gpu when none: the preset
// decides the other flags' defaults, so it is read before them.
func presetArg(args []string) string {
	preset := "4gpu"
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--preset="); ok {
			preset = v
		} else if (a == "--preset" || a == "-preset") && i+1 < len(args) {
			preset = args[i+1]
		}
	}
	return preset
}

func runSim(args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	preset := presetArg(args)
	cfg, err := bench.SimPreset(preset)
	if err != nil {
		return err
	}
	fs.String("preset", preset, presetHelp)
	var c common
	addCommon(fs, &c, cfg.Workload, cfg.StageLength, cfg.Warmup, strings.Join(cfg.Modes, ","))
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas")
	fs.IntVar(&cfg.Engine.NumGPUBlocks, "kv-blocks", cfg.Engine.NumGPUBlocks, "KV cache blocks per replica")
	fs.IntVar(&cfg.Engine.MaxNumSeqs, "max-num-seqs", cfg.Engine.MaxNumSeqs, "max_num_seqs per replica")
	fs.BoolVar(&cfg.Engine.ReserveFullSequence, "reserve-full-sequence", cfg.Engine.ReserveFullSequence, "admit a waiting request only when its whole prompt fits (vLLM's scheduler_reserve_full_isl, current releases)")
	fs.BoolVar(&cfg.Engine.CountEveryLookup, "count-every-lookup", cfg.Engine.CountEveryLookup, "count a prefix cache lookup at every admission attempt, as vLLM did before PR 48860")
	fs.IntVar(&cfg.Placement.SpillThreshold, "spill-threshold", 0, "LM Warden spill threshold (0: auto = max_num_seqs/4)")
	fs.IntVar(&cfg.Placement.SpillWaiting, "spill-waiting", 0, "also spill from a replica with at least this many requests waiting (0: off)")
	fs.Float64Var(&cfg.Placement.HighWater, "admit-high-water", placement.DefaultHighWater, "admit mode: share of a replica's KV capacity new conversations may fill")
	fs.DurationVar(&cfg.Placement.AdmitWindow, "admit-window", placement.DefaultAdmitWindow, "admit mode: longest a conversation counts in its replica's working set after its last turn, engine time")
	fs.DurationVar(&cfg.Placement.AdmitWait, "admit-wait", placement.DefaultAdmitWait, "admit mode: longest a new conversation waits for room, engine time")
	fs.IntVar(&cfg.Placement.RotateTurns, "rotate-turns", 0, "time-slicing's quantum in turns (0: none, the default; -1: time-slicing off)")
	fs.DurationVar(&cfg.DPStatsInterval, "dp-stats-interval", emulator.DefaultDPStatsInterval, "vllm-dp: how often vLLM's coordinator publishes the engines' counts, engine time")
	fs.IntVar(&cfg.DPAPIServers, "dp-api-servers", 0, "vllm-dp: vLLM API server processes, each balancing on its own (0: one per replica, vLLM's default)")
	fs.BoolVar(&cfg.DPRotate, "dp-rotate", false, "vllm-dp: rotate the balancer's tie-break after every pick (vLLM from PR 47420 on) instead of ties to the lowest engine")
	fs.DurationVar(&cfg.RestartAt, "restart-at", 0, "restart one replica (cache and counters cleared) this long after every stage's start, engine time (0: never)")
	fs.IntVar(&cfg.RestartReplica, "restart-replica", 0, "the replica --restart-at restarts")
	matrix := fs.Bool("matrix", false, "run every traffic shape the bench knows (closed loop, --think 3s and 20s, --interactive, seqs8, 7gpu, waves, fleet, h100 with 3 s pauses and closed, and llmd-sim against off and on at its own 60 s stages) for vllm-dp, every peer router's policy and default, over --seeds, and print the scorecard of the default against the others; --stage-length and --warmup apply to all but llmd-sim; --modes runs only those modes besides the default; --out writes every figure's mean, lowest and highest to matrix.json there")
	seeds := fs.String("seeds", "1,2,3", "--matrix: workload seeds, comma-separated; every figure is their mean, with their range")
	detail := fs.Bool("detail", false, "print per stage where turns spend their time (queue, prefill, preemptions) and each replica's load")
	trace := fs.String("trace", "", "replay a turn trace (the lm_warden handler's trace option; FILE or FILE.1,FILE) with every mode, the peer routers' included, instead of the workload, on the replicas the other flags size; docs/trace.md")
	var topt bench.TraceOptions
	shared := fs.String("trace-shared", "0", "--trace: tokens every new line (a conversation's first turn, a side request) starts with, shared by all (the system prompt and tools a client sends in every one); auto: the median of what such turns found cached when recorded")
	fs.DurationVar(&topt.Limit, "trace-limit", 0, "--trace: longest a mode's replay runs, engine time (0: ten times the trace's span plus an hour)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The preset's own stages and modes, unless given.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *trace != "" {
		if *shared == "auto" {
			topt.SharedTokens = bench.SharedAuto
		} else if n, err := strconv.Atoi(*shared); err != nil || n < 0 {
			return fmt.Errorf("--trace-shared must be a token count or auto, got %q", *shared)
		} else {
			topt.SharedTokens = n
		}
		if !set["modes"] && !c.compare {
			// every mode the simulator runs, the peer routers' included
			c.modes = strings.Join(bench.AllModes(), ",")
		}
		return runTrace(cfg, c, strings.Split(*trace, ","), topt, *detail)
	}
	if *matrix {
		var length, warm time.Duration
		if set["stage-length"] {
			length = c.stageLength
		}
		if set["warmup"] {
			warm = c.warmup
		}
		var ss []uint64
		for _, f := range strings.Split(*seeds, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
			if err != nil {
				return fmt.Errorf("bad --seeds entry %q", f)
			}
			ss = append(ss, v)
		}
		var modes []string
		if set["modes"] {
			// a subset, e.g. --modes default to see what a change to the
			// default moves, in a quarter of the time
			if _, modes, err = c.parse(); err != nil {
				return err
			}
		}
		start := time.Now()
		rows, err := bench.Matrix(bench.MatrixRegimes(), bench.MatrixOptions{StageLength: length, Warmup: warm, Seeds: ss, Modes: modes,
			Progress: func(rg string, seed uint64) {
				fmt.Fprintf(os.Stderr, "matrix %-12s seed %d  (%.0fs)\n", rg, seed, time.Since(start).Seconds())
			}})
		if err != nil {
			return err
		}
		if set["out"] {
			// every figure's mean, lowest and highest over the seeds, for
			// comparing two runs column by column
			if err := writeJSON(filepath.Join(c.out, "matrix.json"), rows); err != nil {
				return err
			}
		}
		return bench.WriteScorecard(os.Stdout, rows)
	}
	if !set["stages"] {
		c.stages = joinInts(cfg.Stages)
	}
	if !set["modes"] {
		c.modes = strings.Join(cfg.Modes, ",")
	}
	stages, modes, err := c.parse()
	if err != nil {
		return err
	}
	cfg.Workload, cfg.Stages, cfg.Modes = c.w, stages, modes
	cfg.StageLength, cfg.Warmup = c.stageLength, c.warmup
	cfg.Placement.MaxNumSeqs = cfg.Engine.MaxNumSeqs
	start := time.Now()
	cfg.Progress = func(st bench.Stage) {
		fmt.Fprintf(os.Stderr, "sim %-12s %3d sessions: %5d requests, prefix hits %5.1f%%, TTFB p50 %6.2fs  (%.1fs)\n",
			st.Mode, st.Sessions, st.Requests, st.PrefixHitPct, st.TTFBP50S, time.Since(start).Seconds())
	}
	if *detail {
		cfg.Detail = func(d bench.SimDetail) { _ = bench.WriteSimDetail(os.Stderr, d) }
	}
	rep, err := bench.Sim(cfg)
	if err != nil {
		return err
	}
	return finish(rep, c.out)
}

// runTrace replays a trace under every mode (or --modes) and prints what
// the trace recorded, then the same table as a sweep.
func runTrace(cfg bench.SimConfig, c common, paths []string, opt bench.TraceOptions, detail bool) error {
	_, modes, err := c.parse()
	if err != nil {
		return err
	}
	turns, err := bench.ReadTraceFiles(paths...)
	if err != nil {
		return err
	}
	cfg.Modes = modes
	cfg.Placement.MaxNumSeqs = cfg.Engine.MaxNumSeqs
	start := time.Now()
	cfg.Progress = func(st bench.Stage) {
		fmt.Fprintf(os.Stderr, "sim %-12s trace: %5d requests, prefix hits %5.1f%%, TTFB p50 %6.2fs  (%.1fs)\n",
			st.Mode, st.Requests, st.PrefixHitPct, st.TTFBP50S, time.Since(start).Seconds())
	}
	if detail {
		cfg.Detail = func(d bench.SimDetail) { _ = bench.WriteSimDetail(os.Stderr, d) }
	}
	rep, err := bench.SimTrace(cfg, turns, opt)
	if err != nil {
		return err
	}
	fmt.Println()
	if err := bench.WriteTraceSummary(os.Stdout, rep, cfg); err != nil {
		return err
	}
	fmt.Println()
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	paths, err = rep.WriteReport(c.out)
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("wrote", strings.Join(paths, " "))
	return nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func runHTTP(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	var c common
	addCommon(fs, &c, bench.DefaultWorkload(), 3*time.Minute, 30*time.Second, "off,on")
	var cl bench.Client
	fs.StringVar(&cl.BaseURL, "url", "", "base URL to drive (LM Warden, vLLM or the emulator), without /v1")
	targets := fs.String("targets", "", "several front-ends in front of the same replicas, comma-separated base URLs (instead of --url): a session's turns go to them in turn")
	api := fs.String("api", "anthropic", "client API: anthropic (POST /v1/messages) or openai (POST /v1/chat/completions)")
	fs.StringVar(&cl.Token, "token", os.Getenv("ANTHROPIC_AUTH_TOKEN"), "bearer token (default $ANTHROPIC_AUTH_TOKEN)")
	fs.StringVar(&cl.SessionHeader, "session-header", "x-session-affinity", "session header of --api openai")
	metrics := fs.String("metrics", "", "the replicas' metrics URLs, comma-separated (http://host:8000/metrics,...)")
	speed := fs.Float64("speed", 1, "engine seconds per wall second (the emulator's --speed; 1 for real vLLM)")
	var sw bench.CaddySwitcher
	fs.StringVar(&sw.Admin, "admin", "", "Caddy's admin address: switch modes through LM Warden's admin API (and Caddy's config API with --lb-path)")
	fs.StringVar(&sw.LBPath, "lb-path", "", "config API path of the reverse proxy's selection_policy, for the Caddy baselines")
	tokenizer := fs.String("tokenizer", "emulator", "sizes texts with: emulator (its tokenizer) or bytes (4 bytes per token)")
	label := fs.String("label", "direct", "without --admin: the mode name the report gives the single run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *targets != "" {
		for _, u := range strings.Split(*targets, ",") {
			if u = strings.TrimSpace(u); u != "" {
				cl.Targets = append(cl.Targets, u)
			}
		}
		if cl.BaseURL == "" && len(cl.Targets) > 0 {
			cl.BaseURL = cl.Targets[0]
		}
	}
	stages, modes, err := c.parse()
	if err == nil {
		modes, err = c.httpModes(modes, false)
	}
	if err != nil {
		return err
	}
	npeer := 0
	for _, m := range modes {
		if peers.Is(m) {
			npeer++
		}
	}
	var peer *bench.PeerProxy
	if npeer > 0 {
		// The peer routers' policies run in the bench's own reverse proxy
		// in front of the replicas (--metrics gives their URLs), which the
		// run drives instead of --url.
		if npeer != len(modes) {
			return errors.New("peer modes run in a run of their own (the bench's proxy serves them, not --url's router)")
		}
		if *metrics == "" {
			return errors.New("peer modes need --metrics: the replicas the bench's proxy routes to")
		}
		peer = &bench.PeerProxy{Clock: bench.SpeedClock(*speed), PollInterval: time.Duration(float64(time.Second) / *speed),
			Config: peers.Config{Seed: c.w.Seed}}
		for _, u := range strings.Split(*metrics, ",") {
			peer.Replicas = append(peer.Replicas, strings.TrimSuffix(strings.TrimSpace(u), "/metrics"))
		}
		if cl.SessionHeader != "" {
			peer.SessionHeaders = []string{"X-Claude-Code-Session-Id", cl.SessionHeader}
		}
		peer.CacheGeometry(ctx)
		if err := peer.Start("127.0.0.1:0"); err != nil {
			return err
		}
		defer peer.Close()
		cl.BaseURL, cl.Targets = peer.URL(), nil
		fmt.Fprintf(os.Stderr, "peer routers' policies: the bench's proxy on %s in front of %s\n", peer.URL(), strings.Join(peer.Replicas, " "))
	}
	if cl.BaseURL == "" {
		return errors.New("--url or --targets is required")
	}
	cl.API = bench.API(*api)
	hc := bench.HTTPConfig{
		Client: cl, Workload: c.w, Stages: stages, Modes: modes,
		StageLength: c.stageLength, Warmup: c.warmup, Speed: *speed,
		Progress: os.Stderr, LiveProgress: isTerminal(os.Stderr), Policy: bench.PolicyOf,
	}
	if *tokenizer == "emulator" {
		hc.Count = emulator.CountTokens
	}
	if *metrics != "" {
		hc.Metrics = strings.Split(*metrics, ",")
	}
	switch {
	case peer != nil:
		hc.SetMode, hc.EndSession = peer.SetMode, peer.EndSession
	case sw.Admin != "":
		sw.Model = c.w.Model
		hc.SetMode = sw.SetMode
	default:
		// Nothing to switch: one labelled mode, the router is whatever
		// serves --url.
		hc.Modes = []string{*label}
		hc.Policy = func(string) string { return "external" }
	}
	rep, err := bench.RunHTTP(ctx, hc)
	if rep != nil && len(rep.Stages) > 0 {
		if ferr := finish(rep, c.out); ferr != nil && err == nil {
			err = ferr
		}
	}
	return err
}

// set reports whether the flag was given on the command line.
func set(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// isTerminal reports whether f is a terminal (a character device), where a
// progress line may be rewritten in place with \r.
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// writeJSON writes v, indented, to path, making its directory.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
