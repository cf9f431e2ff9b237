package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// API is the wire format the client speaks.
type API string

const (
	// APIAnthropic is POST /v1/messages, streaming, as Claude Code sends it.
	APIAnthropic API = "anthropic"
	// APIOpenAI is POST /v1/chat/completions, streaming with usage.
	APIOpenAI API = "openai"
)

// Headers that tell which replica served a turn.
const (
	// RouteHeader is LM Warden's "<replica>; <reason>" answer header.
	RouteHeader = "X-LM-Warden-Route"
	// WaitHeader is LM Warden's answer header saying how many seconds a
	// new conversation's first request waited for admission.
	WaitHeader = "X-LM-Warden-Wait"
	// ExpectHeader is LM Warden's answer header of the turn's expected time
	// to first token from its routing, in seconds.
	ExpectHeader = "X-LM-Warden-Expect"
	// EngineHeader is the emulator's (and the demo's) engine header.
	EngineHeader = "X-Emu-Engine"
)

// Client sends one turn of a session and streams the answer.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080 (no trailing /v1)
	// Targets, when set, are several front-ends in front of the same
	// replicas (base URLs like BaseURL, which they replace): a session's
	// turns go round-robin over them, starting at a different one per
	// session, so consecutive turns of one session reach different
	// front-ends.
	Targets []string
	API     API
	Token   string // sent as Authorization: Bearer
	// SessionHeader is the OpenAI-format session header (default
	// x-session-affinity; Anthropic requests always send
	// X-Claude-Code-Session-Id).
	SessionHeader string
	HTTP          *http.Client
	// Now returns the time used for TTFB (default time.Now).
	Now func() time.Time
}

// TurnResult is what one streamed turn returned.
type TurnResult struct {
	Sent, FirstToken, Done time.Time // FirstToken zero when no content arrived
	Text                   string
	OutputTokens           int // from usage when reported, else streamed deltas
	CachedTokens           int // from usage, -1 when not reported
	Replica                string
	Route                  string // the raw X-LM-Warden-Route header
	// Waited is how long LM Warden held the request for admission
	// (X-LM-Warden-Wait); 0 when it was not held.
	Waited time.Duration
	// Expect is the turn's expected time to first token from its routing
	// (X-LM-Warden-Expect); 0 when none was given.
	Expect time.Duration
}

// headerSeconds returns the seconds header name gives (LM Warden's wait and
// expect headers, e.g. "0.420") as a duration; 0 when it is absent, does not
// parse, or is negative or implausibly large.
func headerSeconds(h http.Header, name string) time.Duration {
	secs, err := strconv.ParseFloat(h.Get(name), 64)
	if err != nil || secs < 0 || secs >= 1e6 {
		return 0
	}
	return time.Duration(secs * float64(time.Second))
}

// Target returns the base URL turn t of sess is sent to: BaseURL, or one
// of Targets in turn.
func (c *Client) Target(sess *Session, t int) string {
	if len(c.Targets) == 0 {
		return c.BaseURL
	}
	return c.Targets[(sess.Serial+t)%len(c.Targets)]
}

