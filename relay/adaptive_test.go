package relay

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// silentTarget answers nothing until the caller gives up: every call to it
// ends in doubt.
func silentTarget(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // so that the server sees the caller hang up
		<-r.Context().Done()
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// adaptiveHub serves one target CORE at url with a ceiling of 10, a 20 ms
// target timeout, no breaker trip and the limit mode given, on a fake
// clock, logging into log.
func adaptiveHub(t *testing.T, url string, mode LimitMode, log *logtest.Buffer) (*Server, string, func(time.Duration)) {
	t.Helper()
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: url})
	cfg.TargetSettings = TargetSettings{
		MaxInflight: 10, MinInflight: 2, AdaptiveLimit: mode, TargetTimeout: 20 * time.Millisecond,
		Policy: breaker.Policy{FailThreshold: 1 << 30},
	}
	cfg.Logger = zerolog.New(log)
	srv, addr := startServer(t, cfg)
	return srv, addr, clk.Advance
}

func TestCallsInDoubtCutTheAdaptiveLimitEachWindow(t *testing.T) {
	// Given an adaptive limit and a target that never answers.
	var log logtest.Buffer
	srv, addr, advance := adaptiveHub(t, silentTarget(t), LimitAdaptive, &log)
	c := hubtest.Dial(t, addr)

	// When calls end in doubt over three windows.
	limits := []int{status(t, srv, "CORE").Limit}
	for w := range 3 {
		line := c.Exchange(fmt.Sprintf("W%d|CORE|BAL 1", w)).String()
		require.Contains(t, line, "|"+protocol.CodeTimeout+"|")
		advance(600 * time.Millisecond)
		c.Exchange(fmt.Sprintf("X%d|CORE|BAL 1", w)) // ends in the next window, which closes this one
		limits = append(limits, status(t, srv, "CORE").Limit)
	}

	// Then the limit fell each window, and the bulkhead enforces it.
	assert.Equal(t, []int{10, 9, 8, 7}, limits)
	assert.Equal(t, 7, srv.routeFor(t, "CORE").bulkhead.Limit())
	assert.Equal(t, LimitAdaptive, status(t, srv, "CORE").LimitMode)
	assert.Equal(t, 10, status(t, srv, "CORE").MaxInFlight, "the ceiling stays what was set")
	assert.Contains(t, log.String(), `"reason":"calls in doubt"`)
	assert.Contains(t, log.String(), `"message":"bulkhead limit changed"`)
}

func TestAnObservedLimitMovesButTheCeilingIsEnforced(t *testing.T) {
	var log logtest.Buffer
	srv, addr, advance := adaptiveHub(t, silentTarget(t), LimitObserve, &log)
	c := hubtest.Dial(t, addr)
	for w := range 3 {
		c.Exchange(fmt.Sprintf("W%d|CORE|BAL 1", w))
		advance(600 * time.Millisecond)
	}
	c.Exchange("last|CORE|BAL 1")
	assert.Less(t, status(t, srv, "CORE").Limit, 10, "the computed limit is shown")
	assert.Equal(t, 10, srv.routeFor(t, "CORE").bulkhead.Limit(), "max_inflight is enforced")
	assert.Contains(t, log.String(), `"mode":"observe"`)
}

func TestAStaticLimitHasNoController(t *testing.T) {
	var log logtest.Buffer
	srv, addr, advance := adaptiveHub(t, silentTarget(t), LimitStatic, &log)
	c := hubtest.Dial(t, addr)
	for w := range 3 {
		c.Exchange(fmt.Sprintf("W%d|CORE|BAL 1", w))
		advance(600 * time.Millisecond)
	}
	assert.Equal(t, 10, status(t, srv, "CORE").Limit)
	assert.NotContains(t, log.String(), "bulkhead limit changed")
}

func TestReloadKeepsTheLimitWhileItsSettingsStay(t *testing.T) {
	var log logtest.Buffer
	url := silentTarget(t)
	srv, addr, advance := adaptiveHub(t, url, LimitAdaptive, &log)
	c := hubtest.Dial(t, addr)
	c.Exchange("A|CORE|BAL 1")
	advance(600 * time.Millisecond)
	c.Exchange("B|CORE|BAL 1")
	require.Equal(t, 9, status(t, srv, "CORE").Limit)

	_, err := srv.Reload([]Target{{Name: "CORE", URL: url}})
	require.NoError(t, err)
	assert.Equal(t, 9, status(t, srv, "CORE").Limit, "an unchanged target keeps what its limit learnt")

	settings := TargetSettings{MaxInflight: 10, TargetTimeout: 20 * time.Millisecond}
	_, err = srv.Reload([]Target{{Name: "CORE", URL: url, Settings: &settings}})
	require.NoError(t, err)
	assert.Equal(t, 10, status(t, srv, "CORE").Limit, "back to the static limit")
	assert.Equal(t, 10, srv.routeFor(t, "CORE").bulkhead.Limit())
}

// routeFor returns the runtime record of the target named name.
func (s *Server) routeFor(t *testing.T, name string) *target {
	t.Helper()
	rt := s.table.lookup([]byte(name))
	require.NotNil(t, rt, name)
	return rt
}
