// Package lockedfile opens the files the relay appends to and keeps to
// itself while it runs, the breaker log and the in-doubt journal: each is
// held under an exclusive flock(2), so a second relay started on the same
// file refuses to start instead of mixing its lines with the first one's,
// and each is reopened at its path after a rename, which is how logrotate
// rotates it.
//
// Typical use, by a log that rotates on SIGHUP:
//
//	f, err := lockedfile.Open("in-doubt.log", 0o640)
//	if errors.Is(err, lockedfile.ErrLocked) {
//		// another relay writes to it
//	}
//	...
//	// On SIGHUP, with nothing writing to f meanwhile:
//	nf, err := lockedfile.Reopen(f, "in-doubt.log", 0o640)
//	if err == nil && nf != nil {
//		f.Close() // releases the old file's lock
//		f = nf
//	}
package lockedfile

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrLocked is returned (wrapped) by Open and Reopen when another open
// file description, in practice another relay, holds the lock on the file.
var ErrLocked = errors.New("lockedfile: locked by another process")

// Open opens path for appending, creating it with mode perm if needed, and
// takes an exclusive lock on it without waiting. The lock is held until the
// file is closed, or the process ends however it ends, so it never goes
// stale. When another process holds it, the error wraps ErrLocked. Files
// that are not regular files, such as /dev/null, are not locked: writers
// to them have nothing to keep apart.
func Open(path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, perm)
	if err != nil {
		return nil, err
	}
	if err := lock(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// Reopen opens path anew for log rotation, cur being the file written to
// now. When path still names cur (nothing was renamed) it returns nil and
// no error, and cur stays as it is. Otherwise it returns the new file at
// path, created with mode perm if needed and locked as Open locks it; the
// caller moves writing there and closes cur, which releases cur's lock.
// On error cur is untouched and nothing stays open.
func Reopen(cur *os.File, path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, perm)
	if err != nil {
		return nil, err
	}
	same, err := sameFile(cur, f)
	if err != nil || same {
		// Locking f now would fail against the lock held through cur on
		// the same file; closing f leaves that lock alone.
		_ = f.Close()
		return nil, err
	}
	if err := lock(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// sameFile reports whether a and b are the same file. It fails with an
// error wrapping os.ErrClosed when either is closed.
func sameFile(a, b *os.File) (bool, error) {
	ai, err := a.Stat()
	if err != nil {
		return false, err
	}
	bi, err := b.Stat()
	if err != nil {
		return false, err
	}
	return os.SameFile(ai, bi), nil
}

// lock takes an exclusive flock(2) on f without waiting. The lock belongs
// to f's open file description: a second open of the same file, even in
// the same process, cannot take it meanwhile, and unlike an fcntl lock,
// closing another descriptor of the same file does not release it.
func lock(f *os.File) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var flockErr error
	if err := rc.Control(func(fd uintptr) {
		flockErr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
	}); err != nil {
		return err
	}
	if errors.Is(flockErr, syscall.EWOULDBLOCK) {
		return ErrLocked
	}
	if flockErr != nil {
		return fmt.Errorf("lock: %w", flockErr)
	}
	return nil
}
