//go:build unix && !linux

package relay

import "syscall"

// sysRead and sysWrite are read(2) and write(2) through the syscall
// package: raw system calls are for Linux only (conn_linux.go).
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) { return errnoOf(syscall.Read(int(fd), p)) }

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) { return errnoOf(syscall.Write(int(fd), p)) }

// errnoOf returns what a syscall package call returned as a raw call does.
func errnoOf(n int, err error) (int, syscall.Errno) {
	if err == nil {
		return n, 0
	}
	if errno, ok := err.(syscall.Errno); ok {
		return 0, errno
	}
	return 0, syscall.EIO
}
