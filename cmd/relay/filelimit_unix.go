//go:build unix

package main

import (
	"syscall"

	"github.com/relayhub/relayhub/relay"
)

// checkFileLimit refuses a configuration that needs more open files than
// the process may have (filesNeeded): past the limit, connections fail to
// be accepted and targets fail to be dialled. The soft limit is raised to
// the hard one first, as the Go runtime does at start; under systemd the
// hard limit is the unit's LimitNOFILE.
func checkFileLimit(srv *relay.Server, maxConns int, stateStore string) error {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) != nil {
		return nil
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = raised.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	var bulkheads []int
	for _, t := range srv.Targets() {
		bulkheads = append(bulkheads, t.MaxInFlight)
	}
	cur := uint64(lim.Cur) // int64 on some systems (the BSDs), never negative
	if need := filesNeeded(maxConns, bulkheads, storeConns(stateStore)); cur < need {
		return fileLimitError(maxConns, need, cur)
	}
	return nil
}
