// Package resolver owns the transactions in doubt of a hub from the
// moment they are journalled until they are settled: it decides when each
// is asked about again (a look-up of the target's status_url, or a
// reversal), reads what the answer means, and gives up after an expiry.
// It does no I/O and owns no goroutine or timer: the caller drives it,
// asking which attempts are due at a time (Due), making them however it
// likes, handing each result back (Done), and waking again at Next. Time
// is the caller's now, passed to every call, so tests need no clock.
//
// Per target, a Policy: PolicyLookup asks the target whether it applied
// the transaction, PolicyReverse asks it to undo it (one reversal at a
// time per target, oldest first), PolicyManual leaves it to an operator.
// The first attempt is ResolveAfter after the call went in doubt; each
// later one follows an exponential backoff from ResolveAfter with jitter,
// capped at MaxInterval, each rounded up to a Tick; at Expire the entry is
// given up. While the target's Gate is closed (its breaker open) all its
// entries wait; an attempt takes a bulkhead slot from the Gate and skips
// its turn when none is free.
//
// Typical use:
//
//	r := resolver.New(resolver.Config{Settler: journalAndShield})
//	r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup, Gate: coreGate})
//	r.Add(resolver.Entry{Target: "CORE", TxID: "W1", Since: wentInDoubt})
//	for _, a := range r.Due(now) {
//		go func() { r.Done(a, lookUp(a), time.Now()) }()
//	}
//	next, ok := r.Next() // sleep until then, or until Add
package resolver

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
)

// Defaults of a Target's zero durations.
const (
	DefaultResolveAfter = 5 * time.Second
	DefaultMaxInterval  = time.Minute
	DefaultExpire       = 24 * time.Hour
)

// Policy is how a target's transactions in doubt are settled.
type Policy string

// Policies.
const (
	// PolicyLookup asks the target's status URL whether it applied the
	// transaction.
	PolicyLookup Policy = "lookup"
	// PolicyReverse asks the target to reverse the transaction.
	PolicyReverse Policy = "reverse"
	// PolicyManual makes no attempt: an operator settles the entry, or a
	// resend does (Forget). Manual entries never expire.
	PolicyManual Policy = "manual"
)

// Outcome is how an entry was settled.
type Outcome string

// Outcomes, as the journal's stages and the resolved metric name them.
const (
	Applied    Outcome = "applied"
	NotApplied Outcome = "not_applied"
	Reversed   Outcome = "reversed"
	Expired    Outcome = "expired"
)

// Ways an outcome was learnt: the journal's via values, which the
// resolved metric is keyed by too.
const (
	ViaLookup     = indoubt.ViaLookup
	ViaReversal   = indoubt.ViaReversal
	ViaLateAnswer = indoubt.ViaLateAnswer
)

// Gate is a target's admission as a resolution attempt sees it. The
// caller provides one per target; it must be safe for concurrent use and
// must not block. Attempts never count for or against the breaker: Allow
// is a look at its state, never an admission that takes a trial call.
type Gate interface {
	// Allow reports whether the target's breaker lets calls through: false
	// while it is open, held open included.
	Allow() bool
	// TryAcquire takes a bulkhead slot, false when none is free.
	TryAcquire() bool
	// Release gives back a slot TryAcquire took.
	Release()
}

// Settler learns of each settlement. It is called without the resolver's
// lock held, from the goroutine that called Due, Done or LateAnswer, once
// per entry; it may call the resolver back. The hub journals the
// settlement and tells its shield.
type Settler interface {
	Settled(s Settlement)
}

// Target is a target's resolution settings. A plain value.
type Target struct {
	// Policy is how its entries are settled. Empty means PolicyManual.
	Policy Policy
	// ResolveAfter is the wait from going in doubt to the first attempt,
	// and the backoff's base. Zero means DefaultResolveAfter.
	ResolveAfter time.Duration
	// MaxInterval caps the wait between two attempts. Zero means
	// DefaultMaxInterval.
	MaxInterval time.Duration
	// Expire is how long after going in doubt an entry is given up. Zero
	// means DefaultExpire.
	Expire time.Duration
	// Gate is the target's breaker and bulkhead. Nil admits every attempt.
	Gate Gate
}

