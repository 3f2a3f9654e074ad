// Package filelimit is the arithmetic of the relay's file descriptors: how
// many it may hold open at once (Needed), and how many the process may
// have (Raise, which first raises the soft limit to the hard one, as the Go
// runtime does at start; under systemd the hard limit is the unit's
// LimitNOFILE). Past the limit, connections fail to be accepted and
// targets fail to be dialled, so the relay refuses at start a
// configuration the limit cannot hold.
//
// Typical use:
//
//	need := filelimit.Needed(maxConns, []int{10, 10}, filelimit.StoreConns(false))
//	if limit, ok := filelimit.Raise(); ok && limit < need {
//		return fmt.Errorf("needs about %d descriptors but the limit is %d", need, limit)
//	}
package filelimit

import (
	"runtime"

	"github.com/relayhub/relayhub/relay"
)

// What the relay holds open besides its connections to clients and
// targets, counted by Needed.
const (
	// fdLogs: the breaker log, the in-doubt journal and the access log,
	// each of which may be open twice for a moment while SIGHUP reopens it.
	fdLogs = 6
	// fdListeners: the client port and the admin port.
	fdListeners = 2
	// fdAdmin: connections to the admin port (scrapes, status pages,
	// relayctl).
	fdAdmin = 16
	// fdReserve: the standard streams, the Go runtime's poller, the files
	// a reload reads (settings, TLS), the shield's look-ups of calls in
	// doubt.
	fdReserve = 32
)

// Needed is how many files the relay may hold open at once: a connection
// for each of maxConns clients and for each of the relay.MaxTurningAway
// connections it may be turning away, three for each call a target's
// bulkhead admits (the call's, as many idle kept-alive in the target's
// pool, and as many read on for a late answer), storeConns to a fleet's store, and its logs, listeners, admin
// connections and a reserve.
func Needed(maxConns int, bulkheads []int, storeConns int) uint64 {
	n := uint64(maxConns) + relay.MaxTurningAway + uint64(storeConns) + fdLogs + fdListeners + fdAdmin + fdReserve
	for _, b := range bulkheads {
		n += 3 * uint64(b)
	}
	return n
}

// StoreConns is how many connections the relay may hold to a fleet's
// state store: go-redis's default pool of ten a CPU, its subscription,
// and Sentinel's; none without a store.
func StoreConns(store bool) int {
	if !store {
		return 0
	}
	return 10*runtime.GOMAXPROCS(0) + 4
}
