package relay

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
)

// conn is one client connection: a net.Conn, a line reader, a write buffer
// and a read loop (docs/DESIGN.md, "A line's way through the hub"). The
// read loop parses lines and answers those that need no call itself;
// admitted calls answer from their own goroutines. Every answer is appended
// to one write buffer under wmu, so each line is written whole.
//
// Backpressure: only calls admitted by a bulkhead run asynchronously, so a
// connection never has more calls in flight than its targets' bulkheads
// allow. Every other line is answered by the read loop itself, which
// therefore stops reading while a client that does not read its answers
// blocks the writer, until WriteTimeout closes the connection.
type conn struct {
	srv *Server
	nc  net.Conn

	// Set before the read loop starts, read-only afterwards.
	client netip.AddrPort // the PROXY header's source when there was one, else the socket peer
	peer   *connPeer      // what a PROXY header or a client certificate told; nil when neither did

	// Owned by the read loop.
	in         lineReader
	rdl        time.Time // the read deadline last set: a check, see afterDeadline
	quietSince time.Time // when the loop last answered every complete line it held
	refusals   uint8     // lines refused in a row, up to laneAfter (see refusalLane)
	inTurn     bool      // the connection holds a turn in the refusal lane

	wmu  sync.Mutex
	wbuf *[]byte   // guarded by wmu: answers not yet written; nil when there are none
	werr error     // guarded by wmu: why answers can no longer be written
	wdl  time.Time // guarded by wmu: the write deadline last set

	dmu     sync.Mutex
	stopped bool // guarded by dmu: Shutdown stopped reading; the read deadline has passed

	calls sync.WaitGroup // this connection's calls in flight
}

// connPeer is what a connection learnt about its client beyond the
// socket. Most connections have none, so it is kept apart from conn.
type connPeer struct {
	proxy      netip.AddrPort // the load balancer that sent the PROXY header; zero when none
	identities []string       // the client certificate's identities (clientcert.Identities); nil without one
	scope      dedup.Scope    // the shield's scope of the client's certificate (certScope); zero without one
}

// proxyPeer returns the load balancer that sent the PROXY header, or the
// zero AddrPort when none did.
func (c *conn) proxyPeer() netip.AddrPort {
	if c.peer == nil {
		return netip.AddrPort{}
	}
	return c.peer.proxy
}

// certIdentities returns the client certificate's identities, or nil
// without one.
func (c *conn) certIdentities() []string {
	if c.peer == nil {
		return nil
	}
	return c.peer.identities
}

// errConnDone marks a connection whose answers are all written.
var errConnDone = errors.New("relay: connection done")

// aLongTimeAgo is a read deadline that has passed, to stop a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{srv: s, nc: nc, in: lineReader{maxLine: s.maxLineBytes, long: &s.longBufs}}
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
	if !c.begin() {
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
		c.srv.wg.Go(c.resume)
		return
	}
	c.calls.Wait()
	c.finish(end)
	c.logAddrs(c.srv.log.Debug()).Stringer("end", end).Msg("connection closed")
	c.srv.untrack(c.nc)
}

// endOnPanic, deferred by the goroutine serving the connection, catches a
// panic: logged and counted, the connection closed and forgotten. It is
// not goCatching, whose frames would sit under every idle connection's
// wait.
func (c *conn) endOnPanic() {
	if p := recover(); p != nil {
		c.srv.notePanic(taskConn, p, debug.Stack())
		c.nc.Close()
		c.srv.untrack(c.nc)
	}
}

// logAddrs adds to ev the client's address and, when a PROXY header gave
// it, the load balancer's.
func (c *conn) logAddrs(ev *zerolog.Event) *zerolog.Event {
	if !c.client.IsValid() {
		return ev.Str("remote", c.nc.RemoteAddr().String())
	}
	ev = ev.Stringer("remote", c.client)
	if p := c.proxyPeer(); p.IsValid() {
		ev = ev.Stringer("proxy", p)
	}
	return ev
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
	defer c.leaveLane()
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
			if c.awaitTurn() {
				// The wait for a turn is not idle time.
				c.armReadDeadline(time.Now())
			}
		}
		switch {
		case tooLong && c.srv.inShutdown.Load():
			c.noteUnparsed(line, protocol.CodeUnavailable)
			answer(c, line, protocol.CodeUnavailable, protocol.MsgShuttingDown, false)
			c.noteRefused()
		case tooLong:
			c.noteUnparsed(line, protocol.CodeMalformed)
			answer(c, line, protocol.CodeMalformed, protocol.MsgLineTooLong, false)
			c.noteRefused()
		case len(line) > 0:
			if c.serveLine(line) {
				c.refusals = 0
			} else {
				c.noteRefused()
			}
		}
		if err != nil {
			c.in.release()
			c.flush()
			if err == io.EOF {
				return endEOF
			}
			return endError
		}
		if !c.in.lineHeld() {
			now := time.Now()
			c.flushAt(now)
			c.endTurn()
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
	c.wmu.Lock()
	werr := c.werr
	c.wmu.Unlock()
	if werr != nil {
		return nil, false, werr
	}
	return line, tooLong, io.EOF
}

