package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay"
)

func TestReloadEndpoint(t *testing.T) {
	srv, _ := startServer(t, func() relay.Config {
		cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		return cfg
	}())
	var (
		result relay.ReloadResult
		err    error
		calls  int
	)
	var logs logtest.Buffer
	a, nerr := New(Config{Hub: srv, Logger: zerolog.New(&logs), Token: "tok", Reload: func() (relay.ReloadResult, error) {
		calls++
		return result, err
	}})
	require.NoError(t, nerr)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)

	tests := []struct {
		name     string
		method   string
		auth     string
		result   relay.ReloadResult
		err      error
		wantCode int
		wantBody string
	}{
		{"what changed", http.MethodPost, "Bearer tok", relay.ReloadResult{Added: []string{"LOANS"}, Changed: []string{"CORE"}}, nil,
			http.StatusOK, `{"added":["LOANS"],"removed":[],"changed":["CORE"]}`},
		{"nothing changed", http.MethodPost, "Bearer tok", relay.ReloadResult{}, nil,
			http.StatusOK, `{"added":[],"removed":[],"changed":[]}`},
		{"refused settings", http.MethodPost, "Bearer tok", relay.ReloadResult{}, errors.New("config relay.toml: [CORE] fail_threshold: must be at least 1, got 0"),
			http.StatusUnprocessableEntity, `{"error":"config relay.toml: [CORE] fail_threshold: must be at least 1, got 0"}`},
		{"no settings file", http.MethodPost, "Bearer tok", relay.ReloadResult{}, fmt.Errorf("the relay runs without --config: %w", ErrNothingToReload),
			http.StatusConflict, `{"error":"the relay runs without --config: admin: nothing to reload"}`},
		{"without the token", http.MethodPost, "", relay.ReloadResult{}, nil,
			http.StatusUnauthorized, `{"error":"missing or wrong bearer token"}`},
		{"GET", http.MethodGet, "", relay.ReloadResult{}, nil,
			http.StatusMethodNotAllowed, `{"error":"method GET not allowed: POST /reload"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			result, err, calls = tt.result, tt.err, 0
			code, body, _ := adminDo(t, tt.method, hs.URL+"/reload", "", tt.auth)
			assert.Equal(t, tt.wantCode, code)
			assert.JSONEq(t, tt.wantBody, body)
			wantCalls := 0
			if tt.method == http.MethodPost && tt.auth != "" {
				wantCalls = 1
			}
			assert.Equal(t, wantCalls, calls)
		})
	}

	// Each reload request is logged, with who made it and from where.
	requested := logs.Messages(t, "reload requested")
	require.Len(t, requested, 4)
	assert.Equal(t, "token", requested[0]["auth"])
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, requested[0]["remote"])
	assert.NotContains(t, requested[0], "proxy")

	// Without a Reload, there is no such endpoint.
	base := controlAdmin(t, srv, "", &logs)
	code, _, _ := adminDo(t, http.MethodPost, base+"/reload", "", "")
	assert.Equal(t, http.StatusNotFound, code)
}

func TestIndexListsReloadWhenServed(t *testing.T) {
	reload := func() (relay.ReloadResult, error) { return relay.ReloadResult{}, nil }
	tests := []struct {
		name             string
		cfg              Config
		wantReload, page bool
	}{
		{name: "neither", cfg: Config{}},
		{name: "reload", cfg: Config{Reload: reload}, wantReload: true},
		{name: "the page", cfg: Config{Page: fakePage}, page: true},
		{name: "reload and the page", cfg: Config{Reload: reload, Page: fakePage}, wantReload: true, page: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, _ := serveAdmin(t, tt.cfg)
			code, body, _ := getAccept(t, base+"/", "*/*")
			require.Equal(t, http.StatusOK, code)
			assert.True(t, strings.HasPrefix(body, adminIndex), body)
			assert.Equal(t, tt.wantReload, strings.Contains(body, "\nPOST /reload "), body)
			assert.Equal(t, tt.page, strings.Contains(body, "\n/events "), body)
		})
	}
}

// TestOperatorActionsSayWhoAndFromWhere serves the admin handler behind a
// listener that reads PROXY headers from loopback, as the relay does when
// --proxy-protocol is on, and checks that an operator's breaker action is
// logged with the client's address the header gave, the balancer's, and
// whether a token was required.
func TestOperatorActionsSayWhoAndFromWhere(t *testing.T) {
	srv, _ := startServer(t, func() relay.Config {
		cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		return cfg
	}())
	for _, tt := range []struct {
		name, token, auth string
	}{{"with a token", "tok", "token"}, {"without a token", "", "none"}} {
		t.Run(tt.name, func(t *testing.T) {
			var logs logtest.Buffer
			a, err := New(Config{Hub: srv, Logger: zerolog.New(&logs), Token: tt.token})
			require.NoError(t, err)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			pln := &proxyproto.Listener{Listener: ln, ConnPolicy: func(proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
				return proxyproto.USE, nil
			}}
			hs := &http.Server{Handler: a, ConnContext: ConnContext, ReadHeaderTimeout: hubtest.IOTimeout}
			go func() { _ = hs.Serve(pln) }()
			t.Cleanup(func() { _ = hs.Close() })

			// A client whose connections open with a PROXY v2 header for
			// 198.51.100.4:50000, as a load balancer's would.
			var lbAddr string
			client := &http.Client{Timeout: hubtest.IOTimeout, Transport: &http.Transport{
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
					if err != nil {
						return nil, err
					}
					lbAddr = nc.LocalAddr().String()
					src := &net.TCPAddr{IP: net.ParseIP("198.51.100.4"), Port: 50000}
					if _, err := proxyproto.HeaderProxyFromAddrs(2, src, nc.RemoteAddr()).WriteTo(nc); err != nil {
						nc.Close()
						return nil, err
					}
					return nc, nil
				},
			}}
			req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/breakers/CORE", strings.NewReader(`{"action":"close"}`))
			require.NoError(t, err)
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			resp, err := client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)

			var action map[string]any
			hubtest.Eventually(t, func() bool {
				if got := logs.Messages(t, "breaker action"); len(got) == 1 {
					action = got[0]
				}
				return action != nil
			}, "no breaker action logged")
			assert.Equal(t, "198.51.100.4:50000", action["remote"])
			assert.Equal(t, lbAddr, action["proxy"])
			assert.Equal(t, tt.auth, action["auth"])
			assert.Equal(t, "close", action["action"])
		})
	}
}
