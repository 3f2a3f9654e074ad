//go:build linux

package relay

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// waitConsumed polls the receive queue of the hub's end of a connection
// until the read loop has read every byte that has arrived, or fails the
// test after hubtest.IOTimeout.
func waitConsumed(t *testing.T, nc net.Conn) {
	t.Helper()
	rc, err := nc.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	deadline := time.Now().Add(hubtest.IOTimeout)
	for {
		var queued int32
		var errno syscall.Errno
		require.NoError(t, rc.Control(func(fd uintptr) {
			_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&queued)))
		}))
		require.Zero(t, errno)
		if queued == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the read loop left %d bytes unread", queued)
		runtime.Gosched()
	}
}

// TestLinesWrittenInPiecesWithPauses writes lines in pieces and lets the
// read loop read each piece before the next is written, so that a line is
// assembled across many reads and waits for input: the read buffer is
// handed back or trimmed to the line begun at each wait, and a line that
// outgrows it moves to a long-line buffer and back.
func TestLinesWrittenInPiecesWithPauses(t *testing.T) {
	const maxLine = 2 * readBufSize
	srv := lineServer(t, maxLine)
	line := func(txid string, n int) string {
		s := txid + "|NONE|"
		return s + strings.Repeat("p", n-len(s))
	}
	unknown := func(txid string) string { return txid + "|E903|" + protocol.MsgUnknownTarget + "\n" }
	tests := []struct {
		name   string
		input  string
		pieces []int // sizes of the first pieces; the last size repeats
		want   []string
	}{
		{name: "a short line a byte at a time", input: "P1|NONE|hello\r\n", pieces: []int{1}, want: []string{unknown("P1")}},
		{name: "longer than the read buffer", input: line("P2", readBufSize+1500) + "\n", pieces: []int{700}, want: []string{unknown("P2")}},
		{name: "a read buffer and a byte, then the rest", input: line("P3", readBufSize+2) + "\r\n", pieces: []int{readBufSize, 1, 1, 500}, want: []string{unknown("P3")}},
		{name: "at the limit", input: line("P4", maxLine) + "\r\n", pieces: []int{1000}, want: []string{unknown("P4")}},
		{name: "over-long, its TXID a byte at a time", input: line("P5", maxLine+3*readBufSize) + "\n", pieces: []int{1, 1, 1, 1, 1500}, want: []string{"P5|E900|" + protocol.MsgLineTooLong + "\n"}},
		{name: "over-long by its terminator", input: line("P6", maxLine+1) + "\r\n", pieces: []int{maxLine, 1, 1, 1}, want: []string{"P6|E900|" + protocol.MsgLineTooLong + "\n"}},
		{
			// The short line begun waits in a read buffer, not the long one.
			name: "a short line begun after a long one", input: line("P7", readBufSize+100) + "\nP8|NONE|after\n",
			pieces: []int{readBufSize + 101 + 3, 1}, want: []string{unknown("P7"), unknown("P8")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, client := tcpPair(t)
			ended := make(chan readEnd, 1)
			go func() { ended <- newConn(srv, nc).readLoop() }()
			t.Cleanup(func() {
				client.Close()
				<-ended
			})
			require.NoError(t, client.SetDeadline(time.Now().Add(hubtest.IOTimeout)))
			r := bufio.NewReader(client)

			// Given a line written in pieces, each read before the next.
			for rest, i := tt.input, 0; len(rest) > 0; i++ {
				n := min(len(rest), tt.pieces[min(i, len(tt.pieces)-1)])
				_, err := io.WriteString(client, rest[:n])
				require.NoError(t, err)
				rest = rest[n:]
				waitConsumed(t, nc)
			}
			// Then it is answered, and the connection goes on.
			for _, want := range tt.want {
				got, err := r.ReadString('\n')
				require.NoError(t, err)
				assert.Equal(t, want, got)
			}
			_, err := io.WriteString(client, "N|NONE|next\n")
			require.NoError(t, err)
			got, err := r.ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, unknown("N"), got)
		})
	}
}
