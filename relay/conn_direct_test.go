//go:build unix

package relay

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// rawWriteCounter is a TCP connection whose syscall.RawConn counts its
// Write calls: the writes of answers that went through the runtime's
// RawConn.Write rather than the read loop's own write(2).
type rawWriteCounter struct {
	*net.TCPConn
	writes atomic.Int64
}

func (rw *rawWriteCounter) SyscallConn() (syscall.RawConn, error) {
	rc, err := rw.TCPConn.SyscallConn()
	return countedRawConn{RawConn: rc, writes: &rw.writes}, err
}

type countedRawConn struct {
	syscall.RawConn
	writes *atomic.Int64
}

func (rc countedRawConn) Write(f func(fd uintptr) bool) error {
	rc.writes.Add(1)
	return rc.RawConn.Write(f)
}

// serveCounted runs a read loop on the hub's end of a loopback pair, its
// RawConn.Writes counted, until the test ends; the loop's end is sent on
// the channel returned.
func serveCounted(t *testing.T, srv *Server, tune func(hub, client *net.TCPConn)) (*rawWriteCounter, net.Conn, <-chan readEnd) {
	t.Helper()
	nc, client := tcpPair(t)
	if tune != nil {
		tune(nc.(*net.TCPConn), client.(*net.TCPConn))
	}
	counted := &rawWriteCounter{TCPConn: nc.(*net.TCPConn)}
	c := newConn(srv, counted)
	require.NotNil(t, c.rc, "the hub reads the socket through its RawConn")
	ended, done := make(chan readEnd, 1), make(chan struct{})
	go func() {
		defer close(done)
		ended <- c.readLoop()
	}()
	t.Cleanup(func() {
		client.Close()
		<-done
	})
	return counted, client, ended
}

// TestReadLoopWritesItsAnswersOnItsOwnDescriptor checks that the read
// loop, inside serveReadable, writes the answers of a depth-1 client with
// its own write(2) on the descriptor it holds: no RawConn.Write per
// answer.
func TestReadLoopWritesItsAnswersOnItsOwnDescriptor(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes)
	counted, client, _ := serveCounted(t, srv, nil)
	require.NoError(t, client.SetDeadline(time.Now().Add(hubtest.IOTimeout)))
	r := bufio.NewReader(client)

	// Given a client that sends a line at a time and waits for its answer.
	for i := range 50 {
		_, err := fmt.Fprintf(client, "D%d|NONE|x\n", i)
		require.NoError(t, err)
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		// Then every answer comes, whole and in turn.
		require.Equal(t, fmt.Sprintf("D%d|E903|%s\n", i, protocol.MsgUnknownTarget), got)
	}
	// And none went through RawConn.Write: the socket took each at once.
	assert.Zero(t, counted.writes.Load(), "RawConn.Writes")
}

// TestReadLoopWaitsForAFullSocketWithTheWriteDeadline checks the other way
// of the read loop's write: a client that sends and never reads fills the
// socket's buffers, the write the socket cannot take at once waits through
// RawConn.Write, and the write deadline ends it: the loop stops, broken.
func TestReadLoopWaitsForAFullSocketWithTheWriteDeadline(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.WriteTimeout = 30 * time.Millisecond
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	counted, client, ended := serveCounted(t, srv, func(hub, client *net.TCPConn) {
		require.NoError(t, hub.SetWriteBuffer(4096))
		require.NoError(t, client.SetReadBuffer(4096))
	})

	// Given a client that only writes.
	sent := make(chan error, 1)
	go func() {
		line := []byte(strings.Repeat("U|NONE|x\n", 512))
		var err error
		for err == nil {
			_ = client.SetWriteDeadline(time.Now().Add(hubtest.IOTimeout))
			_, err = client.Write(line)
		}
		sent <- err
	}()

	// Then the hub's write waits in RawConn.Write until the write deadline,
	// and the read loop ends.
	select {
	case end := <-ended:
		assert.Equal(t, endError, end)
	case <-time.After(hubtest.IOTimeout):
		t.Fatal("the read loop did not end")
	}
	assert.Positive(t, counted.writes.Load(), "RawConn.Writes")
	client.Close()
	<-sent
}
