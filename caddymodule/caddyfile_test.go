package caddymodule

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

func ptr[T any](v T) *T { return &v }

func TestPolicyCaddyfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		input   string
		want    *Policy
		wantErr bool
	}{
		{"inline model", `lm_warden qwen3-4b`, &Policy{Model: "qwen3-4b"}, false},
		{"every setting", `lm_warden {
			model qwen3-4b
			affinity off
			spill_threshold 8
			spill_waiting 2
			max_num_seqs 32
			idle_ttl 1h
			active_window 10m
			max_sessions 5000
			poll_interval 2s
			poll_timeout 1500ms
			fail_after 4
			fail_cooldown 2s
			metrics_path /prom
			poll_scheme https
			data_parallel_size 4
			client_pin_header X-LM-Warden-Replica
			route_header off
		}`, &Policy{
			Model: "qwen3-4b", Affinity: ptr(false), SpillThreshold: 8, SpillWaiting: 2, MaxNumSeqs: 32,
			IdleTTL: caddy.Duration(time.Hour), ActiveWindow: caddy.Duration(10 * time.Minute),
			MaxSessions: 5000, PollInterval: caddy.Duration(2 * time.Second),
			PollTimeout: caddy.Duration(1500 * time.Millisecond), FailAfter: 4, FailCooldown: caddy.Duration(2 * time.Second), MetricsPath: "/prom",
			PollScheme: "https", DataParallelSize: 4, ClientPinHeader: "X-LM-Warden-Replica", RouteHeader: ptr(false),
		}, false},
		{"spill auto", `lm_warden {
			model m
			spill_threshold auto
			affinity on
		}`, &Policy{Model: "m", Affinity: ptr(true)}, false},
		{"bad spill", `lm_warden {
			spill_threshold zero
		}`, &Policy{}, true},
		{"spill_waiting off", `lm_warden {
			model m
			spill_waiting off
		}`, &Policy{Model: "m"}, false},
		{"bad spill_waiting", `lm_warden {
			spill_waiting -1
		}`, &Policy{}, true},
		{"abandon_after", `lm_warden {
			model m
			abandon_after 5
		}`, &Policy{Model: "m", AbandonAfter: 5}, false},
		{"abandon_after off", `lm_warden {
			model m
			abandon_after off
		}`, &Policy{Model: "m", AbandonAfter: -1}, false},
		{"bad abandon_after", `lm_warden {
			abandon_after 0
		}`, &Policy{}, true},
		{"bad affinity", `lm_warden {
			affinity maybe
		}`, &Policy{}, true},
		{"bad duration", `lm_warden {
			idle_ttl soon
		}`, &Policy{}, true},
		{"unknown option", `lm_warden {
			colour blue
		}`, &Policy{}, true},
		{"relative metrics path", `lm_warden {
			metrics_path metrics
		}`, &Policy{}, true},
		{"two inline args", `lm_warden a b`, &Policy{}, true},
		{"admission settings", `lm_warden {
			model m
			admission off
			kv_tokens 36800
			admit_high_water 0.9
			admit_window 30s
			admit_wait 2m
			admit_queue 64
			bytes_per_token 3.5
		}`, &Policy{Model: "m", Admission: ptr(false), KVTokens: 36800, AdmitHighWater: 0.9,
			AdmitWindow: caddy.Duration(30 * time.Second), AdmitWait: caddy.Duration(2 * time.Minute),
			AdmitQueue: 64, BytesPerToken: 3.5}, false},
		{"bad kv_tokens", `lm_warden {
			kv_tokens lots
		}`, &Policy{}, true},
		{"bad admit_high_water", `lm_warden {
			admit_high_water -1
		}`, &Policy{}, true},
		{"bad admit_wait", `lm_warden {
			admit_wait 0s
		}`, &Policy{}, true},
		{"bad admission", `lm_warden {
			admission sometimes
		}`, &Policy{}, true},
		{"rotate_turns", `lm_warden m {
			rotate_turns 4
		}`, &Policy{Model: "m", RotateTurns: 4}, false},
		{"rotate_turns off", `lm_warden m {
			rotate_turns off
		}`, &Policy{Model: "m", RotateTurns: -1}, false},
		{"bad rotate_turns", `lm_warden {
			rotate_turns 0
		}`, &Policy{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := new(Policy)
			err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(p, tt.want) {
				t.Fatalf("got %+v\nwant %+v", p, tt.want)
			}
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		p    *Policy
		ok   bool
	}{
		{"ok", &Policy{Model: "m"}, true},
		{"no model", &Policy{}, false},
		{"timeout not shorter than interval", &Policy{Model: "m", PollInterval: caddy.Duration(time.Second), PollTimeout: caddy.Duration(time.Second)}, false},
		{"bad scheme", &Policy{Model: "m", PollScheme: "ftp"}, false},
		{"high water too high", &Policy{Model: "m", AdmitHighWater: 5}, false},
		{"negative kv_tokens", &Policy{Model: "m", KVTokens: -1}, false},
		{"rotate_turns off", &Policy{Model: "m", RotateTurns: -1}, true},
		{"rotate_turns below off", &Policy{Model: "m", RotateTurns: -2}, false},
		{"bytes per token too high", &Policy{Model: "m", BytesPerToken: 100}, false},
	} {
		if err := tt.p.Validate(); (err == nil) != tt.ok {
			t.Errorf("%s: err = %v", tt.name, err)
		}
	}
}

func TestHandlerCaddyfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		input   string
		want    Handler
		wantErr bool
	}{
		{"defaults", `lm_warden`, Handler{}, false},
		{"every setting", `lm_warden {
			session_headers X-Session-Id X-Other
			agent_header off
			parent_agent_header X-Parent
			body_keys off
			fingerprint off
			fingerprint_bytes 4KiB
			restart_detection off
			session_end_headers X-Session-End X-Last-Turn
			model_var off
			max_body 8MiB
		}`, Handler{
			SessionHeaders: []string{"X-Session-Id", "X-Other"}, AgentHeader: "-", ParentAgentHeader: "X-Parent",
			BodyKeys: ptr(false), Fingerprint: ptr(false), FingerprintBytes: 4096, ModelVar: ptr(false), MaxBody: 8 << 20,
			RestartDetection: ptr(false), SessionEndHeaders: []string{"X-Session-End", "X-Last-Turn"},
		}, false},
		{"session end off", `lm_warden {
			session_end_headers off
		}`, Handler{SessionEndHeaders: []string{"-"}}, false},
		{"session end on", `lm_warden {
			session_end_headers on
		}`, Handler{SessionEndHeaders: []string{"X-Session-End"}}, false},
		{"no session end headers", `lm_warden {
			session_end_headers
		}`, Handler{}, true},
		{"bad restart_detection", `lm_warden {
			restart_detection maybe
		}`, Handler{}, true},
		{"bad size", `lm_warden {
			max_body lots
		}`, Handler{}, true},
		{"no headers", `lm_warden {
			session_headers
		}`, Handler{}, true},
		{"argument", `lm_warden now`, Handler{}, true},
		{"error_response", `lm_warden {
			error_response caddy
		}`, Handler{ErrorResponse: "caddy"}, false},
		{"bad error_response", `lm_warden {
			error_response html
		}`, Handler{}, true},
		{"trace", `lm_warden {
			trace /var/log/caddy/turns.jsonl
		}`, Handler{TraceFile: "/var/log/caddy/turns.jsonl"}, false},
		{"trace with a cap", `lm_warden {
			trace turns.jsonl 20MiB
		}`, Handler{TraceFile: "turns.jsonl", TraceMaxSize: 20 << 20}, false},
		{"trace without a file", `lm_warden {
			trace
		}`, Handler{}, true},
		{"trace with a bad cap", `lm_warden {
			trace turns.jsonl lots
		}`, Handler{}, true},
		{"trace with a zero cap", `lm_warden {
			trace turns.jsonl 0
		}`, Handler{}, true},
		{"trace with too much", `lm_warden {
			trace turns.jsonl 1MiB 2MiB
		}`, Handler{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tt.input))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && !reflect.DeepEqual(h, tt.want) {
				t.Fatalf("got %+v\nwant %+v", h, tt.want)
			}
		})
	}
}

