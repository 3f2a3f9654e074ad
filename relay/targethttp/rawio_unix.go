//go:build unix

package targethttp

import "github.com/relayhub/relayhub/internal/sockio"

// canPeek reports that peekReadable, writeFD and readFD work here, so idle
// target connections are checked before reuse and a request on plain TCP
// is written by the read that waits for its answer (targetConn.exchange).
const canPeek = true

// peekReadable reports whether the non-blocking socket fd has anything to
// read: bytes, the end of the stream, or an error such as a reset. It
// consumes nothing.
func peekReadable(fd uintptr) bool { return sockio.Readable(fd) }

// writeFD writes p, which is not empty, to the non-blocking socket fd with
// one write: n bytes moved (fewer than len(p) when the send buffer fills);
// wouldBlock reports that nothing could move yet.
func writeFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) { return sockio.Write(fd, p) }

// readFD reads the non-blocking socket fd into p, which is not empty, with
// one read: a read of 0 bytes with a nil err is the end of the stream;
// wouldBlock reports that there is nothing to read yet.
func readFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) { return sockio.Read(fd, p) }
