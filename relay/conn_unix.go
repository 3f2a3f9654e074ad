//go:build unix

package relay

import (
	"os"
	"syscall"
)

// rawReads reports that connections with a file descriptor read it through
// syscall.RawConn, so that they wait for input without holding a buffer.
const rawReads = true

// readFD reads from the non-blocking descriptor fd into p, which is not
// empty. wouldBlock reports that there is nothing to read yet; n is 0 with
// a nil err at the end of the input.
func readFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return ioFD(sysRead, "read", fd, p)
}

// writeFD writes p, which is not empty, to the non-blocking descriptor fd.
// wouldBlock reports that the socket's buffer has no room yet; n may be
// short of len(p).
func writeFD(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return ioFD(sysWrite, "write", fd, p)
}

// ioFD runs one read or write (op, named name in errors) of fd, again after
// EINTR, telling EAGAIN apart.
func ioFD(op func(fd uintptr, p []byte) (int, syscall.Errno), name string, fd uintptr, p []byte) (int, bool, error) {
	for {
		n, errno := op(fd, p)
		switch {
		case errno == 0:
			return n, false, nil
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK:
			return 0, true, nil
		}
		return 0, false, os.NewSyscallError(name, errno)
	}
}

// waitReadable is a syscall.RawConn read callback that reads nothing. It
// reports whether fd has input, its end or an error to report, by peeking
// at one byte, so that RawConn.Read returns once the socket is readable and
// the caller holds no buffer while it waits. It checks before the first
// wait, as RawConn.Read forgets readiness noted before it began.
func waitReadable(fd uintptr) bool {
	var b [1]byte
	for {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
		}
	}
}
