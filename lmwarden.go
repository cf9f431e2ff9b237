// Package caddylmwarden plugs LM Warden into Caddy. Importing it registers
// the lm_warden handler, selection policy, app and admin API (see package
// caddymodule), so Caddy can be built with
//
//	xcaddy build v2.11.9 --with github.com/lmwarden/caddy-lmwarden
package caddylmwarden

import (
	// the Caddy modules
	_ "github.com/lmwarden/caddy-lmwarden/caddymodule"
)
