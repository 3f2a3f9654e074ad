package relay

import (
	"time"

	"github.com/relayhub/relayhub/breaker"
)

// callHold is one transaction in flight: taken when the admitter meets
// the request, it carries what the transaction holds until its answer —
// the hub's count of active calls (which Shutdown waits for), the breaker
// ticket and the bulkhead slot once admitted, and, once it has left the
// read loop for a call, a resolver or a copy waiting on the shield, a
// place among its connection's calls (which the connection waits for
// before it closes). Every path ends in release — answered, refused,
// panicked, handed to a resolver — which hands back whatever is still
// held, once.
//
// A hold moves, it is never copied: handOff empties the hold it is called
// on and returns the full one. release empties the hold too, so releasing
// an empty hold — a second time, or after the hold moved on — is a no-op
// by design: a deferred release needs no flag to know whether another
// path released first, and no count goes down twice.
type callHold struct {
	adm       *admitter      // nil when the hold is empty
	target    *target        // the target whose breaker admitted the request; nil before
	ticket    breaker.Ticket // held while hasTicket
	handed    bool           // counted among adm.calls: the hold left the read loop
	hasTicket bool
	hasSlot   bool
}

// take makes the empty hold h hold a request of a about to be admitted,
// counted among the hub's active calls. It fills h in place rather than
// returning a hold, to spare the read loop's admission a copy.
func (h *callHold) take(a *admitter) {
	a.srv.serving.activeCalls.Add(1)
	h.adm = a
}

// held reports whether h holds a transaction: not yet released nor moved.
func (h *callHold) held() bool { return h.adm != nil }

// admitted records the ticket of t's breaker.
func (h *callHold) admitted(t *target, ticket breaker.Ticket) {
	h.target, h.ticket, h.hasTicket = t, ticket, true
}

// takeSlot tries to take a slot of the admitting target's bulkhead and
// reports whether it did.
func (h *callHold) takeSlot() bool {
	h.hasSlot = h.target.bulkhead.TryAcquire()
	return h.hasSlot
}

// handBackTicket hands the ticket back to the breaker as neither success
// nor failure (Cancel).
func (h *callHold) handBackTicket() {
	h.hasTicket = false // before the breaker: a panic in it hands nothing back twice
	h.target.breaker.Cancel(h.ticket)
}

// recordTicket gives the breaker the call's result.
func (h *callHold) recordTicket(failed bool, took time.Duration) {
	h.hasTicket = false
	h.target.breaker.Done(h.ticket, failed, took)
}

// releaseSlot gives the bulkhead slot back.
func (h *callHold) releaseSlot() {
	h.hasSlot = false
	h.target.bulkhead.Release()
}

// handBack hands back the ticket and the slot if they are still held and
// reports whether the ticket was. The counts stay: release lowers them.
func (h *callHold) handBack() (ticket bool) {
	ticket = h.hasTicket
	if h.hasTicket {
		h.handBackTicket()
	}
	if h.hasSlot {
		h.releaseSlot()
	}
	return ticket
}

// handOff moves the hold to another goroutine — a call, a resolver, a
// copy waiting on the shield — counting it among the connection's calls
// once, and returns it; h is left empty.
func (h *callHold) handOff() callHold {
	if !h.handed {
		h.handed = true
		h.adm.calls.Add(1)
	}
	moved := *h
	*h = callHold{}
	return moved
}

// release ends the hold: whatever is still held is handed back (handBack)
// and the counts go down. A no-op on an empty hold.
func (h *callHold) release() {
	if h.adm != nil {
		h.releaseHeld()
	}
}

// releaseHeld is release of a hold that is not empty.
func (h *callHold) releaseHeld() {
	a := h.adm
	if h.hasTicket || h.hasSlot {
		h.handBack()
	}
	handed := h.handed
	h.adm, h.handed = nil, false // empty: the rest went with handBack
	a.srv.serving.activeCalls.Add(-1)
	if handed {
		a.calls.Done()
	}
}
