//go:build unix

package relay

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unreadBytes returns the bytes the client has sent on nc, a socket the
// hub serves, that the hub has not read: peeked, left in place.
func unreadBytes(t *testing.T, nc interface {
	SyscallConn() (syscall.RawConn, error)
}) string {
	t.Helper()
	rc, err := nc.SyscallConn()
	require.NoError(t, err)
	buf := make([]byte, 4096)
	var n int
	var peekErr error
	require.NoError(t, rc.Control(func(fd uintptr) {
		n, _, peekErr = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}))
	if peekErr == syscall.EAGAIN {
		return ""
	}
	require.NoError(t, peekErr)
	return string(buf[:n])
}

func TestRefusalHeavyConnectionReadsOnlyInItsTurn(t *testing.T) {
	// Given a refusal-heavy connection and every turn of the lane held.
	srv, heavy, giveBack := heavyBehindHeldLane(t)

	// When it sends two lines, the hub waits for a turn before it reads
	// them: they are still in the socket, so that none waits for a turn
	// once read.
	heavy.Send("H1|CORE|BAL 1", "H2|CORE|BAL 2")
	waitersBecome(t, srv, 1)
	nc, ok := serverConn(t, srv).(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	require.True(t, ok, "the hub serves a socket")
	assert.Equal(t, "H1|CORE|BAL 1\nH2|CORE|BAL 2\n", unreadBytes(t, nc))
	assert.Equal(t, int64(1), srv.lane.owed.Load(), "the input found is owed a read")

	// Then, its turn come, both are read and answered in it.
	giveBack()
	assert.Equal(t, map[string]string{
		"H1": "H1|E904|circuit open; retry after 3600s",
		"H2": "H2|E904|circuit open; retry after 3600s",
	}, heavy.ReadByTxID(2))
	assert.Empty(t, unreadBytes(t, nc))
	assert.Zero(t, srv.lane.owed.Load())
}
