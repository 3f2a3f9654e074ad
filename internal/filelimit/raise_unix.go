//go:build unix

package filelimit

import "syscall"

// Raise raises the process's soft limit on open files to its hard limit,
// when it can, and returns the soft limit then in force; ok is false when
// the limit cannot be read.
func Raise() (limit uint64, ok bool) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return 0, false
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	return uint64(lim.Cur), true // int64 on some systems (the BSDs), never negative
}
