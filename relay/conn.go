package relay

import (
	"errors"
	"io"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay/protocol"
)

// conn is one client connection: a net.Conn, a line reader, a write buffer
// and a read loop (docs/DESIGN.md, "A line's way through the hub"). It
// reads and writes; its admitter decides. The read loop parses lines and
// hands each request to the admitter, which answers those that need no
// call at once and starts the others, which answer from their own
// goroutines. Every answer goes through one answerWriter, so each line is
// written whole.
//
// Backpressure: only calls admitted by a bulkhead run asynchronously, so a
// connection never has more calls in flight than its targets' bulkheads
// allow. Every other line is answered by the read loop itself, which
// therefore stops reading while a client that does not read its answers
// blocks the writer, until WriteTimeout closes the connection.
type conn struct {
	srv *Server
	nc  net.Conn

	// Owned by the read loop.
	in           lineReader
	readDeadline time.Time // the read deadline last set: a check, see afterDeadline
	quietSince   time.Time // when the loop last answered every complete line it held

	out answerWriter // the answers not yet written; the admitter's sink

	stopMu  sync.Mutex
	stopped bool // guarded by stopMu: Shutdown stopped reading; the read deadline has passed

	// adm admits the connection's requests; it holds what the connection
	// learnt of its client, set before the read loop starts.
	adm admitter
}

// errConnDone marks a connection whose answers are all written.
var errConnDone = errors.New("relay: connection done")

// aLongTimeAgo is a read deadline that has passed, to stop a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, nc: nc, in: lineReader{maxLine: s.maxLineBytes, long: &s.longBufs}}
	c.out.c = c
	c.adm = admitter{srv: s, sink: &c.out}
	return c
}

// readEnd says why a connection's read loop stopped.
type readEnd uint8

const (
	endEOF     readEnd = iota // the client closed its side
	endIdle                   // no complete line within IdleTimeout
	endStopped                // Shutdown stopped reading
	endError                  // the connection failed or was closed
	endTLS                    // the TLS handshake failed: the loop never ran
	endHandOff                // quiet with no input held: a fresh goroutine waits on (see afterDeadline)
)

func (e readEnd) String() string {
	return [...]string{"eof", "idle timeout", "shutdown", "error", "tls handshake failed", "handed off"}[e]
}

// serve runs the connection: the PROXY header when the Server takes one,
// the TLS handshake when it is served over TLS, the read loop
// (serveInput), then the wait for its calls in flight to answer, the final
// flush and the close.
func (c *conn) serve() {
	defer c.endOnPanic()
	if !c.acceptProxyHeader() {
		// Refused by the PROXY rules (and logged), or gone before a byte.
		c.nc.Close()
		c.srv.untrack(c.nc)
		return
	}
	if !c.handshake() {
		c.ended(endTLS)
		return
	}
	c.awaitIdle(time.Now())
	if c.in.buf == nil {
		// The wait for the first input, in a shallow frame, holding
		// nothing (docs/DESIGN.md, "Memory").
		c.in.waitForInput(c.nc)
	}
	c.ended(c.serveInput())
}

// resume serves a connection handed off by a quiet read loop, on a fresh
// goroutine whose stack starts small; it waits in a shallow frame, holding
// nothing, so the stack stays small while the connection is idle.
func (c *conn) resume() {
	defer c.endOnPanic()
	c.in.waitForInput(c.nc)
	c.ended(c.serveInput())
}

// ended finishes the connection once its read loop has ended: the wait
// for its calls in flight, the final flush and the close; or, after a
// hand-off, starts resume, which the Server's WaitGroup owns like serve.
func (c *conn) ended(end readEnd) {
	if end == endHandOff {
		c.srv.serving.clientWork.Go(c.resume)
		return
	}
	c.adm.calls.Wait()
	c.finish(end)
	c.logAddrs(c.srv.obs.log.Debug()).Stringer("end", end).Msg("connection closed")
	c.srv.untrack(c.nc)
}

