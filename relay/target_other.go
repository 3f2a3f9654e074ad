//go:build !unix

package relay

// peekReadable is never called where connections are not read through
// syscall.RawConn (rawReads is false): idle target connections go
// unchecked there.
func peekReadable(uintptr, []byte) bool { return false }
