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
)

func TestSetPolicyKeepsTheCountAndAppliesTheNewThreshold(t *testing.T) {
	// Given a closed breaker with threshold 5 and two failures counted
	b, _, rec := newBreaker(t, 5, 10*time.Second)
	call(t, b, true)
	call(t, b, true)

	// When the threshold becomes 3
	b.SetPolicy(breaker.Policy{FailThreshold: 3, ResetTimeout: 10 * time.Second})

	// Then the count is kept, nothing changed state, the settings say 3,
	assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 2}, b.Snapshot())
	assert.Equal(t, 3, b.Settings().FailThreshold)
	assert.Empty(t, rec.chain())

	// and the third failure opens it.
	call(t, b, true)
	assert.Equal(t, breaker.Open, b.Snapshot().State)
	assert.Equal(t, 3, b.Snapshot().ConsecutiveFailures)
	assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
}

func TestSetPolicyBelowTheCountOpensAtTheNextFailureOnly(t *testing.T) {
	// Given four failures counted under threshold 5
	b, _, rec := newBreaker(t, 5, 10*time.Second)
	for range 4 {
		call(t, b, true)
	}

	// When the threshold drops to 2, the breaker stays closed until a
	// result comes,
	b.SetPolicy(breaker.Policy{FailThreshold: 2})
	assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 4}, b.Snapshot())
	assert.Empty(t, rec.chain())

	// a success clears the count as always,
	call(t, b, false)
	assert.Zero(t, b.Snapshot().ConsecutiveFailures)

	// and two failures now open it.
	call(t, b, true)
	call(t, b, true)
	assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
}

func TestSetPolicyLetsCallsInFlightReport(t *testing.T) {
	// Given a call admitted before the change
	b, _, _ := newBreaker(t, 2, 10*time.Second)
	call(t, b, true)
	tk, _, err := b.Allow()
	require.NoError(t, err)

	// When the policy changes and the call then fails
	b.SetPolicy(breaker.Policy{FailThreshold: 3, SlowCall: time.Second})
	b.Done(tk, false, 2*time.Second)

	// Then its result counts, judged by the new policy: slow, so failed.
	assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 2}, b.Snapshot())
}

func TestSetPolicyKeepsTheOpenPeriodInProgress(t *testing.T) {
	// Given a breaker open for 10s, 4s into its open period
	b, clk, rec := newBreaker(t, 1, 10*time.Second)
	trip(t, b, 1)
	clk.Advance(4 * time.Second)

	// When the reset timeout becomes 2s
	b.SetPolicy(breaker.Policy{FailThreshold: 1, ResetTimeout: 2 * time.Second})

	// Then the period in progress still ends when it was due,
	assert.Equal(t, 6*time.Second, b.RetryAfter())
	_, _, err := b.Allow()
	require.ErrorIs(t, err, breaker.ErrOpen)

	// and the next open period is the new one.
	p := probe(t, b, clk)
	b.Done(p, true, 0)
	assert.Equal(t, 2*time.Second, b.RetryAfter())
	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
}

func TestSetPolicyBackoff(t *testing.T) {
	backoff := breaker.Policy{FailThreshold: 1, ResetTimeout: time.Second, MaxResetTimeout: 8 * time.Second}
	// failProbes lets n probes fail, leaving the breaker open.
	failProbes := func(t *testing.T, b *breaker.Breaker, clk interface{ Advance(time.Duration) }, n int) {
		t.Helper()
		for range n {
			clk.Advance(b.RetryAfter())
			tk, _, err := b.Allow()
			require.NoError(t, err)
			b.Done(tk, true, 0)
		}
	}

	t.Run("a breaker backing off goes on from its period, within the new bounds", func(t *testing.T) {
		// Given a breaker whose two failed probes took it to 4s
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: backoff})
		trip(t, b, 1)
		failProbes(t, b, clk, 2)
		require.Equal(t, 4*time.Second, b.RetryAfter())

		// When the cap drops to 6s, the next failed probe doubles to the cap
		p := backoff
		p.MaxResetTimeout = 6 * time.Second
		b.SetPolicy(p)
		failProbes(t, b, clk, 1)
		assert.Equal(t, 6*time.Second, b.RetryAfter())
	})

	t.Run("turning backoff off brings the period back to the reset timeout", func(t *testing.T) {
		// Given a breaker backing off at 4s
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: backoff})
		trip(t, b, 1)
		failProbes(t, b, clk, 2)

		// When backoff is turned off, the next open period is the reset timeout
		b.SetPolicy(breaker.Policy{FailThreshold: 1, ResetTimeout: 3 * time.Second})
		failProbes(t, b, clk, 1)
		assert.Equal(t, 3*time.Second, b.RetryAfter())
	})

	t.Run("a breaker not backing off starts from the new reset timeout", func(t *testing.T) {
		// Given a breaker open at its 1s reset timeout
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: backoff})
		trip(t, b, 1)

		// When the reset timeout becomes 2s, a failed probe doubles that
		p := backoff
		p.ResetTimeout = 2 * time.Second
		b.SetPolicy(p)
		failProbes(t, b, clk, 1)
		assert.Equal(t, 4*time.Second, b.RetryAfter())
	})
}

