package relay

import (
	"context"
	"strings"
	"time"

	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// shieldOutcome is what the duplicate-TXID shield did with a resend: a
// label value of relay_dedup_total and a count of the target's status.
type shieldOutcome uint8

const (
	shieldJoined             shieldOutcome = iota // joined the call in flight
	shieldReplayed                                // answered again from memory
	shieldRefusedPayload                          // E909
	shieldResolvedApplied                         // in doubt; the target says applied
	shieldResolvedNotApplied                      // in doubt; the target says not applied: called afresh
	shieldUnresolved                              // in doubt and still unknown: E901 without a call
	numShieldOutcomes
)

// shieldOutcomeNames are the outcome label values of relay_dedup_total.
var shieldOutcomeNames = [numShieldOutcomes]string{"joined", "replayed", "refused_payload", "resolved_applied", "resolved_not_applied", "unresolved"}

// countShielded counts what the shield did with one of r's requests.
func (r *target) countShielded(o shieldOutcome) {
	r.shielded[o].Add(1)
	r.metrics.countShielded(o)
}

// shield puts req, for rt with configuration conf, through the
// duplicate-TXID shield (docs/DESIGN.md, "The duplicate-TXID shield").
// When the shield remembers the TXID it deals with req itself and reports
// handled: answered now (a remembered answer, E909, E901 for an outcome it
// cannot look up, E906 for a new TXID when it is full), joined to the call in flight, or handed to a look-up of
// its outcome (async, answered later). Otherwise req is the first of its
// TXID and the caller leads its call through the returned flight.
func (a *admitter) shield(rt *target, conf *targetConf, req protocol.Request) (f *dedup.Flight, handled, async bool) {
	s := a.srv
	v, f, code, msg := s.shield.mem.Begin(rt.name, a.shieldScope(conf), req.TxID, dedup.HashPayload(req.Payload), func() dedup.Waiter {
		return a.join(rt, req)
	})
	switch v {
	case dedup.Claimed:
		return f, false, false
	case dedup.Joined:
		rt.countShielded(shieldJoined)
		return nil, true, true
	case dedup.Replayed:
		rt.countShielded(shieldReplayed)
		a.recordHubAnswer(rt, nil, req, code, answerCodeLabel(code), breakerNote{})
		a.sink.answerText(req.TxID, code, msg, false)
		return nil, true, false
	case dedup.Conflict:
		rt.countShielded(shieldRefusedPayload)
		a.recordHubAnswer(rt, nil, req, protocol.CodeTxIDReused, lblTxIDReused, breakerNote{})
		a.sink.answerText(req.TxID, protocol.CodeTxIDReused, protocol.MsgTxIDReused, false)
		return nil, true, false
	case dedup.Full:
		// Sent unshielded, a resend of it could be a second call.
		rt.metrics.countShieldFull()
		a.recordHubAnswer(rt, nil, req, protocol.CodeUnavailable, lblUnavailable, breakerNote{})
		a.sink.answerText(req.TxID, protocol.CodeUnavailable, protocol.MsgShieldFull, false)
		return nil, true, false
	}
	// dedup.Resolve: the first call ended in doubt, answered msg.
	return nil, true, a.startResolver(rt, f, req, msg)
}

// shieldScope returns the scope of the connection's TXIDs to a target
// configured by conf: its client's identity when it presented a
// certificate and the target keeps identities apart, else the target's.
func (a *admitter) shieldScope(conf *targetConf) dedup.Scope {
	if a.peer == nil || conf.settings.DedupScope == DedupByTarget {
		return dedup.Scope{}
	}
	return a.peer.scope
}

// startResolver starts the look-up of the outcome of req, a resend of a
// transaction in doubt to rt whose first call was answered doubt, on a
// goroutine of its own, which leads f and holds the transaction (see
// resolve). When the target that made that call has no status URL, has
// its transactions in doubt reversed, or is no longer configured, it
// answers at once instead (unresolved). It
// reports whether the look-up started.
func (a *admitter) startResolver(rt *target, f *dedup.Flight, req protocol.Request, doubt string) bool {
	called := a.srv.calledTarget(rt, doubt)
	// A target whose transactions in doubt are reversed is not asked: a
	// look-up during a reversal would read "not applied" and send the
	// transaction afresh. The resolver's reversal settles it.
	if called == nil || called.conf.Load().statusURL == "" || called.conf.Load().resolve == resolver.PolicyReverse {
		a.unresolved(rt, f, req)
		return false
	}
	own := protocol.Request{TxID: clone(req.TxID), Target: rt.nameBytes, Payload: clone(req.Payload)}
	var h callHold
	h.take(a)
	hold := h.handOff()
	a.srv.goCatching(taskResolver, func() { a.resolve(rt, called, f, own, hold) })
	return true
}

// calledTarget returns the target whose call left a transaction to rt in
// doubt, answered doubt: rt's fallback when the answer names it ("via
// NAME: ", as a fallback's answers begin; an answer in doubt is the hub's
// own, never a target's), else rt. Nil when that fallback is no longer
// configured. Asking rt about a call its fallback made would read "not
// applied" and send it a second time.
func (s *Server) calledTarget(rt *target, doubt string) *target {
	rest, ok := strings.CutPrefix(doubt, "via ")
	if !ok {
		return rt
	}
	name, _, ok := strings.Cut(rest, ": ")
	if !ok {
		return rt
	}
	return s.table.lookup([]byte(name))
}

// clone returns a copy of b that the connection's next read cannot
// overwrite.
func clone(b []byte) []byte { return append([]byte(nil), b...) }

// joiner is a copy of a request that joined the call in flight for its
// TXID: the call's leader answers it with the call's answer. While it
// waits it holds a transaction (callHold), like the call it joined.
type joiner struct {
	hold callHold
	rt   *target
	txid []byte
	size int
}

// join returns the waiter of req's copy, holding a call in flight.
// Called under the shield's lock, so that the leader cannot answer before
// the hold is taken.
func (a *admitter) join(rt *target, req protocol.Request) dedup.Waiter {
	var h callHold
	h.take(a)
	return &joiner{hold: h.handOff(), rt: rt, txid: clone(req.TxID), size: len(req.Payload)}
}

// Answer gives the copy the call's answer and releases its hold.
func (j *joiner) Answer(code string, msg []byte) {
	a := j.hold.adm
	j.rt.metrics.count(answerCodeLabel(code))
	a.srv.obs.access.record(accessNote{txid: j.txid, target: j.rt.nameBytes, code: code, size: j.size, client: a.client})
	a.sink.answer(j.txid, code, msg, true)
	j.hold.release()
}

// answerAll gives each waiter the answer code, msg.
func answerAll(ws []dedup.Waiter, code string, msg []byte) {
	for _, w := range ws {
		w.Answer(code, msg)
	}
}

// unresolved answers req, a resend of a transaction in doubt whose outcome
// the hub cannot learn, E901 without a call, and f's waiters alike; the
// transaction stays in doubt.
func (a *admitter) unresolved(rt *target, f *dedup.Flight, req protocol.Request) {
	rt.countShielded(shieldUnresolved)
	msg := []byte(protocol.MsgStillUnknown)
	ws := a.srv.shield.mem.Settle(f, dedup.InDoubt, protocol.CodeTimeout, msg, rt.conf.Load().settings.shieldWindow())
	a.recordHubAnswer(rt, nil, req, protocol.CodeTimeout, lblTimeout, breakerNote{})
	a.sink.answer(req.TxID, protocol.CodeTimeout, msg, true)
	answerAll(ws, protocol.CodeTimeout, msg)
}

// resolve asks called, the target that made the first call of req (rt or
// its fallback), whether it applied req, a resend to rt of a transaction
// in doubt whose flight f this goroutine leads: applied, req and its
// copies get the target's recorded answer and the journal records it; not
// applied, req is sent now as a fresh call to rt; no answer, E901 and no
// call. It owns hold, taken by startResolver, which passes to the fresh
// call, if one starts, and is released otherwise.
func (a *admitter) resolve(rt, called *target, f *dedup.Flight, req protocol.Request, hold callHold) {
	s := a.srv
	conf, cconf := rt.conf.Load(), called.conf.Load()
	ad := admission{hold: hold, named: rt, flight: f, inDoubt: true}
	defer func() {
		if !ad.hold.held() {
			return // handed to the fresh call, which releases it
		}
		if p := recover(); p != nil {
			a.answerPanic(&ad, req, p)
		}
		ad.hold.release()
	}()
	outcome, code, ansMsg, reason := cconf.lookUp(context.Background(), string(req.TxID))
	switch outcome {
	case targethttp.Applied:
		rt.countShielded(shieldResolvedApplied)
		msg := []byte(ansMsg)
		if called != rt {
			msg = append([]byte(called.viaPrefix), msg...)
		}
		ad.flight = nil
		ws := s.shield.mem.Settle(f, dedup.Answered, code, msg, conf.settings.shieldWindow())
		s.resolve.r.Forget(called.name, string(req.TxID))
		s.journalResolved(called, cconf, req, code)
		s.storeResolved(rt, conf, req, f, code, msg)
		a.recordHubAnswer(rt, nil, req, code, answerCodeLabel(code), breakerNote{})
		a.sink.answer(req.TxID, code, msg, true)
		answerAll(ws, code, msg)
	case targethttp.NotApplied:
		rt.countShielded(shieldResolvedNotApplied)
		if s.resolve.r.Forget(called.name, string(req.TxID)) {
			countResolved(called, resolver.NotApplied, indoubt.ViaResend)
			s.journalSettled(called, called.name, &doubtRef{url: cconf.url, sum: payloadSum(req.Payload)}, string(req.TxID),
				indoubt.StageResolvedNotApplied, indoubt.ViaResend, "")
		}
		// admit's steps 3 to 5 with the flight held, so that copies
		// still join this call.
		ad.inDoubt, ad.resolved = false, true
		a.admitCall(&ad, rt, conf, req, true)
	default:
		rt.log.Warn().Bytes("txid", req.TxID).Str("reason", reason).Msg("outcome of a resent transaction in doubt still unknown")
		ad.flight = nil
		a.unresolved(rt, f, req)
	}
}

// settleFlight ends the flight of a call that ended with res, answered to
// the client as code, msg, and returns its waiters: an answer from the
// target is remembered, a call in doubt is remembered as such, and a call
// not sent is forgotten so that a resend is a fresh try.
func (s *Server) settleFlight(f *dedup.Flight, res targethttp.Result, code string, msg []byte, window time.Duration) []dedup.Waiter {
	switch {
	case res.Stage == targethttp.Answered:
		return s.shield.mem.Settle(f, dedup.Answered, code, msg, window)
	case res.Stage.InDoubt():
		return s.shield.mem.Settle(f, dedup.InDoubt, code, msg, window)
	default:
		return s.shield.mem.Forget(f)
	}
}

// releaseFlight forgets f, whose call was refused or never made, and
// answers its waiters as the leader was answered.
func (s *Server) releaseFlight(f *dedup.Flight, code string, msg []byte) {
	if f != nil {
		answerAll(s.shield.mem.Forget(f), code, msg)
	}
}

// answerCodeLabel is the label of any answer's code: the hub's own
// refusals keep theirs, and a target's codes fold as callCodeLabel does.
func answerCodeLabel(code string) codeLabel {
	switch code {
	case protocol.CodeCircuitOpen:
		return lblCircuitOpen
	case protocol.CodeBulkheadFull:
		return lblBulkheadFull
	case protocol.CodeUnavailable:
		return lblUnavailable
	case protocol.CodeInternal:
		return lblInternal
	case protocol.CodeNotAllowed:
		return lblNotAllowed
	case protocol.CodeTxIDReused:
		return lblTxIDReused
	}
	return callCodeLabel(code)
}
