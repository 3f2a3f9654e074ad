//go:build unix && !(linux && !386 && !s390x)

package sockio

import "syscall"

// sysPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT into p through the
// syscall package: raw system calls are for Linux, where recvfrom is a
// system call of its own (peek_linux.go).
func sysPeek(fd uintptr, p []byte) syscall.Errno {
	_, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return errnoOf(err)
}
