// Package bindstore is the shared binding store: several Caddy front-ends
// in front of the same replicas keep one set of bindings (conversation →
// replica) in Redis or Valkey, so a conversation whose turns alternate between front-ends stays
// on one replica. Each front-end's router stays the local cache of the
// store and the one that places conversations; the store is the source of
// truth between front-ends. A front-end reads the store only for a
// conversation it does not hold (or has not confirmed since it connected),
// claims a new conversation with SET NX, and publishes the moves it makes
// (spill, re-placement, restart, unpin, session end) on a channel that the
// other front-ends apply on the conversation's next turn. A sticky turn on
// a confirmed binding costs no command: its key's TTL (the idle TTL) is
// refreshed in the background once half of it has passed.
//
// Client: github.com/redis/go-redis/v9. rueidis' client-side caching with
// server-assisted invalidation was considered: its cache is a copy of the
// values, but the binding the request path needs lives in the router with
// its load and lifecycle state, so that cache would be a second local copy
// that still builds a key string per turn (allocations on the sticky path),
// and its invalidations carry no new value. A move message on a channel
// carries the new replica, so the other front-ends follow without a read.
// go-redis gives per-command deadlines through the context (the request
// path's few milliseconds), plain pipelines, and a pub/sub connection that
// reconnects and resubscribes by itself; it is the client most operators
// already know. Redis 7.0 or newer (or Valkey) is needed for SET NX GET.
package bindstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-lmwarden/placement"
)

// Defaults of a store's settings.
const (
	DefaultAddress = "127.0.0.1:6379"
	DefaultPrefix  = "lmw:"
	DefaultTimeout = 5 * time.Millisecond
)

// Config configures the store a model's bindings are shared through
// between front-ends (Caddy instances in front of the same replicas).
type Config struct {
	// Type of store: "redis" (Redis 7.0 or newer, or Valkey).
	Type string `json:"type,omitempty"`
	// Address of the server, host:port. Default 127.0.0.1:6379.
	Address string `json:"address,omitempty"`
	// Username and Password for AUTH (ACL user or requirepass). Both may be
	// placeholders such as {env.REDIS_PASSWORD}.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// DB is the database number. Default 0.
	DB int `json:"db,omitempty"`
	// TLS connects with TLS; TLSServerName overrides the name checked in
	// the server's certificate (default: the address's host).
	TLS           bool   `json:"tls,omitempty"`
	TLSServerName string `json:"tls_server_name,omitempty"`
	// Prefix of every key and of the channel. Default "lmw:". Front-ends
	// share bindings when they use the same store, prefix and model name.
	Prefix string `json:"prefix,omitempty"`
	// Timeout is the deadline of the store's work on a request's path (a
	// read, and a claim for a new conversation); past it the request is
	// routed with the local bindings. Default 5ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// Resolved returns the settings with placeholders ({env.*}) replaced and
// defaults filled in.
func (c Config) Resolved() Config {
	repl := caddy.NewReplacer()
	c.Address = repl.ReplaceAll(c.Address, "")
	c.Username = repl.ReplaceAll(c.Username, "")
	c.Password = repl.ReplaceAll(c.Password, "")
	c.TLSServerName = repl.ReplaceAll(c.TLSServerName, "")
	if c.Type == "" {
		c.Type = "redis"
	}
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Timeout <= 0 {
		c.Timeout = caddy.Duration(DefaultTimeout)
	}
	return c
}

// Validate checks the settings (after Resolved).
func (c Config) Validate(model string) error {
	if c.Type != "redis" {
		return fmt.Errorf("lm_warden %s: store type must be redis, got %q", model, c.Type)
	}
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		return fmt.Errorf("lm_warden %s: store address must be host:port, got %q: %v", model, c.Address, err)
	}
	if c.DB < 0 {
		return fmt.Errorf("lm_warden %s: store db must not be negative", model)
	}
	if time.Duration(c.Timeout) > 10*time.Second {
		return fmt.Errorf("lm_warden %s: store timeout %v is longer than a request should wait for it (at most 10s)", model, time.Duration(c.Timeout))
	}
	return nil
}

// Identity is what policies of one model must agree on about the store;
// the password is compared by a digest, so an error message that lists the
// settings in which two policies differ never shows it.
func (c Config) Identity() string {
	if c.Type == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(c.Password))
	return fmt.Sprintf("%s://%s@%s/%d tls=%v(%s) prefix=%q timeout=%v password=%s",
		c.Type, c.Username, c.Address, c.DB, c.TLS, c.TLSServerName, c.Prefix, time.Duration(c.Timeout), hex.EncodeToString(sum[:4]))
}

