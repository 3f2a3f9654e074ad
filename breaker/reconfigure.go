package breaker

import "time"

// A running breaker's policy can change without losing what the breaker
// knows: a hub that reloads its settings keeps each target's state, failure
// count and open period, and only the rules that judge the next results
// change. Neither change is a state change, so neither reaches
// Settings.OnTransition.

// SetPolicy makes the breaker judge results by p from now on, as if it had
// been created with it, keeping its state, its consecutive failure count,
// its generation (so calls in flight still report), its manual control and
// the open period in progress. In detail:
//
//   - a new FailThreshold applies to the next failure: a closed breaker
//     whose count is already at or past a lowered threshold opens at its
//     next failure, not at once;
//   - a new ResetTimeout, backoff or jitter applies from the next open
//     period; the one in progress ends when it was due to. A breaker that
//     was backing off goes on from its current period, brought within the
//     new ResetTimeout and MaxResetTimeout (back to ResetTimeout when
//     backoff is now off);
//   - a new ProbeSuccesses, ProbeInterval or SyntheticProbes applies from
//     the next probe's admission or result; a half-open breaker keeps the
//     healthy probes it has had;
//   - a new SlowCall applies to the results reported from now on, calls in
//     flight included;
//   - the failure-rate window keeps its results while FailureRate stays on
//     and Window stays the same; turning it on, or changing Window, starts
//     an empty window (results cannot be spread over buckets of another
//     width), and turning it off drops it.
//
// It takes the breaker's lock and calls no foreign code under it; it is
// safe for concurrent use with every other method.
func (b *Breaker) SetPolicy(p Policy) {
	b.mu.Lock()
	defer b.unlock()
	old := b.pol.Load()
	s := old.settings
	s.Policy = p
	np := newPolicy(s.effective())
	switch {
	case np.maxReset == 0 || b.period <= old.resetTimeout:
		b.period = np.resetTimeout
	default:
		b.period = min(max(b.period, np.resetTimeout), np.maxReset)
	}
	switch {
	case !np.rateOn:
		b.win = window{}
	case !old.rateOn || np.settings.Window != old.settings.Window:
		b.win = newWindow(np.settings.Window)
	}
	if np.jitter > 0 && old.jitter == 0 {
		// No share was drawn while jitter was off: unlock draws one, outside
		// the lock like every draw.
		b.redraw = true
	}
	b.pol.Store(np)
	if stateOf(b.word.Load()) == Open && !b.held {
		// An open breaker that refused without the lock while it waited
		// for a synthetic probe must look again under the new policy.
		b.storeProbeAfterLocked()
	}
}

// SetProbeTimeout makes d the breaker's ProbeTimeout from now on (zero or
// negative turns it off), for the probe out as well: a probe admitted
// longer than d ago may be replaced by the next Allow. It keeps the
// breaker's state and is safe for concurrent use with every other method.
func (b *Breaker) SetProbeTimeout(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.pol.Load().settings
	s.ProbeTimeout = d
	b.pol.Store(newPolicy(s.effective()))
}
