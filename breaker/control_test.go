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

func TestHoldOpen(t *testing.T) {
	t.Run("refuses forever despite the clock", func(t *testing.T) {
		// Given a closed breaker with two failures counted
		b, clk, rec := newBreaker(t, 5, time.Second)
		call(t, b, true)
		call(t, b, true)

		// When an operator holds it open
		b.HoldOpen()

		// Then it is open, held, with no retry hint, and refuses however long it waits
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 2, Held: true}, b.Snapshot())
		for range 10 {
			clk.Advance(100 * time.Hour)
			_, _, err := b.Allow()
			assert.ErrorIs(t, err, breaker.ErrOpen)
		}
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("from half-open the probe becomes stale", func(t *testing.T) {
		// Given a half-open breaker with its probe out
		b, clk, rec := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		p := probe(t, b, clk)

		// When an operator holds it open and the probe then succeeds
		b.HoldOpen()
		b.Done(p, false, 0)

		// Then the probe's result changes nothing
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 1, Held: true}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
	})

	t.Run("an open breaker is held without a transition", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		b.HoldOpen()
		b.HoldOpen()
		clk.Advance(time.Hour)
		_, _, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("ends Disable", func(t *testing.T) {
		b, _, rec := newBreaker(t, 1, time.Second)
		b.Disable()
		b.HoldOpen()
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, Held: true}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})
}

func TestEnable(t *testing.T) {
	t.Run("after a hold, a normal open period starts now", func(t *testing.T) {
		// Given a breaker backed off to 40 s, then held open for an hour
		b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: time.Minute}})
		trip(t, b, 1)
		b.Done(probe(t, b, clk), true, 0)
		b.Done(probe(t, b, clk), true, 0)
		require.Equal(t, 40*time.Second, b.RetryAfter())
		b.HoldOpen()
		clk.Advance(time.Hour)

		// When an operator enables it
		b.Enable()

		// Then it stays open for the reset timeout from now, then probes
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 3, RetryAfter: 10 * time.Second}, b.Snapshot())
		clk.Advance(10*time.Second - time.Nanosecond)
		_, _, err := b.Allow()
		require.ErrorIs(t, err, breaker.ErrOpen)
		clk.Advance(time.Nanosecond)
		tk, _, err := b.Allow()
		require.NoError(t, err)
		assert.True(t, tk.Probe())
		assert.Equal(t, []string{
			"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN", "OPEN->HALF_OPEN",
		}, rec.chain())
	})

	t.Run("after a hold, the open period has its jitter", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{ResetTimeout: 10 * time.Second, ResetJitter: 0.5}, Rand: func() float64 { return 0.5 }})
		b.HoldOpen()
		b.Enable()
		assert.Equal(t, 12500*time.Millisecond, b.RetryAfter())
	})

	t.Run("after Disable, the count is kept and the next failure opens", func(t *testing.T) {
		// Given a disabled breaker that counted past its threshold
		b, _, rec := newBreaker(t, 3, time.Second)
		b.Disable()
		for range 5 {
			call(t, b, true)
		}

		// When an operator enables it
		b.Enable()

		// Then it is a normal closed breaker with that count
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 5}, b.Snapshot())
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("after Disable, a success clears the count", func(t *testing.T) {
		b, _, rec := newBreaker(t, 3, time.Second)
		b.Disable()
		for range 5 {
			call(t, b, true)
		}
		b.Enable()
		call(t, b, false)
		call(t, b, true)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 1}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})

	t.Run("after Disable, the window is kept and the next result decides", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 100, FailureRate: 0.5, Window: time.Minute, MinSamples: 4}})
		b.Disable()
		for range 4 {
			call(t, b, true)
		}
		b.Enable()
		require.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 4, RecentCalls: 4, RecentFailures: 4}, b.Snapshot())
		call(t, b, false)
		assert.Equal(t, breaker.Open, b.Snapshot().State, "four failures in five is over the rate")
	})

	t.Run("on a breaker under no control it does nothing", func(t *testing.T) {
		b, _, rec := newBreaker(t, 1, 10*time.Second)
		b.Enable()
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
		trip(t, b, 1)
		b.Enable()
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 1, RetryAfter: 10 * time.Second}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})
}

