package relay

import (
	"errors"
	"fmt"
	"strings"
)

// BreakerAction is an operator's command to one target's breaker (docs/PROTOCOL.md,
// "Per-target settings and policies", manual control). It is a plain string value.
type BreakerAction string

// The breaker actions, as POST /breakers/{target} takes them.
const (
	// ActionOpen holds the breaker open, refusing every call, until
	// ActionClose or ActionEnable. While it is held, the target's fallback,
	// if any, takes its requests: an operator's failover.
	ActionOpen BreakerAction = "open"
	// ActionClose closes the breaker with a failure count of zero and ends
	// a hold or a disable.
	ActionClose BreakerAction = "close"
	// ActionDisable makes the breaker pass-through: closed, admitting every
	// call and never opening, while it still counts and reports.
	ActionDisable BreakerAction = "disable"
	// ActionEnable returns the breaker to normal operation from where it
	// stands: a held breaker starts a normal open period, a disabled one
	// judges the next result as usual.
	ActionEnable BreakerAction = "enable"
)

// ErrUnknownTarget is returned by ControlBreaker for a name that is no
// configured target.
var ErrUnknownTarget = errors.New("relay: unknown target")

// ErrUnknownAction is returned by ControlBreaker for an action other than
// open, close, disable and enable.
var ErrUnknownAction = errors.New("relay: unknown breaker action: want open, close, disable or enable")

// ParseBreakerAction returns the action named by s (case-insensitive), or
// ErrUnknownAction.
func ParseBreakerAction(s string) (BreakerAction, error) {
	switch a := BreakerAction(strings.ToLower(strings.TrimSpace(s))); a {
	case ActionOpen, ActionClose, ActionDisable, ActionEnable:
		return a, nil
	}
	return "", fmt.Errorf("%w, got %q", ErrUnknownAction, s)
}

// ControlBreaker applies an operator's action to the breaker of the target
// named name (matched case-insensitively) and returns the target's status
// afterwards. Each state change the action causes reaches the breaker's
// transition observer (the breaker log), the metrics and the log, like any
// other change. It returns ErrUnknownTarget or ErrUnknownAction, changing
// nothing, when either is not known.
func (s *Server) ControlBreaker(name string, action BreakerAction) (TargetSnapshot, error) {
	rt := s.table.lookup([]byte(name))
	if rt == nil {
		return TargetSnapshot{}, fmt.Errorf("%w %q", ErrUnknownTarget, name)
	}
	switch action {
	case ActionOpen:
		rt.breaker.HoldOpen()
	case ActionClose:
		rt.breaker.ForceClose()
	case ActionDisable:
		rt.breaker.Disable()
	case ActionEnable:
		rt.breaker.Enable()
	default:
		return TargetSnapshot{}, fmt.Errorf("%w, got %q", ErrUnknownAction, string(action))
	}
	rt.logTransitions()
	return s.snapshot(rt), nil
}
