package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// The hub settles its transactions in doubt itself (docs/PROTOCOL.md,
// "In-doubt journal"): a call that ends in doubt is journalled, then
// handed to the Server's resolver, which says when to look it up or
// reverse it. resolveLoop drives it; each attempt runs on a goroutine of
// its own, through the target's breaker (a look only) and bulkhead (a slot
// per attempt), and never counts for or against the breaker. Settled
// journals each outcome and tells the shield, so that a resend gets what
// became of the transaction. Nothing here is on a call's answer path: a
// call in doubt is added once its client has its answer.

// resolveTick bounds the driver's sleep, so that a clock that jumps (or a
// test's fake one) is noticed within it; resolveCoalesce is its shortest
// sleep, so that entries due close together, each its own jitter, are
// taken in one pass over the open entries rather than one pass each.
const (
	resolveTick     = time.Second
	resolveCoalesce = 50 * time.Millisecond
)

// resolveState is a Server's resolver and what drives it.
type resolveState struct {
	r    *resolver.Resolver
	wake chan struct{} // capacity 1: the driver looks again at once
	// ctx bounds the attempts; cancelled when the Server begins to stop.
	ctx    context.Context
	cancel context.CancelFunc
}

// doubtRef is what the hub keeps of an entry besides the resolver's
// Entry, for its journal lines and its shield (resolver.Entry.Ref).
type doubtRef struct {
	url  string   // the called target's URL, as journalled
	sum  [32]byte // the payload's SHA-256
	code string   // what the client was answered: E901, E902 or E500
	msg  string
	// shield is the name of the target whose shield remembers the
	// transaction (the one the client named); empty when none does.
	shield string
	scope  dedup.Scope
	hash   dedup.Hash
	window time.Duration
}

// initResolve makes the Server's resolver; New calls it before the
// targets are configured.
func (s *Server) initResolve() {
	rs := &s.resolve
	rs.r = resolver.New(resolver.Config{Settler: settler{s}, Rand: s.rand})
	rs.wake = make(chan struct{}, 1)
	rs.ctx, rs.cancel = context.WithCancel(context.Background())
}

// pokeResolver wakes the driver.
func (s *Server) pokeResolver() {
	select {
	case s.resolve.wake <- struct{}{}:
	default:
	}
}

// now reads the Server's clock.
func (s *Server) now() time.Time {
	if s.clock != nil {
		return s.clock.Now()
	}
	return time.Now()
}

// targetGate is a target's admission as a resolution attempt sees it: a
// look at its breaker, which takes no ticket, and its bulkhead, adaptive
// limit included.
type targetGate struct{ rt *target }

var _ resolver.Gate = targetGate{}

// Allow reports whether the breaker is not open (held open included).
func (g targetGate) Allow() bool { return g.rt.breaker.Snapshot().State != breaker.Open }

// TryAcquire takes a slot of the bulkhead.
func (g targetGate) TryAcquire() bool { return g.rt.bulkhead.TryAcquire() }

// Release gives the slot back.
func (g targetGate) Release() { g.rt.bulkhead.Release() }

// configureResolver gives the resolver rt's policy and schedule under conf.
func (s *Server) configureResolver(rt *target, conf *targetConf) {
	t := conf.settings.ResolveTarget(conf.resolve)
	t.Gate = targetGate{rt}
	s.resolve.r.Configure(rt.name, t)
	s.pokeResolver()
}

// resolveLoop drives the resolver until the Server stops: it starts the
// attempts due, each on a goroutine of its own, and sleeps until the next
// is due (resolveCoalesce at least), an entry is added or an attempt done,
// or resolveTick has passed.
func (s *Server) resolveLoop() {
	t := time.NewTimer(resolveTick)
	defer t.Stop()
	for {
		for _, a := range s.resolve.r.Due(s.now()) {
			s.goCatching(taskResolver, func() { s.attempt(a) })
		}
		wait := resolveTick
		if next, ok := s.resolve.r.Next(); ok {
			wait = min(max(next.Sub(s.now()), resolveCoalesce), resolveTick)
		}
		t.Reset(wait)
		select {
		case <-s.serving.stopping:
			return
		case <-s.resolve.wake:
		case <-t.C:
		}
	}
}

