package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Fault is a failure injected into one replica in the middle of every
// stage: from At after the stage's measured window starts, for For (both
// engine time), the replica is killed (kill: its port refuses connections
// and its open streams are cut; restarted empty afterwards) or hung (hang:
// it accepts requests and never answers them, while its /metrics still
// does; cleared afterwards), or restarted (restart: killed and restarted
// at once with an empty prefix cache and counters from zero, as vLLM after
// a quick restart; For does not apply).
type Fault struct {
	Kind    string // "kill" or "hang"
	Replica int
	At, For time.Duration
}

// Fault kinds.
const (
	FaultKill    = "kill"
	FaultHang    = "hang"
	FaultRestart = "restart"
)

// String renders the fault as ParseFault reads it.
func (f Fault) String() string {
	if f.Kind == FaultRestart {
		return fmt.Sprintf("%s:replica=%d,at=%s", f.Kind, f.Replica, f.At)
	}
	return fmt.Sprintf("%s:replica=%d,at=%s,for=%s", f.Kind, f.Replica, f.At, f.For)
}

// ParseFault reads "kill:replica=1,at=30s,for=25s" (or hang:…, or
// restart:replica=1,at=30s without for). replica defaults to 0, at to 30s,
// for to 25s.
func ParseFault(s string) (Fault, error) {
	kind, rest, _ := strings.Cut(strings.TrimSpace(s), ":")
	f := Fault{Kind: kind, At: 30 * time.Second, For: 25 * time.Second}
	if kind != FaultKill && kind != FaultHang && kind != FaultRestart {
		return Fault{}, fmt.Errorf("fault %q: kind must be kill, hang or restart", s)
	}
	if kind == FaultRestart {
		f.For = 0
	}
	if rest == "" {
		return f, nil
	}
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return Fault{}, fmt.Errorf("fault %q: %q is not key=value", s, kv)
		}
		var err error
		switch k {
		case "replica":
			f.Replica, err = strconv.Atoi(v)
			if err == nil && f.Replica < 0 {
				err = fmt.Errorf("negative")
			}
		case "at":
			f.At, err = time.ParseDuration(v)
			if err == nil && f.At < 0 {
				err = fmt.Errorf("negative")
			}
		case "for":
			if kind == FaultRestart {
				err = fmt.Errorf("a restart has no duration")
				break
			}
			f.For, err = time.ParseDuration(v)
			if err == nil && f.For <= 0 {
				err = fmt.Errorf("must be positive")
			}
		default:
			err = fmt.Errorf("unknown key")
		}
		if err != nil {
			return Fault{}, fmt.Errorf("fault %q: %s=%s: %v", s, k, v, err)
		}
	}
	return f, nil
}

// FaultTarget applies a fault to a replica and lifts it (the emulator's
// fault controls).
type FaultTarget interface {
	Stop(replica int) error
	Restart(replica int) error
	SetRequestsHang(replica int, on bool) error
}

// Inject runs the fault once: it waits until At after warmup (engine time,
// at speed engine seconds per wall second), applies it, and lifts it For
// later or when ctx ends, whichever comes first. log, when set, is told
// when each happens.
func (f Fault) Inject(ctx context.Context, target FaultTarget, warmup time.Duration, speed float64, log func(string)) error {
	wall := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(wall(warmup + f.At)):
	}
	var err error
	if f.Kind == FaultRestart {
		if err = target.Stop(f.Replica); err == nil {
			err = target.Restart(f.Replica)
		}
		if err != nil {
			return fmt.Errorf("fault %s: %w", f, err)
		}
		if log != nil {
			log(fmt.Sprintf("fault: restarted replica %d (empty cache)", f.Replica))
		}
		return nil
	}
	if f.Kind == FaultKill {
		err = target.Stop(f.Replica)
	} else {
		err = target.SetRequestsHang(f.Replica, true)
	}
	if err != nil {
		return fmt.Errorf("fault %s: %w", f, err)
	}
	if log != nil {
		log(fmt.Sprintf("fault: %s replica %d", f.Kind, f.Replica))
	}
	select {
	case <-ctx.Done():
	case <-time.After(wall(f.For)):
	}
	if f.Kind == FaultKill {
		err = target.Restart(f.Replica)
	} else {
		err = target.SetRequestsHang(f.Replica, false)
	}
	if err != nil {
		return fmt.Errorf("lifting fault %s: %w", f, err)
	}
	if log != nil {
		log(fmt.Sprintf("fault lifted: replica %d", f.Replica))
	}
	return nil
}
