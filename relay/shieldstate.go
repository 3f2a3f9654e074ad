package relay

import (
	"sync/atomic"

	"github.com/relayhub/relayhub/relay/dedup"
)

// shieldState is the duplicate-TXID shield of a Server: the hub's memory
// of transactions, the fleet's store (nil: none), and how the store's
// commands went.
type shieldState struct {
	mem            *dedup.Shield
	store          dedup.Store
	storeDown      atomic.Bool  // the store failed its latest command
	storeFallbacks atomic.Int64 // the store's commands that failed, shielded on mem alone
}

// trackStore records how a command to the fleet's store went: a failure is
// counted as a fallback to this hub's memory, and the first of a run of
// them, like the first success after, is logged.
func (s *Server) trackStore(err error) {
	if err != nil {
		s.shield.storeFallbacks.Add(1)
		if !s.shield.storeDown.Swap(true) {
			s.obs.log.Warn().Err(err).Msg("dedup store unusable: shielding on this hub's memory only")
		}
		return
	}
	if s.shield.storeDown.Swap(false) {
		s.obs.log.Info().Msg("dedup store usable again: shield shared with the fleet")
	}
}

// DedupStoreDown reports whether the fleet's store failed the shield's
// latest command, so that the hub shields on its own memory.
func (s *Server) DedupStoreDown() bool { return s.shield.storeDown.Load() }
