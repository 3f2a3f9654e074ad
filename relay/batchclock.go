package relay

import "time"

// One reading of the breakers' clock serves a whole batch of lines: the
// read loop answers a pipelined burst from one read, and the breakers
// decide for all its requests by one reading (breaker.AllowAt), which the
// access log records as each request's start. Reading the clock for every
// refused line cost 6 % of its instructions, and on a virtual machine's
// clock more than that in time (BenchmarkFastFailLine, breaker's
// BenchmarkOpenRefuseAt).
//
// The reading is taken when the batch's first request reaches a breaker
// and forgotten when the batch is answered, so it never spans a wait for
// input: it is when the batch came. Within a batch it can only grow old by
// the batch's own work, of which a write of a full buffer to a client slow
// to read is the longest; an old reading only makes an open period look
// less passed, so a refusal may hint a second more than needed, or a
// probe wait for the next batch.

// breakerNow returns the breakers' clock for a request that reaches a
// breaker: the batch's reading on the read loop, a fresh one off it
// (offLoop), where there is no batch: there the batch's fields belong to
// the read loop, so offLoop is tested before they are read. It is small
// enough to be inlined.
func (a *admitter) breakerNow(offLoop bool) time.Time {
	if !offLoop && a.batchRead {
		return a.batchAt
	}
	return a.readBreakerClock(offLoop)
}

// readBreakerClock reads the breakers' clock, and keeps the reading for the
// rest of the batch on the read loop. Not inlined, so that breakerNow is.
//
//go:noinline
func (a *admitter) readBreakerClock(offLoop bool) time.Time {
	now := a.srv.now()
	if !offLoop {
		a.batchAt, a.batchRead = now, true
	}
	return now
}

// endBatch forgets the batch's reading once every line the read loop held
// is answered: the next batch, which follows a wait for input, reads the
// clock again.
func (a *admitter) endBatch() {
	a.batchRead = false
}