// storeHash is the conversation key's hash in the store's keys and move
// messages: FNV-1a, 64 bits, the same in every front-end (the router's own
// hash is seeded per process). Keys carry no conversation key in clear.
func storeHash(key string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h
}

// storeValue is a binding as the store holds it: "<start hex> <replica>".
type storeValue struct {
	replica string
	start   uint64
}

func (v storeValue) String() string { return strconv.FormatUint(v.start, 16) + " " + v.replica }

func parseStoreValue(s string) (storeValue, bool) {
	st, rep, ok := strings.Cut(s, " ")
	if !ok || rep == "" {
		return storeValue{}, false
	}
	n, err := strconv.ParseUint(st, 16, 64)
	if err != nil {
		return storeValue{}, false
	}
	return storeValue{replica: rep, start: n}, true
}

// move is a binding another front-end moved: replica "" means unbound.
type move struct {
	storeValue
	at int64 // when it arrived, unix nanos
}

// genMap is a bounded map from store hash to V: two generations, the
// current one and the previous; when the current one holds half the limit
// it becomes the previous and the previous is dropped. A dropped entry
// costs one read of the store at its conversation's next turn, nothing
// else.
type genMap[V any] struct {
	mu       sync.Mutex
	cur, old map[uint64]V
	half     int
	n        atomic.Int64 // entries held (an upper bound: cur + old)
}

func (g *genMap[V]) init(limit int) {
	g.cur = make(map[uint64]V)
	g.setLimit(limit)
}

func (g *genMap[V]) setLimit(limit int) {
	g.mu.Lock()
	g.half = max(limit/2, 1)
	g.mu.Unlock()
}

func (g *genMap[V]) get(h uint64) (V, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v, ok := g.cur[h]; ok {
		return v, true
	}
	v, ok := g.old[h]
	if ok {
		delete(g.old, h)
		g.putLocked(h, v)
	}
	return v, ok
}

// take returns and removes h's entry.
func (g *genMap[V]) take(h uint64) (V, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	v, ok := g.cur[h]
	if ok {
		delete(g.cur, h)
	} else if v, ok = g.old[h]; ok {
		delete(g.old, h)
	}
	g.n.Store(int64(len(g.cur) + len(g.old)))
	return v, ok
}

func (g *genMap[V]) put(h uint64, v V) {
	g.mu.Lock()
	g.putLocked(h, v)
	g.mu.Unlock()
}

func (g *genMap[V]) putLocked(h uint64, v V) {
	if _, ok := g.cur[h]; !ok && len(g.cur) >= g.half {
		g.old, g.cur = g.cur, make(map[uint64]V, g.half)
	}
	g.cur[h] = v
	g.n.Store(int64(len(g.cur) + len(g.old)))
}

func (g *genMap[V]) del(h uint64) {
	g.mu.Lock()
	delete(g.cur, h)
	delete(g.old, h)
	g.n.Store(int64(len(g.cur) + len(g.old)))
	g.mu.Unlock()
}

func (g *genMap[V]) clear() {
	g.mu.Lock()
	g.cur, g.old = make(map[uint64]V), nil
	g.n.Store(0)
	g.mu.Unlock()
}

func (g *genMap[V]) size() int { return int(g.n.Load()) }

// storeOp is a write the background worker sends.
type storeOp struct {
	kind  uint8
	h     uint64
	key   string // the conversation key (to adopt a winner)
	value storeValue
}

const (
	opMove    uint8 = iota + 1 // SET the binding and PUBLISH it
	opRefresh                  // PEXPIRE; claim anew when the key is gone
	opDelete                   // DEL the binding and PUBLISH it unbound
)

// storeQueue bounds the writes waiting for the worker; past it they are
// dropped (counted as errors).
const storeQueue = 4096

