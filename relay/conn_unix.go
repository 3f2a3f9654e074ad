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
	for {
		n, err = syscall.Read(int(fd), p)
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
		return 0, false, os.NewSyscallError("read", err)
	}
}
