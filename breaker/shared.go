package breaker

import "time"

// Shared state lets several breakers for one target, one per hub, act as
// one: a hub applies what another hub's breaker did with AdoptOpen and
// AdoptClose, and with Settings.ProbePermits only the hub given a permit
// (PermitProbe) sends the probe. The breaker itself knows nothing of other
// hubs or of how their state travels; each change these cause reaches
// Settings.OnTransition with CauseShared, so the caller can tell the
// changes it must spread from those it applied.

// AdoptOpen makes the breaker open for remaining from now, as another hub's
// breaker for the same target is: a closed or half-open breaker opens (a
// probe out becomes stale), an open one moves the end of its open period.
// period, when above zero, becomes the base length of the open periods
// that follow, so backoff goes on from where the other hub left it. A
// permit given for the open period that ends is withdrawn. A breaker held
// open or disabled by an operator is left as it is: manual control
// overrides shared state. A remaining of zero or less makes the open period
// end now.
func (b *Breaker) AdoptOpen(remaining, period time.Duration) {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	if b.held || b.disabled {
		return
	}
	if period > 0 {
		b.period = period
	}
	remaining = max(remaining, time.Nanosecond)
	w := b.word.Load()
	if stateOf(w) != Open {
		b.changeStateLocked(w, Open, now, CauseShared, remaining)
		return
	}
	b.permitted = false
	b.openedAt, b.openFor = now, remaining
	b.storeProbeAfterLocked()
}

// AdoptClose closes the breaker, as another hub's probe found the target
// healthy: a failure count of zero, the failure-rate window cleared, the
// backoff ended. A breaker held open by an operator is left as it is; a
// disabled one stays disabled.
func (b *Breaker) AdoptClose() {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	if b.held {
		return
	}
	p := b.pol.Load()
	b.period = p.resetTimeout
	if p.rateOn {
		b.win.clear()
	}
	w := b.word.Load()
	if stateOf(w) != Closed {
		b.changeStateLocked(w, Closed, now, CauseShared, 0)
		return
	}
	b.word.Store(pack(generationOf(w), 0, Closed))
}

// PermitProbe lets a breaker with Settings.ProbePermits admit a probe in its
// current open period, once the period has passed, or replace a silent
// probe of its current half-open period. The permit ends with the period:
// the next open period needs a new one. On a closed breaker it does
// nothing.
func (b *Breaker) PermitProbe() {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	if stateOf(w) == Closed || b.held {
		return
	}
	b.permitted = true
	if stateOf(w) == Open {
		b.storeProbeAfterLocked()
	}
}

// WithdrawPermit takes back a permit given by PermitProbe that no probe has
// used: an open breaker goes back to waiting for a permit. It reports
// whether it took one back; false when there was none, or when the breaker
// is not open (the probe the permit admitted is out, or the breaker moved
// on), so the caller knows whether the permit was used. Several hubs
// sharing a target's breaker use it when the right to probe lapses unused,
// so that the next hub given the right is the only one that may probe.
func (b *Breaker) WithdrawPermit() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if stateOf(b.word.Load()) != Open || !b.permitted || b.held {
		return false
	}
	b.permitted = false
	b.storeProbeAfterLocked()
	return true
}
