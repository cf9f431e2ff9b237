package caddymodule

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// responseWatcher passes the response through unchanged and at once, and
// feeds a copy of the bytes to the usage parser. Watchers are pooled: one is
// taken per request and put back when the handler returns.
type responseWatcher struct {
	caddyhttp.ResponseWriterWrapper
	ctx         context.Context // the request's: done when the client has gone
	remote      string          // the client's address (names a keyless client)
	answered    bool            // the replica's answer was reported a success
	failReport  bool            // the request's failure was reported
	st          *routeState
	parser      *vllmstats.UsageParser
	measure     bool
	inference   bool // the request asks the engine for a generation (isInference)
	wroteHeader bool
	status      int
	encoded     bool // the response has a Content-Encoding: usage cannot be read
	stream      bool // a measured event stream: its first write marks the first token
	// arrived: when the handler got the request, taken only for the turn
	// trace (zero without one); here, in the pooled watcher, so that the
	// request's own state does not grow by it
	arrived time.Time
}

// statusClientClosed is the status Caddy's proxy records for a request
// whose client left before the upstream answered.
const statusClientClosed = 499

var watcherPool = sync.Pool{New: func() any { return new(responseWatcher) }}

// WriteHeader starts usage parsing for successful generation responses.
func (rw *responseWatcher) WriteHeader(status int) {
	if rw.wroteHeader {
		rw.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	if status >= 100 && status < 200 {
		rw.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	if status == statusClientClosed && !rw.answered && rw.ctx != nil && rw.ctx.Err() != nil {
		// Caddy's proxy records a client that left before the replica
		// answered: no answer of the replica's
		rw.abandoned()
		rw.wroteHeader, rw.status = true, status
		rw.ResponseWriterWrapper.WriteHeader(status)
		return
	}
	rw.wroteHeader = true
	rw.status = status
	if rw.st.routed && !rw.answered {
		// the replica answered: a 5xx to an inference request is its
		// failure, anything else ends its run of failures (a stream it
		// cuts later is still one); a 5xx to a probe (HEAD, GET
		// /v1/models, Claude Code's HEAD /api/hello) says nothing about
		// the engine: a 501 from a server that does not know the path
		if status >= 500 {
			if rw.inference {
				rw.failed()
			}
		} else {
			rw.answered = true
			rw.st.dec.Succeeded()
		}
	}
	rw.encoded = rw.Header().Get("Content-Encoding") != ""
	if rw.measure && rw.st.routed && status >= 200 && status < 300 {
		h := rw.Header()
		if !rw.encoded {
			stream := strings.HasPrefix(h.Get("Content-Type"), "text/event-stream")
			rw.parser = getParser(rw.st.api, stream)
			rw.stream = stream
		} else {
			// compressed: cannot read usage; the request still counts, unmeasured
			rw.parser = getParser(vllmstats.APIOpenAI, false)
		}
	}
	rw.ResponseWriterWrapper.WriteHeader(status)
}

// isInference reports whether r asks the engine for a generation: a POST
// other than a token count. Only those requests' error answers count
// against a replica.
func isInference(r *http.Request) bool {
	return r.Method == http.MethodPost && !strings.HasSuffix(r.URL.Path, "/count_tokens")
}

// failed reports the request's failure at its replica, once, unless the
// client went away first (then the replica is not to blame).
func (rw *responseWatcher) failed() {
	if rw.failReport || rw.st == nil || !rw.st.routed || (rw.ctx != nil && rw.ctx.Err() != nil) {
		return
	}
	rw.failReport = true
	rw.st.dec.Failed(time.Time{})
}

// abandoned reports a routed request whose client left before the replica
// sent response headers (nor was the request's failure reported): see
// placement.Decision.Abandoned.
func (rw *responseWatcher) abandoned() {
	if rw.wroteHeader || rw.failReport || rw.st == nil || !rw.st.routed || rw.ctx == nil || rw.ctx.Err() == nil {
		return
	}
	rw.failReport = true
	client := rw.st.key
	if client == "" {
		host, _, err := net.SplitHostPort(rw.remote)
		if err != nil {
			host = rw.remote
		}
		client = "addr:" + host
	}
	rw.st.dec.Abandoned(client, time.Time{})
}

// Write passes b through and parses a copy.
func (rw *responseWatcher) Write(b []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	n, err := rw.ResponseWriterWrapper.Write(b)
	if rw.stream && n > 0 && rw.st.firstAt.IsZero() {
		// a stream's first bytes come with its first token
		rw.st.firstAt = time.Now()
	}
	if rw.parser != nil && n > 0 && !rw.encoded {
		_, _ = rw.parser.Write(b[:n])
	}
	return n, err
}

// ReadFrom keeps io.Copy going through Write, so the parser sees the bytes.
func (rw *responseWatcher) ReadFrom(src io.Reader) (int64, error) {
	return io.Copy(writerOnly{rw}, src)
}

type writerOnly struct{ io.Writer }

var parserPool sync.Pool

func getParser(api vllmstats.API, stream bool) *vllmstats.UsageParser {
	if p, ok := parserPool.Get().(*vllmstats.UsageParser); ok {
		p.Reset(api, stream)
		return p
	}
	return vllmstats.NewUsageParser(api, stream)
}

func putParser(p *vllmstats.UsageParser) { parserPool.Put(p) }

// Interface guards
var (
	_ http.ResponseWriter = (*responseWatcher)(nil)
	_ io.ReaderFrom       = (*responseWatcher)(nil)
)
