package relay

import (
	"context"

	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// The fleet's side of the shield (Config.DedupStore): a call the hub's
// memory let through is claimed in the store before it is made, on its
// call worker, so that the connection never waits for the store; its
// outcome is stored after the client has its answer.

// named returns the target the client named: the one whose shield the call
// is under, when a fallback took it.
func (cl *call) named() *target {
	if cl.primary != nil {
		return cl.primary
	}
	return cl.rt
}

// claimShared claims cl's transaction in the fleet's store. It reports
// whether another hub already holds it, with that hub's record: then no
// call is to be made. A store that fails is counted and lets the call go
// on, shielded by this hub's memory only.
func (cl *call) claimShared() (dedup.Record, bool) {
	s := cl.adm.srv
	named := cl.named()
	rec := dedup.Record{State: dedup.InFlight, Hash: cl.flight.Hash(), Hub: s.inDoubt.hubName()}
	txid := string(cl.line[:cl.txidN])
	window := named.conf.Load().settings.shieldWindow()
	if cl.resolved {
		// The target said it never applied the transaction the fleet
		// holds in doubt: this call takes the record over.
		s.trackStore(s.shield.store.Settle(context.Background(), named.name, cl.flight.Scope(), txid, rec, window))
		return dedup.Record{}, false
	}
	existing, claimed, err := s.shield.store.Claim(context.Background(), named.name, cl.flight.Scope(), txid, rec, window)
	s.trackStore(err)
	if err != nil || claimed {
		return dedup.Record{}, false
	}
	return existing, true
}

// answerShared answers cl's request and its copies from ex, the record of
// another hub that holds the transaction: its answer, E909 for another
// payload, E901 while it is in flight there, or, in doubt, a look-up of
// its outcome as for a resend on this hub. Called with cl's ticket and
// slot already handed back.
func (cl *call) answerShared(ex dedup.Record) {
	a, s, named := cl.adm, cl.adm.srv, cl.named()
	conf := named.conf.Load()
	f := cl.flight
	cl.flight = nil
	req := protocol.Request{TxID: cl.line[:cl.txidN], Target: named.nameBytes, Payload: cl.line[cl.txidN:]}
	var code, msg string
	switch {
	case ex.Hash != f.Hash():
		named.countShielded(shieldRefusedPayload)
		code, msg = protocol.CodeTxIDReused, protocol.MsgTxIDReused
		s.releaseFlight(f, code, []byte(msg))
	case ex.State == dedup.Answered:
		named.countShielded(shieldReplayed)
		code, msg = ex.Code, ex.Message
		answerAll(s.shield.mem.Settle(f, dedup.Answered, code, []byte(msg), conf.settings.shieldWindow()), code, []byte(msg))
	case ex.State == dedup.InDoubt:
		a.startResolver(named, f, req, ex.Message)
		return
	default: // in flight on another hub
		named.countShielded(shieldUnresolved)
		code, msg = protocol.CodeTimeout, protocol.MsgStillUnknown
		s.releaseFlight(f, code, []byte(msg))
	}
	a.recordHubAnswer(named, nil, req, code, answerCodeLabel(code), breakerNote{})
	a.sink.answerText(req.TxID, code, msg, true)
}

// settleShared stores the outcome of cl's call, claimed in scope with the
// payload hash hash, which ended with res and was answered code, msg, for
// the fleet: an answer or a call in doubt is kept for the window, a call
// not sent is released.
func (cl *call) settleShared(scope dedup.Scope, hash dedup.Hash, res targethttp.Result, code string, msg []byte) {
	s, named := cl.adm.srv, cl.named()
	txid := string(cl.line[:cl.txidN])
	rec := dedup.Record{Hash: hash, Hub: s.inDoubt.hubName(), Code: code, Message: string(msg)}
	window := named.conf.Load().settings.shieldWindow()
	switch {
	case res.Stage == targethttp.Answered:
		rec.State = dedup.Answered
	case res.Stage.InDoubt():
		rec.State = dedup.InDoubt
	default:
		s.trackStore(s.shield.store.Release(context.Background(), named.name, scope, txid, rec.Hub))
		return
	}
	s.trackStore(s.shield.store.Settle(context.Background(), named.name, scope, txid, rec, window))
}

// storeResolved stores, for the fleet, that the target applied
// rt's txid, whose flight was f, with code, msg.
func (s *Server) storeResolved(rt *target, conf *targetConf, req protocol.Request, f *dedup.Flight, code string, msg []byte) {
	if s.shield.store == nil {
		return
	}
	rec := dedup.Record{State: dedup.Answered, Hash: f.Hash(), Hub: s.inDoubt.hubName(), Code: code, Message: string(msg)}
	s.trackStore(s.shield.store.Settle(context.Background(), rt.name, f.Scope(), string(req.TxID), rec, conf.settings.shieldWindow()))
}
