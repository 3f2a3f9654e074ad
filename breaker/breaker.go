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
// caller's own (Policy.SyntheticProbes and AdmitProbe) in place of a
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
//	ticket, err := b.Allow()
//	if errors.Is(err, breaker.ErrOpen) {
//		return fmt.Sprintf("circuit open; retry after %s", b.RetryAfter())
//	}
//	began := time.Now()
//	failed := call() != nil
//	b.DoneAfter(ticket, failed, time.Since(began))
package breaker

import (
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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
	// longer than SlowCall (as given to DoneAfter) count as a failure for
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
	// by Allow or Admit is ever the probe. Once the open period has passed
	// and while the breaker is half-open they refuse every call, and only
	// AdmitProbe admits the probe. False means the first call after the
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

// Ticket is the admission handed out by Allow. The caller gives it back
// exactly once, to Done or DoneAfter with the call's result or to Cancel
// when the call was never made. A ticket from an earlier generation
// (admitted before the breaker last changed state, or a probe replaced
// after ProbeTimeout) is stale: its result is ignored.
type Ticket struct {
	generation uint32
	probe      bool
}

// Probe reports whether the ticket admitted the half-open probe.
func (t Ticket) Probe() bool { return t.probe }

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

// Allow asks to make one call. It returns ErrOpen when the breaker refuses:
// it is open and its open period has not passed, it is held open (then the
// error is ErrHeld, which wraps ErrOpen), it is half-open with its probe
// out or not yet due, or it takes only synthetic probes
// (Policy.SyntheticProbes) and is not closed. Otherwise the returned ticket
// must be given back to Done, DoneAfter or Cancel.
func (b *Breaker) Allow() (Ticket, error) {
	t, _, err := b.Admit()
	return t, err
}

// Admit is Allow that, when it refuses, also returns how long until a probe
// may be admitted, as RetryAfter would, read from the same clock reading.
// An open breaker refuses without taking the lock.
func (b *Breaker) Admit() (t Ticket, retryAfter time.Duration, err error) {
	w := b.word.Load()
	if stateOf(w) == Closed {
		return Ticket{generation: generationOf(w)}, 0, nil
	}
	now := b.clock.Now()
	if retryAfter, err := b.refuseOpen(w, now); err != nil {
		return Ticket{}, retryAfter, err
	}
	return b.admitSlow(now, false)
}

// AdmitIn is Admit for a caller that answers a run of requests at once (a
// batch of pipelined lines, say): run is the run's reading of the breaker's
// clock (Settings.Clock), zero until a breaker of the run needs the time,
// which then reads its clock into it. An open breaker whose period has not
// passed refuses at that reading, so a run of refusals costs one clock
// reading; anything else (a probe, a change of state) reads the clock
// afresh, so every transition is stamped as by Admit. A run is to be short
// (no waiting within it) and shared only by breakers of one clock.
func (b *Breaker) AdmitIn(run *time.Time) (t Ticket, retryAfter time.Duration, err error) {
	w := b.word.Load()
	if stateOf(w) == Closed {
		return Ticket{generation: generationOf(w)}, 0, nil
	}
	fresh := run.IsZero()
	if fresh {
		*run = b.clock.Now()
	}
	if retryAfter, err := b.refuseOpen(w, *run); err != nil {
		return Ticket{}, retryAfter, err
	}
	if fresh {
		return b.admitSlow(*run, false)
	}
	return b.admitSlow(b.clock.Now(), false)
}

// refuseOpen is the lock-free refusal of a breaker whose word was w: the
// error and wait Admit returns when it refuses at now without the lock, a
// nil error when the lock must decide.
func (b *Breaker) refuseOpen(w uint64, now time.Time) (retryAfter time.Duration, err error) {
	if stateOf(w) == Open {
		after := b.probeAfter.Load()
		switch after {
		case heldOpen:
			return 0, ErrHeld
		case awaitPermit:
			return 0, ErrOpen
		}
		if wait := time.Duration(after) - now.Sub(b.epoch); wait > 0 {
			return wait, ErrOpen
		}
	}
	return 0, nil
}

// AdmitProbe asks to send a probe of the caller's own, as a hub does with
// Policy.SyntheticProbes: it admits one when a call would be admitted as
// the probe, that is once the open period has passed (and, with
// Settings.ProbePermits, a permit came) or, in HALF_OPEN, once no probe is
// out and the next one is due. The ticket goes back to Done, DoneAfter or
// Cancel like any other. It returns ErrClosed when the breaker is closed
// (disabled included: no probe is needed), ErrHeld when it is held open,
// and ErrOpen, with how long until a probe is due (zero when it waits for
// a permit or for the probe out), otherwise.
func (b *Breaker) AdmitProbe() (t Ticket, retryAfter time.Duration, err error) {
	return b.admitSlow(b.clock.Now(), true)
}

// heldOpen is the probeAfter of a breaker held open: no probe, ever.
const heldOpen = math.MaxInt64

// awaitPermit is the probeAfter of an open breaker whose open period has
// passed and which waits for PermitProbe (Settings.ProbePermits): refused
// with no time to wait, without the lock.
const awaitPermit = math.MaxInt64 - 1

func (b *Breaker) admitSlow(now time.Time, own bool) (Ticket, time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	p := b.pol.Load()
	switch stateOf(w) {
	case Closed:
		if own {
			return Ticket{}, 0, ErrClosed
		}
		return Ticket{generation: generationOf(w)}, 0, nil
	case Open:
		if b.held {
			return Ticket{}, 0, ErrHeld
		}
		if wait := b.openedAt.Add(b.openFor).Sub(now); wait > 0 {
			return Ticket{}, wait, ErrOpen
		}
		if (b.probePermits && !b.permitted) || (p.synthetic && !own) {
			// Refused from now on without the lock, until a permit or
			// the breaker's own probe moves it on.
			b.probeAfter.Store(awaitPermit)
			return Ticket{}, 0, ErrOpen
		}
		permitted := b.permitted
		w = b.setStateLocked(w, HalfOpen, now, CauseProbe)
		// The permit covers the half-open period it began, so this hub may
		// replace a silent probe of its own.
		b.permitted = permitted
	default: // HalfOpen
		if b.probeOut && (p.probeTimeout == 0 || now.Sub(b.probeAt) < p.probeTimeout) {
			return Ticket{}, 0, ErrOpen
		}
		wait := max(b.nextProbe.Sub(now), 0)
		if p.synthetic && !own {
			return Ticket{}, wait, ErrOpen
		}
		if wait > 0 && !b.probeOut {
			return Ticket{}, wait, ErrOpen
		}
		// A fresh generation, so a probe that was handed back, or one that
		// outlived ProbeTimeout, can never report for this one.
		w = pack(generationOf(w)+1, failuresOf(w), HalfOpen)
		b.word.Store(w)
	}
	b.probeOut = true
	b.probeAt = now
	return Ticket{generation: generationOf(w), probe: true}, 0, nil
}

// Done records the result of a call admitted with t. failed says whether the
// call counts as a failure. A stale ticket is ignored. Done(t, failed) is
// DoneAfter(t, failed, 0): the call is never slow.
func (b *Breaker) Done(t Ticket, failed bool) {
	b.DoneAfter(t, failed, 0)
}

// DoneAfter records the result of a call admitted with t that took took.
// failed says whether the call failed; with SlowCall set, a success that
// took longer than SlowCall counts as a failure too. A stale ticket is
// ignored.
func (b *Breaker) DoneAfter(t Ticket, failed bool, took time.Duration) {
	p := b.pol.Load()
	if p.slowCall > 0 && took > p.slowCall {
		failed = true
	}
	if t.probe {
		b.probeDone(t, failed)
		return
	}
	if p.rateOn {
		b.doneInWindow(t, failed)
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
		if n+1 >= p.threshold {
			b.failAtThreshold(t)
			return
		}
		if b.word.CompareAndSwap(w, w+failureUnit) {
			return
		}
	}
}

// failAtThreshold records a failure that may open the breaker. It rechecks
// under mu because a success may have cleared the count meanwhile, and
// because a disabled breaker only counts.
func (b *Breaker) failAtThreshold(t Ticket) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	for {
		w := b.word.Load()
		if generationOf(w) != t.generation || stateOf(w) != Closed {
			return
		}
		n := failuresOf(w)
		if n+1 >= b.pol.Load().threshold && !b.disabled {
			b.setStateLocked(w+failureUnit, Open, now, CauseResults)
			return
		}
		if n >= maxFailures || b.word.CompareAndSwap(w, w+failureUnit) {
			return
		}
	}
}

