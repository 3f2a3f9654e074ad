package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLaneInForceForgetsCallsOnceRecentHasPassed checks that the lane's
// record of the last calls is cleared once laneCallsRecent has passed with
// no call in flight, so that a hub which then only refuses asks no clock,
// and that the lane stays in force within laneCallsRecent of calls.
func TestLaneInForceForgetsCallsOnceRecentHasPassed(t *testing.T) {
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	srv := openCoreServer(t, cfg)
	require.False(t, srv.callsInFlight())

	// Given calls last seen in flight just now: the lane is in force.
	recent := time.Now().UnixNano()
	srv.lane.callsAt.Store(recent)
	assert.True(t, srv.laneInForce())
	assert.Equal(t, recent, srv.lane.callsAt.Load())

	// When laneCallsRecent has passed since: not in force, and forgotten.
	srv.lane.callsAt.Store(time.Now().Add(-2 * laneCallsRecent).UnixNano())
	assert.False(t, srv.laneInForce())
	assert.Zero(t, srv.lane.callsAt.Load())

	// Then, with no calls since, it stays out of force.
	assert.False(t, srv.laneInForce())
	assert.Zero(t, srv.lane.callsAt.Load())
}
