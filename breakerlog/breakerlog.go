// Package breakerlog writes and reads the breaker log: one line per breaker
// state change, in the form
//
//	2026-11-30T05:31:19.123Z|CORE|CLOSED->OPEN
//
// The time is the breaker clock's time of the change in UTC, RFC 3339 with
// exactly three digits of milliseconds (truncated, not rounded). Each line is
// issued to the operating system in a single write under a lock, so lines
// from many goroutines never interleave and a line is in the file as soon as
// Write returns, even if the process is then killed. The file is opened for
// appending and never truncated.
//
// The reading side (ParseLine, Read, ReadFile, CheckChains) is strict, so
// that tests and operators can hold a log file to the format and to the
// chain property: per target, the first change starts from CLOSED and each
// change starts where the previous one ended.
//
// Typical use, wired in through the breaker's transition observer:
//
//	bl, err := breakerlog.Open("breaker.log")
//	if err != nil {
//		return err // the message names the path
//	}
//	defer bl.Close()
//	b := breaker.New(breaker.Settings{
//		Name: "CORE",
//		OnTransition: func(t breaker.Transition) {
//			if err := bl.Write(t); err != nil {
//				logger.Error().Err(err).Msg("breaker log write failed")
//			}
//		},
//	})
package breakerlog

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/relayhub/relayhub/breaker"
)

// TimeLayout is the layout of a line's time field. Formatting a UTC time
// with it gives the trailing Z.
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// ErrUnloggable is returned (wrapped) by Write for a transition whose line
// could not be read back: a name that is empty or holds '|', a space or a
// control character, or a state that is not CLOSED, OPEN or HALF_OPEN.
// Nothing is written for it, so one bad transition cannot corrupt the file.
var ErrUnloggable = errors.New("breakerlog: transition cannot be logged")

// Log appends transition lines to one file. It is safe for concurrent use.
type Log struct {
	path string

	mu     sync.Mutex
	f      *os.File // guarded by mu
	buf    []byte   // guarded by mu; reused for every line so Write does not allocate
	closed bool     // guarded by mu
}

// Open opens path for appending, creating it with mode 0644 if needed. An
// existing file is kept as it is. The error, if any, names the path.
func Open(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("breaker log %q: %w", path, err)
	}
	return &Log{path: path, f: f, buf: make([]byte, 0, 128)}, nil
}

// Path returns the path the log was opened with.
func (l *Log) Path() string { return l.path }

// Write appends the line for t with exactly one write call. There is no
// buffering in the process: when Write returns nil the line is with the
// operating system and survives the process being killed (it is made
// durable on disk by Close, not by every Write, because an fsync per state
// change would stall the breaker that calls Write under its lock).
//
// It returns an error wrapping ErrUnloggable for a transition that would
// make an unreadable line, an error wrapping os.ErrClosed after Close, and
// the write error otherwise; every error names the path.
func (l *Log) Write(t breaker.Transition) error {
	if err := checkTransition(t); err != nil {
		return fmt.Errorf("breaker log %q: %w", l.path, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("breaker log %q: write: %w", l.path, os.ErrClosed)
	}
	l.buf = AppendLine(l.buf[:0], t)
	// os.File.Write keeps writing after a short write, and O_APPEND makes
	// each write(2) land at the end of the file even if another process
	// appends to it too.
	if _, err := l.f.Write(l.buf); err != nil {
		return fmt.Errorf("breaker log %q: %w", l.path, err)
	}
	return nil
}

// Close flushes the file to stable storage and closes it. Writes after Close
// fail with an error wrapping os.ErrClosed, and so does a second Close.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("breaker log %q: close: %w", l.path, os.ErrClosed)
	}
	l.closed = true
	syncErr := l.f.Sync()
	closeErr := l.f.Close()
	if err := errors.Join(syncErr, closeErr); err != nil {
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