// attempt makes a, a look-up or a reversal, with the target's timeout, and
// hands its result back. A target no longer configured, or one without the
// URL the policy needs, makes no request: the entry waits.
func (s *Server) attempt(a resolver.Attempt) {
	res := resolver.Retry
	defer func() {
		s.resolve.r.Done(a, res, s.now())
		s.pokeResolver()
	}()
	rt := s.table.lookup([]byte(a.Target))
	if rt == nil {
		return
	}
	conf := rt.conf.Load()
	switch {
	case a.Policy == resolver.PolicyLookup && conf.lookup != nil:
		outcome, code, msg, reason := conf.lookUp(s.resolve.ctx, a.TxID)
		switch outcome {
		case targethttp.Applied:
			res = resolver.LookupResult(true, code, msg)
		case targethttp.NotApplied:
			res = resolver.LookupResult(false, "", "")
		default:
			rt.log.Debug().Str("txid", a.TxID).Int("attempt", a.N).Str("reason", reason).Msg("in-doubt look-up settled nothing")
		}
	case a.Policy == resolver.PolicyReverse && conf.reverse != nil:
		// The ReverseClient bounds it with the target timeout.
		code, _, err := conf.reverse.Reverse(s.resolve.ctx, conf.reverseURL, a.TxID, a.N)
		if err != nil {
			rt.log.Debug().Err(err).Str("txid", a.TxID).Int("attempt", a.N).Msg("reversal settled nothing")
			return
		}
		res = resolver.ReversalResult(code)
	}
}

// lookUp asks the target at its status URL whether it applied txid,
// within the target timeout: for Applied, code is the code it recorded
// (E500 when that is not one a target sends) and msg its message; for
// Unknown, reason says why.
func (c *targetConf) lookUp(parent context.Context, txid string) (o targethttp.Outcome, code, msg, reason string) {
	ctx, cancel := context.WithTimeout(parent, c.settings.TargetTimeout)
	defer cancel()
	o, ans, reason := c.lookup.Lookup(ctx, strings.Replace(c.statusURL, StatusTxID, txid, 1), txid)
	if o == targethttp.Applied {
		code, msg = ans.Code, ans.Message
		if !protocol.ValidTargetCode(code) {
			code = protocol.CodeTargetFailed
		}
	}
	return o, code, msg, reason
}

// addInDoubt hands a call to rt that ended in doubt to the resolver, its
// schedule counted from now on the Server's clock, after its client has its answer. named is the target the
// client named, whose shield remembers it under scope and hash when
// shielded.
func (s *Server) addInDoubt(rt *target, conf *targetConf, named *target, shielded bool, scope dedup.Scope, hash dedup.Hash,
	txid, payload []byte, code string, msg []byte) {
	ref := &doubtRef{url: conf.url, sum: payloadSum(payload), code: code, msg: string(msg)}
	if shielded {
		ref.shield, ref.scope, ref.hash = named.name, scope, hash
		ref.window = named.conf.Load().settings.shieldWindow()
	}
	if s.resolve.r.Add(resolver.Entry{Target: rt.name, TxID: string(txid), Since: s.now(), Ref: ref}) {
		s.pokeResolver()
	}
}

// lateAnswer is the OnLateAnswer of rt's client: a target answer in full
// (0000 or Bnnn) settles the entry as applied; anything else (E400, E500,
// a target's Ennn) is left to the resolver's schedule, whose look-up tells
// what the target recorded.
func (s *Server) lateAnswer(rt *target, la targethttp.LateAnswer) {
	if la.Code != protocol.CodeOK && !strings.HasPrefix(la.Code, "B") {
		rt.log.Debug().Str("txid", la.TxID).Str("code", la.Code).Msg("late answer ignored: not a target answer")
		return
	}
	s.resolve.r.LateAnswer(rt.name, la.TxID, la.Code, string(la.Msg), s.now())
}

// settler is the resolver's Settler: the Server journals each settlement,
// counts it and tells its shield.
type settler struct{ s *Server }

