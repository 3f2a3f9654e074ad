package bulkhead

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of AdaptiveSettings' zero fields.
const (
	DefaultMinInflight = 2
	DefaultWindow      = 500 * time.Millisecond
)

// The controller's constants (docs/DESIGN.md, "The adaptive limit").
const (
	// overloadCut is what a window with any call in doubt multiplies the
	// limit by.
	overloadCut = 0.9
	// tolerance is how much slower than its baseline the target may answer
	// before the limit falls: queueing inside the target a third of its
	// pace is not yet worth a refusal.
	tolerance = 1.5
	// minGradient bounds one window's fall through latency alone.
	minGradient = 0.5
	// smoothing is the share of a latency-driven fall taken per window, so
	// one noisy window does not halve the limit.
	smoothing = 0.5
	// baselineUp and baselineDown are the weights of a healthy window's
	// latency in the baseline: it follows a faster target at once and a
	// slower one slowly.
	baselineUp   = 0.05
	baselineDown = 0.5
)

// AdaptiveSettings configures an Adaptive limit. NewAdaptive copies it.
type AdaptiveSettings struct {
	// Max is the ceiling, the operator's max_inflight: the limit starts
	// there and never goes above it. Required, at least 1.
	Max int
	// Min is the floor. Zero means DefaultMinInflight (2), or Max when Max
	// is lower.
	Min int
	// Window is how long the controller gathers samples before it moves
	// the limit. A window closes by time, at the first call that ends
	// after it, however few calls there were. Zero means DefaultWindow.
	Window time.Duration
}

// Outcome is how a call ended, as the controller counts it.
type Outcome uint8

const (
	// Answered is an answer from the target, whatever its code (0000,
	// Bnnn, E400, E500): a latency sample.
	Answered Outcome = iota
	// Overloaded is a call whose outcome is unknown (E901, or E902 once
	// the request went out): the target took it and did not answer in
	// time, the sign of a target past its capacity.
	Overloaded
)

// Change is one move of the limit, as Record reports it.
type Change struct {
	From, To int
	// Reason says why, for the log: "calls in doubt", "latency rose" or
	// "demand reached the limit".
	Reason string
	// Baseline and Recent are the latencies the decision compared.
	Baseline, Recent time.Duration
}

// Adaptive computes a target's concurrency limit from its latency and its
// calls in doubt, in the spirit of Netflix's Gradient2: a long-term latency
// baseline against the recent window's, the limit moved towards
// limit × baseline/recent, a headroom when the demand reaches the limit, and
// a multiplicative cut for every window with a call in doubt. It does no I/O
// and reads no clock: callers pass the time.
//
// It only computes: the caller applies the limit to its Bulkhead
// (SetLimit), or only shows it. It is safe for concurrent use.
type Adaptive struct {
	min, max int
	window   time.Duration

	limitNow atomic.Int64 // the limit, rounded, for readers without mu

	mu        sync.Mutex
	limit     float64   // guarded by mu
	baseline  float64   // guarded by mu; ns, 0 until the first window with samples
	windowEnd time.Time // guarded by mu; zero until the first call
	samples   int       // guarded by mu
	sum       float64   // guarded by mu; ns
	overload  bool      // guarded by mu
	peak      int       // guarded by mu; most calls in flight seen in the window
	// slowFrom and slowRecent are the limit and the latency when the
	// current run of slow windows began; slowFrom is 0 outside one.
	slowFrom, slowRecent float64 // guarded by mu
}

// NewAdaptive returns a controller whose limit starts at s.Max. It panics
// if s.Max is below 1 or s.Min is negative, which configuration validation
// refuses first.
func NewAdaptive(s AdaptiveSettings) *Adaptive {
	if s.Max < 1 || s.Min < 0 {
		panic(fmt.Sprintf("bulkhead: adaptive limit needs 1 <= Max and 0 <= Min, got Max %d, Min %d", s.Max, s.Min))
	}
	a := &Adaptive{min: s.Min, max: s.Max, window: s.Window}
	if a.min == 0 {
		a.min = DefaultMinInflight
	}
	a.min = min(a.min, a.max)
	if a.window <= 0 {
		a.window = DefaultWindow
	}
	a.limit = float64(a.max)
	a.limitNow.Store(int64(a.max))
	return a
}