// serveLine answers a malformed line E900 (E906 once shutting down, like
// every line) and hands a well-formed one to dispatch. It reports whether
// the line was admitted: handed to a call, which answers it.
func (c *conn) serveLine(line []byte) (admitted bool) {
	req, err := protocol.ParseRequest(line)
	if err == nil {
		return c.dispatch(req)
	}
	var pe *protocol.ProtocolError
	if !errors.As(err, &pe) {
		panic("relay: protocol.ParseRequest returned a foreign error: " + err.Error())
	}
	code, msg := pe.Code, pe.Message
	if c.srv.inShutdown.Load() {
		code, msg = protocol.CodeUnavailable, protocol.MsgShuttingDown
	}
	// pe.TxID, when set, is the start of line: reslicing it spares a copy.
	c.noteUnparsed(line[:len(pe.TxID)], code)
	answer(c, pe.TxID, code, msg, false)
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
	if now.Add(slack).After(c.rdl) || c.rdl.After(now.Add(2*slack)) {
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
	c.rdl = t
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.stopped {
		_ = c.nc.SetReadDeadline(t)
	}
}

// stopReading makes the read loop stop once it has handled the complete
// lines it holds (each answered E906 during shutdown).
func (c *conn) stopReading() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.stopped = true
	_ = c.nc.SetReadDeadline(aLongTimeAgo)
}

// stoppedReading reports whether Shutdown has stopped the connection's
// reads.
func (c *conn) stoppedReading() bool {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	return c.stopped
}

// finish writes what is left in the buffer and closes the connection. When
// the hub stopped reading while the client may still be sending
// (shutdown), it half-closes and drains the client's input first, so the
// close does not reset the connection and destroy answers not yet
// delivered.
func (c *conn) finish(end readEnd) {
	c.wmu.Lock()
	if c.werr == nil && c.wbuf != nil {
		c.werr = c.writeOutLocked(time.Now())
	}
	healthy := c.werr == nil
	if healthy {
		c.werr = errConnDone
	}
	c.wmu.Unlock()
	if healthy && end == endStopped {
		closeAfterLinger(c.nc, closeLinger)
		return
	}
	c.nc.Close()
}

// answer writes one response line. flush sends it (and whatever is
// buffered before it) to the client now; without flush it waits in the
// buffer for the read loop's flush. Once a write has failed, answers are
// dropped: the client is gone or did not read within WriteTimeout. Safe
// for concurrent use: the read loop and every call of the connection
// answer through it.
func answer[T, M ~string | ~[]byte](c *conn, txid T, code string, msg M, flush bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	if c.wbuf != nil && len(*c.wbuf) > cap(*c.wbuf)-maxAnswerLen {
		if !c.writeLocked(time.Now()) {
			return
		}
	}
	if c.wbuf == nil {
		c.wbuf = writeBufs.Get().(*[]byte)
	}
	*c.wbuf = protocol.AppendResponse(*c.wbuf, txid, code, msg)
	if flush {
		c.writeLocked(time.Now())
	}
}

// flush sends the buffered answers to the client.
func (c *conn) flush() { c.flushAt(time.Now()) }

// flushAt is flush for a caller that has just read the clock: now.
func (c *conn) flushAt(now time.Time) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr == nil && c.wbuf != nil {
		c.writeLocked(now)
	}
}

// writeLocked writes the buffered answers and reports whether it could.
// A failed write disconnects the client: it is gone, or did not read
// within WriteTimeout. Calls in flight go on and are recorded by their
// breakers; their answers are dropped.
func (c *conn) writeLocked(now time.Time) bool {
	err := c.writeOutLocked(now)
	if err == nil {
		return true
	}
	c.werr = err
	c.nc.Close()
	c.logAddrs(c.srv.log.Debug().Err(err)).Msg("client write failed; connection closed")
	return false
}

// writeOutLocked writes the buffered answers and hands the buffer back,
// whether or not the write succeeds. The write deadline is set only here,
// where the client can make the hub wait, and moved like the read
// deadline: a blocked write fails between WriteTimeout and WriteTimeout
// plus deadlineSlack after it began.
func (c *conn) writeOutLocked(now time.Time) error {
	b := *c.wbuf
	var err error
	if len(b) > 0 {
		if wt := c.srv.writeTimeout; c.wdl.Sub(now) < wt {
			c.wdl = now.Add(wt + deadlineSlack(wt))
			_ = c.nc.SetWriteDeadline(c.wdl)
		}
		_, err = c.nc.Write(b)
	}
	*c.wbuf = b[:0]
	writeBufs.Put(c.wbuf)
	c.wbuf = nil
	return err
}