// endOnPanic, deferred by the goroutine serving the connection, catches a
// panic: logged and counted, the connection closed and forgotten. It is
// not goCatching, whose frames would sit under every idle connection's
// wait.
func (c *conn) endOnPanic() {
	if p := recover(); p != nil {
		c.srv.logPanic(taskConn, p, debug.Stack())
		c.nc.Close()
		c.srv.untrack(c.nc)
	}
}

// logAddrs adds to ev the client's address and, when a PROXY header gave
// it, the load balancer's.
func (c *conn) logAddrs(ev *zerolog.Event) *zerolog.Event {
	if !c.adm.client.IsValid() {
		return ev.Str("remote", c.nc.RemoteAddr().String())
	}
	return c.adm.logAddrs(ev)
}

// serveInput handles lines until the connection ends or hands off. It
// answers an over-long line E900 "line too long" and goes on with the next
// line; it ignores blank lines. Its answers are buffered and flushed once
// no complete line is held, so pipelined requests share a write and no
// answer waits in the buffer while the loop waits for input. The idle
// measure restarts at each flush: it counts time without a complete line.
// A refusal-heavy connection takes its turn in the lane after each read
// (awaitTurn) and gives it back after the flush.
func (c *conn) serveInput() readEnd {
	defer c.adm.leaveLane()
	batch := true // the next line is the first of a read
	for {
		line, tooLong, err := c.in.readLine(c.nc)
		if err == io.EOF {
			line, tooLong, err = c.checkEOF(line, tooLong)
		}
		if isTimeout(err) {
			end, stop := c.afterDeadline()
			if !stop {
				continue
			}
			c.in.release()
			return end
		}
		if batch {
			batch = false
			if c.adm.awaitTurn() {
				// The wait for a turn is not idle time.
				c.armReadDeadline(time.Now())
			}
		}
		switch {
		case tooLong && c.srv.serving.inShutdown.Load():
			c.adm.refuse(line, protocol.CodeUnavailable, protocol.MsgShuttingDown)
			c.adm.tally(false)
		case tooLong:
			c.adm.refuse(line, protocol.CodeMalformed, protocol.MsgLineTooLong)
			c.adm.tally(false)
		case len(line) > 0:
			c.adm.tally(c.serveLine(line))
		}
		if err != nil {
			c.in.release()
			c.out.flush(time.Now())
			if err == io.EOF {
				return endEOF
			}
			return endError
		}
		if !c.in.lineHeld() {
			now := time.Now()
			c.out.flush(now)
			c.adm.endTurn()
			c.adm.endBatch()
			c.armReadDeadline(now)
			batch = true
		}
	}
}

// checkEOF vets the end of a client's input and the unterminated last line
// that came with it. A reset reaches only the first call to see it: when a
// write of the answers took it, the read that follows reports a plain end
// of input, and a line cut by the reset would look like the last line of
// a client that closed its side. So once a write has failed, the end is
// the write's error and the line is dropped, never served. The lock makes
// the check see a write that failed before the read.
func (c *conn) checkEOF(line []byte, tooLong bool) ([]byte, bool, error) {
	if werr := c.out.failed(); werr != nil {
		return nil, false, werr
	}
	return line, tooLong, io.EOF
}

// serveLine answers a malformed line E900 (E906 once shutting down, like
// every line) and hands a well-formed one to the admitter. It reports
// whether the line was admitted: handed to a call, which answers it.
//
// It must stay out of serveInput: the parse's and the admission's locals
// belong on the stack only while a line is served, and the loop's own
// frame, under every idle connection's wait for input, small enough for
// the runtime's smallest stack (docs/DESIGN.md, "Memory"). It is too big
// to be inlined today; go:noinline keeps it so should it shrink.
//
//go:noinline
func (c *conn) serveLine(line []byte) (admitted bool) {
	req, err := protocol.ParseRequest(line)
	if err == nil {
		return c.adm.admit(req)
	}
	var pe *protocol.ProtocolError
	if !errors.As(err, &pe) {
		panic("relay: protocol.ParseRequest returned a foreign error: " + err.Error())
	}
	code, msg := pe.Code, pe.Message
	if c.srv.serving.inShutdown.Load() {
		code, msg = protocol.CodeUnavailable, protocol.MsgShuttingDown
	}
	// pe.TxID, when set, is the start of line: reslicing it spares a copy.
	c.adm.refuse(line[:len(pe.TxID)], code, msg)
	return false
}

