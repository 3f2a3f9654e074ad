package admin

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
)

// testConfig returns a relay.Config for the given targets with a fake
// clock and a test logger.
func testConfig(t *testing.T, targets ...relay.Target) (relay.Config, *fakeclock.Clock) {
	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	return relay.Config{
		Targets: targets,
		Clock:   clk,
		Logger:  zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel),
	}, clk
}

// withMetrics adds relay.Metrics on a fresh registry to cfg and returns the
// registry.
func withMetrics(t *testing.T, cfg *relay.Config) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := relay.NewMetrics(reg)
	require.NoError(t, err)
	cfg.Metrics = m
	return reg
}

// startServer serves cfg on a loopback listener until the test ends and
// returns the Server and its address.
func startServer(t *testing.T, cfg relay.Config) (*relay.Server, string) {
	t.Helper()
	srv, err := relay.New(cfg)
	require.NoError(t, err)
	return srv, hubtest.Serve(t, srv, relay.ErrServerClosed)
}

// startAdmin serves srv's admin handler, with g's metrics, on a loopback
// httptest server until the test ends, and returns its base URL.
func startAdmin(t *testing.T, srv *relay.Server, g prometheus.Gatherer) string {
	t.Helper()
	a, err := New(Config{Hub: srv, Gatherer: g})
	require.NoError(t, err)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	return hs.URL
}

// get sends method url with no body and no Authorization header, and
// returns the status, the body and the headers.
func get(t *testing.T, method, url string) (int, string, http.Header) {
	t.Helper()
	return adminDo(t, method, url, "", "")
}

// statusJSON fetches /status as a generic JSON object, so the test sees the
// exact keys a client decodes.
func statusJSON(t *testing.T, base string) map[string]any {
	t.Helper()
	code, body, hdr := get(t, http.MethodGet, base+"/status")
	require.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "application/json", hdr.Get("Content-Type"))
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &m), body)
	return m
}

// statusTarget returns the named target of a /status object.
func statusTarget(t *testing.T, st map[string]any, name string) map[string]any {
	t.Helper()
	targets, ok := st["targets"].([]any)
	require.True(t, ok, "targets is a list: %v", st)
	for _, x := range targets {
		if tg := x.(map[string]any); tg["name"] == name {
			return tg
		}
	}
	t.Fatalf("no target %s in %v", name, st)
	return nil
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestAdminEndpoints(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	reg := withMetrics(t, &cfg)
	srv, _ := startServer(t, cfg)
	base := startAdmin(t, srv, reg)

	tests := []struct {
		name, method, path string
		status             int
		body               string // a substring of the body
	}{
		{name: "healthz", method: "GET", path: "/healthz", status: 200, body: "ok"},
		{name: "readyz", method: "GET", path: "/readyz", status: 200, body: "ready"},
		{name: "status", method: "GET", path: "/status", status: 200, body: `"name":"CORE"`},
		{name: "metrics", method: "GET", path: "/metrics", status: 200, body: `relay_breaker_state{target="CORE"} 0`},
		{name: "index", method: "GET", path: "/", status: 200, body: "/metrics"},
		{name: "head", method: "HEAD", path: "/healthz", status: 200},
		{name: "unknown path", method: "GET", path: "/nope", status: 404},
		{name: "post status", method: "POST", path: "/status", status: 405},
		{name: "delete readyz", method: "DELETE", path: "/readyz", status: 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := get(t, tt.method, base+tt.path)
			assert.Equal(t, tt.status, code, body)
			assert.Contains(t, body, tt.body)
		})
	}
}

func TestAdminWithoutGathererServesNoMetrics(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)
	base := startAdmin(t, srv, nil)
	code, _, _ := get(t, http.MethodGet, base+"/metrics")
	assert.Equal(t, http.StatusNotFound, code)

	_, err := New(Config{})
	assert.ErrorContains(t, err, "no Hub")
}

