package relay

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

// shieldedConn returns a connection to a Server whose CORE, a fake target
// answering 0000, has the shield on, with its first line, TX-000123,
// already answered by a call; and the client's end.
func shieldedConn(t *testing.T) (*conn, net.Conn, *hubtest.Target) {
	t.Helper()
	ft := hubtest.NewTarget(t, hubtest.AnswerCode("0000", "booked"))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: ft.URL})
	cfg.Dedup = true
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	nc, client := tcpPair(t)
	c := newConn(srv, nc)
	require.NoError(t, client.SetDeadline(time.Now().Add(hubtest.IOTimeout)))
	_, err = client.Write([]byte("TX-000123|core|XFER 1001 1002 2500\n"))
	require.NoError(t, err)
	c.armReadDeadline(time.Now())
	line, _, err := c.readLine()
	require.NoError(t, err)
	require.True(t, c.serveLine(line), "the first line is a call")
	want := "TX-000123|0000|booked\n"
	got := make([]byte, len(want))
	_, err = io.ReadFull(client, got)
	require.NoError(t, err)
	require.Equal(t, want, string(got))
	return c, client, ft
}

// TestReplayedLineDoesNotAllocate checks that a resend answered from the
// shield's memory costs no allocation from the socket to the answer on the
// socket, nor a call.
func TestReplayedLineDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	c, client, ft := shieldedConn(t)
	assert.Zero(t, allocsPerLine(t, c, client, "TX-000123|core|XFER 1001 1002 2500\n", "TX-000123|0000|booked\n"))
	assert.Equal(t, 1, ft.Calls(), "one call, every copy answered from memory")
}
