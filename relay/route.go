package relay

import (
	"bytes"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/bulkhead"
)

// route is everything the hub holds for one target: its breaker, its
// bulkhead and its HTTP side. It is safe for concurrent use; its fields are
// set once by New.
type route struct {
	name         string
	nameBytes    []byte
	url          string
	breaker      *breaker.Breaker
	bulkhead     *bulkhead.Bulkhead
	target       target
	failureCodes []string
	log          zerolog.Logger
}

// isFailure reports whether a call that ended with code counts as a breaker
// failure for this route.
func (r *route) isFailure(code string) bool {
	for _, c := range r.failureCodes {
		if c == code {
			return true
		}
	}
	return false
}

// lookup returns the route for a target name as a client wrote it, matched
// case-insensitively, or nil. A linear scan: there are few targets, and it
// needs no allocation to fold case.
func (s *Server) lookup(name []byte) *route {
	for _, r := range s.routes {
		if bytes.EqualFold(r.nameBytes, name) {
			return r
		}
	}
	return nil
}

// dispatch is the one place that composes the policies for a request. In
// order:
//
//  1. shutting down: E906 at once;
//  2. the target is looked up: unknown, E903 at once;
//  3. the target's breaker admits the call: refused (open, or half-open with
//     the probe out), E904 at once with the retry hint;
//  4. the target's bulkhead takes a slot: full, the breaker ticket goes back
//     with Cancel (neither success nor failure, so a probe's slot is freed)
//     and E905 at once;
//  5. in a goroutine of its own: the HTTP call, its classification, the
//     result recorded with the breaker's Done (a failure when the code is one
//     of the route's failure codes), the slot released, and the answer.
//
// Steps 1 to 4 never wait, so their answers go out from the read loop (which
// flushes them) and a fast refusal never queues behind a slow call. The
// result is recorded before the answer is written, so a client that has its
// answer sees the breaker already moved by it.
//
// A panic anywhere in here is a hub bug: the request is answered E907, a
// breaker ticket taken is handed back with Cancel and a bulkhead slot taken
// is released, so neither policy is left holding a leaked admission.
func (c *conn) dispatch(req Request) {
	s := c.srv
	// Counted before the shutdown check so that Shutdown, which sets the
	// flag and then waits for this count to drain, cannot miss a call about
	// to start.
	s.activeCalls.Add(1)
	var (
		rt       *route
		ticket   breaker.Ticket
		admitted bool // ticket is held
		acquired bool // a bulkhead slot is held
		async    bool // the call goroutine owns what is held
	)
	defer func() {
		if async {
			return
		}
		if p := recover(); p != nil {
			if admitted {
				admitted = false
				rt.breaker.Cancel(ticket)
			}
			if acquired {
				acquired = false
				rt.bulkhead.Release()
			}
			s.log.Error().Bytes("txid", req.TxID).Interface("panic", p).Bytes("stack", debug.Stack()).Msg("request handling panicked")
			answer(c, req.TxID, CodeInternal, msgInternal, true)
		}
		s.activeCalls.Add(-1)
	}()

	if s.inShutdown.Load() {
		answer(c, req.TxID, CodeUnavailable, msgShuttingDown, false)
		return
	}
	rt = s.lookup(req.Target)
	if rt == nil {
		answer(c, req.TxID, CodeUnknownTarget, msgUnknownTarget, false)
		return
	}
	var err error
	if ticket, err = rt.breaker.Allow(); err != nil {
		c.scratch = appendRetryHint(c.scratch[:0], rt.breaker.RetryAfter())
		answer(c, req.TxID, CodeCircuitOpen, c.scratch, false)
		return
	}
	admitted = true
	if !rt.bulkhead.TryAcquire() {
		admitted = false
		rt.breaker.Cancel(ticket)
		answer(c, req.TxID, CodeBulkheadFull, msgBulkheadFull, false)
		return
	}
	acquired = true

	cl := getCall(c, rt, ticket, req)
	c.calls.Add(1)
	s.wg.Go(func() { cl.run() })
	async = true
}

// appendRetryHint appends the E904 message "circuit open; retry after Ns",
// N being d in whole seconds rounded up and at least 1: a half-open breaker
// with its probe out has no fixed reopening time, and "0s" would invite a
// busy loop.
func appendRetryHint(dst []byte, d time.Duration) []byte {
	secs := max(int64((d+time.Second-1)/time.Second), 1)
	dst = append(dst, msgCircuitOpenHead...)
	dst = strconv.AppendInt(dst, secs, 10)
	return append(dst, 's')
}

// call is one admitted transaction on its way to a target. It owns a copy of
// the TXID and payload, because the request line lives in the connection's
// read buffer, which the next line overwrites. Calls are pooled so that
// their buffers are reused. A call is used by one goroutine at a time.
type call struct {
	c      *conn
	rt     *route
	ticket breaker.Ticket
	line   []byte // TXID then payload
	txidN  int    // length of the TXID at the start of line
	body   []byte // scratch for the target's answer
}

var callPool = sync.Pool{New: func() any { return new(call) }}

// getCall returns a pooled call holding copies of req's TXID and payload.
func getCall(c *conn, rt *route, ticket breaker.Ticket, req Request) *call {
	cl := callPool.Get().(*call)
	cl.c, cl.rt, cl.ticket = c, rt, ticket
	cl.line = append(append(cl.line[:0], req.TxID...), req.Payload...)
	cl.txidN = len(req.TxID)
	return cl
}

// put returns cl to the pool. Buffers grown by an unusually large answer
// are dropped rather than kept alive by the pool.
func (cl *call) put() {
	cl.c, cl.rt = nil, nil
	if cap(cl.body) > 16<<10 {
		cl.body = nil
	}
	if cap(cl.line) > 16<<10 {
		cl.line = nil
	}
	callPool.Put(cl)
}

// run is step 5 of dispatch: the call, the breaker's record, the slot's
// release and the answer, in that order. The call's context is the
// Server's, not the connection's, so a client that disconnects does not
// cancel a transaction that may have reached the target, and its result
// still counts for the breaker; only the answer is dropped.
func (cl *call) run() {
	c, rt := cl.c, cl.rt
	s := c.srv
	txid := cl.line[:cl.txidN]
	reported, released := false, false
	defer func() {
		if p := recover(); p != nil {
			if !reported {
				reported = true
				rt.breaker.Cancel(cl.ticket)
			}
			if !released {
				released = true
				rt.bulkhead.Release()
			}
			rt.log.Error().Bytes("txid", txid).Interface("panic", p).Bytes("stack", debug.Stack()).Msg("target call panicked")
			answer(c, txid, CodeInternal, msgInternal, true)
		}
		c.calls.Done()
		s.activeCalls.Add(-1)
		cl.put()
	}()

	start := time.Now()
	code, msg, body := rt.target.call(s.callCtx, string(txid), cl.line[cl.txidN:], cl.body)
	cl.body = body
	failed := rt.isFailure(code)
	// Flags are set before each step so that a panic inside a step never
	// hands the same admission back twice.
	reported = true
	rt.breaker.Done(cl.ticket, failed)
	released = true
	rt.bulkhead.Release()
	answer(c, txid, code, msg, true)
	// Failures are logged at warn: the breaker bounds how many a sick target
	// can cause, and they are what an operator looks for.
	ev := rt.log.Debug()
	if failed {
		ev = rt.log.Warn().Bytes("message", msg)
	}
	ev.Bytes("txid", txid).Str("code", code).Bool("failed", failed).Dur("took", time.Since(start)).Msg("call done")
}
