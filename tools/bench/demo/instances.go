package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// instance is a front-end of the demo in a process of its own.
type instance struct {
	px    *demoProxy
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	dir   string
}

// multi returns targets when there is more than one front-end.
func multi(targets []string) []string {
	if len(targets) < 2 {
		return nil
	}
	return targets
}

// startInstances starts the front-ends beyond the first: each a process of
// InstanceCommand serving first's configuration on its own ports.
func startInstances(ctx context.Context, cfg Config, first *demoProxy) ([]*instance, error) {
	var out []*instance
	for k := 1; k < cfg.Instances; k++ {
		if len(cfg.InstanceCommand) == 0 {
			return out, fmt.Errorf("demo: %d front-ends need a command to run the others", cfg.Instances)
		}
		px := *first
		var err error
		if px.admin, err = freeAddr(); err != nil {
			return out, err
		}
		if px.listen, err = freeAddr(); err != nil {
			return out, err
		}
		px.remote = true
		in, err := startInstance(ctx, cfg.InstanceCommand, &px, first.mode)
		if err != nil {
			return out, err
		}
		out = append(out, in)
	}
	return out, nil
}

func startInstance(ctx context.Context, command []string, px *demoProxy, mode string) (*instance, error) {
	dir, err := os.MkdirTemp("", "lmw-demo-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(px.Caddyfile(mode)), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "caddy.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	in := &instance{px: px, dir: dir, done: make(chan struct{})}
	in.cmd = exec.Command(command[0], append(command[1:], path)...)
	in.cmd.Stdout, in.cmd.Stderr = logf, logf
	if in.stdin, err = in.cmd.StdinPipe(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	if err := in.cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting a front-end: %w", err)
	}
	go func() { _ = in.cmd.Wait(); logf.Close(); close(in.done) }()
	px.mode = mode
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + px.admin + "/lm-warden/models")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"model"`) {
				return in, nil
			}
		}
		select {
		case <-in.done:
			log, _ := os.ReadFile(filepath.Join(dir, "caddy.log"))
			os.RemoveAll(dir)
			return nil, fmt.Errorf("a front-end exited at start: %s", log)
		case <-ctx.Done():
			in.stop()
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			in.stop()
			return nil, fmt.Errorf("a front-end did not come up on %s within 30s", px.admin)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop closes the front-end's standard input, waits for it to exit (or
// kills it after 10s) and removes its directory.
func (in *instance) stop() {
	in.stdin.Close()
	select {
	case <-in.done:
	case <-time.After(10 * time.Second):
		_ = in.cmd.Process.Kill()
		<-in.done
	}
	os.RemoveAll(in.dir)
}

// ServeInstance serves the Caddyfile at path in this process until its
// standard input closes: a front-end the demo started (Config.Instances).
func ServeInstance(path string) error {
	cfg, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(cfg, map[string]any{"filename": path})
	if err != nil {
		return fmt.Errorf("adapting %s: %w", path, err)
	}
	if err := caddy.Load(cfgJSON, false); err != nil {
		return fmt.Errorf("loading %s: %w", path, err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return caddy.Stop()
}
