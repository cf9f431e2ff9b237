package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/lmwarden/caddy-lmwarden/emulator"
	"github.com/lmwarden/caddy-lmwarden/tools/bench/peers"
)

// PeerProxy is the HTTP bench's stand-in for a peer router: a reverse
// proxy (net/http/httputil, responses streamed as they come) in front of
// the replicas that picks each request's replica with a peer policy
// (package peers), the same code the simulator runs. It gives the policy
// the signals its router has: its own in-flight counts (a request counts
// from the pick until its response body ends, its prefill until the first
// body bytes), the replicas' queue and KV usage polled from their
// /metrics, and the request's text (system prompt and messages rendered
// and tokenized as the emulator does) for its prefix index.
type PeerProxy struct {
	// Replicas are the replicas' base URLs (http://host:port, without /v1).
	Replicas []string
	// Config sizes the policies (Replicas is filled from the URLs).
	Config peers.Config
	// PollInterval is how often the replicas' /metrics are read (default
	// 1 s).
	PollInterval time.Duration
	// SessionHeaders are read in order for the session key (default
	// X-Claude-Code-Session-Id, then x-session-affinity).
	SessionHeaders []string
	// Clock is the policies' clock (default time.Now); an emulator sped
	// up runs its TTLs on engine time (SpeedClock).
	Clock func() time.Time

	mu     sync.Mutex
	tick   chan struct{} // closed at every poll, for requests a policy holds
	onHold func()        // called when a request is held (tests)
	policy peers.Policy
	mode   string
	proxy  []*httputil.ReverseProxy
	srv    *http.Server
	ln     net.Listener
	cancel context.CancelFunc
	done   chan struct{}
}

// maxPeerBody bounds the request body the proxy reads to render it.
const maxPeerBody = 32 << 20

// CacheGeometry reads the replicas' KV cache geometry from the first
// replica's vllm:cache_config_info into Config (left as it is when the
// replica does not publish it).
func (p *PeerProxy) CacheGeometry(ctx context.Context) {
	if len(p.Replicas) == 0 {
		return
	}
	ms, err := fetchMetrics(ctx, &http.Client{Timeout: 5 * time.Second}, strings.TrimSuffix(p.Replicas[0], "/")+"/metrics")
	if err != nil {
		return
	}
	for _, m := range ms {
		if m.BlockSize > 0 && m.NumGPUBlocks > 0 {
			p.Config.BlockSize, p.Config.NumGPUBlocks = m.BlockSize, m.NumGPUBlocks
			return
		}
	}
}

// Start listens on addr (127.0.0.1:0 for a free port) and starts polling
// the replicas. The policy is set by SetMode.
func (p *PeerProxy) Start(addr string) error {
	if len(p.Replicas) == 0 {
		return errors.New("peer proxy: no replicas")
	}
	if p.PollInterval <= 0 {
		p.PollInterval = time.Second
	}
	if p.Clock == nil {
		p.Clock = time.Now
	}
	if len(p.SessionHeaders) == 0 {
		p.SessionHeaders = []string{"X-Claude-Code-Session-Id", "x-session-affinity"}
	}
	p.Config.Replicas = p.Replicas
	p.tick = make(chan struct{})
	for _, r := range p.Replicas {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return fmt.Errorf("peer proxy: bad replica URL %q", r)
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.FlushInterval = -1 // stream every chunk as it comes (SSE)
		rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "peer proxy: upstream: "+err.Error(), http.StatusBadGateway)
		}
		p.proxy = append(p.proxy, rp)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("peer proxy: %w", err)
	}
	p.ln = ln
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		p.pollLoop(ctx)
	}()
	go func() { _ = p.srv.Serve(ln) }()
	return nil
}

// URL is the proxy's base URL.
func (p *PeerProxy) URL() string { return "http://" + p.ln.Addr().String() }

// Close stops the proxy and its poller.
func (p *PeerProxy) Close() error {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	if p.srv != nil {
		return p.srv.Close()
	}
	return nil
}

// SetMode installs a fresh policy of that peer mode (a router restarted
// with that policy: no bindings, no index).
func (p *PeerProxy) SetMode(_ context.Context, mode string) error {
	pol, err := peers.New(mode, p.Config)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.policy, p.mode = pol, mode
	p.mu.Unlock()
	return nil
}

// EndSession tells the policy a conversation is over (the bench's stage
// end).
func (p *PeerProxy) EndSession(_ context.Context, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.policy != nil {
		p.policy.EndSession(id, p.Clock())
	}
}

