// Command vllm-emu runs emulated vLLM replicas (see package emulator): N
// one-engine servers on consecutive ports, or one data-parallel server.
//
//	vllm-emu --replicas 4 --port 8001 --speed 10
//	vllm-emu --data-parallel-size 4 --port 8000 --control-port 7999
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/emulator"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vllm-emu:", err)
		os.Exit(1)
	}
}

func run() error {
	def := emulator.DefaultEngineConfig()
	var (
		replicas    = flag.Int("replicas", 1, "one-engine replicas, each on its own port (port, port+1, ...)")
		dp          = flag.Int("data-parallel-size", 1, "engines behind one server (balanced like vLLM, X-data-parallel-rank honoured); overrides --replicas")
		host        = flag.String("host", "127.0.0.1", "listen host")
		port        = flag.Int("port", 8000, "port of the first replica (0 = random)")
		speed       = flag.Float64("speed", 1, "engine time runs this many times faster than the wall clock")
		model       = flag.String("model", emulator.DefaultModel, "served model name")
		maxSeqs     = flag.Int("max-num-seqs", def.MaxNumSeqs, "requests in the running batch per engine")
		blocks      = flag.Int("num-gpu-blocks", def.NumGPUBlocks, "KV cache blocks per engine")
		blockSize   = flag.Int("block-size", def.BlockSize, "tokens per KV block")
		batched     = flag.Int("max-num-batched-tokens", def.MaxNumBatchedTokens, "per-step token budget (chunked prefill)")
		maxLen      = flag.Int("max-model-len", def.MaxModelLen, "max prompt + output tokens")
		controlPort = flag.Int("control-port", 0, "serve fault controls (stop/restart/errors/metrics-hang/slow) on this port; 0 = off")
		slow        = flag.String("slow", "", "start with engine:factor slowed, e.g. 2:3")
		apiServers  = flag.Int("api-server-count", 0, "with --data-parallel-size: API server processes, each balancing on its own (0: one per engine, vLLM's default)")
		dpRotate    = flag.Bool("dp-rotate", false, "the data-parallel balancer rotates its tie-break after every pick (vLLM from PR 47420 on); default: ties to the lowest engine")
		reserveFull = flag.Bool("reserve-full-sequence", false, "admit a waiting request only when its whole prompt fits (vLLM's scheduler_reserve_full_isl)")
		everyLookup = flag.Bool("count-every-lookup", false, "count prefix cache queries at every admission attempt (vLLM before PR 48860)")
		defaultMax  = flag.Int("default-max-tokens", 0, "the most tokens a request that sets no max_tokens gets (vLLM: --override-generation-config '{\"max_new_tokens\": N}'); 0 = up to --max-model-len")
		dpInterval  = flag.Duration("dp-stats-interval", emulator.DefaultDPStatsInterval, "engine-time period of the load snapshot the data-parallel balancer decides on")
	)
	flag.Parse()

	logger, err := zap.NewProduction()
	if err != nil {
		return err
	}
	defer logger.Sync()

	cfg := def
	cfg.MaxNumSeqs, cfg.NumGPUBlocks, cfg.BlockSize = *maxSeqs, *blocks, *blockSize
	cfg.MaxNumBatchedTokens, cfg.MaxModelLen = *batched, *maxLen
	cfg.ReserveFullSequence, cfg.CountEveryLookup = *reserveFull, *everyLookup
	srv, err := emulator.NewServer(emulator.ServerConfig{
		Replicas: *replicas, DataParallel: *dp, Speed: *speed, Model: *model,
		Engine: cfg, Host: *host, BasePort: *port, Logger: logger, DPStatsInterval: *dpInterval,
		DPRotate: *dpRotate, DPAPIServers: *apiServers, DefaultMaxTokens: *defaultMax,
	})
	if err != nil {
		return err
	}
	defer srv.Close()
	if *slow != "" {
		var e int
		var f float64
		if _, err := fmt.Sscanf(*slow, "%d:%g", &e, &f); err != nil {
			return fmt.Errorf("--slow %q: want engine:factor: %w", *slow, err)
		}
		if err := srv.SetSlow(e, f); err != nil {
			return err
		}
	}
	for i, u := range srv.URLs() {
		logger.Info("replica listening", zap.Int("replica", i), zap.String("url", u))
	}

	var ctl *http.Server
	if *controlPort > 0 {
		addr := net.JoinHostPort(*host, strconv.Itoa(*controlPort))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("control listener: %w", err)
		}
		ctl = &http.Server{Handler: srv.ControlHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := ctl.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("control server", zap.Error(err))
			}
		}()
		logger.Info("fault controls listening", zap.String("url", "http://"+addr))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if ctl != nil {
		ctl.Close()
	}
	return nil
}
