//go:build unix

package targethttp

import "syscall"

// canPeek reports that peekReadable, writeFD and readFD work here, so idle
// target connections are checked before reuse and a request on plain TCP
// is written by the read that waits for its answer (targetConn.exchange).
const canPeek = true

// peekReadable reports whether the non-blocking socket fd has anything to
// read: bytes, the end of the stream, or an error such as a reset. It
// consumes nothing: buf (one byte is enough) receives a peeked copy.
func peekReadable(fd uintptr, buf []byte) bool {
	for {
		_, _, err := syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
		}
	}
}

// sockIO makes one read or write (op: syscall.Read or syscall.Write) of p,
// which is not empty, on the non-blocking socket fd: n bytes moved (a
// write may move fewer than len(p) when the send buffer fills; a read of 0
// bytes with a nil err is the end of the stream); wouldBlock reports that
// nothing could move yet.
func sockIO(op func(int, []byte) (int, error), fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	for {
		n, err = op(int(fd), p)
		if err != syscall.EINTR {
			break
		}
	}
	switch {
	case err == nil:
		return n, false, nil
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
		return 0, true, nil
	default:
		return 0, false, err
	}
}

// writeFD writes p to the socket fd with one write (see sockIO).
func writeFD(fd uintptr, p []byte) (int, bool, error) { return sockIO(syscall.Write, fd, p) }

// readFD reads the socket fd into p with one read (see sockIO).
func readFD(fd uintptr, p []byte) (int, bool, error) { return sockIO(syscall.Read, fd, p) }
