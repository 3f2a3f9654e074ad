package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay"
)

func TestPolicyFlagsAreOffByDefault(t *testing.T) {
	c, err := parse(t, nil)
	require.NoError(t, err)
	assert.Empty(t, c.Config)
	assert.Zero(t, c.FailureRate)
	assert.Zero(t, c.Window)
	assert.Zero(t, c.MinSamples)
	assert.Zero(t, c.SlowCall)
	assert.Zero(t, c.MaxResetTimeout)
	assert.Zero(t, c.ResetJitter)
	assert.Empty(t, c.AdminToken)
}

func TestPolicyFlagsFromTheEnvironment(t *testing.T) {
	c, err := parse(t, []string{
		"RELAY_CONFIG=/etc/relay.toml", "RELAY_FAILURE_RATE=0.5", "RELAY_WINDOW=30s", "RELAY_MIN_SAMPLES=12",
		"RELAY_SLOW_CALL=1.5", "RELAY_MAX_RESET_TIMEOUT=2m", "RELAY_RESET_JITTER=0.1", "RELAY_ADMIN_TOKEN=t0ken",
	})
	require.NoError(t, err)
	assert.Equal(t, "/etc/relay.toml", c.Config)
	assert.Equal(t, 0.5, c.FailureRate)
	assert.Equal(t, duration(30*time.Second), c.Window)
	assert.Equal(t, 12, c.MinSamples)
	assert.Equal(t, duration(1500*time.Millisecond), c.SlowCall)
	assert.Equal(t, duration(2*time.Minute), c.MaxResetTimeout)
	assert.Equal(t, 0.1, c.ResetJitter)
	assert.Equal(t, "t0ken", c.AdminToken)

	assert.Equal(t, relay.TargetSettings{
		MaxInflight: 10, MinInflight: 2, Policy: breaker.Policy{
			FailThreshold:   5,
			ResetTimeout:    10 * time.Second,
			FailureRate:     0.5,
			Window:          30 * time.Second,
			MinSamples:      12,
			SlowCall:        1500 * time.Millisecond,
			MaxResetTimeout: 2 * time.Minute,
			ResetJitter:     0.1,
			ProbeSuccesses:  1,
		}, TargetTimeout: 3 * time.Second, TargetIdleTimeout: 4 * time.Second,
		FailureCodes: []string{"E500"}, ProbeExpect: []string{"0000"},
		ResolveAfter: 5 * time.Second, ResolveMaxInterval: time.Minute, ResolveExpire: 24 * time.Hour,
	}, c.targetDefaults([]string{"E500"}))
}

func TestResolveFlags(t *testing.T) {
	c, err := parse(t, []string{"RELAY_RESOLVE_AFTER=2s", "RELAY_RESOLVE_MAX_INTERVAL=30s", "RELAY_RESOLVE_EXPIRE=1h"})
	require.NoError(t, err)
	ts := c.targetDefaults([]string{"E500"})
	assert.Equal(t, 2*time.Second, ts.ResolveAfter)
	assert.Equal(t, 30*time.Second, ts.ResolveMaxInterval)
	assert.Equal(t, time.Hour, ts.ResolveExpire)

	assertBadFlags(t, []badFlagCase{
		{name: "zero resolve after", args: []string{"--resolve-after", "0"}, want: "--resolve-after: must be more than zero, got 0s"},
		{name: "negative max interval", args: []string{"--resolve-max-interval=-1m"}, want: "--resolve-max-interval: must be more than zero"},
		{name: "bad expire", args: []string{"--resolve-expire", "a day"}, want: "--resolve-expire"},
	})
}

func TestBadPolicyValuesNameTheirFlag(t *testing.T) {
	tests := []badFlagCase{
		{name: "rate above 1", args: []string{"--failure-rate", "1.5"}, want: "--failure-rate: must be from 0 (off) to 1, got 1.5"},
		{name: "negative rate", args: []string{"--failure-rate=-0.2"}, want: "--failure-rate: must be from 0 (off) to 1"},
		{name: "rate NaN", args: []string{"--failure-rate", "NaN"}, want: "--failure-rate"},
		{name: "rate not a number", args: []string{"--failure-rate", "half"}, want: "--failure-rate"},
		{name: "jitter above 1", args: []string{"--reset-jitter", "2"}, want: "--reset-jitter: must be from 0 (off) to 1"},
		{name: "negative window", args: []string{"--window=-1s"}, want: "--window: must not be negative"},
		{name: "bad window", args: []string{"--window", "a while"}, want: "--window"},
		{name: "negative min samples", args: []string{"--min-samples=-1"}, want: "--min-samples: must not be negative"},
		{name: "negative slow call", args: []string{"--slow-call=-2s"}, want: "--slow-call: must not be negative"},
		{name: "negative backoff", args: []string{"--max-reset-timeout=-1m"}, want: "--max-reset-timeout: must not be negative"},
		{name: "backoff cap below reset", args: []string{"--reset-timeout", "30s", "--max-reset-timeout", "20s"}, want: "--max-reset-timeout: must be more than --reset-timeout (30s)"},
		{name: "blank config", args: []string{"--config", " "}, want: "--config: must name a file"},
		{name: "token with spaces", args: []string{"--admin-token", " t "}, want: "--admin-token"},
		{name: "zero probe successes", args: []string{"--probe-successes", "0"}, want: "--probe-successes: must be at least 1, got 0"},
		{name: "negative probe successes", args: []string{"--probe-successes", "-2"}, want: "--probe-successes: must be at least 1, got -2"},
		{name: "bad probe code", args: []string{"--probe-expect", "0000,B4O4"}, want: `--probe-expect: probe code "B4O4": want 0000, Bnnn`},
		{name: "failure as probe code", args: []string{"--probe-expect", "E901"}, want: "--probe-expect: probe code E901: E900 and above are the hub's own"},
		{name: "negative probe interval", args: []string{"--probe-interval=-1s"}, want: "--probe-interval: must not be negative"},
		{name: "probe payload of two lines", args: []string{"--probe-payload", "BAL\nHEALTH"}, want: "--probe-payload: must be one line"},
	}
	assertBadFlags(t, tests)
}

