package relay

import (
	"errors"
	"net/netip"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
)

// admitter decides what becomes of one connection's requests: the
// client-certificate check, the shield, the breaker, the bulkhead, the
// fallback, and fair reading (the refusal lane). It takes a parsed request
// and answers through its sink, so it needs no socket: the connection
// reads and writes, the admitter decides. The calls it starts answer
// through the same sink from their own goroutines.
type admitter struct {
	srv  *Server
	sink answerSink

	// Set before the first request, read-only afterwards.
	client netip.AddrPort // the PROXY header's source when there was one, else the socket peer
	peer   *connPeer      // what a PROXY header or a client certificate told; nil when neither did

	// Owned by the read loop.
	refusals  uint8     // lines refused in a row, up to laneAfter (see refusalLane)
	inTurn    bool      // the connection holds a turn in the refusal lane
	batchRead bool      // batchAt holds the reading for the batch of lines being served (breakerNow)
	batchAt   time.Time // the breakers' clock for the batch of lines being served

	// calls counts the holds handed off to other goroutines (callHold):
	// the connection waits for them before it closes.
	calls sync.WaitGroup
}

// connPeer is what a connection learnt about its client beyond the
// socket. Most connections have none, so it is kept apart from conn.
type connPeer struct {
	proxy      netip.AddrPort // the load balancer that sent the PROXY header; zero when none
	identities []string       // the client certificate's identities (clientcert.Identities); nil without one
	scope      dedup.Scope    // the shield's scope of the client's certificate (certScope); zero without one
}

// certIdentities returns the client certificate's identities, or nil
// without one.
func (a *admitter) certIdentities() []string {
	if a.peer == nil {
		return nil
	}
	return a.peer.identities
}

// logAddrs adds to ev the client's address and, when a PROXY header gave
// it, the load balancer's.
func (a *admitter) logAddrs(ev *zerolog.Event) *zerolog.Event {
	ev = ev.Stringer("remote", a.client)
	if a.peer != nil && a.peer.proxy.IsValid() {
		ev = ev.Stringer("proxy", a.peer.proxy)
	}
	return ev
}

// refuse answers a line that could not be parsed, txid being its TXID
// when it could be read: E900 with msg, or E906 once shutting down. No
// target can be credited with it.
func (a *admitter) refuse(txid []byte, code, msg string) {
	a.recordHubAnswer(nil, nil, protocol.Request{TxID: txid}, code, 0, breakerNote{})
	a.sink.answerText(txid, code, msg, false)
}

// admit is the one place that composes the policies for a request, in
// order (docs/DESIGN.md, "A line's way through the hub"):
//
//  1. shutting down: E906 at once;
//  2. unknown target: E903; a target the client's certificate may not
//     use: E908;
//  3. the target's breaker admits the call; when it refuses and the target
//     has a fallback, the fallback's breaker is asked, and the request is
//     the fallback's from then on ("via FALLBACK: " in its message); when
//     both refuse, E904 with the target's own retry hint;
//  4. the admitting target's bulkhead takes a slot; full: the ticket goes
//     back with Cancel and E905 (a full bulkhead never sends a request to
//     the fallback);
//  5. on a call worker (startCall): the call, the breaker's record, the
//     slot's release, a call in doubt journalled, then the answer. A call
//     the hub could not make for want of its own resources (out of file
//     descriptors, say) hands the ticket back with Cancel and is answered
//     E906 "hub overloaded; not sent": the target is not to blame.
//
// Steps 1 to 4 never wait, so a refusal never queues behind a slow call.
// A panic is answered E907 and hands back what was taken. It reports
// whether the call started; every other request is answered on return.
func (a *admitter) admit(req protocol.Request) (started bool) {
	s := a.srv
	// Held before the shutdown check so that Shutdown, which sets the
	// flag and then waits for the active calls to drain, cannot miss a
	// call about to start.
	var ad admission
	ad.hold.take(a)
	defer func() {
		if !ad.hold.held() {
			return // handed to the call, which releases it
		}
		if p := recover(); p != nil {
			a.answerPanic(&ad, req, p)
		}
		ad.hold.release()
	}()

	if s.serving.inShutdown.Load() {
		// Shutdown is rare and this answer is no hot path: a lookup so
		// that a configured target is still credited with it.
		a.recordHubAnswer(s.table.lookup(req.Target), nil, req, protocol.CodeUnavailable, lblUnavailable, breakerNote{})
		a.sink.answerText(req.TxID, protocol.CodeUnavailable, protocol.MsgShuttingDown, false)
		return
	}
	t := s.table.lookup(req.Target)
	if t == nil {
		a.recordHubAnswer(nil, nil, req, protocol.CodeUnknownTarget, 0, breakerNote{})
		a.sink.answerText(req.TxID, protocol.CodeUnknownTarget, protocol.MsgUnknownTarget, false)
		return
	}
	conf := t.conf.Load()
	if !a.mayUse(conf) {
		a.refuseNotAllowed(t, req)
		return
	}
	if conf.settings.Dedup {
		var handled bool
		if ad.flight, handled, started = a.shield(t, conf, req); handled {
			return started
		}
	}
	return a.admitCall(&ad, t, conf, req, false)
}