func TestAdminStatusFollowsTheBreaker(t *testing.T) {
	// Given CORE with threshold 2 and reset timeout 7 s, and CLAIM.
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
	cfg, clk := testConfig(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	cfg.FailThreshold, cfg.ResetTimeout = 2, 7*time.Second
	srv, addr := startServer(t, cfg)
	base := startAdmin(t, srv, nil)
	c := hubtest.Dial(t, addr)

	// When CORE trips,
	c.Exchange("F1|CORE|x")
	c.Exchange("F2|CORE|x")

	// then /status has the documented shape and CORE's open breaker.
	st := statusJSON(t, base)
	assert.Equal(t, []string{"connections_open", "draining", "goroutines", "targets"}, keys(st))
	assert.Equal(t, false, st["draining"])
	assert.Equal(t, 1.0, st["connections_open"])
	assert.Greater(t, st["goroutines"], 1.0)
	tg := statusTarget(t, st, "CORE")
	assert.Equal(t, []string{
		"consecutive_failures", "disabled", "held", "in_doubt", "in_doubt_oldest_age_seconds", "in_doubt_open", "inflight", "limit", "limit_mode", "max_inflight", "name",
		"resolve", "retry_after_seconds", "settings", "state", "url",
	}, keys(tg))
	assert.Equal(t, map[string]any{
		"name": "CORE", "url": core.URL, "state": "OPEN", "consecutive_failures": 2.0,
		"inflight": 0.0, "max_inflight": 10.0, "limit": 10.0, "limit_mode": "static", "retry_after_seconds": 7.0,
		"held": false, "disabled": false, "in_doubt": 0.0, "in_doubt_open": 0.0, "in_doubt_oldest_age_seconds": 0.0, "resolve": "manual",
		"settings": map[string]any{
			"fail_threshold": 2.0, "reset_timeout_seconds": 7.0, "target_timeout_seconds": 3.0,
			"target_idle_timeout_seconds": 4.0, "probe_timeout_seconds": 4.0,
			"failure_codes": []any{"E500", "E901", "E902"},
		},
	}, tg)
	assert.Equal(t, "CLOSED", statusTarget(t, st, "CLAIM")["state"])

	// When 2.5 s have passed, the retry hint counts down to the millisecond.
	clk.Advance(2500 * time.Millisecond)
	assert.Equal(t, 4.5, statusTarget(t, statusJSON(t, base), "CORE")["retry_after_seconds"])

	// When the reset timeout is over and the probe is out, CORE is half-open
	// with its probe in flight and no retry hint.
	clk.Advance(4500 * time.Millisecond)
	core.Set(core.BlockThen(hubtest.Echo))
	c.Send("P1|CORE|x")
	core.WaitEntered(t, 1)
	tg = statusTarget(t, statusJSON(t, base), "CORE")
	assert.Equal(t, "HALF_OPEN", tg["state"])
	assert.Equal(t, 1.0, tg["inflight"])
	assert.Equal(t, 0.0, tg["retry_after_seconds"])

	// Then, the probe answered, CORE is closed with no failures.
	core.UnblockAll()
	assert.Equal(t, "P1|0000|got x", c.ReadResponse().String())
	tg = statusTarget(t, statusJSON(t, base), "CORE")
	assert.Equal(t, "CLOSED", tg["state"])
	assert.Equal(t, 0.0, tg["consecutive_failures"])
	assert.Equal(t, 0.0, tg["inflight"])
}

func TestAdminReadyzReportsTheDrain(t *testing.T) {
	// Given a call in flight,
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: core.URL})
	srv, addr := startServer(t, cfg)
	base := startAdmin(t, srv, nil)
	c := hubtest.Dial(t, addr)
	c.Send("S1|CORE|x")
	core.WaitEntered(t, 1)
	code, _, _ := get(t, http.MethodGet, base+"/readyz")
	require.Equal(t, http.StatusOK, code)

	// when Shutdown begins, /readyz answers 503 while /healthz stays 200,
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	hubtest.Eventually(t, func() bool {
		code, _, _ := get(t, http.MethodGet, base+"/readyz")
		return code == http.StatusServiceUnavailable
	}, "readyz still 200 during the drain")
	code, body, _ := get(t, http.MethodGet, base+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Equal(t, "draining\n", body)
	code, _, _ = get(t, http.MethodGet, base+"/healthz")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, true, statusJSON(t, base)["draining"])

	// and the call in flight is still answered.
	core.UnblockAll()
	assert.Equal(t, "S1|0000|got x", c.ReadResponse().String())
	c.Conn().Close()
	require.NoError(t, <-done)
}

func TestAdminStatusPretty(t *testing.T) {
	// Given a hub whose CORE has tripped, so /status holds more than zeros,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: core.URL}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	cfg.FailThreshold = 1
	srv, addr := startServer(t, cfg)
	base := startAdmin(t, srv, nil)
	hubtest.Dial(t, addr).Exchange("F1|CORE|x")
	plain := statusJSON(t, base)
	code, body, _ := get(t, http.MethodGet, base+"/status")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, 1, strings.Count(body, "\n"), "plain /status is one line: %s", body)

	for _, query := range []string{"?pretty", "?pretty=1"} {
		t.Run(query, func(t *testing.T) {
			// when /status is asked for with ?pretty,
			code, body, hdr := get(t, http.MethodGet, base+"/status"+query)
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "application/json", hdr.Get("Content-Type"))

			// then it is indented by two spaces, one key a line,
			var compact, indented bytes.Buffer
			require.NoError(t, json.Compact(&compact, []byte(body)), body)
			require.NoError(t, json.Indent(&indented, compact.Bytes(), "", "  "))
			assert.Equal(t, indented.String()+"\n", body)
			assert.Contains(t, body, "\n  \"targets\": [\n    {\n      \"name\": \"CORE\",\n")

			// and says what /status says (but the goroutine count, which
			// moves between two requests).
			var pretty map[string]any
			require.NoError(t, json.Unmarshal([]byte(body), &pretty), body)
			assert.Greater(t, pretty["goroutines"], 1.0)
			want := maps.Clone(plain)
			delete(want, "goroutines")
			delete(pretty, "goroutines")
			assert.Equal(t, want, pretty)
			assert.Equal(t, "OPEN", statusTarget(t, pretty, "CORE")["state"])
		})
	}
}

func TestAdminStatusShowsTheBreakerLog(t *testing.T) {
	cfg, _ := testConfig(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, _ := startServer(t, cfg)

	// Without a breaker log's state, /status has no breaker_log;
	assert.NotContains(t, statusJSON(t, startAdmin(t, srv, nil)), "breaker_log")

	// with one, it shows it as it is when asked.
	var bl atomic.Pointer[BreakerLog]
	bl.Store(&BreakerLog{Pending: 3, OldestPendingSeconds: 12.5, Dropped: 1, WriteErrors: 4, LastError: "no space left on device"})
	a, err := New(Config{Hub: srv, BreakerLog: func() BreakerLog { return *bl.Load() }})
	require.NoError(t, err)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	assert.Equal(t, map[string]any{"pending": 3.0, "oldest_pending_seconds": 12.5, "dropped": 1.0, "write_errors": 4.0,
		"last_error": "no space left on device"}, statusJSON(t, hs.URL)["breaker_log"])
	bl.Store(&BreakerLog{})
	assert.Equal(t, map[string]any{"pending": 0.0, "oldest_pending_seconds": 0.0, "dropped": 0.0, "write_errors": 0.0},
		statusJSON(t, hs.URL)["breaker_log"])
}
