package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parse parses args (and env, as KEY=VALUE pairs) into a cli as main does.
func parse(t *testing.T, env []string, args ...string) (*cli, error) {
	t.Helper()
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	var c cli
	p, err := kong.New(&c, kong.Name("relay"), kong.Vars{"version": version}, kong.Exit(func(int) {}))
	require.NoError(t, err)
	_, err = p.Parse(args)
	return &c, err
}

func TestDefaults(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9200", c.Listen)
	assert.Equal(t, "127.0.0.1:9280", c.AdminListen)
	assert.Equal(t, []targetFlag{{Name: "CORE", URL: "http://127.0.0.1:9201"}, {Name: "CLAIM", URL: "http://127.0.0.1:9202"}}, c.Target)
	assert.Equal(t, 5, c.FailThreshold)
	assert.Equal(t, duration(10*time.Second), c.ResetTimeout)
	assert.Equal(t, 10, c.MaxInflight)
	assert.Equal(t, duration(3*time.Second), c.TargetTimeout)
	assert.Equal(t, "breaker.log", c.BreakerLog)
	assert.Equal(t, []string{"E500", "E901", "E902"}, c.FailureCodes)
	assert.Equal(t, 16384, c.MaxLineBytes)
	assert.Equal(t, 10000, c.MaxConns)
	assert.Equal(t, duration(5*time.Minute), c.IdleTimeout)
	assert.Equal(t, duration(10*time.Second), c.DrainTimeout)
}

func TestTargetsReplaceDefaults(t *testing.T) {
	c, err := parse(t, nil, "--target", "pay=http://127.0.0.1:1", "--target", "CORE=https://core.bank:8443/api")
	require.NoError(t, err)
	assert.Equal(t, []targetFlag{{Name: "pay", URL: "http://127.0.0.1:1"}, {Name: "CORE", URL: "https://core.bank:8443/api"}}, c.Target)

	c, err = parse(t, []string{"RELAY_TARGET=A=http://127.0.0.1:1,B=http://127.0.0.1:2"})
	require.NoError(t, err)
	assert.Equal(t, []targetFlag{{Name: "A", URL: "http://127.0.0.1:1"}, {Name: "B", URL: "http://127.0.0.1:2"}}, c.Target)
}

