package relay

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

// testConfig returns a Config for the given targets with a fake clock and a
// test logger.
func testConfig(t *testing.T, targets ...Target) (Config, *fakeclock.Clock) {
	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	return Config{
		Targets: targets,
		Clock:   clk,
		Logger:  zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel),
	}, clk
}

// startServer serves cfg on a loopback listener until the test ends.
func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	srv, err := New(cfg)
	require.NoError(t, err)
	return srv, hubtest.Serve(t, srv, ErrServerClosed)
}

// status returns the named target's status.
func status(t *testing.T, srv *Server, name string) TargetSnapshot {
	t.Helper()
	for _, ts := range srv.Targets() {
		if ts.Name == name {
			return ts
		}
	}
	t.Fatalf("no target %s", name)
	return TargetSnapshot{}
}

// readLine reads c's next line as its read loop does.
func (c *conn) readLine() ([]byte, bool, error) { return c.in.readLine(c.nc) }

// readLoop runs c's read loop as serve does after the handshake, and
// returns why it ended.
func (c *conn) readLoop() readEnd {
	c.awaitIdle(time.Now())
	if c.in.buf == nil {
		c.in.waitForInput(c.nc)
	}
	return c.serveInput()
}