// Store is a model's connection to its shared store: the client, the
// subscriber of the move channel, the background writer and prober, and
// what this front-end knows of the store's bindings.
type Store struct {
	model   string
	cfg     Config
	rdb     *redis.Client
	router  *placement.Router
	logger  *zap.Logger
	keyPre  string // prefix + model + ":b:"
	channel string // prefix + model + ":moves"
	self    string // this front-end's ID in move messages
	timeout time.Duration
	ttl     atomic.Int64 // the bindings' idle TTL, nanoseconds

	up   atomic.Bool   // the store answers; false: route with local bindings only
	slow atomic.Int32  // deadlines passed in a row
	wake chan struct{} // tells the prober the store failed

	// confirmed: conversations whose binding this front-end read from or
	// wrote to the store since it last (re)connected, with when (unix
	// nanos); a sticky turn of one costs no command until half its TTL
	// has passed. pending: moves other front-ends published, applied at the
	// conversation's next turn here.
	confirmed genMap[int64]
	pending   genMap[move]

	ops    chan storeOp
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ps     *redis.PubSub

	errs, fallbacks, reads, claims, lost, adopted, published, received, refreshes, dropped, commands atomic.Uint64
	lastErr                                                                                          atomic.Pointer[string]
}

// New connects a model's router to the store in cfg (resolved)
// and starts its goroutines; Close stops them.
func New(model string, cfg Config, router *placement.Router, logger *zap.Logger) (*Store, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	timeout := time.Duration(cfg.Timeout)
	opt := &redis.Options{
		Addr:                  cfg.Address,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DB:                    cfg.DB,
		Protocol:              2,
		DialTimeout:           time.Second,
		ReadTimeout:           time.Second,
		WriteTimeout:          time.Second,
		ContextTimeoutEnabled: true, // the request path's deadline bounds every call
		MaxRetries:            -1,   // a retry would outlast the deadline; the router falls back
		MinIdleConns:          2,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if cfg.TLS {
		name := cfg.TLSServerName
		if name == "" {
			name, _, _ = net.SplitHostPort(cfg.Address)
		}
		opt.TLSConfig = &tls.Config{ServerName: name, MinVersion: tls.VersionTLS12}
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	s := &Store{
		model:   model,
		cfg:     cfg,
		rdb:     redis.NewClient(opt),
		router:  router,
		logger:  logger.Named("store"),
		keyPre:  cfg.Prefix + model + ":b:",
		channel: cfg.Prefix + model + ":moves",
		self:    hex.EncodeToString(id[:]),
		timeout: timeout,
		wake:    make(chan struct{}, 1),
		ops:     make(chan storeOp, storeQueue),
	}
	rc := router.Config()
	s.ttl.Store(int64(rc.IdleTTL))
	s.confirmed.init(rc.MaxBindings)
	s.pending.init(rc.MaxBindings)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.ps = s.rdb.Subscribe(s.ctx, s.channel)
	s.wake <- struct{}{} // the prober connects at once
	s.wg.Add(3)
	go s.probe()
	go s.work()
	go s.subscribe()
	return s, nil
}

// Reconfigured follows the router's settings after a reload.
func (s *Store) Reconfigured() {
	rc := s.router.Config()
	s.ttl.Store(int64(rc.IdleTTL))
	s.confirmed.setLimit(rc.MaxBindings)
	s.pending.setLimit(rc.MaxBindings)
}

// close stops the goroutines and closes the client.
func (s *Store) Close() {
	s.cancel()
	_ = s.ps.Close()
	s.wg.Wait()
	_ = s.rdb.Close()
}

func (s *Store) key(h uint64) string { return keyName(s.keyPre, h) }

// keyName is the store key of hash h under keyPre (prefix + model + ":b:").
func keyName(keyPre string, h uint64) string {
	var b [64]byte
	out := append(b[:0], keyPre...)
	var hx [16]byte
	n := strconv.AppendUint(hx[:0], h, 16)
	for i := len(n); i < 16; i++ {
		out = append(out, '0')
	}
	out = append(out, n...)
	return string(out)
}

// fail counts a failed call. A refused or broken connection, or a third
// deadline passed in a row, takes the store out of the request path until
// the prober finds it answering; the first failure of such an episode is
// logged as a warning. A single slow answer only costs its own turn.
func (s *Store) fail(err error) {
	s.errs.Add(1)
	msg := err.Error()
	s.lastErr.Store(&msg)
	if isTimeout(err) && s.slow.Add(1) < slowInARow {
		return
	}
	if s.up.CompareAndSwap(true, false) {
		s.logger.Warn("shared binding store unreachable: routing with this instance's bindings until it answers again",
			zap.String("model", s.model), zap.String("address", s.cfg.Address), zap.Error(err))
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// slowInARow is how many deadlines passed in a row take the store out.
const slowInARow = 3

// ok records a call that succeeded.
func (s *Store) ok() {
	if s.slow.Load() != 0 {
		s.slow.Store(0)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// probe pings the store while it is out, backing off, and puts it back on
// the request path when it answers. Moves other front-ends made meanwhile
// reach this one on the channel; when its connection broke, the
// subscriber has this front-end read every conversation again (subscribe).
func (s *Store) probe() {
	defer s.wg.Done()
	first := true
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		}
		backoff := 50 * time.Millisecond
		for !s.up.Load() {
			if !first {
				if !s.sleep(&backoff) {
					return
				}
			}
			ctx, cancel := context.WithTimeout(s.ctx, time.Second)
			err := s.rdb.Ping(ctx).Err()
			cancel()
			s.commands.Add(1)
			if err != nil {
				if first {
					s.logger.Warn("shared binding store unreachable: routing with this instance's bindings until it answers",
						zap.String("model", s.model), zap.String("address", s.cfg.Address), zap.Error(err))
					msg := err.Error()
					s.lastErr.Store(&msg)
					first = false
				}
				continue
			}
			s.slow.Store(0)
			s.up.Store(true)
			if first {
				s.logger.Info("shared binding store connected", zap.String("model", s.model), zap.String("address", s.cfg.Address))
			} else {
				s.logger.Info("shared binding store reachable again: bindings are shared", zap.String("model", s.model), zap.String("address", s.cfg.Address))
			}
			first = false
		}
	}
}

// subscribe receives the moves other front-ends publish. The client
// reconnects and resubscribes by itself; every subscription after the
// first means messages may have been missed, so what this front-end had
// confirmed is read again.
func (s *Store) subscribe() {
	defer s.wg.Done()
	subscribed := false
	backoff := 50 * time.Millisecond
	for {
		msg, err := s.ps.ReceiveTimeout(s.ctx, 10*time.Second)
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// nothing published for a while: check the connection
				_ = s.ps.Ping(s.ctx)
				continue
			}
			if !s.sleep(&backoff) {
				return
			}
			continue
		}
		backoff = 50 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				if subscribed {
					s.confirmed.clear()
				}
				subscribed = true
			}
		case *redis.Message:
			s.onMove(m.Payload)
		}
	}
}

