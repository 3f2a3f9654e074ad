package breaker

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// State is a breaker's position: Closed, Open or HalfOpen.
type State uint8

const (
	// Closed admits every call and counts consecutive failures.
	Closed State = iota
	// Open refuses every call until its open period has passed: the reset
	// timeout, lengthened by backoff and jitter when they are set. A held
	// breaker stays Open until Enable or ForceClose.
	Open
	// HalfOpen has admitted one probe and refuses everything else until the
	// probe reports, or until ProbeTimeout, when set, lets a new probe
	// replace a silent one. With ProbeSuccesses above 1 it stays HalfOpen
	// between the healthy probes it needs.
	HalfOpen
)

// String returns the name used in the breaker log and on status pages:
// CLOSED, OPEN or HALF_OPEN.
func (s State) String() string {
	switch s {
	case Closed:
		return "CLOSED"
	case Open:
		return "OPEN"
	case HalfOpen:
		return "HALF_OPEN"
	default:
		return "UNKNOWN"
	}
}

// ErrOpen is returned by Allow when the breaker refuses a call: it is open,
// or half-open with its probe already out.
var ErrOpen = errors.New("breaker: open")

// ErrClosed is returned by AllowProbe when the breaker is closed, disabled
// included: no probe is needed.
var ErrClosed = errors.New("breaker: closed")

// ErrHeld is returned by Allow and AllowProbe when the breaker refuses
// because HoldOpen keeps it open: no probe will be admitted until Enable or
// ForceClose. It wraps ErrOpen.
var ErrHeld = fmt.Errorf("%w: held open", ErrOpen)

// Clock tells the time. The breaker reads time only through it, so tests can
// drive the breaker with a fake clock and never sleep.
type Clock interface {
	Now() time.Time
}

// systemClock is the Clock used when Settings.Clock is nil.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Transition is one change of a breaker's state, as reported to
// Settings.OnTransition.
type Transition struct {
	// Name is the breaker's name (the target it guards).
	Name string
	// From and To are the states before and after the change.
	From, To State
	// At is the breaker clock's time of the change.
	At time.Time
	// Cause says what made the change.
	Cause Cause
	// OpenFor is how long the open period that begins lasts, jitter
	// included, when To is Open and the breaker is not held; else zero.
	OpenFor time.Duration
	// Period is the base length of the breaker's open periods after the
	// change: ResetTimeout, or longer while backing off.
	Period time.Duration
}

// Cause is what made a breaker change state.
type Cause uint8

const (
	// CauseResults is the results of calls: failures that opened a closed
	// breaker, or a probe's outcome.
	CauseResults Cause = iota
	// CauseProbe is a call admitted as the probe once the open period
	// passed (OPEN to HALF_OPEN).
	CauseProbe
	// CauseOperator is manual control: HoldOpen, ForceClose or Disable.
	CauseOperator
	// CauseShared is state adopted from elsewhere, AdoptOpen or
	// AdoptClose: another hub's breaker for the same target.
	CauseShared
)

// String returns the cause's name for logs: results, probe, operator or
// shared.
func (c Cause) String() string {
	switch c {
	case CauseResults:
		return "results"
	case CauseProbe:
		return "probe"
	case CauseOperator:
		return "operator"
	case CauseShared:
		return "shared"
	default:
		return "unknown"
	}
}

// Snapshot is a breaker's state at one instant, for status pages. It is a
// plain value, copied out under the breaker's lock.
type Snapshot struct {
	State State
	// ConsecutiveFailures is the current count of failures in a row. A
	// disabled breaker keeps counting, so it may exceed the threshold.
	ConsecutiveFailures int
	// RetryAfter is how long until a probe may be admitted, jitter
	// included; zero when the breaker is closed, when a probe could be
	// admitted now or is out, and when it is held open (no probe will be
	// admitted until Enable; Held says so).
	RetryAfter time.Duration
	// ProbeSuccesses is how many healthy probes in a row the half-open
	// breaker has had; zero in the other states.
	ProbeSuccesses int
	// Held reports that HoldOpen keeps the breaker open until Enable or
	// ForceClose.
	Held bool
	// Disabled reports that Disable keeps the breaker closed and
	// pass-through until Enable, HoldOpen or ForceClose.
	Disabled bool
	// RecentCalls and RecentFailures count the results in the failure-rate
	// window and how many of them failed; both are zero when FailureRate is
	// off.
	RecentCalls, RecentFailures int
}

