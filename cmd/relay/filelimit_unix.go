//go:build unix

package main

import (
	"syscall"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
)

// checkFileLimit warns when the process may not open as many files as the
// configuration needs (the Go runtime has already raised its soft limit
// to the hard one): past the limit, connections fail to be accepted and
// targets fail to be dialled. Under systemd the limit is the unit's
// LimitNOFILE.
func checkFileLimit(srv *relay.Server, maxConns int, logger zerolog.Logger) {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return
	}
	var bulkheads []int
	for _, t := range srv.Targets() {
		bulkheads = append(bulkheads, t.MaxInFlight)
	}
	cur := uint64(lim.Cur) // int64 on some systems (the BSDs), never negative
	if need := filesNeeded(maxConns, bulkheads); cur < need {
		logger.Warn().Uint64("open_files_limit", cur).Uint64("open_files_needed", need).Int("max_conns", maxConns).
			Msg("the open file limit is below what --max-conns and the bulkheads need; raise it (LimitNOFILE under systemd) or lower --max-conns")
	}
}