// deadlineSlack is how much later than its timeout a deadline may fire. A
// deadline moves only when it would come too early, and then this much
// later than needed, so a busy connection resets its timer about once per
// slack rather than for every line (docs/DESIGN.md, "Deadlines").
func deadlineSlack(timeout time.Duration) time.Duration {
	return min(time.Second, timeout/8)
}

// armReadDeadline restarts the idle measure at now, when every complete
// line held is answered. The socket's read deadline is only a check, due
// between one and two deadlineSlacks after the last restart, moved once
// per slack on a busy connection; afterDeadline decides what its passing
// means.
func (c *conn) armReadDeadline(now time.Time) {
	c.quietSince = now
	slack := deadlineSlack(c.srv.idleTimeout)
	if now.Add(slack).After(c.readDeadline) || c.readDeadline.After(now.Add(2*slack)) {
		c.setReadDeadline(now.Add(2 * slack))
	}
}

// awaitIdle restarts the idle measure at now for a goroutine that has
// served no line and so has nothing to hand off: a new connection, or a
// handed-off one. Its read deadline is the idle one itself; the first
// answered line brings the checks back (armReadDeadline).
func (c *conn) awaitIdle(now time.Time) {
	c.quietSince = now
	c.setReadDeadline(now.Add(c.srv.idleTimeout + deadlineSlack(c.srv.idleTimeout)))
}

// afterDeadline decides what the read deadline's passing means: the end
// of the connection when Shutdown stopped reading or it has been idle for
// IdleTimeout; a hand-off when it has been quiet for a slack with no input
// held, so a fresh goroutine waits on with a small stack (docs/DESIGN.md,
// "Memory"); else only a check, and the read goes on.
func (c *conn) afterDeadline() (end readEnd, stop bool) {
	if c.stoppedReading() {
		return endStopped, true
	}
	now := time.Now()
	idleDue := c.quietSince.Add(c.srv.idleTimeout)
	if !now.Before(idleDue) {
		return endIdle, true
	}
	slack := deadlineSlack(c.srv.idleTimeout)
	if handOff := c.quietSince.Add(slack); c.in.empty() {
		if !now.Before(handOff) {
			c.awaitIdle(c.quietSince)
			return endHandOff, true
		}
		c.setReadDeadline(handOff)
		return 0, false
	}
	next := now.Add(2 * slack)
	if last := idleDue.Add(slack); next.After(last) {
		next = last
	}
	c.setReadDeadline(next)
	return 0, false
}

// setReadDeadline sets the read deadline to t unless Shutdown stopped
// reading: the past deadline that stops it must stay.
func (c *conn) setReadDeadline(t time.Time) {
	c.readDeadline = t
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	if !c.stopped {
		_ = c.nc.SetReadDeadline(t)
	}
}

// stopReading makes the read loop stop once it has handled the complete
// lines it holds (each answered E906 during shutdown).
func (c *conn) stopReading() {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	c.stopped = true
	_ = c.nc.SetReadDeadline(aLongTimeAgo)
}

// stoppedReading reports whether Shutdown has stopped the connection's
// reads.
func (c *conn) stoppedReading() bool {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	return c.stopped
}

// finish writes what is left in the buffer and closes the connection. When
// the hub stopped reading while the client may still be sending
// (shutdown), it half-closes and drains the client's input first, so the
// close does not reset the connection and destroy answers not yet
// delivered.
func (c *conn) finish(end readEnd) {
	if c.out.close(time.Now()) && end == endStopped {
		closeAfterLinger(c.nc, closeLinger)
		return
	}
	c.nc.Close()
}
