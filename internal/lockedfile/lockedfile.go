// Package lockedfile is a file the relay appends to and keeps to itself
// while it runs, the breaker log and the in-doubt journal: it is held
// under an exclusive flock(2), so a second relay started on the same file
// refuses to start instead of mixing its lines with the first one's, and
// Reopen moves writing to a new file at its path after a rename, which is
// how logrotate rotates it, without splitting or losing what is appended.
// An append is whole or absent: one that fails part way (a full disk) is
// cut off again, and if even that fails the next append starts on a line
// of its own, so a reader meets at worst a fragment on a line by itself,
// never two lines run together.
//
// Typical use, by a log that rotates on SIGHUP:
//
//	f, err := lockedfile.Open(lockedfile.Config{Path: "in-doubt.log", Perm: 0o640})
//	if errors.Is(err, lockedfile.ErrLocked) {
//		// another relay writes to it
//	}
//	defer f.Close()
//	err = f.Append(line, true) // whole in one file, and on disk
//	...
//	// On SIGHUP, once logrotate has renamed the file:
//	err = f.Reopen()
package lockedfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"syscall"
)

// ErrLocked is returned (wrapped) by Open and Reopen when another open
// file description, in practice another relay, holds the lock on the file.
var ErrLocked = errors.New("lockedfile: locked by another process")

// ErrTorn is wrapped by the error of an Append that failed and could not be
// cut off the file: some or all of its bytes stay at the end of the file,
// and the next Append starts with a newline so that they stay a line of
// their own. Without ErrTorn, a failed Append left the file as it was.
var ErrTorn = errors.New("lockedfile: failed append left in the file")

// Config configures Open. It is a plain value.
type Config struct {
	// Path is the file to append to. Required.
	Path string
	// Perm is the mode of a file Open or Reopen creates. Zero means 0o640.
	Perm os.FileMode
	// Sync makes what was written to a file durable. Nil means
	// (*os.File).Sync; tests put one in its place to stall or fail it.
	Sync func(*os.File) error
	// Write writes p to a file and Truncate cuts a file to size. Nil means
	// (*os.File).Write and (*os.File).Truncate; tests put their own in
	// their place to fail them part way.
	Write    func(f *os.File, p []byte) (int, error)
	Truncate func(f *os.File, size int64) error
}

// File is a file opened for appending under an exclusive lock, which
// Reopen moves to a new file at the same path. It is safe for concurrent
// use.
type File struct {
	path     string
	perm     os.FileMode
	sync     func(*os.File) error
	write    func(*os.File, []byte) (int, error)
	truncate func(*os.File, int64) error

	// reopenMu lets one Reopen run at a time. It is taken before mu, never
	// while holding it.
	reopenMu sync.Mutex

	mu     sync.Mutex
	f      *os.File // guarded by mu; replaced only by Reopen
	closed bool     // guarded by mu
	// midLine is set while f does not end with a newline: a failed append
	// could not be cut off, or the file was found so at Open. The next
	// append starts with one. Guarded by mu.
	midLine bool
	buf     []byte // guarded by mu: a newline and the bytes of an append, when midLine
}

// Open opens cfg.Path for appending, creating it if needed, and takes an
// exclusive lock on it without waiting. The lock is held until Close (or
// moved to the new file by Reopen), or until the process ends however it
// ends, so it never goes stale. When another process holds it, the error
// wraps ErrLocked. Files that are not regular files, such as /dev/null,
// are not locked: writers to them have nothing to keep apart.
func Open(cfg Config) (*File, error) {
	if cfg.Path == "" {
		return nil, errors.New("lockedfile: Config.Path is required")
	}
	file := &File{path: cfg.Path, perm: cfg.Perm, sync: cfg.Sync, write: cfg.Write, truncate: cfg.Truncate}
	if file.perm == 0 {
		file.perm = 0o640
	}
	if file.sync == nil {
		file.sync = (*os.File).Sync
	}
	if file.write == nil {
		file.write = (*os.File).Write
	}
	if file.truncate == nil {
		file.truncate = (*os.File).Truncate
	}
	f, err := openLocked(file.path, file.perm)
	if err != nil {
		return nil, err
	}
	file.f, file.midLine = f, endsMidLine(f)
	return file, nil
}

// Path returns the path the file was opened at.
func (l *File) Path() string { return l.path }

