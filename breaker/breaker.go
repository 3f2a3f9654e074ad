// Package breaker is a circuit breaker for one target: it counts consecutive
// failures, opens after a threshold, refuses calls while open, and after a
// reset timeout admits exactly one probe whose result closes or reopens it.
//
// Several hubs can make their breakers for one target act as one: each
// transition says what caused it (Transition.Cause) and how long the open
// period it starts lasts, AdoptOpen and AdoptClose apply another hub's
// change, and with Settings.ProbePermits only the hub given a permit sends
// the probe. How that state travels between hubs is not the breaker's
// business.
//
// Optional policies, all off in the zero Settings, extend that: a
// failure-rate trip over a sliding window, slow successes counted as
// failures, an open period that backs off after failed probes and is
// lengthened by random jitter, a probe that is replaced when it never
// reports, several healthy probes in a row to close, probes of the
// caller's own (Policy.SyntheticProbes and AllowProbe) in place of a
// customer's call, and manual control for an operator (HoldOpen,
// ForceClose, Disable, Enable).
//
// The breaker owns no goroutines and no timers. It reads time only through
// an injected Clock, so OPEN becomes HALF_OPEN on the first call after the
// timeout, stamped with that call's time, and tests drive it with a fake
// clock.
//
// Typical use:
//
//	b := breaker.New(breaker.Settings{
//		Name:          "CORE",
//		FailThreshold: 5,
//		ResetTimeout:  10 * time.Second,
//		SlowCall:      2 * time.Second, // a success slower than this counts as a failure
//	})
//	ticket, retryAfter, err := b.Allow()
//	if errors.Is(err, breaker.ErrOpen) {
//		return fmt.Sprintf("circuit open; retry after %s", retryAfter)
//	}
//	began := time.Now()
//	failed := call() != nil
//	b.Done(ticket, failed, time.Since(began))
package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// The breaker's hot state lives in one 64-bit word so that CLOSED admits and
// records without a lock: bits 0-1 hold the State, bits 2-31 the consecutive
// failure count and bits 32-63 the generation. The generation changes with
// every state change and with every probe admitted, which is what makes old
// tickets stale.
const (
	stateMask    = 0x3
	failureShift = 2
	failureUnit  = uint64(1) << failureShift
	maxFailures  = 1<<30 - 1
	failureMask  = uint64(maxFailures) << failureShift
	genShift     = 32
)

func stateOf(w uint64) State       { return State(w & stateMask) }
func failuresOf(w uint64) uint32   { return uint32((w & failureMask) >> failureShift) }
func generationOf(w uint64) uint32 { return uint32(w >> genShift) }
func pack(gen, fails uint32, s State) uint64 {
	return uint64(gen)<<genShift | uint64(fails)<<failureShift | uint64(s)
}

// Breaker is a circuit breaker. It is safe for concurrent use.
//
// In CLOSED, Allow and a successful Done are a single atomic load (plus a
// compare-and-swap when a failure count must be cleared): no lock, no
// allocation. Every state change happens under mu. With FailureRate set,
// every result in CLOSED is recorded under mu instead, because the window
// and the count must move together and a result must never land in a window
// cleared after its generation ended.
type Breaker struct {
	name         string
	clock        Clock
	onTransition func(Transition)
	rand         func() float64
	probePermits bool

	// pol is the policy in force. SetPolicy and SetProbeTimeout replace it
	// under mu, so code holding mu reads a stable one; the lock-free paths
	// load it once per call.
	pol atomic.Pointer[policy]

	// word is read without mu; it is changed under mu, except that failure
	// counts in CLOSED are changed by compare-and-swap without it when
	// FailureRate is off.
	word atomic.Uint64
	// probeAfter is when the current open period ends, as a Duration since
	// epoch (heldOpen while held), so that an open breaker refuses without
	// mu. It is written under mu before the word that makes it current.
	probeAfter atomic.Int64
	epoch      time.Time // the clock's time at New; set once

	mu        sync.Mutex
	openedAt  time.Time     // guarded by mu; when the current open period started
	openFor   time.Duration // guarded by mu; length of the current open period, jitter included
	period    time.Duration // guarded by mu; base open period, longer than resetTimeout while backing off
	nextShare float64       // guarded by mu; the jitter share drawn for the next open period
	redraw    bool          // guarded by mu; nextShare was used and a new one must be drawn
	probeOut  bool          // guarded by mu; a half-open probe has been admitted and not reported
	probeAt   time.Time     // guarded by mu; when the probe out was admitted
	permitted bool          // guarded by mu; PermitProbe allowed a probe for this open or half-open period
	successes int           // guarded by mu; healthy probes of the current half-open period
	nextProbe time.Time     // guarded by mu; in HALF_OPEN with no probe out, no probe is admitted before it
	held      bool          // guarded by mu; HoldOpen is in force
	disabled  bool          // guarded by mu; Disable is in force
	win       window        // guarded by mu; results of the current closed period
}

// New returns a closed breaker configured by s.
func New(s Settings) *Breaker {
	e := s.effective()
	p := newPolicy(e)
	b := &Breaker{
		name:         e.Name,
		clock:        e.Clock,
		onTransition: e.OnTransition,
		rand:         e.Rand,
		probePermits: e.ProbePermits,
		period:       e.ResetTimeout,
		openFor:      e.ResetTimeout,
	}
	b.pol.Store(p)
	if p.rateOn {
		b.win = newWindow(e.Window)
	}
	if p.jitter > 0 {
		b.nextShare = b.drawShare()
	}
	b.epoch = b.clock.Now()
	return b
}

// Name returns the name the breaker was created with.
func (b *Breaker) Name() string { return b.name }

// Settings returns the settings the breaker runs with: those given to New,
// with the Policy and ProbeTimeout of the last SetPolicy and
// SetProbeTimeout, every default filled in, values out of range clamped,
// and the policies that are off zeroed. Status pages show it as the
// effective per-target configuration.
func (b *Breaker) Settings() Settings { return b.pol.Load().settings }
