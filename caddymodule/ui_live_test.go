package caddymodule

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-lmwarden/internal/card"
)

func round1(f float64) float64 { return math.Round(f*10) / 10 }

// uiDecodeView GETs path from h and decodes the view document it answers.
func uiDecodeView[T any](t *testing.T, h http.Handler, path string) (T, *http.Response) {
	t.Helper()
	var v T
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	resp := rec.Result()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("%s: %v: %s", path, err, body)
		}
	}
	return v, resp
}

// TestUILiveSource serves the views of a live model (as the admin endpoint
// finds it) and checks the chart against the accountant's per-second
// series summed into 10 s points, the way the page has always drawn it.
func TestUILiveSource(t *testing.T) {
	now := time.Date(2026, 11, 30, 19, 0, 0, 500_000_000, time.UTC)
	ser := uiLiveModel(t, "ui-live/model", now).acct.Series(now)
	s, err := card.NewServer(liveSource{}, 0, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := s.Serve(w, r); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
		}
	})

	models, resp := uiDecodeView[card.ModelsView](t, h, "/lm-warden/ui/-/models.json")
	if resp.StatusCode != http.StatusOK || !slices.ContainsFunc(models.Models, func(r card.ModelRow) bool {
		return r.Model == "ui-live/model" && r.Href == "ui-live%2Fmodel" && r.Cells["replicas"].V == float64(4)
	}) {
		t.Errorf("status %d, models %+v", resp.StatusCode, models.Models)
	}

	cv, resp := uiDecodeView[card.CardView](t, h, "/lm-warden/ui/ui-live%2Fmodel/view.json")
	if resp.StatusCode != http.StatusOK || cv.Model != "ui-live/model" || len(cv.Replicas) != 4 || cv.Replicas[0].ID != "127.0.0.1:8001" {
		t.Fatalf("status %d, card %+v", resp.StatusCode, cv)
	}

	for _, replica := range []string{"", "127.0.0.1:8003"} {
		sum := ser.Sum
		if replica != "" {
			sum = ser.Replicas[replica]
		}
		v, resp := uiDecodeView[card.StatsView](t, h, "/lm-warden/ui/ui-live%2Fmodel/stats.json?replica="+url.QueryEscape(replica))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("replica %q: status %d", replica, resp.StatusCode)
		}
		if wantEnd := ser.Start.Add(3599 * time.Second); !v.End.Equal(wantEnd) || v.StepS != 10 || len(v.Cached) != 359 {
			t.Fatalf("replica %q: end %v (want %v), step %v, %d points", replica, v.End, wantEnd, v.StepS, len(v.Cached))
		}
		var c, p uint64
		for i := range v.Cached {
			var wc, wp, wg uint64
			for j := 9 + i*10; j < 19+i*10; j++ {
				wc += sum.Cached[j]
				wp += sum.Computed[j]
				wg += sum.Generated[j]
			}
			c, p = c+wc, p+wp
			if v.Cached[i] != round1(float64(wc)/10) || v.Computed[i] != round1(float64(wp)/10) || v.Generated[i] != round1(float64(wg)/10) {
				t.Fatalf("replica %q point %d: %v/%v/%v, want sums %d/%d/%d over 10 s", replica, i,
					v.Cached[i], v.Computed[i], v.Generated[i], wc, wp, wg)
			}
		}
		wantShare := ser.HourCachedShare
		if replica != "" {
			wantShare = float64(c) / float64(c+p)
		}
		if v.Share.V.(float64) != wantShare || !slices.Equal(v.Replicas, []string{"127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003", "127.0.0.1:8004"}) {
			t.Errorf("replica %q: share %v, want %v; replicas %v", replica, v.Share.V, wantShare, v.Replicas)
		}
	}

	for _, tc := range []struct{ path, msg string }{
		{"/lm-warden/ui/ui-live%2Fmodel/stats.json?replica=nope", "no such replica"},
		{"/lm-warden/ui/not-loaded/view.json", "unknown model"},
		{"/lm-warden/ui/not-loaded/stats.json", "unknown model"},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), tc.msg) {
			t.Errorf("%s: status %d, body %s", tc.path, rec.Code, rec.Body.String())
		}
	}
}