// Append writes p with one write call and, when sync is set, fsyncs it,
// both under the lock Reopen takes to switch files: p is whole in exactly
// one file, and synced, it is on disk before a Reopen can close that file.
// After Close it returns an error wrapping os.ErrClosed.
//
// p is whole or absent: when the write fails part way or the fsync fails,
// the file is cut back to its size before the write, and the error
// returned. Should the cut fail too, the error wraps ErrTorn and the next
// Append starts with a newline, so what is left of p stays a line of its
// own. p should end with a newline.
func (l *File) Append(p []byte, sync bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("write: %w", os.ErrClosed)
	}
	// The size before the write, where a failed one is cut back to. Seek
	// does not move O_APPEND's writes, and unlike Stat it does not
	// allocate; it fails on a pipe, which cannot be cut.
	size, seekErr := l.f.Seek(0, io.SeekEnd)
	out := p
	if l.midLine {
		l.buf = append(append(l.buf[:0], '\n'), p...)
		out = l.buf
	}
	// os.File.Write keeps writing after a short write, and O_APPEND makes
	// each write(2) land at the end of the file even if another process
	// appends to it too.
	n, err := l.write(l.f, out)
	if err == nil && n < len(out) {
		err = io.ErrShortWrite
	}
	if err == nil && sync {
		err = l.sync(l.f)
	}
	if err == nil {
		if len(out) > 0 {
			l.midLine = out[len(out)-1] != '\n'
		}
		return nil
	}
	if seekErr != nil {
		size = -1
	}
	return l.cutLocked(out[:n], size, err)
}

// cutLocked cuts written, the part of a failed append that reached the
// file, off again: the file goes back to size, its size before (-1 when
// not known). When it cannot, it wraps err with ErrTorn and the cut's
// error, and the next append starts on a line of its own. l.mu must be
// held.
func (l *File) cutLocked(written []byte, size int64, err error) error {
	if len(written) == 0 {
		return err
	}
	var cutErr error
	if info, statErr := l.f.Stat(); statErr != nil {
		cutErr = statErr
	} else if !info.Mode().IsRegular() || size < 0 {
		cutErr = errors.New("not a regular file")
	} else {
		cutErr = l.truncate(l.f, size)
	}
	if cutErr == nil {
		return err
	}
	l.midLine = written[len(written)-1] != '\n'
	return fmt.Errorf("%w (%w: cut back: %w)", err, ErrTorn, cutErr)
}

// Reopen opens the path anew and moves writing there, for log rotation:
// once logrotate (or an operator) has renamed the file, appends go on into
// the renamed file until Reopen creates a new one at the path. The new
// file is locked as Open locks it; the old one is then synced and closed,
// which releases its lock. If the path still names the file being written
// (nothing was renamed), Reopen leaves it as it is.
//
// On error appends go on in the file they had: the path cannot be opened,
// or another process holds the new file's lock (wrapping ErrLocked). After
// Close it returns an error wrapping os.ErrClosed. If the new file is in
// place but the old one fails to sync or close, that error is returned
// too.
func (l *File) Reopen() error {
	l.reopenMu.Lock()
	defer l.reopenMu.Unlock()

	f, err := openAppend(l.path, l.perm)
	if err != nil {
		return err
	}
	same, err := l.isOpen(f)
	if err != nil || same {
		// Locking f now would fail against the lock held on the same
		// file; closing f leaves that lock alone.
		_ = f.Close()
		return err
	}
	if err := lock(f); err != nil {
		_ = f.Close()
		return err
	}

	midLine := endsMidLine(f)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = f.Close()
		return fmt.Errorf("reopen: %w", os.ErrClosed)
	}
	old := l.f
	l.f, l.midLine = f, midLine
	l.mu.Unlock()

	// Nothing appends to old any more: syncing it outside the lock keeps
	// Append from waiting on the disk.
	syncErr := l.sync(old)
	closeErr := old.Close()
	if err := errors.Join(syncErr, closeErr); err != nil {
		return fmt.Errorf("the old file: %w", err)
	}
	return nil
}

// isOpen reports whether f is the file appended to now. It fails with
// os.ErrClosed after Close.
func (l *File) isOpen(f *os.File) (bool, error) {
	info, err := f.Stat()
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, fmt.Errorf("reopen: %w", os.ErrClosed)
	}
	cur, err := l.f.Stat()
	if err != nil {
		return false, err
	}
	return os.SameFile(cur, info), nil
}

// Close flushes the file to stable storage and closes it, which releases
// its lock. Appends after Close fail with an error wrapping os.ErrClosed,
// and so does a second Close.
func (l *File) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("close: %w", os.ErrClosed)
	}
	l.closed = true
	return errors.Join(l.sync(l.f), l.f.Close())
}

// openLocked opens path for appending, creating it with mode perm, and
// locks it.
func openLocked(path string, perm os.FileMode) (*os.File, error) {
	f, err := openAppend(path, perm)
	if err != nil {
		return nil, err
	}
	if err := lock(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// openAppend opens path for appending, creating it with mode perm. It
// opens it for reading too when it may, so that endsMidLine can read the
// last byte.
func openAppend(path string, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, perm)
	if errors.Is(err, fs.ErrPermission) {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, perm)
	}
	return f, err
}

// endsMidLine reports whether f is a regular file whose last byte is not
// a newline: a line torn by a crash of the last writer, which the next
// append must not run on from. A file it cannot read is taken to end a
// line.
func endsMidLine(f *os.File) bool {
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() || info.Size() == 0 {
		return false
	}
	var last [1]byte
	if _, err := f.ReadAt(last[:], info.Size()-1); err != nil {
		return false
	}
	return last[0] != '\n'
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
