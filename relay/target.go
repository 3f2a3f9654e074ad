package relay

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/bulkhead"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// target is everything the hub holds for one target: its breaker, its
// bulkhead, its metrics, and in conf its HTTP side and its fallback. A
// reload keeps a target's target and replaces its conf. It is safe for
// concurrent use; its fields other than conf and transitions are set once,
// before the target is published.
type target struct {
	name        string
	nameBytes   []byte
	conf        atomic.Pointer[targetConf]
	breaker     *breaker.Breaker
	bulkhead    *bulkhead.Bulkhead
	limiter     atomic.Pointer[adaptiveLimit] // nil with a static limit
	viaPrefix   string                        // "via NAME: ", before the messages this target answers as a fallback
	viaBusy     string                        // viaPrefix + protocol.MsgBulkheadFull
	metrics     *targetMetrics                // nil without metrics
	log         zerolog.Logger
	failLog     zerolog.Logger // log sampled to failLogBurst lines a second
	transitions transitionLog
	lastFailure lastFailure  // the latest failed call, for status pages
	inDoubt     atomic.Int64 // calls ended in doubt, for status pages
	// shielded counts what the shield did with the target's requests, by
	// shieldOutcome, for status pages.
	shielded [numShieldOutcomes]atomic.Int64
	// prober sends the target's synthetic probes, when it has a probe
	// payload.
	prober prober
	// work hands admitted calls to this target's idle call workers; it is
	// unbuffered, so a call goes only to a worker waiting for one.
	work chan *call
}

// observer returns the breaker's transition observer for r: next (the
// Config's observer, which writes the breaker log) first, then the state
// metrics, then the change is queued for logTransitions and the prober, if
// any, is woken. Everything here
// runs under the breaker's lock, so it only stores and counts.
func (r *target) observer(next func(breaker.Transition)) func(breaker.Transition) {
	return func(t breaker.Transition) {
		if next != nil {
			next(t)
		}
		r.metrics.transition(t)
		r.transitions.add(t)
		r.prober.poke()
	}
}

// connOpened is the OnDial of r's client: it counts a connection opened
// to the target. It reads r.metrics when called, so it may be bound before
// New resolves them.
func (r *target) connOpened() {
	r.metrics.countConnOpened()
}

// transitionLog carries a target's breaker changes from the observer, which
// runs under the breaker's lock and so may not ask the breaker anything, to
// logTransitions, which logs them once the call that caused them has left
// the breaker, with the failure count and retry hint that only a Snapshot
// can tell. It is safe for concurrent use.
type transitionLog struct {
	waiting atomic.Bool // queue is not empty; read without mu on every call
	mu      sync.Mutex
	queue   []breaker.Transition // guarded by mu
	// writing is held while a queue is taken and logged, so that the lines
	// of one target come out in the order of its changes.
	writing sync.Mutex
}

// add queues t. Called under the breaker's lock.
func (tl *transitionLog) add(t breaker.Transition) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.queue = append(tl.queue, t)
	tl.waiting.Store(true)
}

// take empties the queue and returns what it held.
func (tl *transitionLog) take() []breaker.Transition {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	q := tl.queue
	tl.queue = nil
	tl.waiting.Store(false)
	return q
}

// logTransitions logs the breaker changes queued since the last call, each
// on one line: at warn when the breaker opened, else at info. The last one
// also carries the consecutive failure count and, for OPEN, the seconds
// until a probe, read from a Snapshot taken now, when the breaker is still
// in the state that change led to. It is called after every breaker call
// that can change the state (Allow when it admits a probe, Done, and
// an operator's action through ControlBreaker), and costs one atomic load
// when there is nothing to log.
func (r *target) logTransitions() {
	if !r.transitions.waiting.Load() {
		return
	}
	r.transitions.writing.Lock()
	defer r.transitions.writing.Unlock()
	q := r.transitions.take()
	if len(q) == 0 {
		return
	}
	snap := r.breaker.Snapshot()
	for i, t := range q {
		ev := r.log.Info()
		if t.To == breaker.Open {
			ev = r.log.Warn()
		}
		ev = ev.Stringer("from", t.From).Stringer("to", t.To).Str("at", t.At.UTC().Format(TimeFormat))
		if i == len(q)-1 && snap.State == t.To {
			ev = ev.Int("consecutive_failures", snap.ConsecutiveFailures)
			if t.To == breaker.Open {
				ev = ev.Float64("retry_after_seconds", RetryAfterSeconds(snap.RetryAfter)).Bool("held", snap.Held)
			}
		}
		ev.Msg("breaker state changed")
	}
}