func TestSetPolicyFailureRateWindow(t *testing.T) {
	rate := breaker.Policy{FailThreshold: 100, FailureRate: 0.5, Window: 10 * time.Second, MinSamples: 4}

	t.Run("the same window keeps its results", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: rate})
		call(t, b, true)
		call(t, b, false)
		p := rate
		p.MinSamples = 3
		b.SetPolicy(p)
		snap := b.Snapshot()
		assert.Equal(t, 2, snap.RecentCalls)
		assert.Equal(t, 1, snap.RecentFailures)
		// The third result reaches the new minimum: 2 of 3 failed.
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})

	t.Run("another window starts empty", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: rate})
		call(t, b, true)
		call(t, b, true)
		p := rate
		p.Window = 20 * time.Second
		b.SetPolicy(p)
		assert.Zero(t, b.Snapshot().RecentCalls)
		assert.Equal(t, 2, b.Snapshot().ConsecutiveFailures, "the consecutive count is kept")
	})

	t.Run("turned on, the window fills from now", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 100}})
		call(t, b, true)
		b.SetPolicy(rate)
		for range 3 {
			call(t, b, true)
		}
		assert.Equal(t, breaker.Closed, b.Snapshot().State, "the result before the change is not in the window")
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})

	t.Run("turned off, the window is gone and the count goes on", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: rate})
		call(t, b, true)
		b.SetPolicy(breaker.Policy{FailThreshold: 3})
		snap := b.Snapshot()
		assert.Zero(t, snap.RecentCalls)
		assert.Equal(t, 1, snap.ConsecutiveFailures)
		call(t, b, true)
		call(t, b, true)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})
}

func TestSetPolicyTurningJitterOnDrawsAShare(t *testing.T) {
	// Given a breaker without jitter
	rnd, calls := sequence(0.5)
	b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second}, Rand: rnd})
	require.Zero(t, *calls)

	// When jitter is turned on, a share is drawn for the next open period
	b.SetPolicy(breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, ResetJitter: 0.2})
	assert.Equal(t, 1, *calls)
	trip(t, b, 1)
	assert.Equal(t, 11*time.Second, b.RetryAfter())
	clk.Advance(11 * time.Second)
	_, _, err := b.Allow()
	assert.NoError(t, err)
}

func TestSetPolicyKeepsManualControl(t *testing.T) {
	t.Run("held", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 5, time.Second)
		b.HoldOpen()
		b.SetPolicy(breaker.Policy{FailThreshold: 2, ResetTimeout: time.Millisecond})
		clk.Advance(time.Minute)
		_, _, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrHeld)
		assert.True(t, b.Snapshot().Held)
	})
	t.Run("disabled", func(t *testing.T) {
		b, _, rec := newBreaker(t, 5, time.Second)
		b.Disable()
		b.SetPolicy(breaker.Policy{FailThreshold: 1})
		call(t, b, true)
		call(t, b, true)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 2, Disabled: true}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})
}

func TestSetProbeTimeoutAppliesToTheProbeOut(t *testing.T) {
	// Given a half-open breaker whose probe has been out 3s, with no probe
	// timeout
	b, clk, _ := newBreaker(t, 1, time.Second)
	trip(t, b, 1)
	old := probe(t, b, clk)
	clk.Advance(3 * time.Second)
	_, _, err := b.Allow()
	require.ErrorIs(t, err, breaker.ErrOpen)

	// When the probe timeout becomes 2s
	b.SetProbeTimeout(2 * time.Second)
	assert.Equal(t, 2*time.Second, b.Settings().ProbeTimeout)

	// Then a new probe replaces the silent one, whose result no longer counts.
	tk, _, err := b.Allow()
	require.NoError(t, err)
	assert.True(t, tk.Probe())
	b.Done(old, true, 0)
	assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
	b.Done(tk, false, 0)
	assert.Equal(t, breaker.Closed, b.Snapshot().State)
}

// TestSetPolicyUnderRace changes the policy and the probe timeout over and
// over while many goroutines call, on a moving clock, flipping the
// failure-rate policy on and off so that results cross from the lock-free
// path to the window's and back. The race detector checks the fields; the
// observer must still see an unbroken chain, and the breaker must end with
// the last policy set.
func TestSetPolicyUnderRace(t *testing.T) {
	policies := []breaker.Policy{
		{FailThreshold: 3, ResetTimeout: 20 * time.Millisecond},
		allPolicies(5).Policy,
		{FailThreshold: 2, ResetTimeout: 10 * time.Millisecond, FailureRate: 0.3, Window: 50 * time.Millisecond, MinSamples: 4},
		{FailThreshold: 6, ResetTimeout: 30 * time.Millisecond, SlowCall: 3 * time.Millisecond, ResetJitter: 0.3},
	}
	b, clk, rec := newPolicyBreaker(t, allPolicies(4))
	var wg sync.WaitGroup
	var admitted atomic.Int64
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b.SetPolicy(policies[i%len(policies)])
			b.SetProbeTimeout(time.Duration(i%40) * time.Millisecond)
			_ = b.Settings()
		}
	})
	var callers sync.WaitGroup
	for g := range 12 {
		callers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 3000 {
				if rng.IntN(8) == 0 {
					clk.Advance(time.Millisecond)
				}
				if hammerCall(b, rng) {
					admitted.Add(1)
				}
			}
		})
	}
	callers.Wait()
	close(stop)
	wg.Wait()

	b.SetPolicy(policies[0])
	assert.Equal(t, policies[0].Effective(), b.Settings().Policy)
	assert.Positive(t, admitted.Load())
	requireUnbrokenChain(t, rec, b, "CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED", "HALF_OPEN->OPEN")
}
