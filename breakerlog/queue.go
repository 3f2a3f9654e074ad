package breakerlog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/lockedfile"
)

// Defaults applied by NewQueue to zero QueueConfig fields.
const (
	// DefaultQueueSize bounds the lines waiting: hours of a flapping
	// target's changes, a few hundred kilobytes.
	DefaultQueueSize = 4096
	// DefaultRetryInterval is how long a line whose write failed waits
	// before it is written again.
	DefaultRetryInterval = time.Second
)

// Sink is what a Queue writes lines to and closes: a *Log, or a test's
// own. Write returns an error wrapping os.ErrClosed after Close.
type Sink interface {
	Write(t breaker.Transition) error
	Close() error
}

var _ Sink = (*Log)(nil)

// QueueConfig configures NewQueue. It is a plain value.
type QueueConfig struct {
	// Sink is the log the lines go to; the Queue owns it from NewQueue on
	// and closes it in Close. Required.
	Sink Sink
	// Size is how many lines may wait for the writer; a change that finds
	// them all taken is dropped and counted. Zero means DefaultQueueSize.
	Size int
	// RetryInterval is how long a line whose write failed waits before it
	// is written again. Zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// Clock stamps a line when it is queued, for QueueStatus's
	// OldestPending. Nil means the system clock.
	Clock breaker.Clock
	// Logger receives write failures and recoveries, and dropped lines.
	// The zero Logger logs nothing.
	Logger zerolog.Logger
}

// QueueStatus is what a Queue has done and has waiting. It is a plain
// value.
type QueueStatus struct {
	// Pending is how many lines are queued or being written.
	Pending int64
	// OldestPending is how long the oldest of them has waited; zero when
	// none waits.
	OldestPending time.Duration
	// Written counts the lines written; Dropped those that never will be:
	// the queue was full, the Queue closed, Close's deadline passed, or a
	// write failed in a way writing again cannot mend (a line that cannot
	// be logged, one left torn in the file).
	Written, Dropped int64
	// WriteErrors counts failed writes, each retry's included.
	WriteErrors int64
	// LastError is the last write error, and LastErrorAt when it came;
	// empty and zero while there has been none.
	LastError   string
	LastErrorAt time.Time
}

// Queue writes breaker transitions to a Sink from a goroutine of its own,
// so that the breaker whose change it is never waits on the disk: Observe,
// the breaker's transition observer, only puts the change in order on a
// bounded queue. A write that fails is tried again every RetryInterval
// until it succeeds, the lines behind it waiting their turn, so the lines
// keep the order the changes happened in and each target's chain holds
// across a full or stalled disk; while the queue is full, further changes
// are dropped and counted. It is safe for concurrent use.
//
// Typical use, as the breakers' transition observer:
//
//	bl, err := breakerlog.Open("breaker.log")
//	if err != nil {
//		return err
//	}
//	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: bl, Logger: logger})
//	defer func() {
//		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
//		defer cancel()
//		_ = q.Close(ctx) // writes what is queued, then closes bl
//	}()
//	b := breaker.New(breaker.Settings{Name: "CORE", OnTransition: q.Observe})
type Queue struct {
	sink  Sink
	retry time.Duration
	clock breaker.Clock
	log   zerolog.Logger

	done    chan struct{} // closed when the writer has ended
	abandon chan struct{} // closed when Close's deadline passed
	// closeErr is the Sink's Close error, set by the writer before done.
	closeErr error

	mu     sync.Mutex    // held to queue, and to close the queue
	closed bool          // guarded by mu
	queue  chan queued   // closed by Close, under mu
	drops  atomic.Bool   // a run of dropped lines is under way; its first was logged
	headAt atomic.Int64  // when the line being written was queued (UnixNano); 0 while none
	lastMu sync.Mutex    // guards lastErr, lastAt
	counts queueCounters // atomics

	lastErr string    // guarded by lastMu
	lastAt  time.Time // guarded by lastMu
}

// queueCounters are a Queue's counts, each an atomic.
type queueCounters struct {
	pending, written, dropped, errors atomic.Int64
}

// queued is one change waiting, and when it was queued. A plain value.
type queued struct {
	t  breaker.Transition
	at time.Time
}

// NewQueue starts a Queue writing to cfg.Sink.
func NewQueue(cfg QueueConfig) *Queue {
	size := cfg.Size
	if size <= 0 {
		size = DefaultQueueSize
	}
	q := &Queue{
		sink:    cfg.Sink,
		retry:   cfg.RetryInterval,
		clock:   cfg.Clock,
		log:     cfg.Logger.With().Str("component", "breaker_log").Logger(),
		done:    make(chan struct{}),
		abandon: make(chan struct{}),
		queue:   make(chan queued, size),
	}
	if q.retry <= 0 {
		q.retry = DefaultRetryInterval
	}
	if q.clock == nil {
		q.clock = systemClock{}
	}
	go q.writeLoop()
	return q
}

