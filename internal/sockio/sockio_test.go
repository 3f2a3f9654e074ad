//go:build unix

package sockio_test

import (
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/sockio"
)

// tcpPair returns the two ends of a loopback TCP connection: the dialled
// end as a RawConn, and the accepted end.
func tcpPair(t *testing.T) (syscall.RawConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	srv, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	return rc, srv.(*net.TCPConn)
}

// control runs f on rc's descriptor.
func control(t *testing.T, rc syscall.RawConn, f func(fd uintptr)) {
	t.Helper()
	require.NoError(t, rc.Control(f))
}

// readableWithin polls Readable on rc until it reports true or a second
// has passed: what the peer sends takes a moment to arrive.
func readableWithin(t *testing.T, rc syscall.RawConn) bool {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var readable bool
		control(t, rc, func(fd uintptr) { readable = sockio.Readable(fd) })
		if readable {
			return true
		}
	}
	return false
}

func TestReadableSeesBytesWithoutConsumingThem(t *testing.T) {
	rc, srv := tcpPair(t)
	control(t, rc, func(fd uintptr) { assert.False(t, sockio.Readable(fd), "nothing sent yet") })

	_, err := srv.Write([]byte("xy"))
	require.NoError(t, err)

	require.True(t, readableWithin(t, rc))
	control(t, rc, func(fd uintptr) {
		assert.True(t, sockio.Readable(fd), "a peek consumes nothing")
		buf := make([]byte, 8)
		n, wouldBlock, err := sockio.Read(fd, buf)
		require.NoError(t, err)
		assert.False(t, wouldBlock)
		assert.Equal(t, "xy", string(buf[:n]), "the bytes peeked are still there to read")
		assert.False(t, sockio.Readable(fd), "all read")
	})
}

func TestReadableSeesTheEndAndAReset(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reset bool
	}{{"end of stream", false}, {"reset", true}} {
		t.Run(tt.name, func(t *testing.T) {
			rc, srv := tcpPair(t)
			if tt.reset {
				require.NoError(t, srv.SetLinger(0)) // the close sends a reset
			}
			require.NoError(t, srv.Close())
			assert.True(t, readableWithin(t, rc))
		})
	}
}

// readWithin reads rc until the read would not block or a second has
// passed.
func readWithin(t *testing.T, rc syscall.RawConn) (n int, err error) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var wouldBlock bool
		control(t, rc, func(fd uintptr) { n, wouldBlock, err = sockio.Read(fd, make([]byte, 8)) })
		if !wouldBlock {
			return n, err
		}
	}
	t.Fatal("nothing to read within a second")
	return 0, nil
}

func TestReadReportsTheEndAndAReset(t *testing.T) {
	t.Run("end of stream", func(t *testing.T) {
		rc, srv := tcpPair(t)
		require.NoError(t, srv.Close())
		n, err := readWithin(t, rc)
		assert.Zero(t, n)
		assert.NoError(t, err, "the end of the stream is a read of 0 bytes")
	})
	t.Run("reset", func(t *testing.T) {
		rc, srv := tcpPair(t)
		require.NoError(t, srv.SetLinger(0))
		require.NoError(t, srv.Close())
		_, err := readWithin(t, rc)
		var se *os.SyscallError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "read", se.Syscall)
		assert.ErrorIs(t, err, syscall.ECONNRESET)
	})
}

func TestReadAndWriteTellEAGAINApart(t *testing.T) {
	rc, srv := tcpPair(t)
	control(t, rc, func(fd uintptr) {
		n, wouldBlock, err := sockio.Read(fd, make([]byte, 8))
		assert.Zero(t, n)
		assert.True(t, wouldBlock, "nothing to read yet")
		assert.NoError(t, err)
	})

	// Write until the send buffer is full: the peer does not read.
	junk := make([]byte, 64<<10)
	total := 0
	control(t, rc, func(fd uintptr) {
		for {
			n, wouldBlock, err := sockio.Write(fd, junk)
			require.NoError(t, err)
			total += n
			if wouldBlock {
				return
			}
			require.Positive(t, n)
		}
	})
	require.Positive(t, total)

	require.NoError(t, srv.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := io.ReadFull(srv, make([]byte, total))
	require.NoError(t, err)
	assert.Equal(t, total, n, "every byte reported written arrived")
}

// TestReadableDoesNotAllocate checks that the peek's one-byte buffer stays
// on the stack: the idle check runs before every request on a kept-alive
// target connection.
func TestReadableDoesNotAllocate(t *testing.T) {
	rc, _ := tcpPair(t)
	control(t, rc, func(fd uintptr) {
		allocs := testing.AllocsPerRun(100, func() { sockio.Readable(fd) })
		assert.Zero(t, allocs)
	})
}

func TestWriteToAClosedPeerFails(t *testing.T) {
	rc, srv := tcpPair(t)
	require.NoError(t, srv.SetLinger(0))
	require.NoError(t, srv.Close())
	require.True(t, readableWithin(t, rc), "the reset arrived")
	control(t, rc, func(fd uintptr) {
		_, wouldBlock, err := sockio.Write(fd, []byte("x"))
		assert.False(t, wouldBlock)
		var se *os.SyscallError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "write", se.Syscall)
	})
}
