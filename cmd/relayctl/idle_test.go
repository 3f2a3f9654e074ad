package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/fakerelay"
)

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

			sum, err := runIdle(t.Context(), idleConfig{Addr: f.Addr, Conns: 20, Hold: time.Millisecond, Warm: tt.warm, Timeout: 5 * time.Second})

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

	sum, err := runIdle(t.Context(), idleConfig{Addr: f.Addr, Conns: 5, Timeout: 5 * time.Second, ServerPID: os.Getpid()})

	require.NoError(t, err)
	assert.Positive(t, sum.RSSBefore)
	assert.Positive(t, sum.RSSHeld)
	assert.InDelta(t, float64(sum.RSSHeld-sum.RSSBefore)/5, sum.KiBPerConn, 1e-9)
	assert.Equal(t, 5, sum.Answered)
}

func TestRunIdleCannotConnect(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	f.Close()

	_, err := runIdle(t.Context(), idleConfig{Addr: f.Addr, Conns: 3, Timeout: time.Second})

	assert.ErrorIs(t, err, errDialAll)
}

func TestRunIdleStopsWhenCancelled(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	_, err := runIdle(ctx, idleConfig{Addr: f.Addr, Conns: 3, Hold: time.Hour, Timeout: time.Second})

	assert.ErrorIs(t, err, context.Canceled)
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
			_, kctx, err := parse(t, "idle", "--addr", f.Addr, "--conns", "3", "--hold", "1ms", "--timeout", "200ms", "--json")
			require.NoError(t, err)
			var out bytes.Buffer
			kctx.BindTo(t.Context(), (*context.Context)(nil))
			err = kctx.Run(&streams{Out: &out, Err: &bytes.Buffer{}})

			assert.Equal(t, tt.wantCode, exitCode(err))
			var sum idleSummary
			require.NoError(t, json.Unmarshal(out.Bytes(), &sum), out.String())
			assert.Equal(t, 3, sum.Opened)
			assert.Equal(t, 3-sum.Answered, sum.Lost)
		})
	}
}

func TestIdleSummaryText(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, idleSummary{
		Addr: "127.0.0.1:9200", Conns: 10000, Opened: 10000, HoldSeconds: 10, Answered: 10000,
		ServerPID: 42, RSSBefore: 10000, RSSHeld: 90000, KiBPerConn: 8,
	}.writeText(&out))
	assert.Contains(t, out.String(), "opened 10000, dial errors 0, held 10.0s, answered the probe 10000, lost 0")
	assert.Contains(t, out.String(), "pid 42: 10000 KiB before, 90000 KiB held, 8.00 KiB per connection")
}
