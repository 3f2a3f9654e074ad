// Package indoubt keeps the record of the calls in doubt: transactions
// whose request may have reached their target while the hub never learnt
// the outcome (a timeout after the request was written, a connection
// closed mid-answer, an answer that is not the target protocol). Such a
// transfer may have been booked although the client got E901; the record
// is what reconciliation starts from.
//
// A Journal appends each in-doubt call, and each later resolution of one
// (Stage StageResolvedApplied), as one JSON line to a file
// (docs/PROTOCOL.md, "In-doubt journal") and returns only once the line is
// on disk: one writer goroutine writes and fsyncs the lines of concurrent
// callers together (group commit), so a burst of in-doubt calls costs one
// fsync per batch, not one per call. The file is held under an exclusive
// lock, so a second hub started on it refuses to start (ErrLocked), and
// Reopen moves writing to a new file at the path once logrotate has renamed
// the old one, each line whole in exactly one of the two. A Ring keeps the
// most recent entries in memory for the admin port.
//
// Typical use:
//
//	j, err := indoubt.Open(indoubt.Config{Path: "in-doubt.log", Logger: logger})
//	if err != nil {
//		return err
//	}
//	defer j.Close()
//	...
//	e := indoubt.Entry{Time: time.Now(), Hub: "hub-a", TxID: "T1", Target: "CORE", ...}
//	if err := j.Append(&e); err != nil {
//		// logged and counted; the client still gets its answer
//	}
package indoubt

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/internal/lockedfile"
)

// TimeFormat is the layout of an entry's time: RFC 3339 in UTC with
// milliseconds, as the hub's other logs write it.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// Stages of a resolution: an entry that settles a transaction in doubt
// rather than records one. The journal keeps the resolution so that
// neither reconciliation nor a restarted hub need ask again.
const (
	// StageResolvedApplied: the target said it had applied the
	// transaction; Code is the code it recorded.
	StageResolvedApplied = "resolved_applied"
	// StageResolvedNotApplied: the target said it never applied it; a
	// resend is a fresh call.
	StageResolvedNotApplied = "resolved_not_applied"
	// StageResolvedReversed: the target undid it (or had nothing to undo)
	// on a reversal; a resend must use a new TXID.
	StageResolvedReversed = "resolved_reversed"
	// StageUnresolvedExpired: the hub gave up asking; an operator must
	// settle it.
	StageUnresolvedExpired = "unresolved_expired"
)

// Ways a resolution was learnt, the Via of a resolution entry.
const (
	// ViaResend: the client resent the TXID and the hub asked the target.
	ViaResend = "resend"
	// ViaLookup: the hub's resolver asked the target's status_url.
	ViaLookup = "lookup"
	// ViaLateAnswer: the target's answer arrived after the target timeout.
	ViaLateAnswer = "late_answer"
	// ViaReversal: the hub's resolver reversed the transaction, or gave up
	// reversing it.
	ViaReversal = "reversal"
	// ViaOperator: an operator settled it (relayctl in-doubt resolve).
	ViaOperator = "operator"
)

// IsResolution reports whether stage is that of a resolution line rather
// than of a call in doubt.
func IsResolution(stage string) bool {
	switch stage {
	case StageResolvedApplied, StageResolvedNotApplied, StageResolvedReversed, StageUnresolvedExpired:
		return true
	}
	return false
}

