package breakerlog_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/lockedfile"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// fakeSink is a Sink that keeps the lines written, and whose writes can
// be held (a stalled disk) or failed (a full one). It is safe for
// concurrent use.
type fakeSink struct {
	mu     sync.Mutex
	lines  []string
	fail   []error       // errors of the next writes, in turn
	gate   chan struct{} // when not nil, each write waits for it to close
	inside chan struct{} // receives once each time a write starts
	closed bool
}

var _ breakerlog.Sink = (*fakeSink)(nil)

func newFakeSink() *fakeSink { return &fakeSink{inside: make(chan struct{}, 1<<16)} }

// hold makes writes wait until the returned func is called.
func (s *fakeSink) hold() (release func()) {
	gate := make(chan struct{})
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
	return sync.OnceFunc(func() { close(gate) })
}

func (s *fakeSink) Write(t breaker.Transition) error {
	s.inside <- struct{}{}
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return os.ErrClosed
	}
	if len(s.fail) > 0 {
		err := s.fail[0]
		s.fail = s.fail[1:]
		return err
	}
	s.lines = append(s.lines, t.Name+"|"+t.From.String()+"->"+t.To.String())
	return nil
}

func (s *fakeSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *fakeSink) written() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

func (s *fakeSink) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// change is the i-th of a breaker's changes CLOSED->OPEN->HALF_OPEN->...,
// a chain whatever i.
func change(name string, i int) breaker.Transition {
	states := []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen}
	from := states[0]
	if i > 0 {
		from = states[1+(i-1)%2]
	}
	return breaker.Transition{Name: name, From: from, To: states[1+i%2], At: at.Add(time.Duration(i) * time.Millisecond)}
}

func lineOf(t breaker.Transition) string {
	return t.Name + "|" + t.From.String() + "->" + t.To.String()
}

// eventually polls cond for a few seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, time.Millisecond, what)
}

// closeQueue closes q within a few seconds, for a test's cleanup.
func closeQueue(q *breakerlog.Queue) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return q.Close(ctx)
}

func TestQueueWritesInOrder(t *testing.T) {
	sink := newFakeSink()
	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink})
	var want []string
	for i := range 200 {
		tr := change([]string{"CORE", "CLAIM"}[i%2], i/2)
		want = append(want, lineOf(tr))
		q.Observe(tr)
	}
	require.NoError(t, closeQueue(q))
	assert.Equal(t, want, sink.written())
	assert.True(t, sink.isClosed(), "Close closes the sink")
	assert.Equal(t, breakerlog.QueueStatus{Written: 200}, q.Status())
}

func TestQueueNeverBlocksTheObserverAndCountsWhatItDrops(t *testing.T) {
	clk := fakeclock.New(at)
	var logs logtest.Buffer
	sink := newFakeSink()
	release := sink.hold()
	t.Cleanup(release)
	const size = 8
	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink, Size: size, Clock: clk, Logger: zerolog.New(&logs)})

	// Given a writer stuck in its first write, as on a frozen disk,
	q.Observe(change("CORE", 0))
	<-sink.inside

	// when more changes come than the queue holds,
	clk.Advance(5 * time.Second)
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		for i := 1; i <= size+3; i++ {
			q.Observe(change("CORE", i))
		}
	}()

	// then Observe returns at once all the same,
	select {
	case <-observed:
	case <-time.After(5 * time.Second):
		t.Fatal("Observe blocked on a stalled write")
	}

	// the lines beyond the queue's size are dropped and counted, the first
	// drop logged once, and the status tells how far behind the log is.
	st := q.Status()
	assert.Equal(t, int64(size+1), st.Pending)
	assert.Equal(t, int64(3), st.Dropped)
	assert.Equal(t, 5*time.Second, st.OldestPending)
	assert.Zero(t, st.Written)
	assert.Equal(t, 1, countMessages(t, &logs, "breaker log queue full or closed; state changes are dropped"))

	// Once the write goes through, the queued lines follow in order.
	release()
	eventually(t, "the queue drains", func() bool { return q.Status().Pending == 0 })
	want := []string{}
	for i := 0; i <= size; i++ {
		want = append(want, lineOf(change("CORE", i)))
	}
	assert.Equal(t, want, sink.written())
	st = q.Status()
	assert.Equal(t, int64(size+1), st.Written)
	assert.Zero(t, st.OldestPending)
	require.NoError(t, closeQueue(q))
	assert.Equal(t, 1, countMessages(t, &logs, "breaker log takes state changes again"))
}

// countMessages counts the log lines with message msg.
func countMessages(t *testing.T, logs *logtest.Buffer, msg string) int {
	n := 0
	for _, l := range logs.Lines(t) {
		if l["message"] == msg {
			n++
		}
	}
	return n
}