// admission is what a request holds on its way to its call, so that a
// panic hands back exactly that: its hold (the target whose breaker
// admitted it, the ticket and the bulkhead slot) and the shield's flight
// it leads.
type admission struct {
	hold    callHold
	primary *target // the target the client named, when its fallback took the request
	asked   time.Time
	flight  *dedup.Flight // the shield's flight this request leads; nil when none
	// inDoubt: the flight's transaction is in doubt (a resend being
	// resolved), so a panic leaves it in doubt rather than forgetting it.
	inDoubt bool
	// resolved: the request follows a look-up that found it not applied.
	resolved bool
	// named is the target the client named, whose settings a panic's
	// flight in doubt keeps before a breaker admitted the request.
	named *target
}

// admitCall is steps 3 and 4 of admit for req, to t with configuration
// conf, then hands the call to a worker (step 5). ad holds the request's
// hold and flight, if any, and receives what is taken. flush says whether
// a refusal is written at once (true off the connection's read loop). It
// reports whether the call started.
func (a *admitter) admitCall(ad *admission, t *target, conf *targetConf, req protocol.Request, flush bool) bool {
	s := a.srv
	ad.named = t
	// The breakers decide by this reading and the access log records it
	// (see accessLog), so a replay of the log puts each decision at the
	// time the breaker saw it.
	ad.asked = a.breakerNow(flush)
	ticket, retryAfter, err := t.breaker.AllowAt(ad.asked)
	if err != nil {
		fb := conf.fallback
		if fb == nil {
			a.refuseOpen(t, req, retryAfter, err, ad.asked, ad.flight, flush)
			return false
		}
		if ticket, _, err = fb.breaker.AllowAt(ad.asked); err != nil {
			a.refuseOpen(t, req, retryAfter, err, ad.asked, ad.flight, flush)
			return false
		}
		conf.countFallback()
		ad.primary, conf = t, fb.conf.Load()
		t = fb
	}
	ad.hold.admitted(t, ticket)
	if ticket.Probe() {
		t.logTransitions()
	}
	if !ad.hold.takeSlot() {
		ad.hold.handBackTicket()
		a.recordHubAnswer(t, ad.primary, req, protocol.CodeBulkheadFull, lblBulkheadFull,
			breakerNote{use: breakerHandedBack, probe: ticket.Probe(), start: ad.asked})
		msg := protocol.MsgBulkheadFull
		if ad.primary != nil {
			msg = t.viaBusy
			a.sink.answerText(req.TxID, protocol.CodeBulkheadFull, msg, flush)
		} else {
			a.sink.answerTail(req.TxID, bulkheadFullTail, flush)
		}
		if ad.flight != nil {
			s.releaseFlight(ad.flight, protocol.CodeBulkheadFull, []byte(msg))
		}
		return false
	}

	cl := getCall(a, t, conf, ad.primary, req)
	cl.asked = ad.asked
	cl.inflight = t.bulkhead.InFlight()
	cl.flight, cl.resolved = ad.flight, ad.resolved
	cl.hold = ad.hold.handOff()
	s.startCall(t, cl)
	return true
}