// RetryAfterSeconds is d in seconds rounded up to the millisecond, so a
// breaker that still refuses is never reported as ready.
func RetryAfterSeconds(d time.Duration) float64 {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	return float64(ms) / 1000
}

// startCall runs cl on one of rt's idle call workers, or on a new one when
// none is waiting. It never waits. Workers outlive their calls so that a
// call does not pay for a fresh goroutine whose stack then grows through
// the HTTP client and the JSON decoder (a tenth of a call's CPU when each
// call had a goroutine of its own). A target's workers number at most twice
// its bulkhead: one per call holding a slot, and one per call that has
// released its slot (before writing its answer) and not yet come back for
// more work; a worker idle for callWorkerIdle ends.
func (s *Server) startCall(rt *target, cl *call) {
	select {
	case rt.work <- cl:
	default:
		s.goCatching(taskCallWorker, func() { s.callWorker(rt.work, cl) })
	}
}

// callWorkerIdle is how long a call worker waits for another call before
// it ends.
const callWorkerIdle = 2 * time.Second

// callWorker runs cl, then the calls handed to it on work, until it has
// waited callWorkerIdle for one or the Server stops.
func (s *Server) callWorker(work <-chan *call, cl *call) {
	idle := time.NewTimer(callWorkerIdle)
	defer idle.Stop()
	for {
		cl.run()
		idle.Reset(callWorkerIdle)
		select {
		case cl = <-work:
		case <-idle.C:
			return
		case <-s.serving.stopWorkers:
			return
		}
	}
}

// nameOrEmpty returns r's name, or "" for a nil target.
func (r *target) nameOrEmpty() string {
	if r == nil {
		return ""
	}
	return r.name
}

// retryHintSeconds is the N of an E904's "retry after Ns": d in whole
// seconds rounded up and at least 1. d is the breaker's own remaining open
// time, so the hint includes the backoff and jitter of the open period in
// force. A half-open breaker with its probe out has no fixed reopening
// time, and "0s" would invite a busy loop.
func retryHintSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}