// Entry is one call in doubt, or, with a resolution Stage (IsResolution),
// the resolution of one. It is a plain value.
type Entry struct {
	// Time is when the outcome became unknown: when the call ended. For a
	// resolution, when the hub learnt the target had applied it.
	Time time.Time
	// Hub names the hub that made the call, or that resolved it.
	Hub string
	// TxID is the transaction's id, as the client sent it.
	TxID string
	// Target is the canonical name of the target called, and URL its base
	// URL as configured.
	Target string
	URL    string
	// Code is the code the client got: E901, E902 or E500. For a
	// resolution, the code the target recorded for the transaction (0000,
	// Bnnn, ...), which the client was answered on its resend.
	Code string
	// Stage says how far the call got: "request_partly_sent",
	// "request_sent" or "answer_partly_read"; or a resolution stage.
	Stage string
	// Via says how a resolution was learnt, one of the Via constants;
	// written on resolution lines only. Empty on a StageResolvedApplied
	// line means ViaResend, the only way such lines were once written.
	Via string
	// BytesSent is how many request bytes were written to the target's
	// connection; 0 for a resolution, which sends no request.
	BytesSent int
	// PayloadSHA256 is the SHA-256 of the payload: the payload itself
	// (an account, an amount) is never kept.
	PayloadSHA256 [sha256.Size]byte
}

// AppendJSON appends e to dst as one JSON object, the form of a journal
// line (without its newline), and returns the extended buffer.
func (e *Entry) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"time":"`...)
	dst = e.Time.UTC().AppendFormat(dst, TimeFormat)
	dst = append(dst, `","hub":`...)
	dst = appendString(dst, e.Hub)
	dst = append(dst, `,"txid":`...)
	dst = appendString(dst, e.TxID)
	dst = append(dst, `,"target":`...)
	dst = appendString(dst, e.Target)
	dst = append(dst, `,"url":`...)
	dst = appendString(dst, e.URL)
	dst = append(dst, `,"code":`...)
	dst = appendString(dst, e.Code)
	dst = append(dst, `,"stage":`...)
	dst = appendString(dst, e.Stage)
	dst = append(dst, `,"bytes_sent":`...)
	dst = strconv.AppendInt(dst, int64(e.BytesSent), 10)
	dst = append(dst, `,"payload_sha256":"`...)
	dst = hex.AppendEncode(dst, e.PayloadSHA256[:])
	if !IsResolution(e.Stage) {
		return append(dst, `"}`...)
	}
	via := e.Via
	if via == "" && e.Stage == StageResolvedApplied {
		via = ViaResend
	}
	dst = append(dst, `","via":`...)
	dst = appendString(dst, via)
	return append(dst, '}')
}

// appendString appends s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 replaced by U+FFFD.
func appendString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}

// Errors of Append.
var (
	// ErrClosed is returned by Append after Close.
	ErrClosed = errors.New("indoubt: journal closed")
	// ErrQueueFull is returned by Append when the writer's queue is full:
	// the line is not written.
	ErrQueueFull = errors.New("indoubt: journal queue full")
	// ErrWaitTimeout is returned by Append when the line was not on disk
	// within Config.WaitTimeout; it may still be written later.
	ErrWaitTimeout = errors.New("indoubt: journal write not done in time")
)

// ErrLocked is returned (wrapped) by Open and Reopen when another process,
// in practice another hub, holds the lock on the journal file.
var ErrLocked = errors.New("indoubt: locked by another process")

// Defaults applied by Open to zero Config fields.
const (
	DefaultQueueSize   = 4096
	DefaultWaitTimeout = 2 * time.Second
	// maxBatch bounds the lines one write and fsync carry.
	maxBatch = 512
)

// Config configures Open. It is a plain value.
type Config struct {
	// Path is the journal file, created if missing (mode 0640) and
	// appended to, never truncated; locked while the Journal has it open.
	// Required.
	Path string
	// QueueSize is how many lines may wait for the writer; Append refuses
	// a line that finds the queue full (ErrQueueFull) rather than wait.
	// Zero means DefaultQueueSize.
	QueueSize int
	// WaitTimeout bounds how long Append waits for its line to be written
	// and fsynced, so that a stalled disk cannot hold answers back for
	// ever. Zero means DefaultWaitTimeout.
	WaitTimeout time.Duration
	// Logger receives write and fsync failures. The zero Logger logs
	// nothing.
	Logger zerolog.Logger
}

