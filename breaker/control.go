package breaker

// Manual control lets an operator override the breaker from the admin port.
// It keeps to the three states: holding a breaker open makes it OPEN,
// forcing it closed or disabling it makes it CLOSED, and each state change
// these cause is reported to Settings.OnTransition like any other. None of
// them returns a value: Snapshot reports the outcome, Held and Disabled
// included.

// HoldOpen moves the breaker to OPEN, if it is not open already, and keeps
// it there, refusing every call, until Enable or ForceClose: the open period
// does not apply while it is held, so it never becomes HALF_OPEN. A probe
// out when it is called becomes stale. HoldOpen ends Disable, because an
// operator who holds a target off wants it off whatever came before.
func (b *Breaker) HoldOpen() {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	b.disabled = false
	b.held = true
	b.probeAfter.Store(heldOpen)
	if w := b.word.Load(); stateOf(w) != Open {
		b.setStateLocked(w, Open, now, CauseOperator)
	}
}

// ForceClose moves the breaker to CLOSED with a failure count of zero, if it
// is not closed already, ends HoldOpen and Disable, clears the failure-rate
// window and ends the backoff. On a breaker that is already closed it only
// clears the count and the window: calls in flight keep their generation
// and still report.
func (b *Breaker) ForceClose() {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	b.held = false
	b.disabled = false
	p := b.pol.Load()
	b.period = p.resetTimeout
	if p.rateOn {
		b.win.clear()
	}
	w := b.word.Load()
	if stateOf(w) != Closed {
		b.setStateLocked(w, Closed, now, CauseOperator)
		return
	}
	// The generation cannot change without mu, so only a concurrent
	// lock-free count update can race this store, and it then retries
	// against the cleared count.
	b.word.Store(pack(generationOf(w), 0, Closed))
}

// Disable makes the breaker pass-through: it moves to CLOSED, if it is not
// closed already (failure count zero, window cleared, backoff ended), and
// from then on admits every call and never opens, by count or by rate,
// until Enable, HoldOpen or ForceClose. It still counts consecutive failures
// and fills the failure-rate window, and Snapshot reports them, so the
// operator can see what the breaker would have done.
func (b *Breaker) Disable() {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	b.held = false
	b.disabled = true
	if w := b.word.Load(); stateOf(w) != Closed {
		b.setStateLocked(w, Closed, now, CauseOperator)
	}
}

// Enable returns the breaker to normal operation from where it stands. A
// disabled breaker stays CLOSED with its current count and window, and the
// next result decides as usual (a failure at or past the threshold opens
// it). A held breaker stays OPEN and starts an open period now, of
// ResetTimeout plus jitter: the backoff starts over, as the operator has
// just decided the target deserves a fresh look. Otherwise Enable does
// nothing.
func (b *Breaker) Enable() {
	now := b.clock.Now()
	b.mu.Lock()
	defer b.unlock()
	b.disabled = false
	if !b.held {
		return
	}
	b.held = false
	b.period = b.pol.Load().resetTimeout
	b.startOpenPeriodLocked(now, 0)
}
