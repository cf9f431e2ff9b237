package caddymodule

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lmwarden/caddy-lmwarden/internal/bindstore"
)

func TestStoreCaddyfile(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		want    *StoreConfig
		wantErr bool
	}{
		{"every setting", `lm_warden {
			model m
			store redis {
				address 10.0.0.9:6380
				username lmw
				password {env.REDIS_PASSWORD}
				db 2
				tls
				tls_server_name redis.internal
				prefix warden:
				timeout 3ms
			}
		}`, &StoreConfig{Type: "redis", Address: "10.0.0.9:6380", Username: "lmw", Password: "{env.REDIS_PASSWORD}", DB: 2,
			TLS: true, TLSServerName: "redis.internal", Prefix: "warden:", Timeout: caddy.Duration(3 * time.Millisecond)}, false},
		{"defaults", `lm_warden {
			model m
			store redis
		}`, &StoreConfig{Type: "redis"}, false},
		{"tls off", `lm_warden {
			model m
			store redis {
				tls off
			}
		}`, &StoreConfig{Type: "redis"}, false},
		{"no type", `lm_warden {
			store
		}`, nil, true},
		{"other type", `lm_warden {
			store memcached
		}`, nil, true},
		{"unknown option", `lm_warden {
			store redis {
				adress 1.2.3.4:6379
			}
		}`, nil, true},
		{"bad timeout", `lm_warden {
			store redis {
				timeout fast
			}
		}`, nil, true},
		{"bad db", `lm_warden {
			store redis {
				db -1
			}
		}`, nil, true},
		{"option after the block", `lm_warden {
			store redis {
				address 127.0.0.1:6379
			}
			max_num_seqs 32
		}`, &StoreConfig{Type: "redis", Address: "127.0.0.1:6379"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil && !reflect.DeepEqual(p.Store, tc.want) {
				t.Fatalf("store = %+v, want %+v", p.Store, tc.want)
			}
		})
	}
}

func TestStoreValidate(t *testing.T) {
	t.Setenv("LMW_TEST_REDIS_PASSWORD", "s3cret")
	tests := []struct {
		name    string
		cfg     StoreConfig
		wantErr bool
	}{
		{"defaults", StoreConfig{}, false},
		{"address without port", StoreConfig{Address: "redis.internal"}, true},
		{"negative db", StoreConfig{DB: -1}, true},
		{"timeout too long", StoreConfig{Timeout: caddy.Duration(time.Minute)}, true},
		{"other type", StoreConfig{Type: "etcd"}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Model: "m", Store: &tc.cfg}
			if err := p.Validate(); (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
	p := Policy{Model: "m", Store: &StoreConfig{Password: "{env.LMW_TEST_REDIS_PASSWORD}"}}
	c := p.storeConfig()
	if c.Password != "s3cret" || c.Address != bindstore.DefaultAddress || c.Prefix != bindstore.DefaultPrefix || time.Duration(c.Timeout) != bindstore.DefaultTimeout {
		t.Fatalf("resolved %+v", c)
	}
	other := Policy{Model: "m", Store: &StoreConfig{Password: "other"}}
	d := p.shared().diff(other.shared())
	if d == "" || strings.Contains(d, "s3cret") || strings.Contains(d, "password=other") {
		t.Fatalf("settings diff %q must name the store without its password", d)
	}
}
