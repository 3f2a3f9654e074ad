package breaker

import (
	"math/rand/v2"
	"time"
)

// Policy is when a breaker opens and how long it stays open: the
// consecutive-failure threshold and reset timeout, and the optional
// policies beyond them. It is the one definition of a target's breaker
// policy: the hub's flags, its settings file, its status and the breaker
// all use it. The zero value of each field selects the default given in its
// comment; every policy beyond the consecutive count is off in the zero
// value, and with all of them off the breaker is the plain
// consecutive-failure breaker. It is a plain value.
//
// The policies combine in this order. A result is classified first: a
// success that took longer than SlowCall is a failure for every rule below.
// In CLOSED a failure adds one to the consecutive count and a success clears
// it; with FailureRate set, the result also goes into the window. The
// breaker opens as soon as either rule fires (FailThreshold failures in a
// row, or a failed share of at least FailureRate among at least MinSamples
// results in the window), unless it is disabled. Each open period lasts the
// base period lengthened by its jitter share; the base period is
// ResetTimeout, doubled by every failed probe up to MaxResetTimeout, and
// back to ResetTimeout whenever the breaker closes. In HALF_OPEN the probe's
// result alone decides. Manual control overrides the rest: a held breaker
// stays OPEN whatever the time, and a disabled one stays CLOSED whatever the
// results.
type Policy struct {
	// FailThreshold is the number of consecutive failures that opens a
	// closed breaker. Zero or negative means 5.
	FailThreshold int
	// ResetTimeout is how long the breaker stays open before it admits a
	// probe; backoff and jitter lengthen it when they are set. Zero or
	// negative means 10 seconds.
	ResetTimeout time.Duration

	// FailureRate turns on the failure-rate trip when it is above zero: a
	// closed breaker also opens when, among the calls that ended within the
	// last Window, there are at least MinSamples and the failed share is at
	// least FailureRate. It is checked after every result, so the success
	// that brings the count to MinSamples can open the breaker too. Values
	// above 1 mean 1. Zero, negative or NaN means off.
	//
	// The window is a fixed ring of ten buckets of Window/10, so it covers
	// between 9/10 of Window and Window of history and never counts a result
	// older than Window. It holds results of the current closed period only:
	// it is cleared on every state change and by ForceClose. With the policy
	// on, every result in CLOSED is recorded under the breaker's lock and
	// Done reads the clock; with it off, the closed path stays lock-free.
	FailureRate float64
	// Window is the span of time the failure rate looks back over. Zero or
	// negative means one minute. It is ignored when FailureRate is off.
	Window time.Duration
	// MinSamples is the fewest results in the window for the failure rate
	// to open the breaker, so that two calls with one failure do not count
	// as a 50% failure rate. Zero or negative means 20. It is ignored when
	// FailureRate is off.
	MinSamples int

	// SlowCall, when above zero, makes a call that succeeded but took
	// longer than SlowCall (as given to Done) count as a failure for
	// the breaker: for the consecutive count, the failure rate and a probe's
	// outcome alike. Zero or negative means off.
	SlowCall time.Duration

	// MaxResetTimeout turns on backoff when it is above ResetTimeout: each
	// failed probe doubles the open period, up to MaxResetTimeout, and the
	// breaker closing (a successful probe, ForceClose or Disable) brings it
	// back to ResetTimeout. Zero, or not above ResetTimeout, means no
	// backoff.
	MaxResetTimeout time.Duration

	// ResetJitter, between 0 and 1, lengthens each open period by a random
	// share of up to ResetJitter, so that several hubs do not probe a
	// recovering target in the same instant: an open period of base length p
	// lasts p + p×Rand()×ResetJitter, truncated to the nanosecond. The share
	// is drawn once per open period, so RetryAfter and Snapshot report the
	// real remaining time. Values above 1 mean 1. Zero, negative or NaN means
	// off.
	ResetJitter float64

	// ProbeSuccesses is how many healthy probes in a row close a half-open
	// breaker. While fewer have succeeded the breaker stays HALF_OPEN,
	// refusing every other call, and admits the next probe once
	// ProbeInterval (or ResetTimeout) has passed since the last one
	// reported; a failed probe reopens it and the count starts over. Zero
	// or negative means 1: the first healthy probe closes it.
	ProbeSuccesses int
	// ProbeInterval, when above zero, is how long after a probe the next
	// one is due while the breaker has not closed: the open period after a
	// failed probe is exactly ProbeInterval (neither backoff nor jitter
	// lengthens it), and with ProbeSuccesses above 1 the next probe of a
	// half-open breaker is due ProbeInterval after a healthy one. Zero or
	// negative means off: a failed probe opens the breaker for its open
	// period as the policies above make it, and the next of several probes
	// is due ResetTimeout after a healthy one.
	ProbeInterval time.Duration
	// SyntheticProbes makes the probes the caller's own: no call admitted
	// by Allow is ever the probe. Once the open period has passed and while
	// the breaker is half-open Allow refuses every call, and only
	// AllowProbe admits the probe. False means the first call after the
	// open period is the probe.
	SyntheticProbes bool
}