func TestEnvironment(t *testing.T) {
	c, err := parse(t, []string{
		"RELAY_LISTEN=127.0.0.1:7000", "RELAY_FAIL_THRESHOLD=9", "RELAY_RESET_TIMEOUT=500ms",
		"RELAY_MAX_INFLIGHT=3", "RELAY_TARGET_TIMEOUT=2", "RELAY_BREAKER_LOG=/tmp/x.log",
		"RELAY_FAILURE_CODES=E500,E400", "RELAY_MAX_LINE_BYTES=100", "RELAY_MAX_CONNS=7",
		"RELAY_IDLE_TIMEOUT=1m", "RELAY_DRAIN_TIMEOUT=0.5", "RELAY_ADMIN_LISTEN=",
		"RELAY_WRITE_TIMEOUT=4s", "RELAY_LOG_LEVEL=debug", "RELAY_LOG_FORMAT=console",
	})
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:7000", c.Listen)
	assert.Equal(t, "", c.AdminListen)
	assert.Equal(t, 9, c.FailThreshold)
	assert.Equal(t, duration(500*time.Millisecond), c.ResetTimeout)
	assert.Equal(t, 3, c.MaxInflight)
	assert.Equal(t, duration(2*time.Second), c.TargetTimeout)
	assert.Equal(t, "/tmp/x.log", c.BreakerLog)
	assert.Equal(t, []string{"E500", "E400"}, c.FailureCodes)
	assert.Equal(t, 100, c.MaxLineBytes)
	assert.Equal(t, 7, c.MaxConns)
	assert.Equal(t, duration(time.Minute), c.IdleTimeout)
	assert.Equal(t, duration(500*time.Millisecond), c.DrainTimeout)
	assert.Equal(t, duration(4*time.Second), c.WriteTimeout)
	assert.Equal(t, "debug", c.LogLevel)
	assert.Equal(t, "console", c.LogFormat)
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{in: "10", want: 10 * time.Second},
		{in: "0.5", want: 500 * time.Millisecond},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "1m30s", want: 90 * time.Second},
		{in: "0", want: 0},
		{in: "", bad: true},
		{in: "abc", bad: true},
		{in: "1.2.3", bad: true},
		{in: "10 s", bad: true},
		{in: "99999999999999999999", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseDuration(tt.in)
			if tt.bad {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestBadValuesNameTheirFlag(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "zero threshold", args: []string{"--fail-threshold", "0"}, want: "--fail-threshold: must be at least 1"},
		{name: "negative inflight", args: []string{"--max-inflight=-2"}, want: "--max-inflight: must be at least 1"},
		{name: "zero line", args: []string{"--max-line-bytes", "0"}, want: "--max-line-bytes"},
		{name: "zero conns", args: []string{"--max-conns", "0"}, want: "--max-conns"},
		{name: "zero reset", args: []string{"--reset-timeout", "0"}, want: "--reset-timeout: must be more than zero"},
		{name: "negative timeout", args: []string{"--target-timeout=-1s"}, want: "--target-timeout: must be more than zero"},
		{name: "bad duration", args: []string{"--idle-timeout", "soon"}, want: "--idle-timeout: duration \"soon\""},
		{name: "zero drain", args: []string{"--drain-timeout", "0s"}, want: "--drain-timeout"},
		{name: "zero write", args: []string{"--write-timeout", "0"}, want: "--write-timeout"},
		{name: "target without url", args: []string{"--target", "CORE"}, want: "--target: \"CORE\": want NAME=URL"},
		{name: "target bad scheme", args: []string{"--target", "CORE=ftp://h"}, want: "--target: target CORE: URL \"ftp://h\""},
		{name: "target no host", args: []string{"--target", "CORE=http://"}, want: "--target: target CORE"},
		{name: "target bad name", args: []string{"--target", "CO RE=http://h"}, want: "--target: target name"},
		{name: "duplicate target", args: []string{"--target", "core=http://a", "--target", "CORE=http://b"}, want: "--target: CORE given twice"},
		{name: "bad failure code", args: []string{"--failure-codes", "E500,X1"}, want: "--failure-codes: failure code \"X1\""},
		{name: "failure code of a refusal", args: []string{"--failure-codes", "E905"}, want: "--failure-codes: failure code \"E905\""},
		{name: "bad listen", args: []string{"--listen", "9200"}, want: "--listen \"9200\""},
		{name: "bad admin listen", args: []string{"--admin-listen", "x"}, want: "--admin-listen \"x\""},
		{name: "empty breaker log", args: []string{"--breaker-log", ""}, want: "--breaker-log"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, nil, tt.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n", "one line on stderr")
		})
	}
}

func TestRunFailsOnBreakerLogItCannotOpen(t *testing.T) {
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--breaker-log", filepath.Join(t.TempDir(), "missing", "b.log"))
	require.NoError(t, err)
	err = run(context.Background(), c, zerolog.Nop(), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join("missing", "b.log"))
}

func TestRunServesAndLogsTransitions(t *testing.T) {
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	t.Cleanup(target.Close)
	logPath := filepath.Join(t.TempDir(), "breaker.log")
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "", "--target", "CORE="+target.URL,
		"--fail-threshold", "1", "--breaker-log", logPath)
	require.NoError(t, err)

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, c, zerolog.New(zerolog.NewTestWriter(t)), func(a string) { addrs <- a }) }()
	addr := <-addrs

	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer nc.Close()
	r := bufio.NewReader(nc)
	require.NoError(t, nc.SetDeadline(time.Now().Add(5*time.Second)))
	for _, rt := range []struct{ send, want string }{
		{"T1|core|x\n", "T1|E500|target failed: HTTP 500\n"},
		{"T2|CORE|x\n", "T2|E904|circuit open; retry after 10s\n"},
	} {
		_, err = io.WriteString(nc, rt.send)
		require.NoError(t, err)
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, rt.want, got)
	}

	stop()
	require.NoError(t, <-done)
	data, err := os.ReadFile(logPath)
	require.NoError(t, err)
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\|CORE\|CLOSED->OPEN\n$`, string(data))
}
