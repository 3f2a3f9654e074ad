package relay

import (
	"fmt"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/bulkhead"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// LimitMode is how a target's bulkhead limit is set (TargetSettings.AdaptiveLimit).
type LimitMode uint8

const (
	// LimitStatic enforces MaxInflight.
	LimitStatic LimitMode = iota
	// LimitAdaptive computes the limit and enforces it.
	LimitAdaptive
	// LimitObserve computes and shows the limit but enforces MaxInflight:
	// a dry run before turning it on.
	LimitObserve
)

// String returns the mode's name in the settings file and on /status:
// "static", "adaptive" or "observe".
func (m LimitMode) String() string {
	switch m {
	case LimitStatic:
		return "static"
	case LimitAdaptive:
		return "adaptive"
	case LimitObserve:
		return "observe"
	}
	return fmt.Sprintf("LimitMode(%d)", uint8(m))
}

// ParseLimitMode reads a mode by its name; "on" and "true" are adaptive,
// "off" and "false" static.
func ParseLimitMode(s string) (LimitMode, error) {
	switch s {
	case "static", "off", "false":
		return LimitStatic, nil
	case "adaptive", "on", "true":
		return LimitAdaptive, nil
	case "observe":
		return LimitObserve, nil
	}
	return 0, fmt.Errorf("%q: want on, off or observe", s)
}

// adaptiveLimit is a target's limit controller, with the settings it was
// built for, so that a reload keeps it when they stay. A plain value once
// published.
type adaptiveLimit struct {
	*bulkhead.Adaptive
	mode     LimitMode
	min, max int
	now      func() time.Time // the breakers' clock, which closes its windows
}

// newAdaptiveLimit returns the controller for settings ts on clock, or nil
// for a static limit.
func newAdaptiveLimit(ts TargetSettings, clock breaker.Clock) *adaptiveLimit {
	if ts.AdaptiveLimit == LimitStatic {
		return nil
	}
	a := &adaptiveLimit{
		Adaptive: bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: ts.MaxInflight, Min: ts.MinInflight}),
		mode:     ts.AdaptiveLimit, min: ts.MinInflight, max: ts.MaxInflight,
		now: time.Now,
	}
	if clock != nil {
		a.now = clock.Now
	}
	return a
}

// setLimitMode gives r the limit ts asks for: the old controller while its
// settings stay, a new one on clock (at the ceiling) when they change, none
// for a static limit; and the bulkhead the limit to enforce.
func (r *target) setLimitMode(ts TargetSettings, clock breaker.Clock) {
	old := r.limiter.Load()
	if old != nil && old.mode == ts.AdaptiveLimit && old.min == ts.MinInflight && old.max == ts.MaxInflight {
		return
	}
	a := newAdaptiveLimit(ts, clock)
	r.limiter.Store(a)
	if a != nil && a.mode == LimitAdaptive {
		r.bulkhead.SetLimit(a.Limit())
		return
	}
	r.bulkhead.SetLimit(ts.MaxInflight)
}

// limit returns the limit r's status shows: the computed one with an
// adaptive or observed limit, else the bulkhead's.
func (r *target) limit() int {
	if a := r.limiter.Load(); a != nil {
		return a.Limit()
	}
	return r.bulkhead.Limit()
}

// adaptLimit gives r's limit controller, if any, the outcome of a call that
// ended now after took, admitted with inflight calls in flight: an
// answer from the target is a latency sample, a call in doubt after a
// timeout or a broken connection is overload, and anything else (nothing
// sent, a hub-side failure) tells nothing of the target's capacity. A move
// of the limit is applied (unless observed), and logged when it is over
// a tenth.
func (r *target) adaptLimit(res targethttp.Result, took time.Duration, inflight int) {
	a := r.limiter.Load()
	if a == nil {
		return
	}
	var o bulkhead.Outcome
	switch {
	case res.Stage == targethttp.Answered:
		o = bulkhead.Answered
	case res.Stage.InDoubt() && (res.Code == protocol.CodeTimeout || res.Code == protocol.CodeUnreachable):
		o = bulkhead.Overloaded
	default:
		return
	}
	ch, moved := a.Record(a.now(), o, took, inflight)
	if !moved {
		return
	}
	if a.mode == LimitAdaptive {
		r.bulkhead.SetLimit(ch.To)
	}
	if diff := ch.To - ch.From; diff*10 > ch.From || -diff*10 > ch.From {
		r.log.Info().Int("from", ch.From).Int("to", ch.To).Str("reason", ch.Reason).Stringer("mode", a.mode).
			Dur("baseline", ch.Baseline).Dur("recent", ch.Recent).Msg("bulkhead limit changed")
	}
}