// Settings configures a Breaker: its name, its Policy, and the seams (clock,
// transition observer, random source). New copies the Settings, so changing
// them afterwards does not affect the breaker. ProbeTimeout only lets a new
// probe replace a silent one and changes neither the state nor the backoff.
type Settings struct {
	// Name identifies the breaker in transitions; usually the target name.
	Name string
	// Policy is when the breaker opens and how long it stays open.
	// Embedded, so that its fields read as the Settings' own.
	Policy
	// Clock supplies the time. Nil means the system clock.
	Clock Clock
	// OnTransition, if set, is called for every state change, in the order
	// the changes happen, including those caused by HoldOpen, ForceClose and
	// Disable. It runs under the breaker's lock so that each breaker's
	// changes reach observers as an unbroken chain; it must therefore be
	// fast and must never call back into the breaker.
	OnTransition func(Transition)

	// Rand returns the random share for the jitter, in [0, 1); values out of
	// that range are clamped into [0, 1]. Nil means math/rand/v2's Float64.
	// It is never called under the breaker's lock: the share for the next
	// open period is drawn ahead, in New and again after each open period
	// starts. It must be safe for concurrent use, as two goroutines may draw
	// at once.
	Rand func() float64

	// ProbePermits, when set, makes the breaker wait for PermitProbe before
	// it admits a probe: once its open period has passed it stays OPEN,
	// refusing with no time to wait, until a permit comes. Several hubs
	// that share a target's breaker state use it so that only the one that
	// won the right to probe does. False means the first call after the
	// open period is the probe.
	ProbePermits bool

	// ProbeTimeout, when above zero, keeps the breaker from hanging in
	// HALF_OPEN: if the probe has not reported within ProbeTimeout of its
	// admission, the next Allow admits a new probe, and the old probe's
	// result is ignored when it comes. Zero or negative means off: the
	// breaker waits for the probe however long it takes.
	ProbeTimeout time.Duration
}

// Default values of the policy settings that have one.
const (
	defaultFailThreshold = 5
	defaultResetTimeout  = 10 * time.Second
	defaultWindow        = time.Minute
	defaultMinSamples    = 20
)

// effective returns s with every default filled in and every policy that is
// off zeroed, as Breaker.Settings reports it.
func (s Settings) effective() Settings {
	s.Policy = s.Policy.Effective()
	if s.Clock == nil {
		s.Clock = systemClock{}
	}
	if s.Rand == nil {
		s.Rand = rand.Float64
	}
	s.ProbeTimeout = max(s.ProbeTimeout, 0)
	return s
}

// Effective returns p with every default filled in, values out of range
// clamped, and every policy that is off zeroed: the policy a breaker given
// p runs with.
func (p Policy) Effective() Policy {
	s := p
	if s.FailThreshold <= 0 {
		s.FailThreshold = defaultFailThreshold
	}
	s.FailThreshold = min(s.FailThreshold, maxFailures)
	if s.ResetTimeout <= 0 {
		s.ResetTimeout = defaultResetTimeout
	}
	if s.FailureRate > 0 {
		s.FailureRate = min(s.FailureRate, 1)
		if s.Window <= 0 {
			s.Window = defaultWindow
		}
		if s.MinSamples <= 0 {
			s.MinSamples = defaultMinSamples
		}
	} else {
		s.FailureRate, s.Window, s.MinSamples = 0, 0, 0
	}
	s.SlowCall = max(s.SlowCall, 0)
	if s.MaxResetTimeout <= s.ResetTimeout {
		s.MaxResetTimeout = 0
	}
	if s.ResetJitter > 0 {
		s.ResetJitter = min(s.ResetJitter, 1)
	} else {
		s.ResetJitter = 0
	}
	// One healthy probe is the plain breaker: like a policy that is off,
	// it reads as zero.
	if s.ProbeSuccesses <= 1 {
		s.ProbeSuccesses = 0
	}
	s.ProbeInterval = max(s.ProbeInterval, 0)
	return s
}

// policy is a breaker's effective settings and the values the breaker
// reads from them. It is never changed once published: SetPolicy and
// SetProbeTimeout publish a new one.
type policy struct {
	settings     Settings // effective settings, as Settings reports them
	threshold    uint32
	resetTimeout time.Duration
	rateOn       bool
	failureRate  float64
	minSamples   int
	slowCall     time.Duration
	maxReset     time.Duration
	jitter       float64
	probeTimeout time.Duration
	successes    int
	interval     time.Duration
	synthetic    bool
}

// newPolicy returns the policy of the effective settings e.
func newPolicy(e Settings) *policy {
	return &policy{
		settings:     e,
		threshold:    uint32(e.FailThreshold),
		resetTimeout: e.ResetTimeout,
		rateOn:       e.FailureRate > 0,
		failureRate:  e.FailureRate,
		minSamples:   e.MinSamples,
		slowCall:     e.SlowCall,
		maxReset:     e.MaxResetTimeout,
		jitter:       e.ResetJitter,
		probeTimeout: e.ProbeTimeout,
		successes:    max(e.ProbeSuccesses, 1),
		interval:     e.ProbeInterval,
		synthetic:    e.SyntheticProbes,
	}
}
