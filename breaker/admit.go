package breaker

import (
	"math"
	"time"
)

// Ticket is the admission handed out by Allow and AllowProbe. The caller
// gives it back exactly once, to Done with the call's result or to Cancel
// when the call was never made. A ticket from an earlier generation
// (admitted before the breaker last changed state, or a probe replaced
// after ProbeTimeout) is stale: its result is ignored.
type Ticket struct {
	generation uint32
	probe      bool
}

// Probe reports whether the ticket admitted the half-open probe.
func (t Ticket) Probe() bool { return t.probe }

// Allow asks to make one call. It returns ErrOpen when the breaker refuses:
// it is open and its open period has not passed, it is held open (then the
// error is ErrHeld, which wraps ErrOpen, and the wait is zero), it is
// half-open with its probe out or not yet due, or it takes only synthetic
// probes (Policy.SyntheticProbes) and is not closed. A refusal also returns how
// long until a probe may be admitted, as RetryAfter would, from the same
// clock reading, so the caller can say when to retry without asking again.
// Otherwise the returned ticket must be given back to Done or Cancel.
//
// A closed breaker admits without the lock or the clock, and an open one
// refuses without the lock.
func (b *Breaker) Allow() (t Ticket, retryAfter time.Duration, err error) {
	w := b.word.Load()
	if stateOf(w) == Closed {
		return Ticket{generation: generationOf(w)}, 0, nil
	}
	return b.allowOpen(w, b.clock.Now())
}

// allowOpen is Allow at now for a breaker that was not closed in w: an
// open one refuses without the lock while its open period has not passed.
func (b *Breaker) allowOpen(w uint64, now time.Time) (Ticket, time.Duration, error) {
	if stateOf(w) == Open {
		switch after := b.probeAfter.Load(); after {
		case heldOpen:
			return Ticket{}, 0, ErrHeld
		case awaitPermit:
			return Ticket{}, 0, ErrOpen
		default:
			if wait := time.Duration(after) - now.Sub(b.epoch); wait > 0 {
				return Ticket{}, wait, ErrOpen
			}
		}
	}
	return b.admitSlow(now, false)
}

// AllowProbe asks to send a probe of the caller's own, as the hub's prober
// does under Policy.SyntheticProbes. Unlike Allow it never admits an
// ordinary call: a closed breaker, disabled included, refuses it with
// ErrClosed, as no probe is needed. It admits the probe when one is due (the
// open period has passed and, with Settings.ProbePermits, a permit came; or,
// in HALF_OPEN, no probe is out and the next is due), and otherwise refuses
// with ErrHeld, or with ErrOpen and the wait until a probe is due (zero
// while it waits for a permit or for the probe out).
func (b *Breaker) AllowProbe() (t Ticket, retryAfter time.Duration, err error) {
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

// Done records the result of a call admitted with t. failed says whether
// the call failed; took is how long it took, for Policy.SlowCall: a success
// that took longer than SlowCall counts as a failure too. A took of zero
// means unknown, and is never slow. A stale ticket is ignored.
func (b *Breaker) Done(t Ticket, failed bool, took time.Duration) {
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
