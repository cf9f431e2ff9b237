package caddymodule

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// Caddy drops every request header whose name holds "_" or "." before any
// handler runs (modules/caddyhttp/server.go, since 2.11: CGI-style
// backends fold "-", "_" and "." onto one variable name), unless the
// server's expected_underscore_headers (expected_dot_headers) lists it.
// A session header so named never reaches the handler: conversations
// keyed by it would get no key at all. The module cannot let such a
// header through itself (the server drops it first, and changing another
// app's settings from a handler is not Caddy's way), so it says so.

// warnDroppedHeaders logs a warning for each name the server will drop:
// one with "_" that no server of the configuration lists in
// expected_underscore_headers, or with "." none lists in
// expected_dot_headers. The handler cannot tell which server it belongs
// to while it is provisioned, so a name any server expects is taken as
// expected.
func (h *Handler) warnDroppedHeaders(ctx caddy.Context, names []string) {
	var servers map[string]*caddyhttp.Server
	if ctx.Context != nil {
		// the http app is registered before it provisions its routes
		if app, err := ctx.AppIfConfigured("http"); err == nil {
			if a, ok := app.(*caddyhttp.App); ok {
				servers = a.Servers
			}
		}
	}
	for _, name := range names {
		under, dot := strings.Contains(name, "_"), strings.Contains(name, ".")
		if !under && !dot {
			continue
		}
		expected := false
		for _, s := range servers {
			switch {
			case under && dot:
				// only an exact entry, in either list, keeps such a name
				expected = expected || headerListed(name, s.ExpectedUnderscoreHeaders, false) || headerListed(name, s.ExpectedDotHeaders, false)
			case under:
				expected = expected || headerListed(name, s.ExpectedUnderscoreHeaders, true)
			default:
				expected = expected || headerListed(name, s.ExpectedDotHeaders, true)
			}
		}
		if expected {
			continue
		}
		setting, c := "expected_underscore_headers", "_"
		if !under {
			setting, c = "expected_dot_headers", "."
		}
		h.logger.Warn("lm_warden: Caddy drops request headers whose name contains \""+c+"\" before any handler runs; "+
			"list the header in the global option servers { "+setting+" "+name+" } or it never reaches lm_warden",
			zap.String("header", name), zap.String("setting", setting))
	}
}

// headerListed reports whether name matches an entry of a server's
// expected_underscore_headers or expected_dot_headers as Caddy matches
// them: case-insensitive, a trailing "*" a prefix (when globs apply).
func headerListed(name string, list []string, globs bool) bool {
	canon := http.CanonicalHeaderKey(name)
	for _, e := range list {
		if p, glob := strings.CutSuffix(e, "*"); glob {
			if globs && strings.HasPrefix(canon, http.CanonicalHeaderKey(p)) {
				return true
			}
			continue
		}
		if http.CanonicalHeaderKey(e) == canon {
			return true
		}
	}
	return false
}
