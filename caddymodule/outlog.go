package caddymodule

import (
	"time"

	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// logOuts logs, once per poll round, every replica that went out of
// placement or came back since the previous round for a cause other than
// failed polls (which onSnapshot logs as they happen): proxy errors,
// abandoned turns, health checks, an admin's unavailable. A cool-down that
// starts and ends between two rounds is not logged; the counters and
// lm_warden_replica_out still count it.
func (m *modelState) logOuts() {
	const logged = ^placement.CausePoll
	outs := m.router.Outs(nil)
	m.mu.Lock()
	if m.outs == nil {
		m.outs = make(map[string]placement.Cause, len(outs))
	}
	type change struct {
		o          placement.ReplicaOut
		went, back placement.Cause
	}
	var changes []change
	for _, o := range outs {
		cur, prev := o.Out&logged, m.outs[o.ID]
		if cur != prev {
			changes = append(changes, change{o, cur &^ prev, prev &^ cur})
		}
		if cur == 0 {
			delete(m.outs, o.ID)
		} else {
			m.outs[o.ID] = cur
		}
	}
	l := m.logger
	m.mu.Unlock()
	for _, c := range changes {
		fields := []zap.Field{zap.String("model", m.name), zap.String("replica", c.o.ID)}
		if c.went != 0 {
			fs := append(fields, zap.Strings("cause", c.went.Names()), zap.Uint64("proxy_failures", c.o.ProxyFailures))
			if !c.o.CooldownUntil.IsZero() {
				fs = append(fs, zap.Time("until", c.o.CooldownUntil), zap.Duration("for", time.Until(c.o.CooldownUntil).Round(time.Millisecond)))
			}
			// a health check's verdict re-places the replica's
			// conversations; a failure's cool-down or an admin's
			// unavailable only sends elsewhere the turns that come
			// meanwhile (placement.Decision.Failed)
			what := "; turns that come meanwhile go elsewhere"
			if c.went&placement.CauseHealth != 0 {
				what = "; its conversations are re-placed on their next turn"
			}
			l.Warn("replica out of placement: "+c.went.String()+what, fs...)
		}
		if c.back != 0 {
			still := c.o.Out.Names()
			l.Info("replica back in placement: "+c.back.String()+" over", append(fields, zap.Strings("cause", c.back.Names()),
				zap.Strings("still_out_for", still))...)
		}
	}
}
