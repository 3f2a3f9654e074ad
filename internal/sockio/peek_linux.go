//go:build linux && !386 && !s390x

package sockio

import (
	"syscall"
	"unsafe"
)

// sysPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT into p, which is not
// empty, as a raw system call (see sysRead). 386 and s390x reach recvfrom
// through socketcall(2): peek_unix.go.
func sysPeek(fd uintptr, p []byte) syscall.Errno {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	return errno
}
