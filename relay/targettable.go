package relay

import (
	"sync"
	"sync/atomic"

	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// targetTable is the Server's targets: the table in force, the defaults
// of a target without settings of its own, and what Reload keeps between
// tables.
type targetTable struct {
	// list is the table of targets, replaced whole by Reload: the hot
	// path reads it without a lock.
	list         atomic.Pointer[[]*target]
	defaults     TargetSettings // effective settings of a target without its own
	defaultCodes []string       // the failure codes of defaults, parsed
	// defaultExpect are the probe codes of defaults, parsed.
	defaultExpect []string
	reloadMu      sync.Mutex // held by Reload: one at a time
	// retired holds the targets a reload removed, by name, so that a
	// target added back gets its breaker back: its state and its line of
	// the breaker log go on where they stopped. Guarded by reloadMu.
	retired map[string]*target
	// conns holds every open target connection, so that abortCalls can
	// cut the calls blocked on them.
	conns *targethttp.Conns
}

// lookup returns the target for a name as a client wrote it, matched
// in ASCII case only (protocol.MatchesTarget), or nil. A linear scan: there
// are few targets, and it needs no allocation to fold case.
func (t *targetTable) lookup(name []byte) *target {
	for _, r := range t.all() {
		if protocol.MatchesTarget(r.nameBytes, name) {
			return r
		}
	}
	return nil
}

// all returns the targets in force, in configuration order. The slice
// is never changed: a reload stores a new one.
func (t *targetTable) all() []*target {
	return *t.list.Load()
}

// callsInFlight reports whether any target has a call in flight.
func (t *targetTable) callsInFlight() bool {
	for _, rt := range t.all() {
		if rt.bulkhead.InFlight() > 0 {
			return true
		}
	}
	return false
}
