package breaker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

// newSharedBreaker returns a breaker with threshold 2, reset 10 s and
// backoff to 80 s, that needs probe permits when permits is set.
func newSharedBreaker(t *testing.T, permits bool) (*breaker.Breaker, *fakeclock.Clock, *recorder) {
	t.Helper()
	return newPolicyBreaker(t, breaker.Settings{
		Policy:       breaker.Policy{FailThreshold: 2, ResetTimeout: 10 * time.Second, MaxResetTimeout: 80 * time.Second},
		ProbePermits: permits,
	})
}

func TestAdoptOpen(t *testing.T) {
	t.Run("a closed breaker opens for the time left", func(t *testing.T) {
		// Given a closed breaker,
		b, clk, rec := newSharedBreaker(t, false)

		// when another hub's breaker is open for 4 more seconds,
		b.AdoptOpen(4*time.Second, 0)

		// then this one is open with the same time left, and says why,
		require.Len(t, rec.transitions, 1)
		assert.Equal(t, breaker.Transition{
			Name: "CORE", From: breaker.Closed, To: breaker.Open, At: start,
			Cause: breaker.CauseShared, OpenFor: 4 * time.Second, Period: 10 * time.Second,
		}, rec.transitions[0])
		_, wait, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, 4*time.Second, wait)

		// and once the time has passed, the next call is the probe.
		clk.Advance(4 * time.Second)
		tk, _, err := b.Allow()
		require.NoError(t, err)
		assert.True(t, tk.Probe())
	})

	t.Run("an open breaker moves the end of its period without a transition", func(t *testing.T) {
		b, clk, rec := newSharedBreaker(t, false)
		trip(t, b, 2)
		clk.Advance(time.Second)

		b.AdoptOpen(30*time.Second, 0)

		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
		assert.Equal(t, 30*time.Second, b.RetryAfter())
	})

	t.Run("a half-open breaker opens and its probe is stale", func(t *testing.T) {
		b, clk, rec := newSharedBreaker(t, false)
		trip(t, b, 2)
		clk.Advance(10 * time.Second)
		probe, _, err := b.Allow()
		require.NoError(t, err)

		b.AdoptOpen(5*time.Second, 0)
		b.Done(probe, false, 0)

		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
		assert.Equal(t, breaker.Open, b.Snapshot().State, "the stale probe's success decides nothing")
	})

	t.Run("backoff goes on from the period adopted", func(t *testing.T) {
		// Given a breaker that adopts another hub's open period after that
		// hub's backoff reached 40 s,
		b, clk, rec := newSharedBreaker(t, false)
		b.AdoptOpen(time.Second, 40*time.Second)
		clk.Advance(time.Second)

		// when its own probe fails,
		probe, _, err := b.Allow()
		require.NoError(t, err)
		b.Done(probe, true, 0)

		// then the next open period is doubled from 40 s, capped at 80 s.
		last := rec.transitions[len(rec.transitions)-1]
		assert.Equal(t, 80*time.Second, last.OpenFor)
		assert.Equal(t, breaker.CauseResults, last.Cause)
	})

	t.Run("manual control wins", func(t *testing.T) {
		held, _, heldRec := newSharedBreaker(t, false)
		held.HoldOpen()
		held.AdoptOpen(time.Second, 0)
		held.AdoptClose()
		assert.Equal(t, []string{"CLOSED->OPEN"}, heldRec.chain())
		assert.True(t, held.Snapshot().Held)

		disabled, _, disabledRec := newSharedBreaker(t, false)
		disabled.Disable()
		disabled.AdoptOpen(time.Second, 0)
		assert.Empty(t, disabledRec.chain())
		assert.Equal(t, breaker.Closed, disabled.Snapshot().State)
	})
}

func TestAdoptClose(t *testing.T) {
	t.Run("an open breaker closes with the backoff ended", func(t *testing.T) {
		b, _, rec := newSharedBreaker(t, false)
		b.AdoptOpen(time.Second, 40*time.Second)

		b.AdoptClose()

		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->CLOSED"}, rec.chain())
		assert.Equal(t, breaker.CauseShared, rec.transitions[1].Cause)
		assert.Equal(t, 10*time.Second, rec.transitions[1].Period)
		trip(t, b, 2)
		assert.Equal(t, 10*time.Second, rec.transitions[2].OpenFor, "the next open period is the reset timeout again")
	})

	t.Run("a closed breaker forgets its failures", func(t *testing.T) {
		b, _, rec := newSharedBreaker(t, false)
		callAfter(t, b, true, 0)
		require.Equal(t, 1, b.Snapshot().ConsecutiveFailures)

		b.AdoptClose()

		assert.Zero(t, b.Snapshot().ConsecutiveFailures)
		assert.Empty(t, rec.chain())
		callAfter(t, b, true, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State, "one failure after the reset is not two")
	})
}

func TestProbePermits(t *testing.T) {
	// Given a breaker that needs a permit to probe, open for 10 s,
	b, clk, rec := newSharedBreaker(t, true)
	trip(t, b, 2)

	// when its open period has passed without a permit, it refuses with
	// nothing to wait for and stays open,
	clk.Advance(time.Minute)
	for range 3 {
		_, wait, err := b.Allow()
		require.ErrorIs(t, err, breaker.ErrOpen)
		assert.Zero(t, wait)
	}
	assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	assert.Zero(t, b.RetryAfter())

	// and a permit lets the next call be the probe.
	b.PermitProbe()
	probe, _, err := b.Allow()
	require.NoError(t, err)
	require.True(t, probe.Probe())

	// When that probe fails, the next open period needs a permit of its own.
	b.Done(probe, true, 0)
	clk.Advance(time.Hour)
	_, _, err = b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)

	// A permit given before the period ends waits for its end;
	b.PermitProbe()
	b.AdoptOpen(5*time.Second, 0)
	clk.Advance(5 * time.Second)
	_, _, err = b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen, "an adopted open period withdraws the permit")
	b.PermitProbe()
	probe, _, err = b.Allow()
	require.NoError(t, err)
	b.Done(probe, false, 0)
	assert.Equal(t, breaker.Closed, b.Snapshot().State)

	// and on a closed breaker a permit does nothing.
	b.PermitProbe()
	trip(t, b, 2)
	clk.Advance(time.Hour)
	_, _, err = b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
}

func TestWithdrawPermit(t *testing.T) {
	// Given a breaker that needs a permit to probe, open with its period
	// passed and a permit given,
	b, clk, _ := newSharedBreaker(t, true)
	trip(t, b, 2)
	clk.Advance(time.Minute)
	b.PermitProbe()

	// when the permit is taken back before any call used it, the breaker
	// refuses again, with no time to wait,
	require.True(t, b.WithdrawPermit())
	_, wait, err := b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
	assert.Zero(t, wait)
	assert.False(t, b.WithdrawPermit(), "nothing left to take back")

	// and a permit given again admits the probe, which then cannot be taken
	// back: the breaker is half-open, the permit used.
	b.PermitProbe()
	probe, _, err := b.Allow()
	require.NoError(t, err)
	assert.False(t, b.WithdrawPermit())
	b.Done(probe, false, 0)
	assert.Equal(t, breaker.Closed, b.Snapshot().State)
	assert.False(t, b.WithdrawPermit(), "a closed breaker has no permit")

	// A permit given before the period ends and taken back leaves the
	// period as it was.
	trip(t, b, 2)
	b.PermitProbe()
	require.True(t, b.WithdrawPermit())
	assert.Equal(t, 10*time.Second, b.RetryAfter())
}