// Journal is the in-doubt journal file and its writer goroutine. It is safe
// for concurrent use.
type Journal struct {
	path        string
	file        *lockedfile.File
	sync        func(*os.File) error // (*os.File).Sync; a test's in its place
	syncs       atomic.Int64         // fsyncs done: one per batch, and one per Reopen
	waitTimeout time.Duration
	log         zerolog.Logger
	done        chan struct{} // closed when the writer goroutine has ended

	mu     sync.RWMutex // held for reading to queue, for writing to close queue
	closed bool         // guarded by mu
	queue  chan *pending
}

// pending is one line on its way to the file, and where its writer
// reports the outcome: done receives one error (nil once fsynced). wait is
// the caller's timer, kept with it so that a pooled pending allocates none.
type pending struct {
	line []byte
	done chan error
	wait *time.Timer
}

var pendingPool = sync.Pool{New: func() any { return &pending{done: make(chan error, 1)} }}

// Open opens (or creates) the journal at cfg.Path, takes an exclusive lock
// on it, and starts its writer. It fails when the file cannot be opened
// for appending, or when another process holds its lock (wrapping
// ErrLocked); the error names the path. Files that are not regular files,
// such as /dev/null, are not locked.
func Open(cfg Config) (*Journal, error) {
	if cfg.Path == "" {
		return nil, errors.New("indoubt: Config.Path is required")
	}
	if cfg.QueueSize < 0 || cfg.WaitTimeout < 0 {
		return nil, errors.New("indoubt: QueueSize and WaitTimeout must not be negative")
	}
	queueSize := cfg.QueueSize
	if queueSize == 0 {
		queueSize = DefaultQueueSize
	}
	j := &Journal{
		path:        cfg.Path,
		sync:        (*os.File).Sync,
		waitTimeout: cfg.WaitTimeout,
		log:         cfg.Logger.With().Str("component", "in_doubt_log").Str("path", cfg.Path).Logger(),
		done:        make(chan struct{}),
		queue:       make(chan *pending, queueSize),
	}
	if j.waitTimeout == 0 {
		j.waitTimeout = DefaultWaitTimeout
	}
	// Mode 0640: the journal holds transaction ids, for the hub's group
	// (its operators) to read, no one else.
	f, err := lockedfile.Open(lockedfile.Config{Path: cfg.Path, Perm: 0o640, Sync: j.syncFile})
	if err != nil {
		return nil, fmt.Errorf("in-doubt journal %q: %w", cfg.Path, lockedErr(err))
	}
	j.file = f
	go j.write()
	return j, nil
}

// Path returns the journal's file name.
func (j *Journal) Path() string { return j.path }

// Append writes e as one line and returns once the line is written and
// fsynced, or with the error that kept it from being so: the write's or
// the fsync's, ErrQueueFull, ErrWaitTimeout or ErrClosed. Lines of
// concurrent callers share one write and one fsync.
func (j *Journal) Append(e *Entry) error {
	p := pendingPool.Get().(*pending)
	p.line = append(e.AppendJSON(p.line[:0]), '\n')
	if err := j.enqueue(p); err != nil {
		pendingPool.Put(p)
		return err
	}
	if p.wait == nil {
		p.wait = time.NewTimer(j.waitTimeout)
	} else {
		// Stopped, and since Go 1.23 a stopped timer's channel holds no
		// stale tick.
		p.wait.Reset(j.waitTimeout)
	}
	select {
	case err := <-p.done:
		p.wait.Stop()
		pendingPool.Put(p)
		return err
	case <-p.wait.C:
		// The writer still holds p and will report on done: p is left to
		// it, not put back in the pool.
		return ErrWaitTimeout
	}
}

// enqueue hands p to the writer without waiting.
func (j *Journal) enqueue(p *pending) error {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.closed {
		return ErrClosed
	}
	select {
	case j.queue <- p:
		return nil
	default:
		return ErrQueueFull
	}
}

