package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// CaddySwitcher switches a running Caddy between the modes of a run:
// affinity off and on, and admission (the admit mode), through LM
// Warden's admin API, and Caddy's own
// selection policies by replacing the reverse proxy's selection_policy
// through Caddy's config API (the LM Warden policy is put back, as it was,
// before the next off/on stage).
type CaddySwitcher struct {
	// Admin is Caddy's admin address, e.g. 127.0.0.1:2019.
	Admin string
	// Model is the lm_warden policy's model name.
	Model string
	// LBPath is the config path of the reverse proxy's selection policy,
	// e.g. /config/apps/http/servers/srv0/routes/0/handle/0/routes/0/handle/1/load_balancing/selection_policy.
	// Empty: only off and on can be switched.
	LBPath string
	// SessionHeader is hashed by the header mode (default X-Claude-Code-Session-Id).
	SessionHeader string
	HTTP          *http.Client

	original json.RawMessage
	replaced bool
}

func (c *CaddySwitcher) client() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

func (c *CaddySwitcher) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Admin+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(out))
	}
	return out, nil
}

// SetMode switches Caddy to mode.
func (c *CaddySwitcher) SetMode(ctx context.Context, mode string) error {
	switch mode {
	case ModeOff, ModeOn, ModeAdmit, ModeDefault:
		if c.replaced {
			if _, err := c.do(ctx, http.MethodPatch, c.LBPath, c.original); err != nil {
				return fmt.Errorf("restoring the lm_warden policy: %w", err)
			}
			c.replaced = false
		}
		base := "/lm-warden/models/" + url.PathEscape(c.Model)
		body, _ := json.Marshal(map[string]bool{"affinity": mode != ModeOff})
		if _, err := c.do(ctx, http.MethodPut, base+"/affinity", body); err != nil {
			return err
		}
		body, _ = json.Marshal(map[string]bool{"admission": Admits(mode)})
		_, err := c.do(ctx, http.MethodPut, base+"/admission", body)
		return err
	}
	if mode == ModeVLLMDP {
		return fmt.Errorf("mode %s is vLLM's own balancer, not a Caddy policy: drive the data-parallel server directly (--url at it, without --admin, --label %s)", mode, mode)
	}
	if c.LBPath == "" {
		return fmt.Errorf("mode %s needs the selection policy's config path (--lb-path)", mode)
	}
	if c.original == nil {
		orig, err := c.do(ctx, http.MethodGet, c.LBPath, nil)
		if err != nil {
			return fmt.Errorf("reading the selection policy: %w", err)
		}
		if !strings.Contains(string(orig), `"lm_warden"`) {
			return fmt.Errorf("the selection policy at %s is not lm_warden: %s", c.LBPath, bytes.TrimSpace(orig))
		}
		c.original = bytes.TrimSpace(orig)
	}
	pol := map[string]string{"policy": mode}
	if mode == ModeHeader {
		h := c.SessionHeader
		if h == "" {
			h = "X-Claude-Code-Session-Id"
		}
		pol["field"] = h
	}
	body, _ := json.Marshal(pol)
	if _, err := c.do(ctx, http.MethodPatch, c.LBPath, body); err != nil {
		return fmt.Errorf("switching to %s: %w", mode, err)
	}
	c.replaced = true
	return nil
}
