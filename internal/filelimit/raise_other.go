//go:build !unix

package filelimit

// Raise reports no limit where there is no RLIMIT_NOFILE.
func Raise() (limit uint64, ok bool) { return 0, false }
