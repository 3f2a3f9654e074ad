// Package breaker is a circuit breaker for one target: it counts consecutive
// failures, opens after a threshold, refuses calls while open, and after a
// reset timeout admits exactly one probe whose result closes or reopens it.
//
// The breaker owns no goroutines and no timers. It reads time only through
// an injected Clock, so OPEN becomes HALF_OPEN on the first call after the
// timeout, stamped with that call's time, and tests drive it with a fake
// clock.
//
// Typical use:
//
//	b := breaker.New(breaker.Settings{Name: "CORE", FailThreshold: 5, ResetTimeout: 10 * time.Second})
//	ticket, err := b.Allow()
//	if errors.Is(err, breaker.ErrOpen) {
//		return fmt.Sprintf("circuit open; retry after %s", b.RetryAfter())
//	}
//	failed := call() != nil
//	b.Done(ticket, failed)
package breaker

import (
	"sync"
	"sync/atomic"
	"time"
)

// Settings configures a Breaker. The zero value of each field selects the
// default given in its comment.
type Settings struct {
	// Name identifies the breaker in transitions; usually the target name.
	Name string
	// FailThreshold is the number of consecutive failures that opens a
	// closed breaker. Zero or negative means 5.
	FailThreshold int
	// ResetTimeout is how long the breaker stays open before it admits a
	// probe. Zero or negative means 10 seconds.
	ResetTimeout time.Duration
	// Clock supplies the time. Nil means the system clock.
	Clock Clock
	// OnTransition, if set, is called for every state change, in the order
	// the changes happen. It runs under the breaker's lock so that each
	// breaker's changes reach observers as an unbroken chain; it must
	// therefore be fast and must never call back into the breaker.
	OnTransition func(Transition)
}

// Ticket is the admission handed out by Allow. The caller gives it back
// exactly once, to Done with the call's result or to Cancel when the call
// was never made. A ticket from an earlier generation (admitted before the
// breaker last changed state) is stale: its result is ignored.
type Ticket struct {
	generation uint32
	probe      bool
}

// Probe reports whether the ticket admitted the half-open probe.
func (t Ticket) Probe() bool { return t.probe }

// Snapshot is a breaker's state at one instant, for status pages.
type Snapshot struct {
	State State
	// ConsecutiveFailures is the current count of failures in a row.
	ConsecutiveFailures int
	// RetryAfter is how long until a probe may be admitted; zero when the
	// breaker is closed or a probe could be admitted now.
	RetryAfter time.Duration
}

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
// allocation. Every state change happens under mu.
type Breaker struct {
	name         string
	threshold    uint32
	resetTimeout time.Duration
	clock        Clock
	onTransition func(Transition)

	// word is read without mu; it is changed under mu, except that failure
	// counts in CLOSED are changed by compare-and-swap without it.
	word atomic.Uint64

	mu       sync.Mutex
	openedAt time.Time // guarded by mu; when the breaker last opened
	probeOut bool      // guarded by mu; a half-open probe has been admitted and not reported
}

// New returns a closed breaker configured by s.
func New(s Settings) *Breaker {
	b := &Breaker{
		name:         s.Name,
		threshold:    5,
		resetTimeout: 10 * time.Second,
		clock:        s.Clock,
		onTransition: s.OnTransition,
	}
	if s.FailThreshold > 0 {
		b.threshold = uint32(min(s.FailThreshold, maxFailures))
	}
	if s.ResetTimeout > 0 {
		b.resetTimeout = s.ResetTimeout
	}
	if b.clock == nil {
		b.clock = systemClock{}
	}
	return b
}

// Name returns the name the breaker was created with.
func (b *Breaker) Name() string { return b.name }

// Allow asks to make one call. It returns ErrOpen when the breaker refuses:
// it is open and the reset timeout has not passed, or it is half-open with
// its probe out. Otherwise the returned ticket must be given back to Done or
// Cancel.
func (b *Breaker) Allow() (Ticket, error) {
	if w := b.word.Load(); stateOf(w) == Closed {
		return Ticket{generation: generationOf(w)}, nil
	}
	return b.allowSlow()
}

