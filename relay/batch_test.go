package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBatchNowIsTheRunsReadingOfTheSystemClock checks where the read loop
// takes the clock reading that restarts the idle measure after a batch:
// the breakers' reading for the run when it is the system clock's and no
// answer was written since it, else a fresh reading.
func TestBatchNowIsTheRunsReadingOfTheSystemClock(t *testing.T) {
	systemClock := func(t *testing.T) *conn {
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		cfg.Clock = nil
		nc, _ := tcpPair(t)
		return newConn(openCoreServer(t, cfg), nc)
	}
	injectedClock := func(t *testing.T) *conn {
		cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
		nc, _ := tcpPair(t)
		return newConn(openCoreServer(t, cfg), nc)
	}

	t.Run("a run of refusals", func(t *testing.T) {
		c := systemClock(t)
		// Given refusals that read the system clock for their run.
		before := time.Now()
		c.serveLine([]byte("R1|CORE|x"))
		c.serveLine([]byte("R2|CORE|x"))
		require.False(t, c.run.Before(before), "the run's reading is taken while the lines are served")
		// Then the batch ends at that reading: no clock is read again.
		assert.Equal(t, c.run, c.batchNow())
	})
	t.Run("an answer written since", func(t *testing.T) {
		c := systemClock(t)
		c.serveLine([]byte("R1|CORE|x"))
		run := c.run
		// Given an answer written after the run began: it may have waited.
		c.flush()
		// Then the batch ends at a fresh reading.
		now := c.batchNow()
		assert.NotEqual(t, run, now)
		assert.False(t, now.Before(run))
	})
	t.Run("no breaker read the clock", func(t *testing.T) {
		c := systemClock(t)
		before := time.Now()
		c.serveLine([]byte("U1|NONE|x"))
		require.True(t, c.run.IsZero())
		assert.False(t, c.batchNow().Before(before))
	})
	t.Run("the breakers' clock is injected", func(t *testing.T) {
		c := injectedClock(t)
		c.serveLine([]byte("R1|CORE|x"))
		require.False(t, c.run.IsZero())
		before := time.Now()
		// Then its reading is not the system clock's: a fresh one is taken.
		now := c.batchNow()
		assert.NotEqual(t, c.run, now)
		assert.False(t, now.Before(before))
	})
}
