package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

// parse runs the command line through kong as main does, without exiting.
func parse(t *testing.T, args ...string) (*cli, *kong.Context, error) {
	t.Helper()
	var c cli
	p, err := newParser(&c, kong.Exit(func(int) { t.Fatal("kong tried to exit") }))
	require.NoError(t, err)
	kctx, err := p.Parse(args)
	return &c, kctx, err
}

// run parses and runs a command line and returns what it printed and the
// status main would exit with.
func run(t *testing.T, args ...string) (stdout, stderr string, code int, err error) {
	t.Helper()
	_, kctx, err := parse(t, args...)
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	kctx.BindTo(t.Context(), (*context.Context)(nil))
	err = kctx.Run(&streams{Out: &out, Err: &errOut})
	return out.String(), errOut.String(), cmdline.Code(err), err
}

func TestParseLoadBenchmarkFlags(t *testing.T) {
	c, _, err := parse(t, "load", "--protocol", "redis-ping", "--server-pid", "12", "--server-pid", "34")
	require.NoError(t, err)
	cfg, err := c.Load.Config()
	require.NoError(t, err)
	assert.Equal(t, loadgen.ProtocolRedisPing, cfg.Protocol)
	assert.Equal(t, []int{12, 34}, cfg.ServerPIDs)

	_, _, err = parse(t, "load", "--protocol", "smtp")
	assert.ErrorContains(t, err, "--protocol")
	_, _, err = parse(t, "load", "--server-pid=-1")
	assert.ErrorContains(t, err, "--server-pid -1")
	_, _, err = parse(t, "idle", "--conns", "0")
	assert.ErrorContains(t, err, "--conns 0")
}

func TestParsePhasesAndWatch(t *testing.T) {
	c, _, err := parse(t, "load", "--rate", "100", "--phase", "healthy=120s", "--phase", "degraded=90s",
		"--watch-url", "http://127.0.0.1:9/metrics", "--watch-series", `relay_bulkhead_limit{target="CORE"}`)
	require.NoError(t, err)
	cfg, err := c.Load.Config()
	require.NoError(t, err)
	assert.Equal(t, []loadgen.Phase{{Name: "healthy", Duration: 120 * time.Second}, {Name: "degraded", Duration: 90 * time.Second}}, cfg.Phases)
	assert.NotNil(t, cfg.Watch)

	for _, tt := range []struct{ args []string }{
		{[]string{"--phase", "healthy"}},
		{[]string{"--watch-url", "http://127.0.0.1:9/metrics", "--watch-series", "x"}},
		{[]string{"--phase", "a=1s", "--watch-url", "http://127.0.0.1:9/metrics"}},
	} {
		_, _, err := parse(t, append([]string{"load"}, tt.args...)...)
		assert.Error(t, err, tt.args)
	}
}

func TestParseFromEnvironment(t *testing.T) {
	t.Setenv("RELAYBENCH_ADDR", "127.0.0.1:16379")
	t.Setenv("RELAYBENCH_CONNS", "3")
	t.Setenv("RELAYBENCH_PROTOCOL", "redis-ping")
	t.Setenv("RELAYBENCH_SERVER_PID", "12")
	c, _, err := parse(t, "load")
	require.NoError(t, err)
	cfg, err := c.Load.Config()
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:16379", cfg.Addr)
	assert.Equal(t, 3, cfg.Conns)
	assert.Equal(t, loadgen.ProtocolRedisPing, cfg.Protocol)
	assert.Equal(t, []int{12}, cfg.ServerPIDs)

	t.Setenv("RELAYBENCH_WARM", "true")
	c, _, err = parse(t, "idle")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:16379", c.Idle.Addr)
	assert.True(t, c.Idle.Warm)
}

func TestLoadCommandMeasuresServerCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc on this system")
	}
	tests := []struct {
		name     string
		relay    fakerelay.Config
		wantCode int
	}{
		{"clean run", fakerelay.Config{}, 0},
		{"bogus answer fails the run", fakerelay.Config{BogusAfterNth: 3}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The fake relay runs in this process, so its pid is ours.
			f := fakerelay.New(t, tt.relay)

			pid := strconv.Itoa(os.Getpid())

			out, errOut, code, _ := run(t, "load", "--addr", f.Addr, "--conns", "2", "--requests", "100",
				"--server-pid", pid, "--server-pid", pid, "--json", "--quiet", "--drain", "200ms")

			assert.Equal(t, tt.wantCode, code)
			assert.Empty(t, errOut, "--quiet prints no progress")
			var sum loadgen.Summary
			require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
			assert.Equal(t, "relay", sum.Protocol)
			assert.Equal(t, int64(100), sum.Answered)
			require.Len(t, sum.ServerCPU, 2, "one reading per --server-pid")
			assert.Equal(t, os.Getpid(), sum.ServerCPU[1].PID)
		})
	}
}

func TestLoadCommandHTTPStraightToTarget(t *testing.T) {
	fx, err := fixtures.New(fixtures.Config{Name: "CORE", Kind: fixtures.KindCore})
	require.NoError(t, err)
	ts := httptest.NewUnstartedServer(fx)
	var conns atomic.Int64
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)

	out, _, code, err := run(t, "load", "--addr", strings.TrimPrefix(ts.URL, "http://"), "--protocol", "http",
		"--conns", "3", "--depth", "2", "--requests", "300", "--payload", "WD ACC{conn} 1", "--quiet")

	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "closed loop, protocol http, mix CORE=100")
	assert.Contains(t, out, "sent 300, answered 300")
	assert.Regexp(t, `\ncodes +0000 300\n`, out)
	assert.Equal(t, int64(300), fx.Stats().Calls, "every request reached the target")
	assert.Equal(t, int64(3), conns.Load(), "one keep-alive connection per load connection")
}

func TestLoadCommandCannotConnect(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	f.Close()

	out, _, code, err := run(t, "load", "--addr", f.Addr, "--requests", "10", "--quiet")

	assert.Equal(t, 2, code)
	assert.ErrorIs(t, err, loadgen.ErrDialAll)
	assert.Empty(t, out)
}

func TestIdleCommandEndToEnd(t *testing.T) {
	tests := []struct {
		name     string
		relay    fakerelay.Config
		wantCode int
	}{
		{"every connection held", fakerelay.Config{}, 0},
		{"connections lost", fakerelay.Config{Silent: true}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fakerelay.New(t, tt.relay)

			out, _, code, _ := run(t, "idle", "--addr", f.Addr, "--conns", "3", "--hold", "1ms", "--timeout", "200ms", "--json")

			assert.Equal(t, tt.wantCode, code)
			var sum loadgen.IdleSummary
			require.NoError(t, json.Unmarshal([]byte(out), &sum), out)
			assert.Equal(t, 3, sum.Opened)
			assert.Equal(t, 3-sum.Answered, sum.Lost)
		})
	}
}

func TestParseIdleProtocol(t *testing.T) {
	c, _, err := parse(t, "idle")
	require.NoError(t, err)
	assert.Equal(t, "relay", c.Idle.Protocol)
	c, _, err = parse(t, "idle", "--protocol", "redis-ping")
	require.NoError(t, err)
	assert.Equal(t, "redis-ping", c.Idle.Protocol)
	_, _, err = parse(t, "idle", "--protocol", "http")
	assert.ErrorContains(t, err, "--protocol")
}