func (b *Breaker) allowSlow() (Ticket, error) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	switch stateOf(w) {
	case Closed:
		return Ticket{generation: generationOf(w)}, nil
	case Open:
		if now.Sub(b.openedAt) < b.resetTimeout {
			return Ticket{}, ErrOpen
		}
		w = b.setStateLocked(w, HalfOpen, now)
	default: // HalfOpen
		if b.probeOut {
			return Ticket{}, ErrOpen
		}
		// A fresh generation, so a probe that was handed back can never
		// report for this one.
		w = pack(generationOf(w)+1, failuresOf(w), HalfOpen)
		b.word.Store(w)
	}
	b.probeOut = true
	return Ticket{generation: generationOf(w), probe: true}, nil
}

// Done records the result of a call admitted with t. failed says whether the
// call counts as a failure. A stale ticket is ignored.
func (b *Breaker) Done(t Ticket, failed bool) {
	if t.probe {
		b.probeDone(t, failed)
		return
	}
	for {
		w := b.word.Load()
		if generationOf(w) != t.generation || stateOf(w) != Closed {
			return
		}
		n := failuresOf(w)
		if !failed {
			// Only write when there is a count to clear, so that a stream of
			// successes from many cores does not bounce the cache line.
			if n == 0 || b.word.CompareAndSwap(w, w&^failureMask) {
				return
			}
			continue
		}
		if n+1 >= b.threshold {
			b.failAtThreshold(t)
			return
		}
		if b.word.CompareAndSwap(w, w+failureUnit) {
			return
		}
	}
}

// failAtThreshold records a failure that may open the breaker. It rechecks
// under mu because a success may have cleared the count meanwhile.
func (b *Breaker) failAtThreshold(t Ticket) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		w := b.word.Load()
		if generationOf(w) != t.generation || stateOf(w) != Closed {
			return
		}
		if failuresOf(w)+1 >= b.threshold {
			b.setStateLocked(w+failureUnit, Open, now)
			return
		}
		if b.word.CompareAndSwap(w, w+failureUnit) {
			return
		}
	}
}

func (b *Breaker) probeDone(t Ticket, failed bool) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	if generationOf(w) != t.generation || stateOf(w) != HalfOpen {
		return
	}
	b.probeOut = false
	if failed {
		if failuresOf(w) < maxFailures {
			w += failureUnit
		}
		b.setStateLocked(w, Open, now)
		return
	}
	b.setStateLocked(w, Closed, now)
}

// Cancel gives back a ticket whose call was never made, as neither a
// success nor a failure. A half-open probe's slot becomes free again, so a
// probe turned away elsewhere (say by a full bulkhead) cannot leave the
// breaker stuck in HALF_OPEN.
func (b *Breaker) Cancel(t Ticket) {
	if !t.probe {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	if generationOf(w) == t.generation && stateOf(w) == HalfOpen {
		b.probeOut = false
	}
}

// setStateLocked moves the breaker from the state in w to the state to,
// starting a new generation, and reports the change. Closing clears the
// failure count. It returns the new word. b.mu must be held.
func (b *Breaker) setStateLocked(w uint64, to State, now time.Time) uint64 {
	from := stateOf(w)
	fails := failuresOf(w)
	if to == Closed {
		fails = 0
	}
	if to == Open {
		b.openedAt = now
	}
	nw := pack(generationOf(w)+1, fails, to)
	b.word.Store(nw)
	if b.onTransition != nil {
		b.onTransition(Transition{Name: b.name, From: from, To: to, At: now})
	}
	return nw
}

// RetryAfter returns how long until the breaker may admit a probe: zero when
// it is closed, or when it is half-open (the probe's answer is due at any
// moment).
func (b *Breaker) RetryAfter() time.Duration {
	return b.Snapshot().RetryAfter
}

// Snapshot returns the breaker's state, failure count and retry hint.
func (b *Breaker) Snapshot() Snapshot {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	s := Snapshot{State: stateOf(w), ConsecutiveFailures: int(failuresOf(w))}
	if s.State == Open {
		s.RetryAfter = max(b.openedAt.Add(b.resetTimeout).Sub(now), 0)
	}
	return s
}
