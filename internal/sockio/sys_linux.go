package sockio

import (
	"syscall"
	"unsafe"
)

// sysRead and sysWrite are read(2) and write(2) as raw system calls, for a
// non-blocking socket: such a call never waits, so the runtime need not be
// told of it. syscall.Read and syscall.Write tell it (entersyscall and
// exitsyscall), and a call that spans a tick of the runtime's monitor has
// its P handed to another thread, which keeps the monitor waking every
// 20 µs on a busy hub: together an eighth of the CPU of a fast-fail
// answer (docs/BENCHMARKS.md, "Fast-fail against redis").
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), errno
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	return int(n), errno
}
