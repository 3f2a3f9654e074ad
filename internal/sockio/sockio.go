//go:build unix

package sockio

import (
	"os"
	"syscall"
)

// Supported reports that the functions below work here.
const Supported = true

// Read reads the non-blocking socket fd into p, which is not empty, with
// one read(2). wouldBlock reports that there is nothing to read yet; n is 0
// with a nil err at the end of the stream. An err is an *os.SyscallError.
func Read(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return ioFD(sysRead, "read", fd, p)
}

// Write writes p, which is not empty, to the non-blocking socket fd with
// one write(2). wouldBlock reports that the socket's buffer has no room
// yet; n may be short of len(p) when the buffer fills. An err is an
// *os.SyscallError.
func Write(fd uintptr, p []byte) (n int, wouldBlock bool, err error) {
	return ioFD(sysWrite, "write", fd, p)
}

// Readable reports whether the non-blocking socket fd has anything to
// read: bytes, the end of the stream, or an error such as a reset. It
// never waits and consumes nothing: one recvfrom(2) with MSG_PEEK and
// MSG_DONTWAIT.
func Readable(fd uintptr) bool {
	var b [1]byte
	for {
		errno := sysPeek(fd, b[:])
		if errno != syscall.EINTR {
			return errno != syscall.EAGAIN && errno != syscall.EWOULDBLOCK
		}
	}
}

// ioFD runs one read or write (op, named name in errors) of fd, again
// after EINTR, telling EAGAIN apart.
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
