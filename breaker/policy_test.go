package breaker_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

// newPolicyBreaker builds a breaker named CORE from s on a fake clock that
// reads start, with a recorder observing its transitions.
func newPolicyBreaker(t *testing.T, s breaker.Settings) (*breaker.Breaker, *fakeclock.Clock, *recorder) {
	t.Helper()
	clk := fakeclock.New(start)
	rec := &recorder{}
	s.Name = "CORE"
	s.Clock = clk
	s.OnTransition = rec.observe
	return breaker.New(s), clk, rec
}

// callAfter makes one admitted call that took took.
func callAfter(t *testing.T, b *breaker.Breaker, failed bool, took time.Duration) {
	t.Helper()
	tk, _, err := b.Allow()
	require.NoError(t, err)
	b.Done(tk, failed, took)
}

// probe moves an open breaker to HALF_OPEN and returns the probe's ticket.
func probe(t *testing.T, b *breaker.Breaker, clk *fakeclock.Clock) breaker.Ticket {
	t.Helper()
	clk.Advance(b.RetryAfter())
	tk, _, err := b.Allow()
	require.NoError(t, err)
	require.True(t, tk.Probe())
	return tk
}

// sequence returns a random source that hands out values in turn, starting
// over at the end, and a count of its calls.
func sequence(values ...float64) (func() float64, *int) {
	calls := 0
	return func() float64 {
		v := values[calls%len(values)]
		calls++
		return v
	}, &calls
}

func TestSettingsEffective(t *testing.T) {
	tests := []struct {
		name string
		in   breaker.Settings
		want breaker.Settings
	}{
		{
			name: "zero settings get the plain defaults and no policy",
			in:   breaker.Settings{},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second}},
		},
		{
			name: "failure rate fills in window and minimum",
			in:   breaker.Settings{Policy: breaker.Policy{FailureRate: 0.5}},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second, FailureRate: 0.5, Window: time.Minute, MinSamples: 20}},
		},
		{
			name: "failure rate above one means one",
			in:   breaker.Settings{Policy: breaker.Policy{FailureRate: 3, Window: time.Second, MinSamples: 4}},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second, FailureRate: 1, Window: time.Second, MinSamples: 4}},
		},
		{
			name: "window and minimum without a rate are off",
			in:   breaker.Settings{Policy: breaker.Policy{FailureRate: math.NaN(), Window: time.Second, MinSamples: 4}},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second}},
		},
		{
			name: "backoff not above the reset timeout is off",
			in:   breaker.Settings{Policy: breaker.Policy{ResetTimeout: time.Second, MaxResetTimeout: time.Second}},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: time.Second}},
		},
		{
			name: "backoff above the default reset timeout is kept",
			in:   breaker.Settings{Policy: breaker.Policy{MaxResetTimeout: time.Minute}},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second, MaxResetTimeout: time.Minute}},
		},
		{
			name: "jitter above one means one, negative durations are off",
			in:   breaker.Settings{Policy: breaker.Policy{ResetJitter: 1.5, SlowCall: -time.Second}, ProbeTimeout: -time.Second},
			want: breaker.Settings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second, ResetJitter: 1}},
		},
		{
			name: "every policy on keeps its values",
			in: breaker.Settings{
				Name: "CLAIM", Policy: breaker.Policy{
					FailThreshold:   3,
					ResetTimeout:    2 * time.Second,
					FailureRate:     0.25,
					Window:          30 * time.Second,
					MinSamples:      8,
					SlowCall:        time.Second,
					MaxResetTimeout: time.Minute,
					ResetJitter:     0.2,
				},
				ProbeTimeout: 4 * time.Second,
			},
			want: breaker.Settings{
				Name: "CLAIM", Policy: breaker.Policy{
					FailThreshold:   3,
					ResetTimeout:    2 * time.Second,
					FailureRate:     0.25,
					Window:          30 * time.Second,
					MinSamples:      8,
					SlowCall:        time.Second,
					MaxResetTimeout: time.Minute,
					ResetJitter:     0.2,
				},
				ProbeTimeout: 4 * time.Second,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := breaker.New(tt.in).Settings()
			assert.NotNil(t, got.Clock)
			assert.NotNil(t, got.Rand)
			got.Clock, got.Rand = nil, nil
			assert.Equal(t, tt.want, got)
		})
	}

	t.Run("given seams are kept", func(t *testing.T) {
		clk := fakeclock.New(start)
		got := breaker.New(breaker.Settings{Clock: clk}).Settings()
		assert.Same(t, clk, got.Clock)
	})
}

