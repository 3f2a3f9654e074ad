//go:build unix

package relay

import "github.com/relayhub/relayhub/internal/sockio"

// rawReads reports that connections with a file descriptor read it through
// syscall.RawConn, so that they wait for input without holding a buffer.
const rawReads = true

// readFD reads from the non-blocking descriptor fd into p, which is not
// empty. wouldBlock reports that there is nothing to read yet; n is 0 with
// a nil err at the end of the input.
func readFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return sockio.Read(fd, p)
}

// writeFD writes p, which is not empty, to the non-blocking descriptor fd.
// wouldBlock reports that the socket's buffer has no room yet; n may be
// short of len(p).
func writeFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return sockio.Write(fd, p)
}

// waitReadable is a syscall.RawConn read callback that reads nothing. It
// reports whether fd has input, its end or an error to report, by peeking
// at it, so that RawConn.Read returns once the socket is readable and the
// caller holds no buffer while it waits. It checks before the first wait,
// as RawConn.Read forgets readiness noted before it began.
func waitReadable(fd uintptr) bool {
	return sockio.Readable(fd)
}