func TestAPIOf(t *testing.T) {
	t.Parallel()
	for path, want := range map[string]vllmstats.API{
		"/v1/messages":              vllmstats.APIAnthropic,
		"/v1/messages/count_tokens": vllmstats.APIAnthropic,
		"/v1/chat/completions":      vllmstats.APIOpenAI,
		"/v1/completions":           vllmstats.APIOpenAI,
		"/v1/models":                vllmstats.APIOpenAI,
	} {
		if got := apiOf(path); got != want {
			t.Errorf("%s: %v, want %v", path, got, want)
		}
	}
}

// TestHandlerSwitches: the handler's switches from the JSON, absent (on),
// set, and in their deprecated no_… spellings (read as off, and named so
// Provision can warn).
func TestHandlerSwitches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		json                                  string
		bodyKeys, fingerprint, restart, model bool
		deprecated                            []string
	}{
		{`{}`, true, true, true, true, nil},
		{`{"body_keys":false,"model_var":false}`, false, true, true, false, nil},
		{`{"fingerprint":true,"restart_detection":false}`, true, true, false, true, nil},
		{`{"no_body_keys":true,"no_fingerprint":true,"no_restart_detection":true,"no_model_var":true}`, false, false, false, false,
			[]string{"no_body_keys", "no_fingerprint", "no_restart_detection", "no_model_var"}},
		// the deprecated spelling is off whatever the new one says
		{`{"no_model_var":true,"model_var":true}`, true, true, true, false, []string{"no_model_var"}},
	} {
		var h Handler
		if err := json.Unmarshal([]byte(tc.json), &h); err != nil {
			t.Fatal(err)
		}
		deprecated := h.withDefaults()
		if h.bodyKeys != tc.bodyKeys || h.fingerprint != tc.fingerprint || h.restartDetection != tc.restart || h.modelVar != tc.model ||
			!slices.Equal(deprecated, tc.deprecated) {
			t.Errorf("%s: body_keys %v fingerprint %v restart_detection %v model_var %v, deprecated %v; want %v %v %v %v, %v", tc.json,
				h.bodyKeys, h.fingerprint, h.restartDetection, h.modelVar, deprecated,
				tc.bodyKeys, tc.fingerprint, tc.restart, tc.model, tc.deprecated)
		}
	}
}