// doneInWindow records a closed-state result when the failure-rate policy is
// on. Everything happens under mu: the count, the window and the decision
// to open. The count moves by compare-and-swap all the same, because a
// SetPolicy that has just turned the policy off lets results that no
// longer come here update it without mu.
func (b *Breaker) doneInWindow(t Ticket, failed bool) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	p := b.pol.Load()
	w := b.word.Load()
	if generationOf(w) != t.generation || stateOf(w) != Closed {
		return
	}
	var total, failures int
	if p.rateOn {
		total, failures = b.win.record(now, failed)
	}
	for {
		n := failuresOf(w)
		switch {
		case !failed:
			n = 0
		case n < maxFailures:
			n++
		}
		nw := pack(generationOf(w), n, Closed)
		if !b.disabled && (n >= p.threshold || p.rateTripped(total, failures)) {
			b.setStateLocked(nw, Open, now, CauseResults)
			return
		}
		if nw == w || b.word.CompareAndSwap(w, nw) {
			return
		}
		// The generation cannot change without mu: only a count moved.
		w = b.word.Load()
	}
}

// rateTripped reports whether the window's counts open the breaker. The
// share is compared as a quotient because division rounds once, so a share
// of exactly FailureRate (3 of 10 against 0.3) is not lost to rounding.
func (p *policy) rateTripped(total, failures int) bool {
	return p.rateOn && total >= p.minSamples && float64(failures)/float64(total) >= p.failureRate
}

func (b *Breaker) probeDone(t Ticket, failed bool) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	w := b.word.Load()
	if generationOf(w) != t.generation || stateOf(w) != HalfOpen {
		return
	}
	b.probeOut = false
	p := b.pol.Load()
	if failed {
		if failuresOf(w) < maxFailures {
			w += failureUnit
		}
		if p.interval > 0 {
			b.changeStateLocked(w, Open, now, CauseResults, p.interval)
			return
		}
		if maxReset := p.maxReset; maxReset > 0 {
			// Halve the cap rather than double the period so the product
			// cannot overflow.
			if b.period > maxReset/2 {
				b.period = maxReset
			} else {
				b.period *= 2
			}
		}
		b.setStateLocked(w, Open, now, CauseResults)
		return
	}
	b.successes++
	if b.successes < p.successes {
		// Still half-open, with no change to report: a fresh generation so
		// the ticket cannot report twice, and the next probe due later.
		b.word.Store(pack(generationOf(w)+1, failuresOf(w), HalfOpen))
		interval := p.interval
		if interval == 0 {
			interval = p.resetTimeout
		}
		b.nextProbe = now.Add(interval)
		return
	}
	b.setStateLocked(w, Closed, now, CauseResults)
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
// lock-free path of Admit. b.mu must be held.
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
