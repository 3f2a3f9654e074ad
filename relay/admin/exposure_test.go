package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
)

func TestAdminReadsBeyondLoopbackNeedTheToken(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)
	const token = "s3cret-token"
	serve := func(h http.Handler, path, remote, auth string) int {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.RemoteAddr = remote
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	guarded, err := New(Config{Hub: srv, Gatherer: prometheus.NewRegistry(), Token: token})
	require.NoError(t, err)
	unguarded, err := New(Config{Hub: srv, Gatherer: prometheus.NewRegistry()})
	require.NoError(t, err)

	tests := []struct {
		name, path, remote, auth string
		want                     int
	}{
		{"status from another machine", "/status", "10.1.2.3:50000", "", http.StatusUnauthorized},
		{"metrics from another machine", "/metrics", "10.1.2.3:50000", "", http.StatusUnauthorized},
		{"the index from another machine", "/", "[2001:db8::1]:50000", "", http.StatusUnauthorized},
		{"status with the token", "/status", "10.1.2.3:50000", "Bearer " + token, http.StatusOK},
		{"metrics with the token", "/metrics", "10.1.2.3:50000", "Bearer " + token, http.StatusOK},
		{"status with a wrong token", "/status", "10.1.2.3:50000", "Bearer nope", http.StatusUnauthorized},
		{"liveness from anywhere", "/healthz", "10.1.2.3:50000", "", http.StatusOK},
		{"readiness from anywhere", "/readyz", "10.1.2.3:50000", "", http.StatusOK},
		{"status on loopback", "/status", "127.0.0.1:50000", "", http.StatusOK},
		{"metrics on IPv6 loopback", "/metrics", "[::1]:50000", "", http.StatusOK},
		{"an address that does not parse", "/status", "somewhere", "", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, serve(guarded, tt.path, tt.remote, tt.auth))
			assert.Equal(t, http.StatusOK, serve(unguarded, tt.path, tt.remote, ""), "without a token nothing is asked")
		})
	}
}
