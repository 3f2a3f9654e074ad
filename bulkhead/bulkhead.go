// Package bulkhead bounds how many calls to one target may be in flight at
// once, without ever making a caller wait.
//
// A full bulkhead refuses at once: the relay answers E905 instead of queueing
// the request behind a slow target, so one sick target cannot pile up
// goroutines, connections and memory in the hub.
//
// Typical use:
//
//	bh := bulkhead.New(bulkhead.Settings{MaxInflight: 10})
//	if !bh.TryAcquire() {
//		return "E905" // full: answer at once, do not call the target
//	}
//	defer bh.Release()
//	// call the target
package bulkhead

import (
	"fmt"
	"sync/atomic"
)

// DefaultMaxInflight is the limit used when Settings.MaxInflight is zero.
const DefaultMaxInflight = 10

// overReleaseMsg is the panic value of Release when nothing is held. It is a
// constant so callers and tests can recognise it.
const overReleaseMsg = "bulkhead: Release called more times than TryAcquire succeeded"

// Settings configures a Bulkhead. New copies it, so the caller may reuse it.
type Settings struct {
	// MaxInflight is the number of calls that may hold a slot at the same
	// time. Zero means DefaultMaxInflight (10); a negative value makes New
	// panic, because configuration validation should have refused it.
	MaxInflight int
}

// Bulkhead is a non-blocking counting semaphore. It is safe for concurrent
// use.
//
// It is an atomic counter rather than a buffered channel so that acquiring
// and releasing a slot costs one compare-and-swap and never allocates or
// parks a goroutine.
type Bulkhead struct {
	limit    int64 // set by New, never changed, so read without synchronisation
	inflight atomic.Int64
}

// New returns a Bulkhead with the given settings. It panics if
// s.MaxInflight is negative.
func New(s Settings) *Bulkhead {
	limit := s.MaxInflight
	switch {
	case limit == 0:
		limit = DefaultMaxInflight
	case limit < 0:
		panic(fmt.Sprintf("bulkhead: negative MaxInflight %d", limit))
	}
	return &Bulkhead{limit: int64(limit)}
}

// TryAcquire takes a slot and reports true, or reports false at once when
// all slots are taken. It never blocks. Every true result must be matched by
// exactly one Release.
func (b *Bulkhead) TryAcquire() bool {
	for {
		n := b.inflight.Load()
		if n >= b.limit {
			return false
		}
		// A plain Add could overshoot the limit for an instant and refuse a
		// caller that should have been admitted; the CAS never overshoots.
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a slot taken by a successful TryAcquire. It is safe to
// defer. It panics if no slot is held, because a double release would
// silently raise the limit for everyone after it; the count is left
// unchanged by the panic.
func (b *Bulkhead) Release() {
	for {
		n := b.inflight.Load()
		if n <= 0 {
			panic(overReleaseMsg)
		}
		if b.inflight.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// InFlight returns the number of slots held at the moment of the call. It is
// meant for metrics and status pages: by the time it returns the value may
// already have changed.
func (b *Bulkhead) InFlight() int {
	return int(b.inflight.Load())
}

// Limit returns the maximum number of slots, after defaults were applied.
func (b *Bulkhead) Limit() int {
	return int(b.limit)
}
