// Package breakerlog writes and reads the breaker log: one line per breaker
// state change, in the form
//
//	2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN
//
// The time is the breaker clock's time of the change in UTC, RFC 3339 with
// exactly three digits of milliseconds (truncated, not rounded). Each line is
// issued to the operating system in a single write under a lock, so lines
// from many goroutines never interleave and a line is in the file as soon as
// Write returns, even if the process is then killed. It reaches the disk
// when the log is closed, or at once with Config.Sync. The file is opened
// for appending and never truncated.
//
// A Log holds an exclusive lock (flock(2)) on its file for as long as it
// writes to it, so a second relay started on the same file refuses to start
// (ErrLocked) instead of interleaving its chains with the first one's.
// Reopen moves writing to a new file at the same path after the old one was
// renamed, which is how logrotate rotates the log.
//
// The reading side (ParseLine, Read, ReadFile, CheckChains) is strict, so
// that tests and operators can hold a log file to the format and to the
// chain property: per target, the first change starts from CLOSED and each
// change starts where the previous one ended.
//
// A write that fails is cut off the file again (internal/lockedfile), so
// a line is whole or absent. A breaker writes through a Queue, never to
// the file itself: its transition observer runs under its lock, and a full
// or stalled disk must delay the log, never the breaker's answers.
//
// Typical use, wired in through the breaker's transition observer:
//
//	bl, err := breakerlog.Open("breaker.log")
//	if err != nil {
//		return err // the message names the path
//	}
//	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: bl, Logger: logger})
//	defer q.Close(ctx) // writes what is queued, then closes bl
//	b := breaker.New(breaker.Settings{Name: "CORE", OnTransition: q.Observe})
package breakerlog

import (
	"errors"
	"fmt"
	"sync"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/lockedfile"
)

// TimeLayout is the layout of a line's time field. Formatting a UTC time
// with it gives the trailing Z.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// ErrUnloggable is returned (wrapped) by Write for a transition whose line
// could not be read back: a name that is empty or holds '|', a space or a
// control character, or a state that is not CLOSED, OPEN or HALF_OPEN.
// Nothing is written for it, so one bad transition cannot corrupt the file.
var ErrUnloggable = errors.New("breakerlog: transition cannot be logged")

// ErrLocked is returned (wrapped) by Open, New and Reopen when another
// process, in practice another relay, holds the lock on the file.
var ErrLocked = errors.New("breakerlog: locked by another process")

// Config is the configuration of a Log. Its zero value is not usable: Path
// is required.
type Config struct {
	// Path is the file to append to, created with mode 0644 if missing.
	Path string
	// Sync makes Write fsync the file after every line, so a line is on
	// disk, not only with the operating system, when Write returns. The
	// zero value, false, leaves the lines in the operating system's cache
	// until Close: they survive the process being killed, but not a crash
	// of the machine. An fsync costs a disk flush per line.
	Sync bool
}

// Log appends transition lines to one file. It is safe for concurrent use.
type Log struct {
	path string
	sync bool
	file *lockedfile.File

	mu  sync.Mutex
	buf []byte // guarded by mu; reused for every line so Write does not allocate
}

// Open opens path for appending, as New does with only the path set.
func Open(path string) (*Log, error) {
	return New(Config{Path: path})
}

// New opens cfg.Path for appending, creating it with mode 0644 if needed,
// and takes an exclusive lock on it, held until Close (or moved to the new
// file by Reopen). An existing file is kept as it is. When another process
// holds the lock, the error wraps ErrLocked. Files that are not regular
// files, such as /dev/null, are not locked. The error, if any, names the
// path.
func New(cfg Config) (*Log, error) {
	f, err := lockedfile.Open(lockedfile.Config{Path: cfg.Path, Perm: 0o644})
	if err != nil {
		return nil, fmt.Errorf("breaker log %q: %w", cfg.Path, lockedErr(err))
	}
	return &Log{path: cfg.Path, sync: cfg.Sync, file: f, buf: make([]byte, 0, 128)}, nil
}

