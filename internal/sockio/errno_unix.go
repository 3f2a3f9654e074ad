//go:build unix && !(linux && !386 && !s390x)

package sockio

import "syscall"

// errnoOf returns what a syscall package call returned as err the way a
// raw system call returns it: 0 for none.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno, ok := err.(syscall.Errno); ok {
		return errno
	}
	return syscall.EIO
}
