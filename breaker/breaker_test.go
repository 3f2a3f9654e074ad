package breaker_test

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

var start = time.Date(2026, 11, 30, 5, 31, 19, 123_000_000, time.UTC)

// recorder collects transitions. It is safe for concurrent use because the
// breaker may call it from any goroutine.
type recorder struct {
	mu          sync.Mutex
	transitions []breaker.Transition
}

func (r *recorder) observe(t breaker.Transition) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.transitions = append(r.transitions, t)
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.transitions)
}

func (r *recorder) list() []breaker.Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]breaker.Transition(nil), r.transitions...)
}

func (r *recorder) chain() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.transitions))
	for _, t := range r.transitions {
		out = append(out, t.From.String()+"->"+t.To.String())
	}
	return out
}

func newBreaker(t *testing.T, threshold int, reset time.Duration) (*breaker.Breaker, *fakeclock.Clock, *recorder) {
	t.Helper()
	clk := fakeclock.New(start)
	rec := &recorder{}
	b := breaker.New(breaker.Settings{
		Name: "CORE",
		Policy: breaker.Policy{
			FailThreshold: threshold,
			ResetTimeout:  reset,
		},

		Clock:        clk,
		OnTransition: rec.observe,
	})
	return b, clk, rec
}

func call(t *testing.T, b *breaker.Breaker, failed bool) {
	t.Helper()
	tk, _, err := b.Allow()
	require.NoError(t, err)
	b.Done(tk, failed, 0)
}

func trip(t *testing.T, b *breaker.Breaker, threshold int) {
	t.Helper()
	for range threshold {
		call(t, b, true)
	}
	require.Equal(t, breaker.Open, b.Snapshot().State)
}

func TestStateString(t *testing.T) {
	assert.Equal(t, "CLOSED", breaker.Closed.String())
	assert.Equal(t, "OPEN", breaker.Open.String())
	assert.Equal(t, "HALF_OPEN", breaker.HalfOpen.String())
	assert.Equal(t, "UNKNOWN", breaker.State(7).String())
}

func TestDefaults(t *testing.T) {
	// Given a breaker built from zero settings on a fake clock
	clk := fakeclock.New(start)
	b := breaker.New(breaker.Settings{Clock: clk})

	// When four calls fail, it stays closed; the fifth opens it
	for range 4 {
		call(t, b, true)
	}
	assert.Equal(t, breaker.Closed, b.Snapshot().State)
	call(t, b, true)
	assert.Equal(t, breaker.Open, b.Snapshot().State)

	// Then it refuses for ten seconds and admits a probe after that
	clk.Advance(10*time.Second - time.Millisecond)
	_, _, err := b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
	clk.Advance(time.Millisecond)
	tk, _, err := b.Allow()
	require.NoError(t, err)
	assert.True(t, tk.Probe())
}

