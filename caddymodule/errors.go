package caddymodule

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/lmwarden/caddy-lmwarden/vllmstats"
)

// apiOf classifies a request path, so errors come back in a shape its
// client understands and usage is read in the right format: Anthropic's
// Messages API lives under /v1/messages (Claude Code may add a query string,
// which is not part of the path); everything else is treated as
// OpenAI-compatible.
func apiOf(path string) vllmstats.API {
	if strings.Contains(path, "/v1/messages") {
		return vllmstats.APIAnthropic
	}
	if strings.HasSuffix(strings.TrimSuffix(path, "/"), "/responses") {
		return vllmstats.APIResponses
	}
	return vllmstats.APIOpenAI
}

type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

type openAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// errorType names the error class for a status in each API's vocabulary.
func errorType(api vllmstats.API, status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusServiceUnavailable:
		if api == vllmstats.APIAnthropic {
			return "overloaded_error"
		}
		return "service_unavailable"
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		if api == vllmstats.APIAnthropic {
			return "api_error"
		}
		return "bad_gateway"
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusTooManyRequests:
		if api == vllmstats.APIAnthropic {
			return "rate_limit_error"
		}
		return "rate_limit_exceeded"
	}
	if api == vllmstats.APIAnthropic {
		return "api_error"
	}
	return "server_error"
}

// writeAPIError answers with a JSON error in the request's API format:
// Anthropic {"type":"error","error":{"type":…,"message":…}} or OpenAI
// {"error":{"message":…,"type":…,"code":status}}.
func writeAPIError(w http.ResponseWriter, api vllmstats.API, status int, msg string) {
	var body []byte
	if api == vllmstats.APIAnthropic {
		var e anthropicError
		e.Type = "error"
		e.Error.Type = errorType(api, status)
		e.Error.Message = msg
		body, _ = json.Marshal(e)
	} else {
		var e openAIError
		e.Error.Message = msg
		e.Error.Type = errorType(api, status)
		e.Error.Code = status
		body, _ = json.Marshal(e)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Del("Content-Encoding")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
