// Command caddy is Caddy with its standard modules and LM Warden built in.
// It is what `xcaddy build --with github.com/lmwarden/caddy-lmwarden` produces,
// kept here so tests and the demo can build it with a plain `go build`.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/lmwarden/caddy-lmwarden/caddymodule"
)

func main() {
	caddycmd.Main()
}
