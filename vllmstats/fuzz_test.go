package vllmstats

import (
	"bytes"
	"strings"
	"testing"
)

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"four_engines.txt", "single_no_engine.txt", "single_engine_rank.txt", "legacy.txt", "sim_v0.10.2_excerpt.txt", "sim_v0.10.2.txt", "sim_main.txt", "sim_v0.10.2_no_prefix.txt", "vllm_v1.txt"} {
		f.Add(readFixture(f, name))
	}
	f.Add("vllm:num_requests_running{engine=\"0\"} NaN\n")
	f.Add("vllm:cache_config_info{block_size=\"1e9\",num_gpu_blocks=\"1e9\"} 1\n")
	f.Add("# TYPE vllm:x histogram\nvllm:x_bucket{le=\"+Inf\"} 1\nvllm:x_count 1\n")
	f.Fuzz(func(t *testing.T, in string) {
		engines, err := ParseMetrics(strings.NewReader(in))
		if err != nil {
			if engines != nil {
				t.Fatalf("engines %v with error %v", engines, err)
			}
			return
		}
		if len(engines) == 0 {
			t.Fatal("no engines and no error")
		}
		for id, e := range engines {
			if id == "" || e.Engine != id {
				t.Fatalf("engine key %q holds %q", id, e.Engine)
			}
			if e.BlockSize < 0 || e.NumGPUBlocks < 0 {
				t.Fatalf("negative cache config %+v", e)
			}
			if e.Present == 0 || e.Present&^AllFigures != 0 {
				t.Fatalf("engine %q with figures %b", id, e.Present)
			}
			// an absent figure reads as 0, never as a stale or partial value
			for _, f := range []struct {
				fig Figures
				v   float64
			}{{FigRunning, e.Running}, {FigWaiting, e.Waiting}, {FigKVUsage, e.KVUsage}, {FigPrefixQueries, e.PrefixQueries},
				{FigPrefixHits, e.PrefixHits}, {FigPromptTokens, e.PromptTokens}, {FigGenerationTokens, e.GenerationTokens}} {
				if !e.Present.Has(f.fig) && f.v != 0 {
					t.Fatalf("absent figure %v holds %v", f.fig, f.v)
				}
			}
		}
	})
}

func FuzzUsageParser(f *testing.F) {
	for _, tc := range usageCases {
		if len(tc.body) < 4096 {
			f.Add([]byte(tc.body), uint8(tc.api), uint16(len(tc.body)/2), uint16(len(tc.body)/3))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, apiN uint8, cut1, cut2 uint16) {
		api := API(1 + apiN%3) // APIOpenAI, APIAnthropic, APIResponses
		whole := NewUsageParser(api, true)
		whole.Write(body)
		want := whole.Usage()
		if want.CachedMeasured && !want.Measured {
			t.Fatalf("cached measured without usage: %+v", want)
		}
		a, b := int(cut1)%(len(body)+1), int(cut2)%(len(body)+1)
		if a > b {
			a, b = b, a
		}
		p := NewUsageParser(api, false)
		for _, part := range [][]byte{body[:a], body[a:b], body[b:]} {
			if n, err := p.Write(bytes.Clone(part)); n != len(part) || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
		if got := p.Usage(); got != want {
			t.Fatalf("split at %d,%d: %+v, whole: %+v", a, b, got, want)
		}
	})
}