// starting a new generation, and reports the change. Every change frees the
// probe slot and clears the failure-rate window; closing also clears the
// failure count and ends the backoff, and opening starts an open period
// unless the breaker is held. It returns the new word. b.mu must be held.
func (b *Breaker) setStateLocked(w uint64, to State, now time.Time, cause Cause) uint64 {
	return b.changeStateLocked(w, to, now, cause, 0)
}

// changeStateLocked is setStateLocked with the length of the open period
// that begins when to is Open: openFor, or when zero the next one by the
// policy (the base period lengthened by its jitter share). b.mu must be
// held.
func (b *Breaker) changeStateLocked(w uint64, to State, now time.Time, cause Cause, openFor time.Duration) uint64 {
	p := b.pol.Load()
	from := stateOf(w)
	fails := failuresOf(w)
	switch to {
	case Closed:
		fails = 0
		b.period = p.resetTimeout
	case Open:
		if !b.held {
			b.startOpenPeriodLocked(now, openFor)
		}
	}
	b.probeOut = false
	b.permitted = false
	b.successes = 0
	b.nextProbe = time.Time{}
	if p.rateOn {
		b.win.clear()
	}
	nw := pack(generationOf(w)+1, fails, to)
	b.word.Store(nw)
	if b.onTransition != nil {
		t := Transition{Name: b.name, From: from, To: to, At: now, Cause: cause, Period: b.period}
		if to == Open && !b.held {
			t.OpenFor = b.openFor
		}
		b.onTransition(t)
	}
	return nw
}

// startOpenPeriodLocked starts an open period of length openFor or, when it
// is zero, of the current base length lengthened by the jitter share drawn
// for it. b.mu must be held.
func (b *Breaker) startOpenPeriodLocked(now time.Time, openFor time.Duration) {
	b.openedAt = now
	b.openFor = openFor
	if openFor == 0 {
		b.openFor = b.period
		if jitter := b.pol.Load().jitter; jitter > 0 {
			b.openFor = addSaturating(b.openFor, time.Duration(float64(b.period)*(b.nextShare*jitter)))
			b.redraw = true
		}
	}
	b.storeProbeAfterLocked()
}

// storeProbeAfterLocked publishes the end of the current open period to the
// lock-free path of Allow. b.mu must be held.
func (b *Breaker) storeProbeAfterLocked() {
	b.probeAfter.Store(int64(min(addSaturating(b.openedAt.Sub(b.epoch), b.openFor), awaitPermit-1)))
}

// addSaturating returns a+b for a non-negative b, or the longest Duration
// when the sum would overflow.
func addSaturating(a, b time.Duration) time.Duration {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// unlock releases mu and then, if an open period used up the jitter share,
// draws the next one. Drawing after the unlock keeps Rand, foreign code,
// out from under the lock.
func (b *Breaker) unlock() {
	redraw := b.redraw
	b.redraw = false
	b.mu.Unlock()
	if redraw {
		share := b.drawShare()
		b.mu.Lock()
		b.nextShare = share
		b.mu.Unlock()
	}
}

// drawShare calls Rand and clamps its answer into [0, 1], so a faulty source
// can neither shorten an open period nor stretch it past the jitter.
func (b *Breaker) drawShare() float64 {
	r := b.rand()
	switch {
	case !(r >= 0): // negative or NaN
		return 0
	case r > 1:
		return 1
	}
	return r
}

// RetryAfter returns how long until the breaker may admit a probe, jitter
// included: zero when it is closed, when it is half-open with its probe out
// (the probe's answer is due at any moment) or due, and when it is held
// open (no probe is coming until Enable; Snapshot's Held says so). A
// half-open breaker that needs more healthy probes (ProbeSuccesses) tells
// how long until the next one is due.
func (b *Breaker) RetryAfter() time.Duration {
	return b.Snapshot().RetryAfter
}

// Snapshot returns the breaker's state, failure count, retry hint, manual
// control flags and failure-rate window counts.
func (b *Breaker) Snapshot() Snapshot {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	s := Snapshot{
		State:               stateOf(w),
		ConsecutiveFailures: int(failuresOf(w)),
		Held:                b.held,
		Disabled:            b.disabled,
	}
	switch {
	case s.State == Open && !b.held:
		s.RetryAfter = max(b.openedAt.Add(b.openFor).Sub(now), 0)
	case s.State == HalfOpen:
		s.ProbeSuccesses = b.successes
		if !b.probeOut {
			s.RetryAfter = max(b.nextProbe.Sub(now), 0)
		}
	}
	if b.pol.Load().rateOn {
		s.RecentCalls, s.RecentFailures = b.win.counts(now)
	}
	return s
}