func TestFailureRate(t *testing.T) {
	rate := breaker.Settings{Policy: breaker.Policy{FailThreshold: 100, FailureRate: 0.5, Window: 10 * time.Second, MinSamples: 10}}

	t.Run("opens only with both the share and the minimum", func(t *testing.T) {
		// Given a breaker that opens at half failures among ten or more
		b, _, rec := newPolicyBreaker(t, rate)

		// When nine results come in, five of them failed
		for range 4 {
			callAfter(t, b, true, 0)
			callAfter(t, b, false, 0)
		}
		callAfter(t, b, true, 0)

		// Then the share is enough but the minimum is not
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 1, RecentCalls: 9, RecentFailures: 5}, b.Snapshot())

		// When the tenth result, a success, still leaves half of them failed
		callAfter(t, b, false, 0)

		// Then the breaker opens and the window starts empty
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, RetryAfter: 10 * time.Second}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("stays closed below the share", func(t *testing.T) {
		// Given a breaker that opens at half failures among ten or more
		b, _, rec := newPolicyBreaker(t, rate)

		// When fifty results come in, two in five of them failed
		for range 10 {
			callAfter(t, b, false, 0)
			callAfter(t, b, false, 0)
			callAfter(t, b, false, 0)
			callAfter(t, b, true, 0)
			callAfter(t, b, true, 0)
		}

		// Then it stays closed
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 2, RecentCalls: 50, RecentFailures: 20}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})

	t.Run("an exact share opens", func(t *testing.T) {
		// Given a rate of 0.3, which has no exact binary form
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 100, FailureRate: 0.3, Window: time.Second, MinSamples: 10}})

		// When three of ten results failed
		for range 7 {
			callAfter(t, b, false, 0)
		}
		callAfter(t, b, true, 0)
		callAfter(t, b, true, 0)
		require.Equal(t, breaker.Closed, b.Snapshot().State)
		callAfter(t, b, true, 0)

		// Then the breaker opens
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})

	t.Run("old results slide out of the window", func(t *testing.T) {
		// Given four failures that would open the breaker with one more sample
		b, clk, rec := newPolicyBreaker(t, rate)
		for range 4 {
			callAfter(t, b, true, 0)
		}
		clk.Advance(5 * time.Second)
		for range 5 {
			callAfter(t, b, false, 0)
		}
		require.Equal(t, 9, b.Snapshot().RecentCalls)

		// When the clock reaches one window after the first four
		clk.Advance(5*time.Second - time.Nanosecond)
		assert.Equal(t, 9, b.Snapshot().RecentCalls, "a result younger than the window still counts")
		clk.Advance(time.Nanosecond)

		// Then they no longer count, and the next failure cannot open it
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, RecentCalls: 5}, b.Snapshot())
		callAfter(t, b, true, 0)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 1, RecentCalls: 6, RecentFailures: 1}, b.Snapshot())

		// And after a long quiet spell the window is empty
		clk.Advance(time.Hour)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 1}, b.Snapshot())
		assert.Empty(t, rec.chain())
	})

	t.Run("the window is cleared when the breaker closes", func(t *testing.T) {
		// Given a breaker opened by its failure rate
		b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 100, ResetTimeout: time.Second, FailureRate: 0.5, Window: time.Minute, MinSamples: 4}})
		for range 4 {
			callAfter(t, b, true, 0)
		}
		require.Equal(t, breaker.Open, b.Snapshot().State)

		// When a probe closes it
		b.Done(probe(t, b, clk), false, 0)

		// Then it starts from an empty window: three failures are below the minimum
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
		for range 3 {
			callAfter(t, b, true, 0)
		}
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		callAfter(t, b, true, 0)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED", "CLOSED->OPEN"}, rec.chain())
	})

	t.Run("the consecutive count still opens and clears the window", func(t *testing.T) {
		// Given both rules, the count being the stricter
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 3, FailureRate: 0.9, Window: time.Minute, MinSamples: 50}})

		// When three calls fail in a row
		for range 3 {
			callAfter(t, b, true, 0)
		}

		// Then the count opens it and the window is empty
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 3, RetryAfter: 10 * time.Second}, b.Snapshot())
	})

	t.Run("a stale result is not counted", func(t *testing.T) {
		// Given a call admitted before the breaker opened and closed again
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Second, FailureRate: 0.5, Window: time.Minute, MinSamples: 1}})
		old, _, err := b.Allow()
		require.NoError(t, err)
		callAfter(t, b, true, 0)
		b.Done(probe(t, b, clk), false, 0)
		require.Equal(t, breaker.Closed, b.Snapshot().State)

		// When it reports a failure
		b.Done(old, true, 0)

		// Then neither the window nor the count saw it
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
	})

	t.Run("the closed path does not allocate", func(t *testing.T) {
		b := breaker.New(breaker.Settings{Policy: breaker.Policy{FailureRate: 0.5}})
		allocs := testing.AllocsPerRun(1000, func() {
			tk, _, _ := b.Allow()
			b.Done(tk, false, 0)
		})
		assert.Zero(t, allocs)
	})
}