// Config configures New. A plain value.
type Config struct {
	// Settler learns of settlements. Required.
	Settler Settler
	// Rand returns a number in [0, 1) for the backoff's jitter. Nil means
	// math/rand/v2's Float64.
	Rand func() float64
}

// Entry is a transaction in doubt. A plain value.
type Entry struct {
	// Target is the target's canonical name, TxID the transaction's id.
	Target string
	TxID   string
	// Since is when the call went in doubt: the schedule and the expiry
	// count from it, across restarts.
	Since time.Time
	// Ref is the caller's own data about the entry (its URL, payload
	// hash), handed back in Attempt and Settlement.
	Ref any
}

// Attempt is one look-up or reversal the caller is to make: Done takes
// its result. A plain value.
type Attempt struct {
	Entry
	// Policy is PolicyLookup or PolicyReverse: which request to make.
	Policy Policy
	// N is the attempt's number, from 1: a reversal with N >= 2 is a
	// retransmission (X-Attempt).
	N int

	item *item // the entry as the resolver holds it; stale once settled
	gate Gate  // the Gate a slot was taken from; nil for none
}

// Settlement is how an entry was settled. A plain value.
type Settlement struct {
	Entry
	Outcome Outcome
	// Code is the target's code: what it recorded, for Applied; its
	// answer to the reversal, for Reversed. Msg is the message it recorded
	// with Code, for Applied learnt by a look-up or a late answer.
	Code string
	Msg  string
	// Via is how the outcome was learnt: ViaLookup, ViaReversal or
	// ViaLateAnswer. An expiry has the policy's (lookup or reversal).
	Via string
	// Attempts is how many attempts were made.
	Attempts int
	// At is when it was settled.
	At time.Time
}

// Result is what an attempt found. Make one with LookupResult,
// ReversalResult or Retry. A plain value.
type Result struct {
	outcome Outcome // empty: try again later
	code    string
	msg     string
}

// LookupResult is the result of a look-up: applied with the target's
// code and message, or explicitly not applied. Anything else is Retry.
func LookupResult(applied bool, code, msg string) Result {
	if applied {
		return Result{outcome: Applied, code: code, msg: msg}
	}
	return Result{outcome: NotApplied}
}

// ReversalResult is the result of a reversal the target answered with
// code: 0000 or a Bnnn (such as "nothing to reverse") settles it as
// reversed; any other code (Ennn, or the hub's own for a failed call) is
// Retry.
func ReversalResult(code string) Result {
	if protocol.ValidTargetCode(code) && code[0] != 'E' {
		return Result{outcome: Reversed, code: code}
	}
	return Retry
}

// Retry is the result of an attempt that settled nothing.
var Retry = Result{}

// EntryState is an open entry as Open lists it. A plain value.
type EntryState struct {
	Entry
	Policy   Policy
	Attempts int
	// Next is when the next attempt is due; zero for a manual entry.
	Next time.Time
	// InFlight reports an attempt under way.
	InFlight bool
}

// TargetStats sums up a target's open entries. A plain value.
type TargetStats struct {
	Open int
	// Oldest is the Since of the oldest open entry; zero when none.
	Oldest time.Time
	// Next is the earliest next attempt; zero when none is scheduled.
	Next time.Time
}

// item is an open entry. Its fields are guarded by the resolver's mu.
type item struct {
	Entry
	attempts int
	next     time.Time // when the next attempt is due
	inFlight bool
}

// Resolver holds the open entries. It is safe for concurrent use.
type Resolver struct {
	settler Settler
	rand    func() float64

	mu      sync.Mutex
	targets map[string]*target // guarded by mu
}

// Bounds of the late answers LateAnswer holds for an Add to come.
const (
	LateAnswerHold     = time.Minute
	MaxHeldLateAnswers = 1024
)

// heldAnswer is a late answer that came before its entry was added.
type heldAnswer struct {
	code, msg string
	at        time.Time
}

