package breaker

import (
	"errors"
	"fmt"
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

// ErrClosed is returned by AdmitProbe when the breaker is closed, disabled
// included: no probe is needed.
var ErrClosed = errors.New("breaker: closed")

// ErrHeld is returned by Allow and Admit when the breaker refuses because
// HoldOpen keeps it open: no probe will be admitted until Enable or
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