// lockedErr says that another relay holds the file when err is
// lockedfile's ErrLocked, in the log's own ErrLocked.
func lockedErr(err error) error {
	if errors.Is(err, lockedfile.ErrLocked) {
		return fmt.Errorf("another relay holds it (%w)", ErrLocked)
	}
	return err
}

// Path returns the path the log was opened with.
func (l *Log) Path() string { return l.path }

// Write appends the line for t with exactly one write call. There is no
// buffering in the process: when Write returns nil the line is with the
// operating system and survives the process being killed. It is made
// durable on disk by Close, or by Write itself when Config.Sync is set. A
// write that fails is cut off the file again. Write waits on the disk: a
// breaker's observer queues to a Queue instead.
//
// It returns an error wrapping ErrUnloggable for a transition that would
// make an unreadable line, an error wrapping os.ErrClosed after Close, and
// the write or sync error otherwise; every error names the path.
func (l *Log) Write(t breaker.Transition) error {
	if err := checkTransition(t); err != nil {
		return fmt.Errorf("breaker log %q: %w", l.path, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = AppendLine(l.buf[:0], t)
	if err := l.file.Append(l.buf, l.sync); err != nil {
		return fmt.Errorf("breaker log %q: %w", l.path, err)
	}
	return nil
}

// Reopen opens the log's path anew and moves writing to it, for log
// rotation: once logrotate (or an operator) has renamed the file, lines go
// on into the renamed file until Reopen creates a new one at the path. The
// new file is locked as New locks it; the old one is then synced and closed,
// which releases its lock.
//
// The switch happens under the lock each write takes, so no line is lost
// or split between the two files, and each target's chain goes on from the
// last line of the old file to the first of the new. If the path still
// names the file being written (nothing was renamed), Reopen leaves it as
// it is.
//
// On error the log keeps writing to the file it had: the path cannot be
// opened, or another process holds the new file's lock (wrapping
// ErrLocked). After Close it returns an error wrapping os.ErrClosed. If the
// new file is in place but the old one fails to sync or close, that error
// is returned too. Every error names the path.
func (l *Log) Reopen() error {
	if err := l.file.Reopen(); err != nil {
		return fmt.Errorf("breaker log %q: reopen: %w", l.path, lockedErr(err))
	}
	return nil
}

// Close flushes the file to stable storage and closes it, which releases
// its lock. Writes after Close fail with an error wrapping os.ErrClosed,
// and so does a second Close.
func (l *Log) Close() error {
	if err := l.file.Close(); err != nil {
		return fmt.Errorf("breaker log %q: %w", l.path, err)
	}
	return nil
}

// AppendLine appends the log line for t, newline included, to dst and
// returns the extended slice. It allocates only when dst must grow. It does
// not validate t; Write does.
func AppendLine(dst []byte, t breaker.Transition) []byte {
	dst = t.At.UTC().AppendFormat(dst, TimeLayout)
	dst = append(dst, '|')
	dst = append(dst, t.Name...)
	dst = append(dst, '|')
	dst = append(dst, t.From.String()...)
	dst = append(dst, "->"...)
	dst = append(dst, t.To.String()...)
	return append(dst, '\n')
}

// checkTransition reports why t's line could not be parsed back, if it
// could not.
func checkTransition(t breaker.Transition) error {
	if err := checkName(t.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrUnloggable, err)
	}
	for _, s := range []breaker.State{t.From, t.To} {
		if _, ok := parseState(s.String()); !ok {
			return fmt.Errorf("%w: unknown state %d", ErrUnloggable, s)
		}
	}
	return nil
}

// checkName rejects names that would break the line format or hide in it:
// '|' splits fields, control characters could start a new line, and spaces
// make two different names look alike to a reader.
func checkName(name string) error {
	if name == "" {
		return errors.New("empty target name")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == 0x7f || c == '|' {
			return fmt.Errorf("target name %q contains %q", name, c)
		}
	}
	return nil
}
