package filelimit

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/relayhub/relayhub/relay"
)

func TestNeeded(t *testing.T) {
	// The default configuration: 10000 clients, as many as 1024 turned
	// away, two bulkheads of 10 with as many idle connections and as many
	// read on for late answers, and the
	// files, listeners and admin connections.
	const files = fdLogs + fdListeners + fdAdmin + fdReserve
	assert.Equal(t, uint64(10000+relay.MaxTurningAway+60+files), Needed(10000, []int{10, 10}, 0))
	assert.Equal(t, uint64(1+relay.MaxTurningAway+files), Needed(1, nil, 0))
	assert.Equal(t, uint64(1+relay.MaxTurningAway+files+7), Needed(1, nil, 7), "a fleet's store")
	assert.Zero(t, StoreConns(false))
	assert.Positive(t, StoreConns(true))
}
