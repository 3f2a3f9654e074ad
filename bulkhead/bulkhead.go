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
//
// Adaptive computes a limit from the target's latency and its calls in
// doubt, which the caller applies with SetLimit (docs/DESIGN.md, "The
// adaptive limit").
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
// It is one atomic word rather than a buffered channel so that acquiring
// and releasing a slot costs one compare-and-swap and never allocates or
// parks a goroutine. The word holds both the limit and the slots held, so
// that every slot is taken against the limit in force at that instant, even
// while SetLimit changes it.
type Bulkhead struct {
	// state is the limit in its high 32 bits and the slots held in its low
	// 32 bits.
	state atomic.Uint64
}

// Parts of Bulkhead.state.
const (
	limitShift = 32
	heldMask   = 1<<limitShift - 1
	// maxLimit is the largest limit a Bulkhead keeps; a larger one is
	// taken as this, which no hub reaches.
	maxLimit = heldMask
)

// New returns a Bulkhead with the given settings. It panics if
// s.MaxInflight is negative.
func New(s Settings) *Bulkhead {
	b := &Bulkhead{}
	b.state.Store(limitBits(s.MaxInflight, "MaxInflight"))
	return b
}

// limitBits returns limit, defaulted and capped, in the place of the limit
// in Bulkhead.state. A negative limit panics, naming it as what.
func limitBits(limit int, what string) uint64 {
	switch {
	case limit == 0:
		limit = DefaultMaxInflight
	case limit < 0:
		panic(fmt.Sprintf("bulkhead: negative %s %d", what, limit))
	}
	return min(uint64(limit), maxLimit) << limitShift
}

// TryAcquire takes a slot and reports true, or reports false at once when
// all slots are taken. It never blocks. Every true result must be matched by
// exactly one Release.
func (b *Bulkhead) TryAcquire() bool {
	for {
		w := b.state.Load()
		if w&heldMask >= w>>limitShift {
			return false
		}
		// A plain Add could overshoot the limit for an instant and refuse a
		// caller that should have been admitted; the CAS never overshoots.
		if b.state.CompareAndSwap(w, w+1) {
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
		w := b.state.Load()
		if w&heldMask == 0 {
			panic(overReleaseMsg)
		}
		if b.state.CompareAndSwap(w, w-1) {
			return
		}
	}
}

// InFlight returns the number of slots held at the moment of the call. It is
// meant for metrics and status pages: by the time it returns the value may
// already have changed.
func (b *Bulkhead) InFlight() int {
	return int(b.state.Load() & heldMask)
}

// Limit returns the maximum number of slots, after defaults were applied.
func (b *Bulkhead) Limit() int {
	return int(b.state.Load() >> limitShift)
}

// SetLimit makes limit the number of slots from now on. It never blocks
// and never takes a slot away: a larger limit admits more at once at the
// next TryAcquire; a smaller one refuses every TryAcquire until the calls
// holding slots have fallen below it, so for a while InFlight may exceed
// Limit. Zero means DefaultMaxInflight; a negative limit panics, as in New.
func (b *Bulkhead) SetLimit(limit int) {
	bits := limitBits(limit, "limit")
	for {
		w := b.state.Load()
		if b.state.CompareAndSwap(w, bits|w&heldMask) {
			return
		}
	}
}