// ServeHTTP routes one request.
func (p *PeerProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/health" {
		// the proxy's own health, for a front's health checks
		w.WriteHeader(http.StatusOK)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPeerBody))
	if err != nil {
		http.Error(w, "peer proxy: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	req := peers.Request{Now: p.Clock()}
	for _, h := range p.SessionHeaders {
		if v := r.Header.Get(h); v != "" {
			req.Key = v
			break
		}
	}
	if r.Method == http.MethodPost {
		req.Tokens, req.FirstUser = RenderRequest(body)
	}
	var f *peers.Flight
	var pol peers.Policy
	for {
		p.mu.Lock()
		pol = p.policy
		if pol == nil {
			p.mu.Unlock()
			http.Error(w, "peer proxy: no mode set", http.StatusServiceUnavailable)
			return
		}
		req.Now = p.Clock()
		f = pol.Pick(req)
		tick := p.tick
		p.mu.Unlock()
		if f != nil {
			break
		}
		if p.onHold != nil {
			p.onHold()
		}
		// held at the router (a paused program): ask again after the
		// next poll, or give up with the client
		select {
		case <-tick:
		case <-r.Context().Done():
			return
		}
	}
	fw := &firstWrite{ResponseWriter: w, first: func() {
		p.mu.Lock()
		pol.FirstToken(f, p.Clock())
		p.mu.Unlock()
	}}
	defer func() {
		p.mu.Lock()
		pol.Done(f, p.Clock())
		p.mu.Unlock()
	}()
	p.proxy[f.Replica].ServeHTTP(fw, r)
}

// firstWrite calls first at the first body bytes of the response.
type firstWrite struct {
	http.ResponseWriter
	first func()
	once  sync.Once
}

func (w *firstWrite) Write(b []byte) (int, error) {
	if len(b) > 0 {
		w.once.Do(w.first)
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes flushes through, so SSE events reach the client at once.
func (w *firstWrite) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the writer beneath.
func (w *firstWrite) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (p *PeerProxy) pollLoop(ctx context.Context) {
	hc := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(p.PollInterval)
	defer tick.Stop()
	for {
		p.PollNow(ctx, hc)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// PollNow reads the replicas' /metrics once, gives the policy their load
// and wakes the requests it holds to ask again.
func (p *PeerProxy) PollNow(ctx context.Context, hc *http.Client) {
	{
		loads := make([]peers.Load, len(p.Replicas))
		for i, u := range p.Replicas {
			ms, err := fetchMetrics(ctx, hc, strings.TrimSuffix(u, "/")+"/metrics")
			if err != nil {
				continue
			}
			for _, m := range ms {
				// one engine per replica URL; a data-parallel server's
				// engines add up
				loads[i].Waiting += int(m.Waiting)
				loads[i].Running += int(m.Running)
				loads[i].KVUsage = max(loads[i].KVUsage, m.KVUsage)
			}
		}
		p.mu.Lock()
		if p.policy != nil {
			p.policy.Poll(loads, p.Clock())
		}
		close(p.tick)
		p.tick = make(chan struct{})
		p.mu.Unlock()
	}
}

// RenderRequest returns the prompt of an Anthropic Messages or OpenAI chat
// request body as the peers' request text — the system prompt and every
// message's text rendered and tokenized as the emulator renders prompts
// (tool calls and results by their JSON), so a conversation's next turn
// extends this turn's tokens — and the first user message's text. A body
// it cannot read gives no tokens.
func RenderRequest(body []byte) ([]uint32, string) {
	var req struct {
		System   json.RawMessage `json:"system"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return nil, ""
	}
	var toks []uint32
	if sys := contentText(req.System); sys != "" {
		toks = emulator.AppendTokens(toks, emulator.RenderMessage("system", sys))
	}
	first := ""
	for _, m := range req.Messages {
		text := contentText(m.Content)
		if m.Role == "user" && first == "" {
			first = text
		}
		toks = emulator.AppendTokens(toks, emulator.RenderMessage(m.Role, text))
	}
	return toks, first
}

// contentText is a content field's text: the string, or the text of its
// blocks (other blocks by their JSON).
func contentText(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) != nil {
		return string(raw)
	}
	var b strings.Builder
	for _, blk := range blocks {
		var t struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(blk, &t) == nil && t.Type == "text" {
			b.WriteString(t.Text)
			continue
		}
		var c bytes.Buffer
		if json.Compact(&c, blk) == nil {
			b.Write(c.Bytes())
		}
	}
	return b.String()
}

// SpeedClock is a clock that runs speed times faster than the wall clock
// from now on: the engine time of an emulator sped up.
func SpeedClock(speed float64) func() time.Time {
	start := time.Now()
	return func() time.Time {
		return start.Add(time.Duration(float64(time.Since(start)) * speed))
	}
}
