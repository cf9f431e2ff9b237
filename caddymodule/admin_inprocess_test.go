package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// serveAdminJSON answers a GET of one of this module's JSON paths
// (/lm-warden/models…) in-process, as the admin endpoint would: the status,
// the body, and the error for non-2xx answers.
func serveAdminJSON(ctx context.Context, path string) (int, []byte, error) {
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	rec := httptest.NewRecorder()
	var a adminAPI
	var err error
	switch {
	case req.URL.Path == "/lm-warden/models":
		err = a.handleModels(rec, req)
	case strings.HasPrefix(req.URL.Path, "/lm-warden/models/"):
		err = a.handleModel(rec, req)
	default:
		err = apiErr(http.StatusNotFound, "not found: %s", path)
	}
	if err != nil {
		var ae caddy.APIError
		if errors.As(err, &ae) {
			return ae.HTTPStatus, nil, err
		}
		return http.StatusInternalServerError, nil, err
	}
	return rec.Code, rec.Body.Bytes(), nil
}
