package breaker_test

import (
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

// newSyntheticBreaker returns a breaker with threshold 2 and reset 10 s
// that takes only synthetic probes and needs successes healthy ones, with
// the probe interval given.
func newSyntheticBreaker(t *testing.T, successes int, interval time.Duration) (*breaker.Breaker, *fakeclock.Clock, *recorder) {
	t.Helper()
	return newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{
		FailThreshold: 2, ResetTimeout: 10 * time.Second, MaxResetTimeout: 40 * time.Second,
		ProbeSuccesses: successes, ProbeInterval: interval, SyntheticProbes: true,
	}})
}

// allowProbe admits the breaker's own probe, which must be due.
func allowProbe(t *testing.T, b *breaker.Breaker) breaker.Ticket {
	t.Helper()
	tk, wait, err := b.AllowProbe()
	require.NoError(t, err)
	require.Zero(t, wait)
	require.True(t, tk.Probe())
	return tk
}

// refusesCustomers checks that an ordinary call is refused.
func refusesCustomers(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	_, _, err := b.Allow()
	require.ErrorIs(t, err, breaker.ErrOpen)
}

func TestSyntheticProbes(t *testing.T) {
	t.Run("no customer call is ever the probe", func(t *testing.T) {
		// Given an open breaker whose open period has passed,
		b, clk, rec := newSyntheticBreaker(t, 1, 0)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)

		// when customers call, they are refused and it stays OPEN, again
		// and again (the refusal then needs no lock),
		for range 3 {
			_, wait, err := b.Allow()
			require.ErrorIs(t, err, breaker.ErrOpen)
			assert.Zero(t, wait)
		}
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())

		// then the breaker's own probe is admitted and moves it to HALF_OPEN,
		tk := allowProbe(t, b)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN"}, rec.chain())
		assert.Equal(t, breaker.CauseProbe, rec.list()[1].Cause)

		// customers are refused while it is out, and so is a second probe,
		refusesCustomers(t, b)
		_, _, err := b.AllowProbe()
		require.ErrorIs(t, err, breaker.ErrOpen)

		// and its success closes the breaker for everyone.
		b.Done(tk, false, 0)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
		call(t, b, false)
	})

	t.Run("the probe waits for the open period", func(t *testing.T) {
		b, clk, _ := newSyntheticBreaker(t, 1, 0)
		trip(t, b, 2)
		clk.Advance(4 * time.Second)

		_, wait, err := b.AllowProbe()

		require.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, 6*time.Second, wait)
	})

	t.Run("a closed breaker needs no probe", func(t *testing.T) {
		b, _, _ := newSyntheticBreaker(t, 1, 0)

		_, _, err := b.AllowProbe()

		require.ErrorIs(t, err, breaker.ErrClosed)
		call(t, b, false)
	})

	t.Run("three successes are needed when three are asked for", func(t *testing.T) {
		// Given a breaker that needs three healthy probes 2 s apart,
		b, clk, rec := newSyntheticBreaker(t, 3, 2*time.Second)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)

		// when two probes succeed,
		for i := 1; i <= 2; i++ {
			b.Done(allowProbe(t, b), false, 0)
			// it stays HALF_OPEN, refusing customers, with the next probe
			// due in 2 s and not before,
			snap := b.Snapshot()
			require.Equal(t, breaker.HalfOpen, snap.State)
			assert.Equal(t, i, snap.ProbeSuccesses)
			assert.Equal(t, 2*time.Second, snap.RetryAfter)
			refusesCustomers(t, b)
			_, wait, err := b.AllowProbe()
			require.ErrorIs(t, err, breaker.ErrOpen)
			assert.Equal(t, 2*time.Second, wait)
			clk.Advance(2 * time.Second)
		}
		// and no change was logged for them,
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN"}, rec.chain())

		// then the third closes it.
		b.Done(allowProbe(t, b), false, 0)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
		assert.Zero(t, b.Snapshot().ProbeSuccesses)
	})

	t.Run("a failure between successes reopens and the count starts over", func(t *testing.T) {
		b, clk, rec := newSyntheticBreaker(t, 2, 0)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)
		b.Done(allowProbe(t, b), false, 0)
		// Without an interval, the next probe is due a reset timeout later.
		assert.Equal(t, 10*time.Second, b.RetryAfter())
		clk.Advance(10 * time.Second)

		b.Done(allowProbe(t, b), true, 0)

		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
		// backoff doubles the open period as for any failed probe,
		assert.Equal(t, 20*time.Second, b.RetryAfter())
		clk.Advance(20 * time.Second)
		// and one success is not enough afterwards.
		b.Done(allowProbe(t, b), false, 0)
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		assert.Equal(t, 1, b.Snapshot().ProbeSuccesses)
	})

	t.Run("the probe interval replaces backoff after a failed probe", func(t *testing.T) {
		b, clk, rec := newSyntheticBreaker(t, 1, 3*time.Second)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)

		b.Done(allowProbe(t, b), true, 0)

		last := rec.list()[len(rec.list())-1]
		assert.Equal(t, 3*time.Second, last.OpenFor)
		assert.Equal(t, 3*time.Second, b.RetryAfter())
		clk.Advance(3 * time.Second)
		b.Done(allowProbe(t, b), true, 0)
		assert.Equal(t, 3*time.Second, b.RetryAfter(), "no backoff")
	})

	t.Run("a probe handed back is due again at once", func(t *testing.T) {
		b, clk, _ := newSyntheticBreaker(t, 1, 0)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)
		b.Cancel(allowProbe(t, b))

		tk := allowProbe(t, b)

		b.Done(tk, false, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
	})
}

