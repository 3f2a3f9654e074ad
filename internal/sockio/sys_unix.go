//go:build unix && !linux

package sockio

import "syscall"

// sysRead and sysWrite are read(2) and write(2) through the syscall
// package: raw system calls are for Linux only (sys_linux.go).
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return n, errnoOf(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return n, errnoOf(err)
}