// call is one admitted transaction on its way to a target. It owns a copy of
// the TXID and payload, because the request line lives in the connection's
// read buffer, which the next line overwrites. Calls are pooled so that
// their buffers are reused. A call is used by one goroutine at a time.
type call struct {
	adm     *admitter // the admitter of the connection that asked
	rt      *target
	conf    *targetConf // rt's configuration at admission, kept to the end
	primary *target     // the target the client named, when rt is its fallback; else nil
	hold    callHold    // the ticket, the slot and the counts, released when run ends
	line    []byte      // TXID then payload
	txidN   int         // length of the TXID at the start of line
	msg     []byte      // scratch for "via NAME: " and the target's message

	asked time.Time // the breakers' clock when the breaker was asked, for the access log
	// flight is the shield's flight this call leads, whose copies get its
	// answer; nil when the target has no shield.
	flight *dedup.Flight
	// resolved: the call follows a look-up that found its transaction,
	// in doubt, not applied.
	resolved bool
	// inflight is how many calls to rt held a slot just after this one
	// took its own, for the adaptive limit.
	inflight int
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// getCall returns a pooled call holding copies of req's TXID and payload.
// conf is rt's configuration at admission; primary is the target the
// client named when rt is its fallback, else nil.
func getCall(a *admitter, rt *target, conf *targetConf, primary *target, req protocol.Request) *call {
	cl := callPool.Get().(*call)
	cl.adm, cl.rt, cl.conf, cl.primary = a, rt, conf, primary
	cl.line = append(append(cl.line[:0], req.TxID...), req.Payload...)
	cl.txidN = len(req.TxID)
	return cl
}

// put returns cl to the pool. Buffers grown by an unusually large answer
// are dropped rather than kept alive by the pool.
func (cl *call) put() {
	cl.adm, cl.rt, cl.conf, cl.primary, cl.flight, cl.hold = nil, nil, nil, nil, nil, callHold{}
	if cap(cl.msg) > 16<<10 {
		cl.msg = nil
	}
	if cap(cl.line) > 16<<10 {
		cl.line = nil
	}
	callPool.Put(cl)
}

// panicked hands back, after a panic in run, what the call's hold still
// holds, logs it, and answers E907 to the client unless it has its answer
// (answered) and to the copies joined to its flight. The hold's counts are
// released by run, after the answer.
func (cl *call) panicked(p any, note breakerNote, answered bool) {
	a, rt, s := cl.adm, cl.rt, cl.adm.srv
	txid := cl.line[:cl.txidN]
	if cl.hold.handBack() {
		note.use, note.end = breakerHandedBack, time.Time{}
	}
	what := "target call panicked"
	if answered {
		// The client has its one answer, already counted: a second
		// would break the protocol.
		what = "target call panicked after its answer"
	}
	rt.log.Error().Bytes("txid", txid).Interface("panic", p).Bytes("stack", debug.Stack()).Msg(what)
	if f := cl.flight; f != nil {
		// The call may have been made: its copies get the same
		// E907, and a resend is looked up.
		cl.flight = nil
		msg := []byte(protocol.MsgInternal)
		answerAll(s.shield.mem.Settle(f, dedup.InDoubt, protocol.CodeInternal, msg, cl.named().conf.Load().settings.shieldWindow()), protocol.CodeInternal, msg)
	}
	if !answered {
		a.recordHubAnswer(rt, cl.primary, protocol.Request{TxID: txid, Payload: cl.line[cl.txidN:]}, protocol.CodeInternal, lblInternal, note)
		a.sink.answerText(txid, protocol.CodeInternal, protocol.MsgInternal, true)
	}
}

// logDone logs the call's end. Failures are logged at warn, but at most
// failLogBurst a second per target (the rest at debug): they are what an
// operator looks for, and the metrics count every one.
func (cl *call) logDone(txid []byte, code string, msg []byte, failed bool, took time.Duration) {
	rt := cl.rt
	var ev *zerolog.Event
	if failed {
		if ev = rt.failLog.Warn(); ev == nil {
			ev = rt.log.Debug()
		}
		ev = ev.Bytes("detail", msg)
	} else {
		ev = rt.log.Debug()
	}
	if cl.primary != nil {
		ev = ev.Str("fallback_for", cl.primary.name)
	}
	ev.Bytes("txid", txid).Str("code", code).Bool("failed", failed).
		Float64("duration_ms", float64(took.Microseconds())/1000).Msg("call done")
}

// record counts and notes the call's result: metrics, the target's last
// failure, the access log and the in-doubt journal. It runs before the
// answer, like the breaker's record, so that a client holding its answer
// finds it in the metrics and in the target's last failure.
func (cl *call) record(res targethttp.Result, failed bool, start time.Time, took time.Duration, note breakerNote) {
	a, rt, s := cl.adm, cl.rt, cl.adm.srv
	txid := cl.line[:cl.txidN]
	hubFault := res.Fault != targethttp.NoHubFault
	if hubFault {
		rt.metrics.count(lblUnavailable)
		rt.metrics.countHubRefusal(res.Fault)
		s.logHubFault(rt, txid, res)
	} else {
		rt.metrics.observeCall(callCodeLabel(res.Code), took.Seconds())
	}
	if res.Retried {
		rt.metrics.countRetry()
	}
	if failed {
		rt.lastFailure.record(res.Code, res.Msg, start.Add(took))
	}
	if s.obs.access != nil {
		s.obs.access.record(accessNote{txid: txid, target: rt.nameBytes, fallbackFor: cl.primary.nameOrEmpty(), code: res.Code, took: took, size: len(cl.line) - cl.txidN, breaker: note,
			client: a.client})
	}
	if res.Stage.InDoubt() {
		s.journalInDoubt(rt, cl.conf, txid, cl.line[cl.txidN:], res, start.Add(took))
	}
}

// run is step 5 of admitter.admit: the call, the breaker's record, the slot's
// release and the answer, in that order. The call's context is the
// Server's, not the connection's, so a client that disconnects does not
// cancel a transaction that may have reached the target, and its result
// still counts for the breaker; only the answer is dropped.
func (cl *call) run() {
	a, rt := cl.adm, cl.rt
	s := a.srv
	txid := cl.line[:cl.txidN]
	answered := false // the client has its one answer: a panic after it must not send another
	note := breakerNote{use: breakerAdmitted, probe: cl.hold.ticket.Probe(), start: cl.asked}
	defer func() {
		if p := recover(); p != nil {
			cl.panicked(p, note, answered)
		}
		cl.hold.release()
		cl.put()
	}()

	var shared bool // the flight is claimed in the fleet's store
	if cl.flight != nil && s.shield.store != nil {
		var ex dedup.Record
		if ex, shared = cl.claimShared(); shared {
			// Another hub holds the transaction: no call from this one.
			cl.hold.handBack()
			answered = true
			cl.answerShared(ex)
			return
		}
		shared = true
	}
	// The call is timed once: the same duration goes to the breaker (for
	// its slow-call policy), the histogram, the access log and the log.
	start := time.Now()
	res := cl.conf.client.Call(txid, cl.line[cl.txidN:])
	took := time.Since(start)
	code, msg := res.Code, res.Msg
	// A call the hub could not make for want of its own resources says
	// nothing of the target: its ticket goes back as neither success nor
	// failure, as for a full bulkhead.
	hubFault := res.Fault != targethttp.NoHubFault
	failed := !hubFault && cl.conf.isFailure(code)
	// The hold forgets the ticket and the slot as each goes back, so a
	// panic inside a step never hands one back twice.
	if hubFault {
		cl.hold.handBackTicket()
		note.use = breakerHandedBack
	} else {
		note.end = s.obs.access.now()
		cl.hold.recordTicket(failed, took)
	}
	rt.logTransitions()
	cl.hold.releaseSlot()
	rt.adaptLimit(res, took, cl.inflight)
	cl.record(res, failed, start, took, note)
	if cl.primary != nil {
		// The client asked for another target: say which one answered.
		cl.msg = append(append(cl.msg[:0], rt.viaPrefix...), msg...)
		msg = cl.msg
	}
	var copies []dedup.Waiter
	var (
		hash     dedup.Hash
		scope    dedup.Scope
		shielded bool
	)
	if f := cl.flight; f != nil {
		cl.flight, hash, scope, shielded = nil, f.Hash(), f.Scope(), true
		copies = s.settleFlight(f, res, code, msg, cl.named().conf.Load().settings.shieldWindow())
	}
	a.sink.answer(txid, code, msg, true)
	answered = true
	answerAll(copies, code, msg)
	if shared {
		cl.settleShared(scope, hash, res, code, msg)
	}
	if res.Stage.InDoubt() {
		// Journalled before the answer (record); the resolver takes it
		// now, after the shield and the store remember it in doubt.
		s.addInDoubt(rt, cl.conf, cl.named(), shielded, scope, hash, txid, cl.line[cl.txidN:], code, msg)
	}
	cl.logDone(txid, code, msg, failed, took)
}