func TestForceClose(t *testing.T) {
	tests := []struct {
		name      string
		given     func(t *testing.T, b *breaker.Breaker, clk *fakeclock.Clock)
		wantChain []string
	}{
		{
			name:      "from open",
			given:     func(t *testing.T, b *breaker.Breaker, _ *fakeclock.Clock) { trip(t, b, 2) },
			wantChain: []string{"CLOSED->OPEN", "OPEN->CLOSED"},
		},
		{
			name: "from half-open",
			given: func(t *testing.T, b *breaker.Breaker, clk *fakeclock.Clock) {
				trip(t, b, 2)
				probe(t, b, clk)
			},
			wantChain: []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"},
		},
		{
			name:      "from held open",
			given:     func(t *testing.T, b *breaker.Breaker, _ *fakeclock.Clock) { b.HoldOpen() },
			wantChain: []string{"CLOSED->OPEN", "OPEN->CLOSED"},
		},
		{
			name:      "from closed with a count",
			given:     func(t *testing.T, b *breaker.Breaker, _ *fakeclock.Clock) { call(t, b, true) },
			wantChain: []string{},
		},
		{
			name: "from disabled",
			given: func(t *testing.T, b *breaker.Breaker, _ *fakeclock.Clock) {
				b.Disable()
				for range 4 {
					call(t, b, true)
				}
			},
			wantChain: []string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given a breaker in some state, with a failure-rate window
			b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 2, ResetTimeout: time.Second, FailureRate: 0.5, Window: time.Minute, MinSamples: 3}})
			tt.given(t, b, clk)
			clk.Advance(time.Second)

			// When an operator forces it closed
			b.ForceClose()

			// Then it is closed with a clean count and window, under no control
			assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
			assert.Equal(t, tt.wantChain, rec.chain())

			// And it trips normally again
			call(t, b, true)
			assert.Equal(t, breaker.Closed, b.Snapshot().State)
			call(t, b, true)
			assert.Equal(t, breaker.Open, b.Snapshot().State)
		})
	}

	t.Run("a call in flight on a closed breaker still reports", func(t *testing.T) {
		b, _, _ := newBreaker(t, 2, time.Second)
		call(t, b, true)
		tk, _, err := b.Allow()
		require.NoError(t, err)
		b.ForceClose()
		b.Done(tk, true, 0)
		assert.Equal(t, 1, b.Snapshot().ConsecutiveFailures)
	})
}

func TestDisable(t *testing.T) {
	t.Run("never trips by count but keeps counting", func(t *testing.T) {
		// Given a disabled breaker with a threshold of two
		b, clk, rec := newBreaker(t, 2, time.Second)
		b.Disable()

		// When a hundred calls fail while the clock moves
		for range 100 {
			call(t, b, true)
			clk.Advance(time.Second)
		}

		// Then every call was admitted, it is still closed, and the count shows them
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 100, Disabled: true}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})

	t.Run("never trips by rate but fills the window", func(t *testing.T) {
		b, _, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 3, FailureRate: 0.5, Window: time.Minute, MinSamples: 2}})
		b.Disable()
		for range 10 {
			call(t, b, true)
			callAfter(t, b, false, 0)
		}
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, Disabled: true, RecentCalls: 20, RecentFailures: 10}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})

	t.Run("from open it closes and admits", func(t *testing.T) {
		// Given an open breaker
		b, _, rec := newBreaker(t, 1, time.Hour)
		trip(t, b, 1)

		// When an operator disables it
		b.Disable()

		// Then it is closed, count zero, and admits at once
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, Disabled: true}, b.Snapshot())
		call(t, b, true)
		call(t, b, true)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->CLOSED"}, rec.chain())
	})

	t.Run("from held open it closes and ends the hold", func(t *testing.T) {
		b, _, rec := newBreaker(t, 1, time.Hour)
		b.HoldOpen()
		b.Disable()
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, Disabled: true}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->CLOSED"}, rec.chain())
	})

	t.Run("from half-open the probe becomes stale", func(t *testing.T) {
		b, clk, rec := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		p := probe(t, b, clk)
		b.Disable()
		b.Done(p, true, 0)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, Disabled: true}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
	})
}

// allPolicies turns every policy on, with short periods so that a hammer
// test on a moving clock goes through every state many times.
func allPolicies(seed uint64) breaker.Settings {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 7))
	return breaker.Settings{
		Policy: breaker.Policy{
			FailThreshold:   3,
			ResetTimeout:    20 * time.Millisecond,
			FailureRate:     0.5,
			Window:          100 * time.Millisecond,
			MinSamples:      6,
			SlowCall:        5 * time.Millisecond,
			MaxResetTimeout: 200 * time.Millisecond,
			ResetJitter:     0.5,
		},

		Rand: func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return rng.Float64()
		},
		ProbeTimeout: 30 * time.Millisecond,
	}
}

