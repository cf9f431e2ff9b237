// Package browser holds the headless-chromium tests of the routing card
// page: one renders the page over the pagetest fixture, the other runs
// Caddy with the module in front of emulated replicas and checks that the
// page shows what the admin JSON API says. They live in the tools module
// so the plugin module does not require chromedp.
//
// The tests need Debian's chromium at /usr/bin/chromium (scripts/test
// installs it when run as root) and are skipped without it.
package browser