// onMove records a move another front-end published:
// "<front-end> <hash hex> <start hex> <replica>", replica "-" for unbound.
func (s *Store) onMove(payload string) {
	f := strings.SplitN(payload, " ", 4)
	if len(f) != 4 || f[0] == s.self {
		return
	}
	h, err1 := strconv.ParseUint(f[1], 16, 64)
	start, err2 := strconv.ParseUint(f[2], 16, 64)
	if err1 != nil || err2 != nil {
		return
	}
	rep := f[3]
	if rep == "-" {
		rep = ""
	}
	// pending first: a move counted received is one the next turn applies
	s.pending.put(h, move{storeValue: storeValue{replica: rep, start: start}, at: time.Now().UnixNano()})
	s.received.Add(1)
}

func (s *Store) moveMessage(h uint64, v storeValue) string {
	rep := v.replica
	if rep == "" {
		rep = "-"
	}
	return s.self + " " + strconv.FormatUint(h, 16) + " " + strconv.FormatUint(v.start, 16) + " " + rep
}

// enqueue hands a write to the worker without waiting.
func (s *Store) enqueue(op storeOp) {
	select {
	case s.ops <- op:
	default:
		s.dropped.Add(1)
		s.errs.Add(1)
	}
}

// work sends the queued writes. While the store is out they are dropped:
// what this front-end confirmed is read again when it is back.
func (s *Store) work() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case op := <-s.ops:
			if !s.up.Load() {
				s.dropped.Add(1)
				continue
			}
			ctx, cancel := context.WithTimeout(s.ctx, max(20*s.timeout, 100*time.Millisecond))
			if err := s.do(ctx, op); err != nil && s.ctx.Err() == nil {
				s.fail(err)
			}
			cancel()
		}
	}
}

func (s *Store) do(ctx context.Context, op storeOp) error {
	key := s.key(op.h)
	ttl := time.Duration(s.ttl.Load())
	switch op.kind {
	case opMove:
		s.commands.Add(2)
		s.published.Add(1)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, op.value.String(), ttl)
			p.Publish(ctx, s.channel, s.moveMessage(op.h, op.value))
			return nil
		})
		return err
	case opDelete:
		s.commands.Add(2)
		s.published.Add(1)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			p.Publish(ctx, s.channel, s.moveMessage(op.h, storeValue{}))
			return nil
		})
		return err
	case opRefresh:
		s.commands.Add(1)
		s.refreshes.Add(1)
		ok, err := s.rdb.PExpire(ctx, key, ttl).Result()
		if err != nil || ok {
			return err
		}
		// gone: the store lost it (restarted) or it expired there
		win, lost, err := s.claim(ctx, key, op.value)
		if err != nil {
			return err
		}
		if lost && s.router.Adopt(op.key, win.replica, win.start, time.Time{}) {
			s.adopted.Add(1)
		}
	}
	return nil
}

