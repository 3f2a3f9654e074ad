//go:build unix

package targethttp

import "syscall"

// idleCheckSupported reports that targetConn.stale can peek at a socket.
const idleCheckSupported = true

// peekIdle is the idle check's RawConn.Control callback: one recvfrom with
// MSG_PEEK|MSG_DONTWAIT, which never waits and consumes nothing. Anything
// but "nothing to read yet" (bytes, the end of the stream, a reset) means
// the connection cannot carry another request.
func (c *targetConn) peekIdle(fd uintptr) {
	_, _, err := syscall.Recvfrom(int(fd), c.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	c.readable = err != syscall.EAGAIN
}
