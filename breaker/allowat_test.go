package breaker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
)

func TestAllowAt(t *testing.T) {
	t.Run("a fresh reading refuses as Allow does", func(t *testing.T) {
		// Given a breaker that opened 3 s ago with a 10 s reset timeout
		b, clk, _ := newBreaker(t, 1, 10*time.Second)
		trip(t, b, 1)
		clk.Advance(3 * time.Second)

		// When asked with the clock's reading and without
		_, waitAt, errAt := b.AllowAt(clk.Now())
		_, wait, err := b.Allow()

		// Then both refuse alike
		assert.ErrorIs(t, errAt, breaker.ErrOpen)
		assert.Equal(t, err, errAt)
		assert.Equal(t, 7*time.Second, waitAt)
		assert.Equal(t, wait, waitAt)
	})

	t.Run("an old reading refuses with the wait from it", func(t *testing.T) {
		// Given a breaker whose open period has passed by the clock
		b, clk, rec := newBreaker(t, 1, 10*time.Second)
		trip(t, b, 1)
		clk.Advance(12 * time.Second)

		// When asked with a reading taken before the period passed
		_, wait, err := b.AllowAt(start.Add(7 * time.Second))

		// Then it refuses, with the wait from that reading, and stays open
		assert.ErrorIs(t, err, breaker.ErrOpen)
		assert.Equal(t, 3*time.Second, wait)
		assert.Equal(t, breaker.Open, b.Snapshot().State)
		assert.Equal(t, []string{"CLOSED->OPEN"}, rec.chain())
	})

	t.Run("a change is stamped with the reading", func(t *testing.T) {
		// Given a breaker whose open period has passed by the clock
		b, clk, rec := newBreaker(t, 1, 10*time.Second)
		trip(t, b, 1)
		clk.Advance(12 * time.Second)

		// When asked with a reading 2 s old, after the period passed
		reading := start.Add(10 * time.Second)
		tk, wait, err := b.AllowAt(reading)

		// Then it admits the probe, and the change carries the reading
		require.NoError(t, err)
		assert.True(t, tk.Probe())
		assert.Zero(t, wait)
		changes := rec.list()
		require.Len(t, changes, 2)
		assert.Equal(t, breaker.HalfOpen, changes[1].To)
		assert.Equal(t, reading, changes[1].At)

		// And with its probe out it refuses whatever the reading
		_, _, err = b.AllowAt(clk.Now())
		assert.ErrorIs(t, err, breaker.ErrOpen)
	})

	t.Run("a closed breaker admits without the reading", func(t *testing.T) {
		b, _, _ := newBreaker(t, 1, 10*time.Second)
		tk, wait, err := b.AllowAt(time.Time{})
		require.NoError(t, err)
		assert.False(t, tk.Probe())
		assert.Zero(t, wait)
	})

	t.Run("a held breaker refuses as held", func(t *testing.T) {
		b, clk, _ := newBreaker(t, 1, time.Second)
		trip(t, b, 1)
		b.HoldOpen()
		clk.Advance(time.Hour)
		_, wait, err := b.AllowAt(clk.Now())
		assert.ErrorIs(t, err, breaker.ErrHeld)
		assert.Zero(t, wait)
	})
}

func TestOpenRefusalAtDoesNotAllocate(t *testing.T) {
	b, clk, _ := newBreaker(t, 1, time.Hour)
	trip(t, b, 1)
	now := clk.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		_, _, _ = b.AllowAt(now)
	})
	assert.Zero(t, allocs)
}

// BenchmarkOpenRefuseAt compares, in the same run, an open breaker's
// refusal by Allow, which reads the system clock, with AllowAt given a
// reading taken once, as a connection does for a batch of lines.
func BenchmarkOpenRefuseAt(b *testing.B) {
	br := breaker.New(breaker.Settings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Hour}})
	tk, _, _ := br.Allow()
	br.Done(tk, true, 0)
	b.Run("Allow", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := br.Allow(); err == nil {
				b.Fatal("admitted while open")
			}
		}
	})
	b.Run("AllowAt", func(b *testing.B) {
		now := time.Now()
		for b.Loop() {
			if _, _, err := br.AllowAt(now); err == nil {
				b.Fatal("admitted while open")
			}
		}
	})
}
