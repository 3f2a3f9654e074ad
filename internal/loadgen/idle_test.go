package loadgen

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

// runIdle runs an IdleProbe for cfg, failing the test when NewIdleProbe
// refuses it.
func runIdle(t *testing.T, cfg IdleConfig) (IdleSummary, error) {
	t.Helper()
	p, err := NewIdleProbe(cfg)
	require.NoError(t, err)
	return p.Run(t.Context())
}

func TestRunIdle(t *testing.T) {
	tests := []struct {
		name         string
		relay        fakerelay.Config
		warm         bool
		wantAnswered int
		wantLines    int64
	}{
		{"cold connections all survive", fakerelay.Config{}, false, 20, 20},
		{"warm connections all survive", fakerelay.Config{}, true, 20, 40},
		{"a hub that hangs up after one answer loses warm connections", fakerelay.Config{CloseAfter: 1}, true, 0, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fakerelay.New(t, tt.relay)

			sum, err := runIdle(t, IdleConfig{Addr: f.Addr, Conns: 20, Hold: time.Millisecond, Warm: tt.warm, Timeout: 5 * time.Second})

			require.NoError(t, err)
			assert.Equal(t, 20, sum.Opened)
			assert.Zero(t, sum.DialErrors)
			assert.Equal(t, tt.wantAnswered, sum.Answered)
			assert.Equal(t, 20-tt.wantAnswered, sum.Lost)
			assert.Equal(t, tt.wantLines, f.Lines(), "one probe line per connection, and one more when warm")
			assert.Zero(t, sum.RSSBefore, "no pid, no memory readings")
		})
	}
}

func TestRunIdleReadsServerMemory(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc on this system")
	}
	// The fake relay runs in this process, so its pid is ours.
	f := fakerelay.New(t, fakerelay.Config{})

	sum, err := runIdle(t, IdleConfig{Addr: f.Addr, Conns: 5, Timeout: 5 * time.Second, ServerPID: os.Getpid()})

	require.NoError(t, err)
	assert.Positive(t, sum.RSSBefore)
	assert.Positive(t, sum.RSSHeld)
	assert.InDelta(t, float64(sum.RSSHeld-sum.RSSBefore)/5, sum.KiBPerConn, 1e-9)
	assert.Equal(t, 5, sum.Answered)
}

func TestRunIdleCannotConnect(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	f.Close()

	_, err := runIdle(t, IdleConfig{Addr: f.Addr, Conns: 3, Timeout: time.Second})

	assert.ErrorIs(t, err, ErrDialAll)
}

func TestRunIdleStopsWhenCancelled(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	p, err := NewIdleProbe(IdleConfig{Addr: f.Addr, Conns: 3, Hold: time.Hour, Timeout: time.Second})
	require.NoError(t, err)

	_, err = p.Run(ctx)

	assert.ErrorIs(t, err, context.Canceled)
}

func TestIdleSummaryText(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, IdleSummary{
		Addr: "127.0.0.1:9200", Conns: 10000, Opened: 10000, HoldSeconds: 10, Answered: 10000,
		ServerPID: 42, RSSBefore: 10000, RSSHeld: 90000, KiBPerConn: 8,
	}.WriteText(&out))
	assert.Contains(t, out.String(), "opened 10000, dial errors 0, held 10.0s, answered the probe 10000, lost 0")
	assert.Contains(t, out.String(), "pid 42: 10000 KiB before, 90000 KiB held, 8.00 KiB per connection")
}

func TestNewIdleProbe(t *testing.T) {
	p, err := NewIdleProbe(IdleConfig{Addr: "127.0.0.1:9200", Conns: 1})
	require.NoError(t, err)
	assert.Equal(t, 5*time.Second, p.cfg.Timeout, "zero means the default")

	tests := []struct {
		name    string
		cfg     IdleConfig
		wantErr string
	}{
		{"no connections", IdleConfig{Conns: 0}, "Conns 0"},
		{"too many connections", IdleConfig{Conns: MaxConns + 1}, "Conns 10001"},
		{"negative hold", IdleConfig{Conns: 1, Hold: -time.Second}, "Hold -1s"},
		{"negative timeout", IdleConfig{Conns: 1, Timeout: -time.Second}, "Timeout -1s"},
		{"not a process id", IdleConfig{Conns: 1, ServerPID: -1}, "ServerPID -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewIdleProbe(tt.cfg)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestIdleSummaryProblems(t *testing.T) {
	assert.Empty(t, IdleSummary{Opened: 3, Answered: 3}.Problems())
	assert.Equal(t, "1 connections not opened, 2 lost during the hold",
		IdleSummary{DialErrors: 1, Opened: 2, Lost: 2}.Problems())
}

func TestRunIdleRedisPing(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(t *testing.T) {
			f := newFakeRedis(t)

			sum, err := runIdle(t, IdleConfig{Addr: f.ln.Addr().String(), Conns: 10, Hold: time.Millisecond, Warm: warm,
				Timeout: 5 * time.Second, Protocol: ProtocolRedisPing})

			require.NoError(t, err)
			assert.Equal(t, "redis-ping", sum.Protocol)
			assert.Equal(t, 10, sum.Answered)
			assert.Zero(t, sum.Lost)
			want := int64(10)
			if warm {
				want = 20
			}
			assert.Equal(t, want, f.pings.Load(), "one PING per connection, and one more when warm")
		})
	}
}

func TestRunIdleRedisPingCountsWrongAnswersLost(t *testing.T) {
	// A hub answers a PING line with an E900, not +PONG.
	f := fakerelay.New(t, fakerelay.Config{})

	sum, err := runIdle(t, IdleConfig{Addr: f.Addr, Conns: 3, Timeout: 5 * time.Second, Protocol: ProtocolRedisPing})

	require.NoError(t, err)
	assert.Zero(t, sum.Answered)
	assert.Equal(t, 3, sum.Lost)
}

func TestNewIdleProbeRefusesHTTP(t *testing.T) {
	_, err := NewIdleProbe(IdleConfig{Conns: 1, Protocol: ProtocolHTTP})

	assert.ErrorContains(t, err, "Protocol http")
}