func TestSlowCalls(t *testing.T) {
	t.Run("classification", func(t *testing.T) {
		tests := []struct {
			name     string
			slowCall time.Duration
			failed   bool
			took     time.Duration
			want     int // consecutive failures after the call
		}{
			{name: "fast success", slowCall: time.Second, took: time.Second / 2, want: 0},
			{name: "success exactly at the limit", slowCall: time.Second, took: time.Second, want: 0},
			{name: "slow success", slowCall: time.Second, took: time.Second + time.Nanosecond, want: 1},
			{name: "fast failure", slowCall: time.Second, failed: true, took: time.Millisecond, want: 1},
			{name: "slow failure", slowCall: time.Second, failed: true, took: time.Minute, want: 1},
			{name: "policy off", took: time.Hour, want: 0},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 3, SlowCall: tt.slowCall}})
				callAfter(t, b, tt.failed, tt.took)
				assert.Equal(t, tt.want, b.Snapshot().ConsecutiveFailures)
			})
		}
	})

	t.Run("slow successes open by the consecutive count", func(t *testing.T) {
		// Given a breaker that calls a success over a second slow
		b, _, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 2, SlowCall: time.Second}})

		// When a fast success follows a slow one, the count clears
		callAfter(t, b, false, 2*time.Second)
		callAfter(t, b, false, time.Millisecond)
		require.Zero(t, b.Snapshot().ConsecutiveFailures)

		// When two slow successes come in a row
		callAfter(t, b, false, 2*time.Second)
		callAfter(t, b, false, 2*time.Second)

		// Then the breaker opens
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("Done is never slow", func(t *testing.T) {
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, SlowCall: time.Nanosecond}})
		call(t, b, false)
		assert.Equal(t, breaker.Snapshot{State: breaker.Closed}, b.Snapshot())
	})

	t.Run("slow successes count in the failure rate", func(t *testing.T) {
		// Given a breaker that opens at half failures among four
		b, _, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 100, SlowCall: time.Second, FailureRate: 0.5, Window: time.Minute, MinSamples: 4}})

		// When two of four successes are slow
		callAfter(t, b, false, 2*time.Second)
		callAfter(t, b, false, 0)
		callAfter(t, b, false, 2*time.Second)
		require.Equal(t, breaker.Snapshot{State: breaker.Closed, ConsecutiveFailures: 1, RecentCalls: 3, RecentFailures: 2}, b.Snapshot())
		callAfter(t, b, false, 0)

		// Then the breaker opens
		assert.Equal(t, breaker.Open, b.Snapshot().State)
	})

	t.Run("a slow probe reopens the breaker", func(t *testing.T) {
		// Given a half-open breaker
		b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Second, SlowCall: time.Second}})
		trip(t, b, 1)
		p := probe(t, b, clk)

		// When the probe succeeds, but slowly
		b.Done(p, false, 3*time.Second)

		// Then the breaker opens again for a full reset timeout
		assert.Equal(t, breaker.Snapshot{State: breaker.Open, ConsecutiveFailures: 2, RetryAfter: time.Second}, b.Snapshot())
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, rec.chain())
	})
}