// Settled implements resolver.Settler.
func (st settler) Settled(set resolver.Settlement) {
	s := st.s
	ref, _ := set.Ref.(*doubtRef)
	if ref == nil {
		ref = &doubtRef{}
	}
	rt := s.table.lookup([]byte(set.Target))
	msg := set.Msg
	if rt != nil && ref.shield != "" && ref.shield != rt.name {
		// A fallback made the call: its answer says so, as a resend's does.
		msg = rt.viaPrefix + msg
	}
	code := set.Code
	if set.Outcome == resolver.Expired {
		code = ref.code
	}
	// The shield and the count first: once the line is on disk, a resend
	// finds the outcome and the metric has it.
	s.shieldLearns(ref, set.TxID, set.Outcome, set.Code, msg)
	countResolved(rt, set.Outcome, set.Via)
	s.journalSettled(rt, set.Target, ref, set.TxID, outcomeStage[set.Outcome], set.Via, code)
	if rt != nil {
		rt.log.Info().Str("txid", set.TxID).Str("outcome", string(set.Outcome)).Str("via", set.Via).Str("code", set.Code).
			Int("attempts", set.Attempts).Msg("transaction in doubt settled")
	}
}

// outcomeStage is the journal's stage of each outcome.
var outcomeStage = map[resolver.Outcome]string{
	resolver.Applied:    indoubt.StageResolvedApplied,
	resolver.NotApplied: indoubt.StageResolvedNotApplied,
	resolver.Reversed:   indoubt.StageResolvedReversed,
	resolver.Expired:    indoubt.StageUnresolvedExpired,
}

// shieldLearns tells the shield, and the fleet's store, what became of a
// transaction it remembers in doubt: applied, a resend gets the target's
// answer; not applied, a resend is a fresh call; reversed, a resend gets
// E910 without a call; expired, it stays in doubt. A resend being looked
// up right now settles it itself.
func (s *Server) shieldLearns(ref *doubtRef, txid string, o resolver.Outcome, code, msg string) {
	if ref.shield == "" {
		return
	}
	state := dedup.Answered
	switch o {
	case resolver.Reversed:
		code, msg = protocol.CodeReversed, protocol.MsgReversed
	case resolver.Expired:
		state, code, msg = dedup.InDoubt, ref.code, ref.msg
	}
	v, f, _, _ := s.shield.mem.Begin(ref.shield, ref.scope, []byte(txid), ref.hash, func() dedup.Waiter { return discard{} })
	if v != dedup.Claimed && v != dedup.Resolve {
		return
	}
	if o == resolver.NotApplied {
		s.shield.mem.Forget(f)
		return
	}
	s.shield.mem.Settle(f, state, code, []byte(msg), ref.window)
	if s.shield.store != nil && state == dedup.Answered {
		rec := dedup.Record{State: dedup.Answered, Hash: ref.hash, Hub: s.inDoubt.hubName(), Code: code, Message: msg}
		s.trackStore(s.shield.store.Settle(context.Background(), ref.shield, ref.scope, txid, rec, ref.window))
	}
}

// discard is a waiter whose answer nobody reads: the copy it stands for
// was never sent.
type discard struct{}

// Answer implements dedup.Waiter.
func (discard) Answer(string, []byte) {}

// OpenInDoubt lists the transactions in doubt the hub is settling, each
// target's oldest first, with their attempts and next attempt.
func (s *Server) OpenInDoubt() []resolver.EntryState {
	return s.resolve.r.Open()
}

// Errors of SettleInDoubt.
var (
	// ErrNotInDoubt is returned when the hub holds no open transaction in
	// doubt of that TXID at that target.
	ErrNotInDoubt = errors.New("relay: no open transaction in doubt of that TXID at that target")
	// ErrBadSettleCode is returned for an applied settlement whose code is
	// not one a target sends (0000, Bnnn or Ennn).
	ErrBadSettleCode = errors.New("relay: want the target's code: 0000, Bnnn or Ennn")
)

// SettleInDoubt settles an open transaction in doubt as an operator
// learnt it (via operator): applied with the code the target recorded, or
// not applied. It is journalled and the shield told, as the resolver's own
// settlements are; an attempt in flight for it is then ignored. target is
// matched case-insensitively.
func (s *Server) SettleInDoubt(target, txid string, applied bool, code string) error {
	rt := s.table.lookup([]byte(target))
	if rt == nil {
		return fmt.Errorf("%w: unknown target %q", ErrNotInDoubt, target)
	}
	if applied && !protocol.ValidTargetCode(code) {
		return ErrBadSettleCode
	}
	entry, ok := s.resolve.r.Take(rt.name, txid)
	if !ok {
		return ErrNotInDoubt
	}
	set := resolver.Settlement{Entry: entry, Outcome: resolver.NotApplied, Via: indoubt.ViaOperator, At: s.now()}
	if applied {
		set.Outcome, set.Code = resolver.Applied, code
	}
	settler{s}.Settled(set)
	return nil
}