// bulkheadFullTail is the E905 answer after the TXID, made once.
var bulkheadFullTail = protocol.NewTail(protocol.CodeBulkheadFull, protocol.MsgBulkheadFull)

// heldOpenTail is the E904 answer of a breaker held open, after the TXID,
// made once.
var heldOpenTail = protocol.NewTail(protocol.CodeCircuitOpen, protocol.MsgHeldOpen)

// answerPanic answers req E907 after a panic before its call started,
// handing back what ad holds: the ticket, the slot, and the flight, whose
// copies get the same answer. A flight in doubt stays so; any other is
// forgotten, since no call was made. The hold's counts are the caller's
// to release, after the answer.
func (a *admitter) answerPanic(ad *admission, req protocol.Request, p any) {
	s := a.srv
	var note breakerNote
	t := ad.hold.target // the target whose breaker admitted req, else the one it named
	if t == nil {
		t = ad.named
	}
	if ad.hold.handBack() {
		note = breakerNote{use: breakerHandedBack, probe: ad.hold.ticket.Probe(), start: ad.asked}
	}
	s.obs.log.Error().Bytes("txid", req.TxID).Interface("panic", p).Bytes("stack", debug.Stack()).Msg("request handling panicked")
	a.recordHubAnswer(t, ad.primary, req, protocol.CodeInternal, lblInternal, note)
	a.sink.answerText(req.TxID, protocol.CodeInternal, protocol.MsgInternal, true)
	if f := ad.flight; f != nil {
		ad.flight = nil
		msg := []byte(protocol.MsgInternal)
		if ad.inDoubt && t != nil {
			answerAll(s.shield.mem.Settle(f, dedup.InDoubt, protocol.CodeInternal, msg, t.conf.Load().settings.shieldWindow()), protocol.CodeInternal, msg)
		} else {
			s.releaseFlight(f, protocol.CodeInternal, msg)
		}
	}
}

// refuseOpen answers E904 for t, whose breaker refused the request with
// err and retryAfter (and its fallback's too, if it has one) when asked at
// asked, and the copies that joined f, the flight it leads, if any; flush
// as for admitCall. The message is t's: "held open by operator" while an
// operator holds it, else its retry hint, which the sink writes itself so
// that the hot path formats it on the stack.
func (a *admitter) refuseOpen(t *target, req protocol.Request, retryAfter time.Duration, err error, asked time.Time, f *dedup.Flight, flush bool) {
	a.recordHubAnswer(t, nil, req, protocol.CodeCircuitOpen, lblCircuitOpen, breakerNote{use: breakerRefused, start: asked})
	// A held breaker gives no wait, so an open one with a wait to hint
	// needs no errors.Is: a twentieth of a refusal's instructions.
	if retryAfter == 0 && errors.Is(err, breaker.ErrHeld) {
		a.sink.answerTail(req.TxID, heldOpenTail, flush)
		if f != nil {
			a.srv.releaseFlight(f, protocol.CodeCircuitOpen, []byte(protocol.MsgHeldOpen))
		}
		return
	}
	secs := retryHintSeconds(retryAfter)
	a.sink.answerRetry(req.TxID, secs, flush)
	if f != nil {
		a.srv.releaseFlight(f, protocol.CodeCircuitOpen, protocol.AppendRetryHint(nil, secs))
	}
}

// recordHubAnswer counts an answer the hub made without a target call, in
// the metrics and the access log: credited to t when the request's target
// is configured, else (t nil) to no target, where code must be one the hub
// answers before routing (E900, E903, E906, E907) and l is unused. primary, when
// not nil, is the target the client named, whose fallback t took the
// request; b is what t's breaker did with it.
func (a *admitter) recordHubAnswer(t, primary *target, req protocol.Request, code string, l codeLabel, b breakerNote) {
	s := a.srv
	name := req.Target
	if t != nil {
		t.metrics.count(l)
		name = t.nameBytes
	} else {
		s.obs.metrics.countUnrouted(code)
	}
	if s.obs.access != nil {
		s.obs.access.record(accessNote{txid: req.TxID, target: name, fallbackFor: primary.nameOrEmpty(), code: code, size: len(req.Payload), breaker: b,
			client: a.client})
	}
}