func TestBackoff(t *testing.T) {
	// failProbe lets the open period pass, fails the probe and returns the
	// new open period.
	failProbe := func(t *testing.T, b *breaker.Breaker, clk *fakeclock.Clock) time.Duration {
		t.Helper()
		b.Done(probe(t, b, clk), true, 0)
		require.Equal(t, breaker.Open, b.Snapshot().State)
		return b.RetryAfter()
	}

	t.Run("each failed probe doubles the period up to the cap", func(t *testing.T) {
		// Given a breaker with a reset timeout of 10 s, backing off to 35 s
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: 35 * time.Second}})
		trip(t, b, 1)
		require.Equal(t, 10*time.Second, b.RetryAfter())

		// When probes keep failing
		// Then the period doubles, then stays at the cap
		assert.Equal(t, 20*time.Second, failProbe(t, b, clk))
		assert.Equal(t, 35*time.Second, failProbe(t, b, clk))
		assert.Equal(t, 35*time.Second, failProbe(t, b, clk))

		// And the breaker refuses for exactly that long
		clk.Advance(35*time.Second - time.Nanosecond)
		_, _, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
	})

	t.Run("a successful probe brings it back", func(t *testing.T) {
		// Given a breaker backed off to 40 s
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: time.Minute}})
		trip(t, b, 1)
		failProbe(t, b, clk)
		require.Equal(t, 40*time.Second, failProbe(t, b, clk))

		// When a probe succeeds and the breaker opens again
		b.Done(probe(t, b, clk), false, 0)
		trip(t, b, 1)

		// Then the period is the reset timeout again
		assert.Equal(t, 10*time.Second, b.RetryAfter())
		assert.Equal(t, 20*time.Second, failProbe(t, b, clk))
	})

	t.Run("ForceClose brings it back", func(t *testing.T) {
		// Given a breaker backed off to 40 s
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: time.Minute}})
		trip(t, b, 1)
		failProbe(t, b, clk)
		require.Equal(t, 40*time.Second, failProbe(t, b, clk))

		// When an operator forces it closed and it opens again
		b.ForceClose()
		trip(t, b, 1)

		// Then the period is the reset timeout again
		assert.Equal(t, 10*time.Second, b.RetryAfter())
	})

	t.Run("no backoff unless the cap is above the reset timeout", func(t *testing.T) {
		for _, maxReset := range []time.Duration{0, 5 * time.Second, 10 * time.Second} {
			b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: maxReset}})
			trip(t, b, 1)
			assert.Equal(t, 10*time.Second, failProbe(t, b, clk), "max %s", maxReset)
			assert.Equal(t, 10*time.Second, failProbe(t, b, clk), "max %s", maxReset)
		}
	})
}

func TestJitter(t *testing.T) {
	t.Run("a fixed share lengthens the period exactly", func(t *testing.T) {
		// Given a breaker with up to 50% jitter and a source that always says 0.25
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{
			Policy: breaker.Policy{
				FailThreshold: 1,
				ResetTimeout:  10 * time.Second,
				ResetJitter:   0.5,
			},
			Rand: func() float64 { return 0.25 },
		})

		// When it opens
		trip(t, b, 1)

		// Then the period is 10 s × (1 + 0.25 × 0.5), reported and enforced
		assert.Equal(t, 11250*time.Millisecond, b.RetryAfter())
		clk.Advance(11250*time.Millisecond - time.Nanosecond)
		_, _, err := b.Allow()
		require.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, time.Nanosecond, b.RetryAfter())
		clk.Advance(time.Nanosecond)
		tk, _, err := b.Allow()
		require.NoError(t, err)
		assert.True(t, tk.Probe())
	})

	t.Run("each open period draws once and stays within bounds", func(t *testing.T) {
		// Given a source that hands out edge values, some out of range
		rnd, calls := sequence(0, 0.5, 0.999, 1.7, -0.3, math.NaN())
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, ResetJitter: 0.2}, Rand: rnd})
		require.Equal(t, 1, *calls, "New draws the share of the first period")

		// When the breaker opens six times
		// Then each period uses the next share, clamped into [0, 1]
		want := []time.Duration{
			10 * time.Second,
			11 * time.Second,
			11998 * time.Millisecond,
			12 * time.Second,
			10 * time.Second,
			10 * time.Second,
		}
		trip(t, b, 1)
		for i, w := range want {
			got := b.RetryAfter()
			assert.Equal(t, w, got, "period %d", i)
			assert.GreaterOrEqual(t, got, 10*time.Second)
			assert.LessOrEqual(t, got, 12*time.Second)
			b.Done(probe(t, b, clk), true, 0)
		}
		assert.Equal(t, 1+len(want)+1, *calls, "one draw per open period, plus the one ahead")
	})

	t.Run("jitter applies on top of backoff", func(t *testing.T) {
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{
			Policy: breaker.Policy{
				FailThreshold:   1,
				ResetTimeout:    10 * time.Second,
				MaxResetTimeout: time.Minute,
				ResetJitter:     0.5,
			},
			Rand: func() float64 { return 0.5 },
		})
		trip(t, b, 1)
		assert.Equal(t, 12500*time.Millisecond, b.RetryAfter())
		b.Done(probe(t, b, clk), true, 0)
		assert.Equal(t, 25*time.Second, b.RetryAfter())
	})

	t.Run("the default source stays within bounds", func(t *testing.T) {
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, ResetJitter: 0.3}})
		trip(t, b, 1)
		for range 50 {
			got := b.RetryAfter()
			assert.GreaterOrEqual(t, got, 10*time.Second)
			assert.LessOrEqual(t, got, 13*time.Second)
			b.Done(probe(t, b, clk), true, 0)
		}
	})

	t.Run("the source runs outside the breaker's lock", func(t *testing.T) {
		// Given a source that reads the breaker, which would deadlock under its lock
		var b *breaker.Breaker
		reads := 0
		rnd := func() float64 {
			if b != nil {
				_ = b.Snapshot()
				reads++
			}
			return 0.5
		}
		b, _, _ = newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetJitter: 0.1}, Rand: rnd})

		// When the breaker opens
		trip(t, b, 1)

		// Then the next share was drawn without trouble
		assert.Equal(t, 1, reads)
		assert.Equal(t, 10500*time.Millisecond, b.RetryAfter())
	})
}