// Send streams turn t of sess. The replica is the emulator's engine header
// when present (the ground truth behind any router), else the replica part
// of LM Warden's route header.
func (c *Client) Send(ctx context.Context, sess *Session, t int) (TurnResult, error) {
	now := c.Now
	if now == nil {
		now = time.Now
	}
	body, path, err := c.body(sess, t)
	if err != nil {
		return TurnResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.Target(sess, t), "/")+path, bytes.NewReader(body))
	if err != nil {
		return TurnResult{}, fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	switch c.API {
	case APIOpenAI:
		h := c.SessionHeader
		if h == "" {
			h = "x-session-affinity"
		}
		req.Header.Set(h, sess.ID)
	default:
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14")
		req.Header.Set("X-Claude-Code-Session-Id", sess.ID)
		req.Header.Set("x-app", "cli")
		req.Header.Set("User-Agent", "claude-cli/2.1.0 (external, cli)")
		req.Header.Set("x-client-request-id", fmt.Sprintf("%s-%d", sess.ID[:8], t))
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res := TurnResult{Sent: now(), CachedTokens: -1}
	resp, err := hc.Do(req)
	if err != nil {
		return res, fmt.Errorf("sending turn %d of %s: %w", t, sess.ID, err)
	}
	defer resp.Body.Close()
	res.Route = resp.Header.Get(RouteHeader)
	res.Expect = headerSeconds(resp.Header, ExpectHeader)
	res.Waited = headerSeconds(resp.Header, WaitHeader)
	res.Replica = resp.Header.Get(EngineHeader)
	if res.Replica == "" && res.Route != "" {
		res.Replica = strings.TrimSpace(strings.SplitN(res.Route, ";", 2)[0])
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return res, fmt.Errorf("turn %d of %s: status %d: %s", t, sess.ID, resp.StatusCode, bytes.TrimSpace(msg))
	}
	var text strings.Builder
	deltas := 0
	usageOut := -1
	onContent := func(s string) {
		if s == "" {
			return
		}
		if res.FirstToken.IsZero() {
			res.FirstToken = now()
		}
		deltas++
		text.WriteString(s)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if len(data) == 0 || string(data) == "[DONE]" {
			continue
		}
		var ev streamEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return res, fmt.Errorf("turn %d of %s: bad stream event %.100q: %w", t, sess.ID, data, err)
		}
		if ev.Error != nil {
			return res, fmt.Errorf("turn %d of %s: stream error: %s", t, sess.ID, ev.Error.Message)
		}
		switch c.API {
		case APIOpenAI:
			for _, ch := range ev.Choices {
				onContent(ch.Delta.Content)
			}
			if ev.Usage != nil {
				usageOut = ev.Usage.CompletionTokens
				if ev.Usage.PromptTokensDetails != nil {
					res.CachedTokens = ev.Usage.PromptTokensDetails.CachedTokens
				}
			}
		default:
			switch ev.Type {
			case "message_start":
				if ev.Message != nil && ev.Message.Usage != nil && ev.Message.Usage.CacheReadInputTokens != nil {
					res.CachedTokens = *ev.Message.Usage.CacheReadInputTokens
				}
			case "content_block_delta":
				if ev.Delta != nil {
					onContent(ev.Delta.Text + ev.Delta.Thinking)
				}
			case "message_delta":
				if ev.Usage != nil && ev.Usage.OutputTokens > 0 {
					usageOut = ev.Usage.OutputTokens
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("turn %d of %s: reading stream: %w", t, sess.ID, err)
	}
	res.Done = now()
	res.Text = text.String()
	res.OutputTokens = deltas
	if usageOut >= 0 {
		res.OutputTokens = usageOut
	}
	if res.FirstToken.IsZero() {
		return res, fmt.Errorf("turn %d of %s: stream ended without content", t, sess.ID)
	}
	return res, nil
}

type streamEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *struct {
			CacheReadInputTokens *int `json:"cache_read_input_tokens"`
		} `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text     string `json:"text"`
		Thinking string `json:"thinking"`
	} `json:"delta"`
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		OutputTokens        int `json:"output_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicMessage struct {
	Role    string      `json:"role"`
	Content []textBlock `json:"content"`
}

type anthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens int                `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	System    []textBlock        `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	Metadata  struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

type openAIMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type openAIRequest struct {
	Model         string          `json:"model"`
	Messages      []openAIMessage `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (c *Client) body(sess *Session, t int) ([]byte, string, error) {
	hist := sess.History(t)
	var v any
	path := "/v1/messages?beta=true"
	switch c.API {
	case APIOpenAI:
		r := openAIRequest{Model: sess.Model, MaxTokens: sess.OutputTokens, Stream: true}
		r.StreamOptions.IncludeUsage = true
		r.Messages = append(r.Messages, openAIMessage{Role: "system", Content: sess.System})
		for _, m := range hist {
			r.Messages = append(r.Messages, openAIMessage{Role: m.Role, Content: m.Text})
		}
		v, path = r, "/v1/chat/completions"
	case APIAnthropic, "":
		r := anthropicRequest{Model: sess.Model, MaxTokens: sess.OutputTokens, Stream: true,
			System: []textBlock{{Type: "text", Text: sess.System}}}
		r.Metadata.UserID = sess.UserID
		for _, m := range hist {
			r.Messages = append(r.Messages, anthropicMessage{Role: m.Role, Content: []textBlock{{Type: "text", Text: m.Text}}})
		}
		v = r
	default:
		return nil, "", fmt.Errorf("unknown API %q (anthropic or openai)", c.API)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, "", fmt.Errorf("encoding turn: %w", err)
	}
	return b, path, nil
}