// read returns the store's binding of key and restarts its TTL (one round
// trip: GET and PEXPIRE pipelined).
func (s *Store) read(ctx context.Context, key string) (storeValue, bool, error) {
	s.reads.Add(1)
	s.commands.Add(2)
	var get *redis.StringCmd
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		get = p.Get(ctx, key)
		p.PExpire(ctx, key, time.Duration(s.ttl.Load()))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return storeValue{}, false, err
	}
	s.ok()
	raw, err := get.Result()
	if errors.Is(err, redis.Nil) {
		return storeValue{}, false, nil
	}
	if err != nil {
		return storeValue{}, false, err
	}
	v, ok := parseStoreValue(raw)
	return v, ok, nil
}

// claim sets key to v unless it is set (SET NX GET PX): lost reports that
// another front-end holds it, win is its binding.
func (s *Store) claim(ctx context.Context, key string, v storeValue) (win storeValue, lost bool, err error) {
	s.claims.Add(1)
	s.commands.Add(1)
	ttl := time.Duration(s.ttl.Load())
	raw, err := s.rdb.Do(ctx, "SET", key, v.String(), "NX", "GET", "PX", max(ttl.Milliseconds(), 1)).Text()
	if errors.Is(err, redis.Nil) {
		s.ok()
		return storeValue{}, false, nil
	}
	if err != nil {
		return storeValue{}, false, err
	}
	s.ok()
	s.lost.Add(1)
	win, ok := parseStoreValue(raw)
	if !ok {
		return storeValue{}, false, fmt.Errorf("store key %s holds %q, not a binding", key, raw)
	}
	return win, true, nil
}

// Status is the shared store's state on the routing card.
type Status struct {
	Type      string `json:"type"`
	Address   string `json:"address"`
	Prefix    string `json:"prefix"`
	Connected bool   `json:"connected"`
	// Errors counts calls that failed or timed out (and writes dropped);
	// Fallbacks the turns routed with this instance's bindings alone
	// because the store was out or did not answer in time.
	Errors    uint64 `json:"errors"`
	Fallbacks uint64 `json:"fallbacks"`
	// Reads of the store on a turn's path, claims of new conversations
	// (SET NX), claims another instance had won, bindings adopted from the
	// store or another instance's moves, moves this instance published and
	// received, TTL refreshes, and commands sent in all.
	Reads         uint64 `json:"reads"`
	Claims        uint64 `json:"claims"`
	ClaimsLost    uint64 `json:"claims_lost"`
	Adopted       uint64 `json:"adopted"`
	MovesSent     uint64 `json:"moves_published"`
	MovesReceived uint64 `json:"moves_received"`
	Refreshes     uint64 `json:"refreshes"`
	Commands      uint64 `json:"commands"`
	Timeout       string `json:"timeout"`
	LastError     string `json:"last_error"`
}

func (s *Store) Status() *Status {
	st := &Status{
		Type: s.cfg.Type, Address: s.cfg.Address, Prefix: s.cfg.Prefix, Connected: s.up.Load(),
		Errors: s.errs.Load(), Fallbacks: s.fallbacks.Load(), Reads: s.reads.Load(),
		Claims: s.claims.Load(), ClaimsLost: s.lost.Load(), Adopted: s.adopted.Load(),
		MovesSent: s.published.Load(), MovesReceived: s.received.Load(), Refreshes: s.refreshes.Load(),
		Commands: s.commands.Load(), Timeout: s.timeout.String(),
	}
	if e := s.lastErr.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// quietRedis drops the Redis client's own log lines (dial failures while
// the store is out, one per attempt): the store warns once per episode in
// Caddy's log and counts every failure.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedis{}) }

// sleep waits *backoff, doubled afterwards up to 2 s; false when the store
// is closing.
func (s *Store) sleep(backoff *time.Duration) bool {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C:
	}
	*backoff = min(2**backoff, 2*time.Second)
	return true
}
