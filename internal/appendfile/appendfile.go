// Package appendfile is a log file appended to and reopened at its path
// for logrotate's rename-then-signal rotation without losing or splitting
// a line: the relay's access log.
//
// Typical use:
//
//	f, err := appendfile.Open("access.log")
//	if err != nil {
//		return err
//	}
//	defer f.Close()
//	_, _ = f.Write(lines)
//	...
//	err = f.Reopen() // on SIGHUP, after logrotate renamed the file
package appendfile

import (
	"bytes"
	"errors"
	"os"
	"sync"
)

// File is a log file the relay appends to, which SIGHUP reopens at
// its path for logrotate's rename-then-signal rotation, without losing or
// splitting a line: writes that come while a line is half written finish
// that line in the old file and go on in the new one from the next line.
// The access log is one: its writer hands it lines in chunks of any size.
// It is safe for concurrent use.
type File struct {
	path    string
	mu      sync.Mutex
	f       *os.File // guarded by mu: the file written to
	next    *os.File // guarded by mu: the reopened file, waiting for the end of the line in progress; nil when none
	midLine bool     // guarded by mu: the last byte written to f was not a newline
}

// fileMode is the mode of a log file the relay creates: the access log
// holds transaction ids, readable by the relay's group (its operators and
// log shippers), no one else.
const fileMode = 0o640

// Open opens the file at path for appending, creating it if needed.
func Open(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

// Path returns the path the file was opened at.
func (a *File) Path() string { return a.path }

// Write appends p. After a Reopen, the bytes up to the end of the line in
// progress go to the old file and the rest to the new one.
func (a *File) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next == nil {
		return a.writeLocked(p)
	}
	n := 0
	if a.midLine {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return a.writeLocked(p)
		}
		var err error
		if n, err = a.writeLocked(p[:i+1]); err != nil {
			return n, err
		}
	}
	a.switchLocked()
	m, err := a.writeLocked(p[n:])
	return n + m, err
}

// writeLocked writes p to the current file. a.mu must be held.
func (a *File) writeLocked(p []byte) (int, error) {
	n, err := a.f.Write(p)
	if n > 0 {
		a.midLine = p[n-1] != '\n'
	}
	return n, err
}

// switchLocked makes the reopened file the current one and closes the
// old. a.mu must be held.
func (a *File) switchLocked() {
	old := a.f
	a.f, a.next = a.next, nil
	// The old file's lines are all written; closing it can only fail on
	// filesystems that report write errors late, which the writes would
	// have met first.
	_ = old.Close()
}

// Reopen opens a new file at the path, as logrotate's create would, and
// moves writing there: at once when no line is half written, else at the
// end of that line. When the new file cannot be opened, writing goes on in
// the old one and the error is returned.
func (a *File) Reopen() error {
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next != nil {
		// A second reopen before the line in progress ended: the newest
		// file wins.
		_ = a.next.Close()
	}
	a.next = f
	if !a.midLine {
		a.switchLocked()
	}
	return nil
}

// Close closes the file, and a reopened one still waiting.
func (a *File) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	if a.next != nil {
		errs = append(errs, a.next.Close())
		a.next = nil
	}
	errs = append(errs, a.f.Close())
	return errors.Join(errs...)
}