// TestHammerChainPolicies drives one breaker from many goroutines, mixing
// results, slow calls, cancellations and manual control while the clock
// moves, and checks that the observer saw an unbroken chain of changes.
func TestHammerChainPolicies(t *testing.T) {
	shared := allPolicies(1)
	shared.ProbePermits = true
	tests := []struct {
		name     string
		settings breaker.Settings
	}{
		{name: "plain with manual control", settings: breaker.Settings{Policy: breaker.Policy{FailThreshold: 3, ResetTimeout: 50 * time.Millisecond}}},
		{name: "every policy", settings: allPolicies(1)},
		{name: "every policy, shared state and probe permits", settings: shared},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, clk, rec := newPolicyBreaker(t, tt.settings)
			var wg sync.WaitGroup
			var admitted atomic.Int64
			for g := range 16 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 2))
					for range 3000 {
						// Each goroutine moves the clock as it goes, so that time
						// passes at the pace of the work whatever the scheduler does.
						if rng.IntN(8) == 0 {
							clk.Advance(time.Millisecond)
						}
						switch rng.IntN(2000) {
						case 0:
							b.HoldOpen()
						case 1:
							b.ForceClose()
						case 2:
							b.Disable()
						case 3, 4, 5:
							b.Enable()
						}
						if tt.settings.ProbePermits {
							switch rng.IntN(200) {
							case 0:
								b.AdoptOpen(time.Duration(rng.IntN(60))*time.Millisecond, 0)
							case 1:
								b.AdoptClose()
							case 2, 3, 4, 5, 6, 7, 8, 9:
								b.PermitProbe()
							}
						}
						if hammerCall(b, rng) {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()

			assert.Positive(t, admitted.Load())
			requireUnbrokenChain(t, rec, b, "CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED", "HALF_OPEN->OPEN", "OPEN->CLOSED")
		})
	}
}

// hammerCall asks b for one call and, when admitted, hands the ticket back
// as a hammer test does: cancelled one time in five, else a success or (more
// often) a failure that took up to 7 ms. It reports whether the call was
// admitted.
func hammerCall(b *breaker.Breaker, rng *rand.Rand) bool {
	tk, _, err := b.Allow()
	if err != nil {
		return false
	}
	took := time.Duration(rng.IntN(8)) * time.Millisecond
	switch rng.IntN(5) {
	case 0:
		b.Cancel(tk)
	case 1, 2:
		b.Done(tk, false, took)
	default:
		b.Done(tk, true, took)
	}
	return true
}

// requireUnbrokenChain checks that rec saw an unbroken chain of state
// changes, starting from CLOSED and ending in b's state now, that passed
// every edge given: a hammer that never left CLOSED would prove nothing.
func requireUnbrokenChain(t *testing.T, rec *recorder, b *breaker.Breaker, edges ...string) {
	t.Helper()
	chain := rec.chain()
	require.NotEmpty(t, chain)
	prev := breaker.Closed
	for i, tr := range rec.list() {
		require.Equal(t, prev, tr.From, "transition %d (%s) does not follow %s", i, chain[i], prev)
		require.NotEqual(t, tr.From, tr.To)
		prev = tr.To
	}
	assert.Equal(t, prev, b.Snapshot().State)
	for _, edge := range edges {
		assert.Contains(t, chain, edge)
	}
}

// TestHeldNeverHalfOpens checks under contention that a held breaker admits
// nothing and changes no state while the clock runs far past every period.
func TestHeldNeverHalfOpens(t *testing.T) {
	// Given a held breaker with every policy on
	b, clk, rec := newPolicyBreaker(t, allPolicies(3))
	trip(t, b, 3)
	b.HoldOpen()
	before := len(rec.chain())

	// When many goroutines ask while the clock moves
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 2000 {
				if tk, _, err := b.Allow(); err == nil {
					admitted.Add(1)
					b.Done(tk, false, 0)
				}
			}
		})
	}
	wg.Go(func() {
		for range 2000 {
			clk.Advance(time.Second)
		}
	})
	wg.Wait()

	// Then nothing was admitted and nothing changed
	assert.Zero(t, admitted.Load())
	assert.Len(t, rec.chain(), before)
	assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 3, Held: true}, b.Snapshot())
}