func TestTransitions(t *testing.T) {
	t.Run("closed opens at the threshold and not before", func(t *testing.T) {
		b, _, rec := newBreaker(t, 3, time.Second)
		call(t, b, true)
		call(t, b, true)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 2}, b.Snapshot())
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("a success resets the consecutive count", func(t *testing.T) {
		b, _, rec := newBreaker(t, 3, time.Second)
		call(t, b, true)
		call(t, b, true)
		call(t, b, false)
		assert.Equal(t, 0, b.Snapshot().ConsecutiveFailures)
		call(t, b, true)
		call(t, b, true)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		assert.Empty(t, rec.chain())
	})

	t.Run("threshold one opens on the first failure", func(t *testing.T) {
		b, _, rec := newBreaker(t, 1, time.Second)
		call(t, b, false)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("open refuses until the reset timeout", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 1, 7*time.Second)
		trip(t, b, 1)
		clk.Advance(2 * time.Second)
		_, _, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, 5*time.Second, b.RetryAfter())
	})

	t.Run("a successful probe closes with count zero", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 2, time.Second)
		trip(t, b, 2)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		require.True(t, probe.Probe())
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		b.Done(probe, false, 0)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
	})

	t.Run("a failed probe reopens and restarts the timeout", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 2, 10*time.Second)
		trip(t, b, 2)
		clk.Advance(15 * time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		clk.Advance(2 * time.Second)
		b.Done(probe, true, 0)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, 10*time.Second, b.RetryAfter(), "the timeout counts from the failed probe")
		clk.Advance(9 * time.Second)
		_, _, err = b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
	})

	t.Run("half-open refuses everything but the probe", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		clk.Advance(time.Second)
		_, _, err := b.Allow()
		require.NoError(t, err)
		for range 5 {
			_, _, err := b.Allow()
			assert.ErrorIs(t, err, breaker.ErrOpen)
		}
		assert.Zero(t, b.RetryAfter())
	})

	t.Run("transitions carry the name, the clock's time, the cause and the open period", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 1, time.Second)
		clk.Advance(time.Minute)
		trip(t, b, 1)
		require.Len(t, rec.transitions, 1)
		assert.Equal(t, breaker.Transition{
			Name: "CORE", From: breaker.Closed, To: breaker.Open, At: start.Add(time.Minute),
			Cause: breaker.CauseResults, OpenFor: time.Second, Period: time.Second,
		}, rec.transitions[0])
	})
}

func TestStaleResults(t *testing.T) {
	t.Run("a failure admitted before the trip does not decide the probe", func(t *testing.T) {
		// Given a call admitted while closed, and a trip by other calls
		b, clk, _ := newBreaker(t, 2, time.Second)
		slow, _, err := b.Allow()
		require.NoError(t, err)
		trip(t, b, 2)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)

		// When the old call reports a failure during half-open
		b.Done(slow, true, 0)

		// Then the breaker still waits for its probe
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		b.Done(probe, false, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
	})

	t.Run("a success admitted before the trip does not close it", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 2, time.Second)
		slow, _, err := b.Allow()
		require.NoError(t, err)
		trip(t, b, 2)
		b.Done(slow, false, 0)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		b.Done(slow, false, 0)
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		b.Done(probe, true, 0)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})

	t.Run("a failure from before the last close does not count", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 1, time.Second)
		old, _, err := b.Allow()
		require.NoError(t, err)
		trip(t, b, 1)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		b.Done(probe, false, 0)
		b.Done(old, true, 0)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
	})

	t.Run("a probe reported twice decides once", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		b.Done(probe, false, 0)
		b.Done(probe, true, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		assert.Len(t, rec.chain(), 3)
	})
}