func TestProbeTimeout(t *testing.T) {
	t.Run("a silent probe is replaced after the timeout", func(t *testing.T) {
		// Given a half-open breaker whose probe does not report
		b, clk, rec := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second}, ProbeTimeout: 4 * time.Second})
		trip(t, b, 1)
		first := probe(t, b, clk)

		// When the timeout has not quite passed, nothing else is admitted
		clk.Advance(4*time.Second - time.Nanosecond)
		_, _, err := b.Allow()
		require.ErrorIs(t, err, breaker.ErrOpen)

		// When it has passed
		clk.Advance(time.Nanosecond)
		second, _, err := b.Allow()

		// Then a second probe is admitted, with a timeout of its own, and no state changes
		require.NoError(t, err)
		assert.True(t, second.Probe())
		_, _, err = b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)

		// And the first probe's late result, whatever it is, is ignored
		b.Done(first, true, 0)
		b.Done(first, false, 0)
		b.Cancel(first)
		assert.Equal(t, breaker.HalfOpen, b.Snapshot().State)
		_, _, err = b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen, "the old ticket cannot free the new probe's slot")

		// And the second probe decides
		b.Done(second, false, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, rec.chain())
	})

	t.Run("off: the breaker waits for its probe", func(t *testing.T) {
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Second}})
		trip(t, b, 1)
		first := probe(t, b, clk)
		clk.Advance(1000 * time.Hour)
		_, _, err := b.Allow()
		assert.ErrorIs(t, err, breaker.ErrOpen)
		b.Done(first, false, 0)
		assert.Equal(t, breaker.Closed, b.Snapshot().State)
	})

	t.Run("a replaced probe does not back off", func(t *testing.T) {
		// Given a breaker with backoff whose first probe never reports
		b, clk, _ := newPolicyBreaker(t, breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: 10 * time.Second, MaxResetTimeout: time.Minute}, ProbeTimeout: time.Second})
		trip(t, b, 1)
		probe(t, b, clk)
		clk.Advance(time.Second)
		second, _, err := b.Allow()
		require.NoError(t, err)

		// When the replacement fails
		b.Done(second, true, 0)

		// Then the period doubled once, not twice
		assert.Equal(t, 20*time.Second, b.RetryAfter())
	})
}

func BenchmarkClosedAllowSuccessRateWindow(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{FailureRate: 0.5, Window: 10 * time.Second, MinSamples: 20}})
	b.ReportAllocs()
	for b.Loop() {
		tk, _, _ := br.Allow()
		br.Done(tk, false, 0)
	}
}

func BenchmarkClosedAllowSuccessRateWindowParallel(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{FailureRate: 0.5, Window: 10 * time.Second, MinSamples: 20}})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tk, _, _ := br.Allow()
			br.Done(tk, false, 0)
		}
	})
}

func BenchmarkClosedAllowSuccessSlowCall(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{SlowCall: time.Second}})
	b.ReportAllocs()
	for b.Loop() {
		tk, _, _ := br.Allow()
		br.Done(tk, false, time.Millisecond)
	}
}