func TestQueueWritesAFailedLineAgainInOrder(t *testing.T) {
	var logs logtest.Buffer
	sink := newFakeSink()
	sink.fail = []error{syscall.ENOSPC, syscall.ENOSPC}
	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink, RetryInterval: time.Millisecond, Logger: zerolog.New(&logs)})

	// Given a disk full for the first two writes,
	for i := range 3 {
		q.Observe(change("CORE", i))
	}

	// when it has room again, every line is there once, in order,
	require.NoError(t, closeQueue(q))
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CORE|OPEN->HALF_OPEN", "CORE|HALF_OPEN->OPEN"}, sink.written())

	// and the failures were counted, and logged at the first and at the
	// recovery.
	st := q.Status()
	assert.Equal(t, int64(2), st.WriteErrors)
	assert.Equal(t, int64(3), st.Written)
	assert.Zero(t, st.Dropped)
	assert.Contains(t, st.LastError, "no space left on device")
	assert.Equal(t, 1, countMessages(t, &logs, "breaker log write failed; writing it again until it succeeds"))
	assert.Equal(t, 1, countMessages(t, &logs, "breaker log writes succeed again"))
}

func TestQueueDoesNotWriteAgainWhatCannotBeMended(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("breaker log: %w", breakerlog.ErrUnloggable),
		fmt.Errorf("breaker log: %w (%w)", syscall.ENOSPC, lockedfile.ErrTorn),
	} {
		t.Run(err.Error(), func(t *testing.T) {
			sink := newFakeSink()
			sink.fail = []error{err}
			q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink, RetryInterval: time.Hour})
			q.Observe(change("CORE", 0))
			q.Observe(change("CLAIM", 0))
			require.NoError(t, closeQueue(q))
			assert.Equal(t, []string{"CLAIM|CLOSED->OPEN"}, sink.written())
			st := q.Status()
			assert.Equal(t, int64(1), st.Dropped)
			assert.Equal(t, int64(1), st.WriteErrors)
		})
	}
}

func TestQueueCloseDrainsWithinItsDeadline(t *testing.T) {
	t.Run("in time", func(t *testing.T) {
		// Given lines queued behind a slow write,
		sink := newFakeSink()
		release := sink.hold()
		q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink})
		for i := range 5 {
			q.Observe(change("CORE", i))
		}
		<-sink.inside

		// when Close is called and the write then goes through,
		closed := make(chan error, 1)
		go func() { closed <- closeQueue(q) }()
		release()

		// then Close writes them all before it closes the sink,
		require.NoError(t, <-closed)
		assert.Len(t, sink.written(), 5)
		assert.True(t, sink.isClosed())

		// and a change after Close is dropped and counted.
		q.Observe(change("CORE", 5))
		assert.Equal(t, int64(1), q.Status().Dropped)
		assert.ErrorIs(t, closeQueue(q), os.ErrClosed)
	})
	t.Run("past it", func(t *testing.T) {
		// Given a write that never ends, as on a frozen disk,
		sink := newFakeSink()
		release := sink.hold()
		q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: sink})
		for i := range 3 {
			q.Observe(change("CORE", i))
		}
		<-sink.inside

		// when Close's deadline passes,
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		err := q.Close(ctx)

		// then Close returns, saying how many lines were not written,
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "3 state changes not written")

		// and once the stuck write returns, the writer writes that one,
		// drops the rest, counted, and closes the sink.
		release()
		eventually(t, "the writer closes the sink", sink.isClosed)
		assert.Len(t, sink.written(), 1)
		eventually(t, "the rest are dropped", func() bool { return q.Status().Dropped == 2 })
	})
}

// TestQueueOnARealLogUnderConcurrentBreakers runs real breakers on many
// goroutines into a Queue on a real file: the file parses and chains.
func TestQueueOnARealLogUnderConcurrentBreakers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "breaker.log")
	bl, err := breakerlog.Open(path)
	require.NoError(t, err)
	q := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: bl})
	clk := fakeclock.New(at)
	var wg sync.WaitGroup
	for w := range 8 {
		b := breaker.New(breaker.Settings{Name: fmt.Sprintf("T%d", w), Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Nanosecond}, Clock: clk, OnTransition: q.Observe})
		wg.Go(func() {
			for range 100 {
				if tk, _, err := b.Allow(); err == nil {
					b.Done(tk, true, 0)
				}
				clk.Advance(time.Microsecond)
			}
		})
	}
	wg.Wait()
	require.NoError(t, closeQueue(q))
	entries, fragments, err := breakerlog.ReadFile(path)
	require.NoError(t, err)
	assert.Empty(t, fragments)
	require.NoError(t, breakerlog.CheckChains(entries))
	assert.Equal(t, q.Status().Written, int64(len(entries)))
	assert.NotEmpty(t, entries)
}