// target is a target's settings and open entries.
type target struct {
	early map[string]heldAnswer // guarded by Resolver.mu; late answers by TxID, for Add
	conf  Target                // guarded by Resolver.mu
	items []*item               // guarded by Resolver.mu; oldest Since first
	index map[string]*item      // guarded by Resolver.mu; items by TxID
	// pausedUntil is when the Gate is asked again after it refused: until
	// then no entry of the target is tried. The whole target waits, not
	// each entry on its own, so that thousands of entries behind an open
	// breaker make one wake-up per ResolveAfter, not one each.
	pausedUntil time.Time // guarded by Resolver.mu
}

// resumeAt is when an entry due at next can be tried: not before the
// target's pause ends.
func (tg *target) resumeAt(next time.Time) time.Time {
	if next.Before(tg.pausedUntil) {
		return tg.pausedUntil
	}
	return next
}

// New returns a Resolver with no target.
func New(cfg Config) *Resolver {
	r := &Resolver{settler: cfg.Settler, rand: cfg.Rand, targets: make(map[string]*target)}
	if r.rand == nil {
		r.rand = rand.Float64
	}
	return r
}

// Configure sets the target's settings, for entries open and to come: a
// new policy or schedule applies from each entry's next attempt on.
func (r *Resolver) Configure(name string, t Target) {
	t = withDefaults(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	tg := r.targetLocked(name)
	tg.conf = t
}

// withDefaults fills t's zero fields.
func withDefaults(t Target) Target {
	if t.Policy == "" {
		t.Policy = PolicyManual
	}
	if t.ResolveAfter <= 0 {
		t.ResolveAfter = DefaultResolveAfter
	}
	if t.MaxInterval <= 0 {
		t.MaxInterval = DefaultMaxInterval
	}
	if t.Expire <= 0 {
		t.Expire = DefaultExpire
	}
	return t
}

// targetLocked returns the named target, made with the default settings
// if it is new.
func (r *Resolver) targetLocked(name string) *target {
	tg, ok := r.targets[name]
	if !ok {
		tg = &target{conf: withDefaults(Target{}), index: make(map[string]*item), early: make(map[string]heldAnswer)}
		r.targets[name] = tg
	}
	return tg
}

// Add takes e in, its first attempt ResolveAfter after e.Since. It
// reports false, changing nothing, when e's transaction is open already. A
// target Configure never named is manual. A late answer LateAnswer holds
// for e's transaction settles it at once, the Settler told before Add
// returns.
func (r *Resolver) Add(e Entry) bool {
	r.mu.Lock()
	tg := r.targetLocked(e.Target)
	if _, ok := tg.index[e.TxID]; ok {
		r.mu.Unlock()
		return false
	}
	if held, ok := tg.early[e.TxID]; ok {
		delete(tg.early, e.TxID)
		r.mu.Unlock()
		r.settler.Settled(Settlement{Entry: e, Outcome: Applied, Code: held.code, Msg: held.msg, Via: ViaLateAnswer, At: held.at})
		return true
	}
	defer r.mu.Unlock()
	it := &item{Entry: e, next: onTick(e.Since.Add(tg.conf.ResolveAfter))}
	// Keep items oldest first: entries come in in order, except at a
	// restart's take-up, which is in journal order too.
	i := len(tg.items)
	for i > 0 && tg.items[i-1].Since.After(e.Since) {
		i--
	}
	tg.items = append(tg.items, nil)
	copy(tg.items[i+1:], tg.items[i:])
	tg.items[i] = it
	tg.index[e.TxID] = it
	return true
}

// Forget drops the open entry of txid at target without a settlement, as
// when a resend settled it; an attempt in flight for it is then ignored.
// It reports whether there was one.
func (r *Resolver) Forget(target, txid string) bool {
	_, ok := r.Take(target, txid)
	return ok
}

// Take is Forget returning the entry dropped, for a caller that settles
// it itself, as an operator does.
func (r *Resolver) Take(target, txid string) (e Entry, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if it := r.removeLocked(target, txid); it != nil {
		return it.Entry, true
	}
	return Entry{}, false
}

// removeLocked drops the entry and returns it; nil when it is not open.
func (r *Resolver) removeLocked(target, txid string) *item {
	tg, ok := r.targets[target]
	if !ok {
		return nil
	}
	it, ok := tg.index[txid]
	if !ok {
		return nil
	}
	delete(tg.index, txid)
	if i := slices.Index(tg.items, it); i >= 0 {
		tg.items = slices.Delete(tg.items, i, i+1)
	}
	return it
}

// LateAnswer settles the open entry of txid at target as applied with
// code and msg, via late_answer: the target's answer to the call arrived in full
// after the target timeout. It reports whether there was an open entry.
// When there is none yet (the answer came before the hub had journalled
// the call and called Add), the answer is held for Add, for LateAnswerHold
// at most and up to MaxHeldLateAnswers per target.
func (r *Resolver) LateAnswer(target, txid, code, msg string, now time.Time) bool {
	r.mu.Lock()
	it := r.removeLocked(target, txid)
	var attempts int
	if it != nil {
		attempts = it.attempts
	} else if tg := r.targetLocked(target); len(tg.early) < MaxHeldLateAnswers {
		tg.early[txid] = heldAnswer{code: code, msg: msg, at: now}
	}
	r.mu.Unlock()
	if it == nil {
		return false
	}
	r.settler.Settled(Settlement{Entry: it.Entry, Outcome: Applied, Code: code, Msg: msg, Via: ViaLateAnswer, Attempts: attempts, At: now})
	return true
}

// Due returns the attempts to make now, each holding a Gate slot until
// Done, and settles as expired the entries past their expiry. When a
// target's Gate does not Allow, its entries all wait (the Gate is asked
// again after ResolveAfter); one whose Gate has no free slot skips its
// turn. Of a reverse target only
// the oldest entry is tried, and not while an attempt of it is in flight.
func (r *Resolver) Due(now time.Time) []Attempt {
	var due []Attempt
	var expired []Settlement
	r.mu.Lock()
	for _, tg := range r.targets {
		due, expired = tg.dueLocked(now, r.rand, due, expired)
	}
	r.mu.Unlock()
	for _, s := range expired {
		r.settler.Settled(s)
	}
	return due
}

// dueLocked appends tg's attempts due at now to due, and its expiries to
// expired, removing those.
func (tg *target) dueLocked(now time.Time, rnd func() float64, due []Attempt, expired []Settlement) ([]Attempt, []Settlement) {
	for txid, held := range tg.early {
		if now.Sub(held.at) >= LateAnswerHold {
			delete(tg.early, txid)
		}
	}
	c := tg.conf
	if c.Policy == PolicyManual {
		return due, expired
	}
	kept := tg.items[:0]
	for _, it := range tg.items {
		if !it.inFlight && !now.Before(it.Since.Add(c.Expire)) {
			delete(tg.index, it.TxID)
			expired = append(expired, Settlement{Entry: it.Entry, Outcome: Expired, Via: c.Policy.Via(), Attempts: it.attempts, At: now})
			continue
		}
		kept = append(kept, it)
	}
	clear(tg.items[len(kept):])
	tg.items = kept
	if now.Before(tg.pausedUntil) {
		return due, expired
	}
	for i, it := range tg.items {
		if c.Policy == PolicyReverse && i > 0 {
			break // one reversal at a time, oldest first
		}
		if it.inFlight || now.Before(it.next) {
			continue
		}
		switch {
		case c.Gate != nil && !c.Gate.Allow():
			tg.pausedUntil = now.Add(c.ResolveAfter)
			return due, expired
		case c.Gate != nil && !c.Gate.TryAcquire():
			it.next = onTick(now.Add(backoff(c, it.attempts, rnd)))
		default:
			it.inFlight = true
			it.attempts++
			due = append(due, Attempt{Entry: it.Entry, Policy: c.Policy, N: it.attempts, item: it, gate: c.Gate})
		}
	}
	return due, expired
}

// Tick is the grain of the schedule: every attempt is due on a multiple
// of it. Entries that went in doubt within one Tick are then due
// together, so a caller waking at Next wakes at most once a Tick however
// many entries are open, and each wake's Due, which looks at every open
// entry, is paid for many of them at once.
const Tick = 50 * time.Millisecond

// onTick is t rounded up to a multiple of Tick.
func onTick(t time.Time) time.Time {
	if r := t.Truncate(Tick); r.Before(t) {
		return r.Add(Tick)
	}
	return t
}

// Via is how an entry of policy p learns its outcome by an attempt, or
// gives up: ViaLookup, or ViaReversal for PolicyReverse.
func (p Policy) Via() string {
	if p == PolicyReverse {
		return ViaReversal
	}
	return ViaLookup
}

// backoff is the wait after attempt number n (0: a skipped first turn):
// ResolveAfter doubled n-1 times, capped at MaxInterval, of which the
// second half is jittered.
func backoff(c Target, n int, rnd func() float64) time.Duration {
	d := c.MaxInterval
	if n < 1 {
		n = 1
	}
	if shift := n - 1; shift < 62 && float64(c.ResolveAfter)*math.Exp2(float64(shift)) < float64(c.MaxInterval) {
		d = c.ResolveAfter << shift
	}
	return d/2 + time.Duration(rnd()*float64(d/2))
}

// Done hands back attempt a's result and its Gate slot: a settling result
// settles the entry (the Settler learns of it); Retry schedules the next
// attempt after the backoff. A result for an entry settled or forgotten
// meanwhile only gives the slot back.
func (r *Resolver) Done(a Attempt, res Result, now time.Time) {
	if a.gate != nil {
		a.gate.Release()
	}
	r.mu.Lock()
	tg := r.targets[a.Target]
	it := a.item
	if tg == nil || tg.index[a.TxID] != it {
		r.mu.Unlock()
		return
	}
	it.inFlight = false
	if res.outcome == "" {
		it.next = onTick(now.Add(backoff(tg.conf, it.attempts, r.rand)))
		r.mu.Unlock()
		return
	}
	r.removeLocked(a.Target, a.TxID)
	attempts := it.attempts
	r.mu.Unlock()
	r.settler.Settled(Settlement{Entry: it.Entry, Outcome: res.outcome, Code: res.code, Msg: res.msg, Via: a.Policy.Via(), Attempts: attempts, At: now})
}

// Next returns when the earliest attempt or expiry is due, for the caller
// to call Due then; ok is false when nothing is scheduled (no open entry
// but manual ones, or every one in flight). A time already past means
// now. Add, Configure and Done may move it earlier.
func (r *Resolver) Next() (next time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, tg := range r.targets {
		if tg.conf.Policy == PolicyManual {
			continue
		}
		for _, it := range tg.items {
			if t := it.Since.Add(tg.conf.Expire); !it.inFlight && (!ok || t.Before(next)) {
				next, ok = t, true
			}
		}
		if t, due := tg.nextAttemptLocked(); due && (!ok || t.Before(next)) {
			next, ok = t, true
		}
	}
	return next, ok
}

// nextAttemptLocked returns when tg's earliest attempt is due; ok is false
// when none is scheduled (every entry in flight, or none open). Of a
// reverse target only the oldest entry is tried.
func (tg *target) nextAttemptLocked() (next time.Time, ok bool) {
	for i, it := range tg.items {
		if tg.conf.Policy == PolicyReverse && i > 0 {
			break
		}
		if t := tg.resumeAt(it.next); !it.inFlight && (!ok || t.Before(next)) {
			next, ok = t, true
		}
	}
	return next, ok
}

// Open lists the open entries of every target, each target's oldest
// first.
func (r *Resolver) Open() []EntryState {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EntryState
	for _, tg := range r.targets {
		for _, it := range tg.items {
			st := EntryState{Entry: it.Entry, Policy: tg.conf.Policy, Attempts: it.attempts, InFlight: it.inFlight}
			if tg.conf.Policy != PolicyManual {
				st.Next = tg.resumeAt(it.next)
			}
			out = append(out, st)
		}
	}
	return out
}

// Stats sums up the named target's open entries.
func (r *Resolver) Stats(name string) TargetStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	tg, ok := r.targets[name]
	if !ok || len(tg.items) == 0 {
		return TargetStats{}
	}
	st := TargetStats{Open: len(tg.items), Oldest: tg.items[0].Since}
	if tg.conf.Policy != PolicyManual {
		st.Next, _ = tg.nextAttemptLocked()
	}
	return st
}