func TestCancel(t *testing.T) {
	t.Run("a handed-back probe frees the slot", func(t *testing.T) {
		// Given a half-open breaker whose probe was turned away
		b, clk, rec := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		clk.Advance(time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)
		b.Cancel(probe)

		// When the next request comes
		next, _, err := b.Allow()

		// Then it is the new probe, and the old ticket cannot decide
		require.NoError(t, err)
		assert.True(t, next.Probe())
		b.Done(probe, true, 0)
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		b.Done(next, false, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
	})

	t.Run("a handed-back closed ticket is neither success nor failure", func(t *testing.T) {
		b, _, _ := newBreaker(t, 3, time.Second)
		call(t, b, true)
		tk, _, err := b.Allow()
		require.NoError(t, err)
		b.Cancel(tk)
		assert.Equal(t, 1, b.Snapshot().ConsecutiveFailures)
	})
}

func TestSingleProbeUnderRace(t *testing.T) {
	// Given an open breaker whose reset timeout has passed
	b, clk, _ := newBreaker(t, 1, time.Second)
	trip(t, b, 1)
	clk.Advance(time.Second)

	// When 100 goroutines ask in the same instant, half with Allow and
	// half with AllowAt and the clock's reading
	var admitted, probes atomic.Int32
	var ready, wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range 100 {
		ready.Add(1)
		wg.Go(func() {
			ready.Done()
			<-gate
			allow := b.Allow
			if i%2 == 1 {
				allow = func() (breaker.Ticket, time.Duration, error) { return b.AllowAt(clk.Now()) }
			}
			tk, _, err := allow()
			if err == nil {
				admitted.Add(1)
				if tk.Probe() {
					probes.Add(1)
				}
			}
		})
	}
	ready.Wait()
	close(gate)
	wg.Wait()

	// Then exactly one is admitted, as the probe
	assert.EqualValues(t, 1, admitted.Load())
	assert.EqualValues(t, 1, probes.Load())
}

// TestHammerChain drives one breaker from many goroutines while the clock
// moves, and checks that the observer saw an unbroken chain of changes.
func TestHammerChain(t *testing.T) {
	b, clk, rec := newBreaker(t, 3, 50*time.Millisecond)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 3000 {
				tk, _, err := b.Allow()
				if err != nil {
					continue
				}
				switch rng.IntN(4) {
				case 0:
					b.Cancel(tk)
				case 1:
					b.Done(tk, false, 0)
				default:
					b.Done(tk, true, 0)
				}
			}
		})
	}
	wg.Go(func() {
		for range 2000 {
			clk.Advance(time.Millisecond)
		}
	})
	wg.Wait()

	chain := rec.chain()
	require.NotEmpty(t, chain)
	prev := breaker.Closed
	for i, tr := range rec.transitions {
		require.Equal(t, prev, tr.From, "transition %d (%s) does not follow %s", i, chain[i], prev)
		require.NotEqual(t, tr.From, tr.To)
		prev = tr.To
	}
	assert.Equal(t, prev, b.Snapshot().State)
}

// model is a deliberately plain reference breaker for TestAgainstModel.
type model struct {
	threshold int
	reset     time.Duration
	state     breaker.State
	fails     int
	openedAt  time.Time
	probeOut  bool
	gen       int
}

type modelTicket struct {
	gen   int
	probe bool
}

func (m *model) allow(now time.Time) (modelTicket, bool) {
	switch m.state {
	case breaker.Closed:
		return modelTicket{gen: m.gen}, true
	case breaker.Open:
		if now.Sub(m.openedAt) < m.reset {
			return modelTicket{}, false
		}
		m.state = breaker.HalfOpen
	default:
		if m.probeOut {
			return modelTicket{}, false
		}
	}
	m.gen++
	m.probeOut = true
	return modelTicket{gen: m.gen, probe: true}, true
}

func (m *model) done(t modelTicket, failed bool, now time.Time) {
	if t.gen != m.gen {
		return
	}
	switch {
	case t.probe && failed:
		m.state, m.fails, m.openedAt, m.probeOut = breaker.Open, m.fails+1, now, false
		m.gen++
	case t.probe:
		m.state, m.fails, m.probeOut = breaker.Closed, 0, false
		m.gen++
	case failed:
		m.fails++
		if m.fails >= m.threshold {
			m.state, m.openedAt = breaker.Open, now
			m.gen++
		}
	default:
		m.fails = 0
	}
}

func (m *model) cancel(t modelTicket) {
	if t.probe && t.gen == m.gen {
		m.probeOut = false
	}
}

func (m *model) retryAfter(now time.Time) time.Duration {
	if m.state != breaker.Open {
		return 0
	}
	return max(m.openedAt.Add(m.reset).Sub(now), 0)
}

