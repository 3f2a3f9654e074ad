// Package sockio reads, writes and peeks at a non-blocking socket through
// its file descriptor, from inside a syscall.RawConn callback: one system
// call each, again after EINTR, with EAGAIN told apart from a failure so
// that the callback can report "not yet" and let the runtime's poller wait.
// Both sides of the hub use it: the client connections' read loop and
// writer (relay) and the target connections' held requests and idle check
// (relay/targethttp).
//
// On Linux the calls are raw system calls (syscall.RawSyscall): a call on
// a non-blocking socket never waits, so the runtime need not be told of it,
// and telling it (entersyscall and exitsyscall, as syscall.Read does) costs
// CPU on every call and keeps the runtime's monitor waking on a busy hub
// (docs/BENCHMARKS.md, "Fast-fail against redis"). On other Unix systems
// they go through the syscall package. Where there is no Unix, Supported
// is false and callers use net.Conn instead.
//
// Typical use:
//
//	var n int
//	var err error
//	rerr := rc.Read(func(fd uintptr) bool {
//		var wouldBlock bool
//		n, wouldBlock, err = sockio.Read(fd, buf)
//		return !wouldBlock // false: the runtime waits for the socket to be readable
//	})
//
// The functions are safe for concurrent use; a descriptor's callers order
// their own calls.
package sockio
