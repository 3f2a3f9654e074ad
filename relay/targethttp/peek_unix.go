//go:build unix

package targethttp

import "syscall"

// canPeek reports that peekReadable works here, so idle target connections
// are checked before reuse.
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