// Limit returns the limit now, in [Min, Max].
func (a *Adaptive) Limit() int { return int(a.limitNow.Load()) }

// Record counts one call that ended at now: its outcome, its latency (for
// Answered) and how many calls to the target were in flight when it was
// admitted, itself included, which tells whether the demand reached the
// limit. Refused calls (E904, E905) are not recorded. When the call closes
// a window and the limit moves, Record returns the change and true.
func (a *Adaptive) Record(now time.Time, o Outcome, latency time.Duration, inflight int) (Change, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var (
		ch      Change
		changed bool
	)
	if a.windowEnd.IsZero() {
		a.windowEnd = now.Add(a.window)
	} else if !now.Before(a.windowEnd) {
		ch, changed = a.closeWindowLocked()
		a.windowEnd = now.Add(a.window)
	}
	switch o {
	case Overloaded:
		a.overload = true
	default:
		a.samples++
		a.sum += float64(max(latency, 0))
	}
	a.peak = max(a.peak, inflight)
	return ch, changed
}

// closeWindowLocked moves the limit on what the window gathered and starts
// the next one. a.mu must be held.
func (a *Adaptive) closeWindowLocked() (Change, bool) {
	defer func() { a.samples, a.sum, a.overload, a.peak = 0, 0, false, 0 }()
	from := a.limit
	var recent float64
	if a.samples > 0 {
		recent = a.sum / float64(a.samples)
	}
	reached := a.peak >= int(math.Round(a.limit))
	reason := ""
	switch {
	case a.overload:
		// A call in doubt is the one sign no latency shows when every
		// call times out: the cut needs no sample.
		a.limit = max(min(a.limit*overloadCut, a.limit-1), float64(a.min))
		a.slowFrom = 0
		reason = "calls in doubt"
	case a.samples == 0:
		return Change{}, false
	case a.baseline == 0:
		a.baseline = recent
	default:
		gradient := min(max(tolerance*a.baseline/recent, minGradient), 1)
		target := a.limit * gradient
		if reached {
			// Headroom: enough to find out whether the target takes
			// more. At full health the limit grows by half, so a
			// recovered target is refused for a few windows only.
			if gradient == 1 {
				target += max(a.limit/2, 1)
			} else {
				target += math.Sqrt(a.limit)
			}
		}
		if target < a.limit {
			a.limit += (target - a.limit) * smoothing
			reason = "latency rose"
		} else {
			a.limit = target
			reason = "demand reached the limit"
		}
		a.limit = min(max(a.limit, float64(a.min)), float64(a.max))
		a.learnBaselineLocked(from, recent, gradient)
	}
	// A window with calls in doubt is not learnt from: it says nothing of
	// the target's pace, and must not lift the baseline.
	to := int(math.Round(a.limit))
	a.limitNow.Store(int64(to))
	if to == int(math.Round(from)) {
		return Change{}, false
	}
	return Change{From: int(math.Round(from)), To: to, Reason: reason,
		Baseline: time.Duration(a.baseline), Recent: time.Duration(recent)}, true
}

// learnBaselineLocked moves the baseline towards a healthy window's
// latency: at once when the target got faster, slowly when it got slower.
// A slow window (past the tolerance) is not learnt from, so that a long
// incident never lifts the baseline, with one exception: when the limit has
// halved since the slow windows began and the latency has not improved,
// the hub's calls are not what makes the target slow (it became slower
// for good, or others load it), and refusing more would not help: the
// window's latency becomes the baseline. Likewise at the floor. a.mu must
// be held.
func (a *Adaptive) learnBaselineLocked(from, recent, gradient float64) {
	switch {
	case gradient == 1:
		a.slowFrom = 0
		if recent < a.baseline {
			a.baseline += (recent - a.baseline) * baselineDown
		} else {
			a.baseline += (recent - a.baseline) * baselineUp
		}
	case a.slowFrom == 0:
		a.slowFrom, a.slowRecent = from, recent
		if a.limit <= float64(a.min) {
			a.baseline, a.slowFrom = recent, 0
		}
	case a.limit <= float64(a.min) || (a.limit <= a.slowFrom/2 && recent >= 0.9*a.slowRecent):
		a.baseline, a.slowFrom = recent, 0
	}
}