// systemClock reads time.Now.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Observe queues t's line without waiting, in the order Observe is
// called; the breaker calls it under its lock, which keeps a target's
// changes in order. When the queue is full, or after Close, the line is
// dropped and counted, and the first of a run of drops is logged.
func (q *Queue) Observe(t breaker.Transition) {
	at := q.clock.Now()
	q.mu.Lock()
	ok := false
	if !q.closed {
		select {
		case q.queue <- queued{t: t, at: at}:
			ok = true
			q.counts.pending.Add(1)
		default:
		}
	}
	q.mu.Unlock()
	if !ok {
		q.drop(t, "breaker log queue full or closed; state changes are dropped")
	}
}

// drop counts a line that will never be written, and logs it when it
// starts a run of such lines.
func (q *Queue) drop(t breaker.Transition, msg string) {
	q.counts.dropped.Add(1)
	if q.drops.CompareAndSwap(false, true) {
		q.log.Error().Str("target", t.Name).Str("from", t.From.String()).Str("to", t.To.String()).Msg(msg)
	}
}

// writeLoop is the Queue's writer: it writes each line queued, in order,
// until Close closes the queue, then closes the Sink.
func (q *Queue) writeLoop() {
	defer close(q.done)
	for item := range q.queue {
		q.headAt.Store(item.at.UnixNano())
		q.write(item.t)
		q.headAt.Store(0)
		q.counts.pending.Add(-1)
	}
	q.closeErr = q.sink.Close()
}

// write writes one line, again every retry interval while it fails, until
// it is written, cannot be, or Close's deadline has passed.
func (q *Queue) write(t breaker.Transition) {
	failures := 0
	for {
		select {
		case <-q.abandon:
			q.drop(t, "breaker log closed before a state change was written")
			return
		default:
		}
		err := q.sink.Write(t)
		if err == nil {
			q.counts.written.Add(1)
			if failures > 0 {
				q.log.Info().Int("failures", failures).Msg("breaker log writes succeed again")
			}
			if q.drops.Swap(false) {
				q.log.Info().Int64("dropped_total", q.counts.dropped.Load()).Msg("breaker log takes state changes again")
			}
			return
		}
		failures++
		q.counts.errors.Add(1)
		q.lastMu.Lock()
		q.lastErr, q.lastAt = err.Error(), q.clock.Now()
		q.lastMu.Unlock()
		if errors.Is(err, ErrUnloggable) || errors.Is(err, lockedfile.ErrTorn) || errors.Is(err, os.ErrClosed) {
			// Writing again would not help, or (torn) could write the
			// line twice: the reader skips what is left of it.
			q.log.Error().Err(err).Str("target", t.Name).Msg("breaker log write failed; the state change is not logged")
			q.drop(t, "breaker log lost a state change")
			return
		}
		if failures == 1 {
			q.log.Error().Err(err).Str("target", t.Name).Stringer("retry_every", q.retry).
				Msg("breaker log write failed; writing it again until it succeeds")
		}
		timer := time.NewTimer(q.retry)
		select {
		case <-timer.C:
		case <-q.abandon:
			timer.Stop()
		}
	}
}

// Status returns what q has done and has waiting.
func (q *Queue) Status() QueueStatus {
	st := QueueStatus{
		Pending:     q.counts.pending.Load(),
		Written:     q.counts.written.Load(),
		Dropped:     q.counts.dropped.Load(),
		WriteErrors: q.counts.errors.Load(),
	}
	if at := q.headAt.Load(); at != 0 && st.Pending > 0 {
		st.OldestPending = max(q.clock.Now().Sub(time.Unix(0, at)), 0)
	}
	q.lastMu.Lock()
	st.LastError, st.LastErrorAt = q.lastErr, q.lastAt
	q.lastMu.Unlock()
	return st
}

// Close stops taking lines, writes those queued and closes the Sink,
// waiting until ctx is done at most, so that a stalled disk cannot hold
// a stopping hub for ever. It returns the Sink's Close error; when ctx is
// done first, an error that says how many lines were not written and
// wraps ctx's error: those lines are dropped, and the writer, maybe still
// stuck in a write, ends once that write returns, without waiting on. A
// second Close returns an error wrapping os.ErrClosed.
func (q *Queue) Close(ctx context.Context) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return fmt.Errorf("breaker log queue: %w", os.ErrClosed)
	}
	q.closed = true
	close(q.queue)
	q.mu.Unlock()
	select {
	case <-q.done:
		return q.closeErr
	case <-ctx.Done():
		n := q.counts.pending.Load()
		close(q.abandon)
		return fmt.Errorf("breaker log: %d state changes not written: %w", n, ctx.Err())
	}
}
