package relay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
)

func TestCallHoldReleasesOnce(t *testing.T) {
	// Given a hold admitted by CORE's breaker with one of its slots.
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	rt := srv.table.lookup([]byte("CORE"))
	a, _ := sinkAdmitter(srv)
	var h callHold
	h.take(a)
	ticket, _, err := rt.breaker.Allow()
	require.NoError(t, err)
	h.admitted(rt, ticket)
	require.True(t, h.takeSlot())
	require.EqualValues(t, 1, srv.serving.activeCalls.Load())

	// When it moves to another goroutine's keeping.
	moved := h.handOff()

	// Then the hold it left is empty: releasing it gives nothing back.
	assert.False(t, h.held())
	h.release()
	assert.EqualValues(t, 1, srv.serving.activeCalls.Load())
	assert.Equal(t, 1, rt.bulkhead.InFlight())

	// When the moved hold is released twice.
	moved.release()
	moved.release()

	// Then the slot, the ticket and the counts went back once.
	assert.Zero(t, srv.serving.activeCalls.Load())
	assert.Zero(t, rt.bulkhead.InFlight())
	snap := rt.breaker.Snapshot()
	assert.Equal(t, breaker.Closed, snap.State)
	assert.Zero(t, snap.ConsecutiveFailures, "a ticket handed back is neither success nor failure")
	a.calls.Wait() // the connection's count is down too: this returns
}

func TestCallHoldHandsBackOnlyWhatItStillHolds(t *testing.T) {
	// Given a hold whose ticket was recorded as a failure and whose slot
	// went back.
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.FailThreshold = 2
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, srv.Close()) })
	rt := srv.table.lookup([]byte("CORE"))
	a, _ := sinkAdmitter(srv)
	var h callHold
	h.take(a)
	ticket, _, err := rt.breaker.Allow()
	require.NoError(t, err)
	h.admitted(rt, ticket)
	require.True(t, h.takeSlot())
	h.recordTicket(true, 0)
	h.releaseSlot()

	// When it is released.
	handedBack := h.handBack()
	h.release()

	// Then neither the ticket nor the slot goes back a second time.
	assert.False(t, handedBack)
	assert.Zero(t, rt.bulkhead.InFlight())
	assert.Equal(t, 1, rt.breaker.Snapshot().ConsecutiveFailures)
	assert.Zero(t, srv.serving.activeCalls.Load())
}