func TestSyntheticProbesAndManualControl(t *testing.T) {
	t.Run("no probe while held open", func(t *testing.T) {
		b, clk, _ := newSyntheticBreaker(t, 1, 0)
		b.HoldOpen()
		clk.Advance(time.Hour)

		_, _, err := b.AllowProbe()

		require.ErrorIs(t, err, breaker.ErrHeld)
	})

	t.Run("no probe while disabled", func(t *testing.T) {
		b, _, _ := newSyntheticBreaker(t, 1, 0)
		trip(t, b, 2)
		b.Disable()

		_, _, err := b.AllowProbe()

		require.ErrorIs(t, err, breaker.ErrClosed)
	})

	t.Run("a half-open breaker held open drops its healthy probes", func(t *testing.T) {
		b, clk, _ := newSyntheticBreaker(t, 2, time.Second)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)
		b.Done(allowProbe(t, b), false, 0)

		b.HoldOpen()
		b.Enable()
		clk.Advance(10 * time.Second)
		b.Done(allowProbe(t, b), false, 0)

		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State, "the count started over")
	})
}

func TestSyntheticProbesWithPermits(t *testing.T) {
	// Given a breaker of a fleet, open and past its period,
	b, clk, rec := newPolicyBreaker(t, breaker.Settings{
		Policy:       breaker.Policy{FailThreshold: 2, ResetTimeout: 10 * time.Second, SyntheticProbes: true},
		ProbePermits: true,
	})
	trip(t, b, 2)
	clk.Advance(10 * time.Second)

	// its own probe waits for a permit,
	_, wait, err := b.AllowProbe()
	require.ErrorIs(t, err, breaker.ErrOpen)
	assert.Zero(t, wait)

	// and once one comes, customers are still refused: only the probe
	// uses it.
	b.PermitProbe()
	refusesCustomers(t, b)
	assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	tk := allowProbe(t, b)
	b.Done(tk, false, 0)
	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
}

func TestSetPolicyTurnsSyntheticProbesOff(t *testing.T) {
	// Given a breaker waiting for its own probe, refusing customers
	// without its lock,
	b, clk, rec := newSyntheticBreaker(t, 1, 0)
	trip(t, b, 2)
	clk.Advance(10 * time.Second)
	refusesCustomers(t, b)

	// when a reload turns synthetic probes off,
	b.SetPolicy(breaker.Policy{FailThreshold: 2, ResetTimeout: 10 * time.Second})

	// then the next customer is the probe, as without them.
	tk, _, err := b.Allow()
	require.NoError(t, err)
	assert.True(t, tk.Probe())
	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN"}, rec.chain())
}

func TestProbeSuccessesWithCustomerProbes(t *testing.T) {
	// Without synthetic probes, several successes are customer probes, one
	// at a time.
	b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{
		FailThreshold: 2, ResetTimeout: 10 * time.Second, ProbeSuccesses: 2, ProbeInterval: time.Second,
	}})
	trip(t, b, 2)
	b.Done(probe(t, b, clk), false, 0)

	refusesCustomers(t, b)
	clk.Advance(time.Second)
	b.Done(probe(t, b, clk), false, 0)

	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
}

// TestSyntheticProbesUnderRace hammers a breaker with synthetic probes from
// customers and a prober at once, under -race: no customer is ever
// admitted outside CLOSED, and the chain of changes stays unbroken.
func TestSyntheticProbesUnderRace(t *testing.T) {
	b, clk, rec := newSyntheticBreaker(t, 2, 5*time.Millisecond)
	var wg sync.WaitGroup
	var leaked atomic.Int64
	stop := make(chan struct{})
	for g := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				tk, _, err := b.Allow()
				if err != nil {
					continue
				}
				if tk.Probe() {
					leaked.Add(1)
				}
				b.Done(tk, rng.IntN(3) == 0, 0)
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(99, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			clk.Advance(time.Millisecond)
			if tk, _, err := b.AllowProbe(); err == nil {
				b.Done(tk, rng.IntN(2) == 0, 0)
			}
		}
	})
	require.Eventually(t, func() bool { return strings.Count(strings.Join(rec.chain(), " "), "HALF_OPEN->CLOSED") >= 5 },
		10*time.Second, time.Millisecond, "the hammer recovers the breaker five times")
	close(stop)
	wg.Wait()

	assert.Zero(t, leaked.Load(), "a customer was admitted as the probe")
	requireUnbrokenChain(t, rec, b, "CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN", "HALF_OPEN->CLOSED")
}

// BenchmarkSyntheticRefuse is a customer refused by a breaker with
// synthetic probes: open with its period passed, waiting for its own probe
// (the lock-free refusal), and half-open with the probe out (under the
// lock, as without synthetic probes).
func BenchmarkSyntheticRefuse(b *testing.B) {
	for _, state := range []string{"open, probe due", "half-open"} {
		b.Run(state, func(b *testing.B) {
			clk := fakeclock.New(start)
			br := breaker.New(breaker.Settings{Clock: clk, Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Second, SyntheticProbes: true}})
			tk, _, _ := br.Allow()
			br.Done(tk, true, 0)
			clk.Advance(time.Second)
			if state == "half-open" {
				if _, _, err := br.AllowProbe(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, _, err := br.Allow(); err == nil {
						b.Error("admitted a customer")
					}
				}
			})
		})
	}
}