// write is the writer goroutine: it takes the lines queued, as many as are
// waiting (up to maxBatch), writes them in one write, fsyncs once, and
// reports the outcome to each caller, until Close closes the queue.
func (j *Journal) write() {
	defer close(j.done)
	batch := make([]*pending, 0, maxBatch)
	var buf []byte
	for p := range j.queue {
		batch = append(batch[:0], p)
	fill:
		for len(batch) < maxBatch {
			select {
			case p, ok := <-j.queue:
				if !ok {
					break fill
				}
				batch = append(batch, p)
			default:
				break fill
			}
		}
		buf = buf[:0]
		for _, p := range batch {
			buf = append(buf, p.line...)
		}
		err := j.writeBatch(buf)
		if err != nil {
			j.log.Error().Err(err).Int("lines", len(batch)).Msg("in-doubt journal write failed")
		}
		for _, p := range batch {
			p.done <- err
		}
		clear(batch)
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
}

// syncFile fsyncs f, counting it.
func (j *Journal) syncFile(f *os.File) error {
	j.syncs.Add(1)
	return j.sync(f)
}

// writeBatch writes buf, a batch of whole lines, with one write and
// fsyncs it, so that a Reopen cannot split the batch between two files
// nor close a file before its lines are on disk.
func (j *Journal) writeBatch(buf []byte) error {
	return j.file.Append(buf, true)
}

// Reopen opens the journal's path anew and moves writing there, for log
// rotation: once logrotate (or an operator) has renamed the file, lines go
// on into the renamed file until Reopen creates a new one (mode 0640) at
// the path. The new file is locked as Open locks it; the old one is then
// closed, which releases its lock. If the path still names the file being
// written (nothing was renamed), Reopen leaves it as it is.
//
// The switch happens between two batches: every line is whole in exactly
// one of the two files, and every line written to the old one was fsynced
// before its caller returned.
//
// On error the journal keeps writing to the file it had: the path cannot
// be opened, or another process holds the new file's lock (wrapping
// ErrLocked). After Close it returns an error wrapping os.ErrClosed. Every
// error names the path.
func (j *Journal) Reopen() error {
	if err := j.file.Reopen(); err != nil {
		return fmt.Errorf("in-doubt journal %q: reopen: %w", j.path, lockedErr(err))
	}
	return nil
}

// lockedErr says that another hub holds the file when err is lockedfile's
// ErrLocked, in the journal's own ErrLocked.
func lockedErr(err error) error {
	if errors.Is(err, lockedfile.ErrLocked) {
		return fmt.Errorf("another relay holds it (%w)", ErrLocked)
	}
	return err
}

// Close writes the lines queued, fsyncs, stops the writer and closes the
// file, which releases its lock. Append afterwards returns ErrClosed.
// Close is idempotent.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		<-j.done
		return nil
	}
	j.closed = true
	close(j.queue)
	j.mu.Unlock()
	<-j.done
	return j.file.Close()
}

// Ring keeps the most recent entries in memory, the oldest overwritten
// first. It is safe for concurrent use.
type Ring struct {
	mu      sync.Mutex
	entries []Entry // guarded by mu; a circle of len(entries) once full
	next    int     // guarded by mu: where the next entry goes
	full    bool    // guarded by mu
}

// DefaultRingSize is how many entries a Ring of size zero keeps.
const DefaultRingSize = 1000

// NewRing returns a Ring keeping the last size entries; zero means
// DefaultRingSize.
func NewRing(size int) *Ring {
	if size <= 0 {
		size = DefaultRingSize
	}
	return &Ring{entries: make([]Entry, size)}
}

// Add keeps e, dropping the oldest entry when the ring is full.
func (r *Ring) Add(e Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entries[r.next] = e
	r.next++
	if r.next == len(r.entries) {
		r.next, r.full = 0, true
	}
}

// Since returns the entries kept whose Time is not before since, oldest
// first. A zero since returns them all.
func (r *Ring) Since(since time.Time) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Entry
	add := func(es []Entry) {
		for _, e := range es {
			if !e.Time.Before(since) {
				out = append(out, e)
			}
		}
	}
	if r.full {
		add(r.entries[r.next:])
	}
	add(r.entries[:r.next])
	return out
}
