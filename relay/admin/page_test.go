package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
)

// fakePage stands for the status page: it answers every request with the
// path it got.
var fakePage = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html")
	_, _ = w.Write([]byte("page " + r.URL.Path))
})

// serveAdmin serves a handler for a hub with one target, with cfg's Page
// and Token, and returns its base URL and the hub.
func serveAdmin(t *testing.T, cfg Config) (string, *relay.Server) {
	t.Helper()
	rcfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, rcfg)
	cfg.Hub = srv
	a, err := New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	return hs.URL, srv
}

// getAccept sends GET url with an Accept header (none when empty).
func getAccept(t *testing.T, url, accept string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return send(t, req)
}

func TestIndexGoesToThePageForBrowsers(t *testing.T) {
	base, _ := serveAdmin(t, Config{Page: fakePage})
	tests := []struct {
		name, accept string
		page         bool
	}{
		{name: "a browser", accept: "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", page: true},
		{name: "curl", accept: "*/*"},
		{name: "no Accept"},
		{name: "plain text", accept: "text/plain"},
		{name: "html refused", accept: "text/html;q=0, text/plain"},
		{name: "html with a quality", accept: "TEXT/HTML; q=0.5", page: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, hdr := getAccept(t, base+"/", tt.accept)
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, "Accept", hdr.Get("Vary"))
			if tt.page {
				assert.Equal(t, "page /", body)
				return
			}
			assert.True(t, strings.HasPrefix(body, "relayhub admin\n"), body)
			assert.Contains(t, body, "a browser (Accept: text/html) gets the live status page")
		})
	}
	code, body, _ := getAccept(t, base+"/events", "text/event-stream")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "page /events", body)
}

func TestIndexWithoutThePage(t *testing.T) {
	base, _ := serveAdmin(t, Config{})
	code, body, _ := getAccept(t, base+"/", "text/html")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, adminIndex+inDoubtIndex, body)
	code, _, _ = getAccept(t, base+"/events", "")
	assert.Equal(t, http.StatusNotFound, code)
}

func TestPostsFromAnotherOriginAreRefused(t *testing.T) {
	// Given an admin port with a token,
	base, srv := serveAdmin(t, Config{Token: "s3cret"})
	host := strings.TrimPrefix(base, "http://")
	tests := []struct {
		name    string
		headers map[string]string
		status  int
	}{
		{name: "a tool, no Origin", status: http.StatusOK},
		{name: "the page itself", headers: map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": base}, status: http.StatusOK},
		{name: "typed in the address bar", headers: map[string]string{"Sec-Fetch-Site": "none"}, status: http.StatusOK},
		{name: "another site", headers: map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, status: http.StatusForbidden},
		{name: "another port of the same host", headers: map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}, status: http.StatusForbidden},
		{name: "an old browser from elsewhere", headers: map[string]string{"Origin": "https://evil.example"}, status: http.StatusForbidden},
		{name: "an old browser from here", headers: map[string]string{"Origin": "http://" + host}, status: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// when each sends a valid action with the right token,
			req, err := http.NewRequest(http.MethodPost, base+"/breakers/CORE", strings.NewReader(`{"action":"open"}`))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer s3cret")
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			code, body, _ := send(t, req)

			// then only those from the admin port's own origin, or from no
			// browser, act on the breaker.
			assert.Equal(t, tt.status, code, body)
			snap, _ := srv.Target("CORE")
			assert.Equal(t, tt.status == http.StatusOK, snap.Held)
			_, err = srv.ControlBreaker("CORE", relay.ActionClose)
			require.NoError(t, err)
		})
	}
}