// TestAgainstModel replays thousands of random events against the breaker
// and the reference model and compares them after every step.
func TestAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run("seed", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			threshold := 1 + rng.IntN(4)
			reset := time.Duration(1+rng.IntN(5)) * time.Second
			b, clk, _ := newBreaker(t, threshold, reset)
			m := &model{threshold: threshold, reset: reset}

			type pair struct {
				real  breaker.Ticket
				model modelTicket
			}
			var out []pair
			for step := range 5000 {
				now := clk.Now()
				switch ev := rng.IntN(10); {
				case ev < 4:
					tk, _, err := b.Allow()
					mt, ok := m.allow(now)
					require.Equal(t, ok, err == nil, "step %d: admission", step)
					if ok {
						require.Equal(t, mt.probe, tk.Probe(), "step %d: probe", step)
						out = append(out, pair{tk, mt})
					}
				case ev < 8 && len(out) > 0:
					i := rng.IntN(len(out))
					p := out[i]
					out = append(out[:i], out[i+1:]...)
					failed := rng.IntN(2) == 0
					b.Done(p.real, failed, 0)
					m.done(p.model, failed, now)
				case ev == 8 && len(out) > 0:
					i := rng.IntN(len(out))
					p := out[i]
					out = append(out[:i], out[i+1:]...)
					b.Cancel(p.real)
					m.cancel(p.model)
				default:
					clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
				}
				want := breaker.Snapshot{State: m.state, ConsecutiveFailures: m.fails, RetryAfter: m.retryAfter(clk.Now())}
				require.Equal(t, want, b.Snapshot(), "step %d", step)
			}
		})
	}
}

func TestClosedPathDoesNotAllocate(t *testing.T) {
	b := breaker.New(breaker.Settings{})
	allocs := testing.AllocsPerRun(1000, func() {
		tk, _, _ := b.Allow()
		b.Done(tk, false, 0)
	})
	assert.Zero(t, allocs)
}

func BenchmarkClosedAllowSuccess(b *testing.B) {
	br := breaker.New(breaker.Settings{})
	b.ReportAllocs()
	for b.Loop() {
		tk, _, _ := br.Allow()
		br.Done(tk, false, 0)
	}
}

func BenchmarkClosedAllowSuccessParallel(b *testing.B) {
	br := breaker.New(breaker.Settings{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, _, _ := br.Allow()
			br.Done(tk, false, 0)
		}
	})
}

func BenchmarkOpenRefuse(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Hour}})
	tk, _, _ := br.Allow()
	br.Done(tk, true, 0)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := br.Allow(); err == nil {
			b.Fatal("admitted while open")
		}
	}
}

func BenchmarkOpenRefuseParallel(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Hour}})
	tk, _, _ := br.Allow()
	br.Done(tk, true, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _, _ = br.Allow()
		}
	})
}

func TestAllowTellsTheWait(t *testing.T) {
	// Given a breaker that opened 3 s ago with a 10 s reset timeout
	b, clk, _ := newBreaker(t, 1, 10*time.Second)
	trip(t, b, 1)
	clk.Advance(3 * time.Second)

	// When a request is refused, it learns the same wait RetryAfter reports
	_, wait, err := b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
	assert.NotErrorIs(t, err, breaker.ErrHeld)
	assert.Equal(t, 7*time.Second, wait)
	assert.Equal(t, b.RetryAfter(), wait)

	// Then once the wait is over the next request is the probe
	clk.Advance(wait)
	tk, wait, err := b.Allow()
	require.NoError(t, err)
	assert.True(t, tk.Probe())
	assert.Zero(t, wait)
}

func TestAllowWhileHeld(t *testing.T) {
	// Given a breaker an operator holds open, long past its reset timeout
	b, clk, _ := newBreaker(t, 1, time.Second)
	trip(t, b, 1)
	b.HoldOpen()
	clk.Advance(time.Hour)

	// When a request comes, it is refused as held, with no wait to offer
	_, wait, err := b.Allow()
	assert.ErrorIs(t, err, breaker.ErrHeld)
	assert.ErrorIs(t, err, breaker.ErrOpen)
	assert.Zero(t, wait)

	// Then Enable starts a normal open period from now
	b.Enable()
	_, wait, err = b.Allow()
	assert.NotErrorIs(t, err, breaker.ErrHeld)
	assert.Equal(t, time.Second, wait)
}