func TestRunStopsOnABadConfigFileBeforeTouchingFiles(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "relay.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[CORE]\nmax_inflight = 0\n"), 0o600))
	logPath := filepath.Join(dir, "breaker.log")
	c, err := parse(t, nil, "--listen", "127.0.0.1:0", "--admin-listen", "", "--config", conf, "--breaker-log", logPath, "--in-doubt-log", filepath.Join(dir, "in-doubt.log"))
	require.NoError(t, err)
	err = run(context.Background(), c, zerolog.Nop(), nil)
	require.Error(t, err)
	assert.Equal(t, "config "+conf+": [CORE] max_inflight: must be at least 1, got 0", err.Error())
	assert.Equal(t, 2, exitStatus(err), "a usage error")
	_, statErr := os.Stat(logPath)
	assert.True(t, os.IsNotExist(statErr), "the breaker log is not created for a relay that does not start")
}

// startupLine runs the relay with args until it listens, stops it, and
// returns its start-up log line.
func startupLine(t *testing.T, args ...string) map[string]any {
	t.Helper()
	c, err := parse(t, nil, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "",
		"--target", "CORE=http://127.0.0.1:9", "--breaker-log", filepath.Join(t.TempDir(), "breaker.log"),
		"--in-doubt-log", ""}, args...)...)
	require.NoError(t, err)
	var logs logtest.Buffer
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, c, zerolog.New(&logs), func(string, string) { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		require.NoError(t, err, "the relay stopped before it listened")
	}
	stop()
	require.NoError(t, <-done)
	lines := logs.Lines(t)
	require.NotEmpty(t, lines)
	require.Equal(t, "relay listening", lines[0]["message"])
	return lines[0]
}

func TestStartupLineLogsTheEffectiveSettings(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want map[string]any
	}{
		{
			// Every policy off shows as 0, the failure rate's window and
			// minimum of samples included.
			name: "defaults",
			want: map[string]any{
				"fail_threshold": 5.0, "reset_timeout": "10s", "failure_rate": 0.0, "window": "0s",
				"min_samples": 0.0, "slow_call": "0s", "max_reset_timeout": "0s", "reset_jitter": 0.0,
			},
		},
		{
			// --window 0 and --min-samples 0 mean 1m and 20 once the
			// failure rate is on: the line says so.
			name: "failure rate with its defaults",
			args: []string{"--failure-rate", "0.5"},
			want: map[string]any{"failure_rate": 0.5, "window": "1m0s", "min_samples": 20.0},
		},
		{
			name: "failure rate with its own window and samples",
			args: []string{"--failure-rate", "0.25", "--window", "30s", "--min-samples", "8"},
			want: map[string]any{"failure_rate": 0.25, "window": "30s", "min_samples": 8.0},
		},
		{
			name: "window and samples without the failure rate are off",
			args: []string{"--window", "30s", "--min-samples", "8"},
			want: map[string]any{"failure_rate": 0.0, "window": "0s", "min_samples": 0.0},
		},
		{
			name: "every other policy on",
			args: []string{"--fail-threshold", "3", "--reset-timeout", "2s", "--slow-call", "1.5", "--max-reset-timeout", "1m", "--reset-jitter", "0.2"},
			want: map[string]any{
				"fail_threshold": 3.0, "reset_timeout": "2s", "slow_call": "1.5s", "max_reset_timeout": "1m0s", "reset_jitter": 0.2,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line := startupLine(t, tt.args...)
			for k, v := range tt.want {
				assert.Equal(t, v, line[k], k)
			}
		})
	}
}

func TestProbeFlagsFromTheEnvironment(t *testing.T) {
	c, err := parse(t, []string{
		"RELAY_PROBE_PAYLOAD=BAL HEALTH", "RELAY_PROBE_EXPECT=0000,b404", "RELAY_PROBE_SUCCESSES=3", "RELAY_PROBE_INTERVAL=2.5",
	})
	require.NoError(t, err)
	ts := c.targetDefaults([]string{"E500"})
	assert.Equal(t, "BAL HEALTH", ts.ProbePayload)
	assert.Equal(t, []string{"0000", "B404"}, ts.ProbeExpect, "canonical")
	assert.Equal(t, 3, ts.ProbeSuccesses)
	assert.Equal(t, 2500*time.Millisecond, ts.ProbeInterval)
}
