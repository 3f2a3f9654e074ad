package relay

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"runtime/debug"
	"sync"
	"time"
)

// conn is one client connection. Its read loop parses lines and answers the
// ones that need no call itself; admitted calls answer from their own
// goroutines. Answers share one buffered writer under wmu, so each line is
// written whole. It is safe for concurrent use as described on each field.
//
// Backpressure: only calls admitted by a bulkhead run asynchronously, so a
// connection never has more calls in flight than the sum of its targets'
// bulkhead sizes (and all connections together share that bound). Every
// other line is answered by the read loop itself, which therefore stops
// reading while a client that does not read its answers blocks the writer;
// after WriteTimeout the connection is closed.
type conn struct {
	srv *Server
	nc  net.Conn

	// Owned by the read loop.
	r       *bufio.Reader
	scratch []byte           // message of an E904 answer
	txid    [maxTxIDLen]byte // TXID of an over-long line, kept while its rest is discarded

	wmu  sync.Mutex
	w    *bufio.Writer // guarded by wmu
	line []byte        // guarded by wmu: the answer being written
	werr error         // guarded by wmu: why answers can no longer be written

	dmu     sync.Mutex
	stopped bool // guarded by dmu: Shutdown told the read loop to stop

	calls    sync.WaitGroup // this connection's calls in flight
	readDone chan struct{}  // closed when the read loop has ended
}

// errConnDone marks a connection whose answers are all written.
var errConnDone = errors.New("relay: connection done")

// aLongTimeAgo is a read deadline that has passed, to stop a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		srv: s,
		nc:  nc,
		// Room for a line of MaxLineBytes and its "\r\n": a longer line
		// fills the buffer and is refused without being held whole.
		r:        bufio.NewReaderSize(nc, s.maxLineBytes+2),
		w:        bufio.NewWriter(nc),
		readDone: make(chan struct{}),
	}
}

// readEnd says why a connection's read loop stopped.
type readEnd uint8

const (
	endEOF     readEnd = iota // the client closed its side
	endIdle                   // no complete line within IdleTimeout
	endStopped                // Shutdown stopped reading
	endError                  // the connection failed or was closed
)

func (e readEnd) String() string {
	return [...]string{"eof", "idle timeout", "shutdown", "error"}[e]
}

// serve runs the connection: the read loop, then, once reading has ended,
// the wait for this connection's calls in flight to answer, the final
// flush and the close.
func (c *conn) serve() {
	defer c.srv.untrack(c.nc)
	defer func() {
		if p := recover(); p != nil {
			c.srv.log.Error().Interface("panic", p).Bytes("stack", debug.Stack()).Msg("connection panicked")
			c.nc.Close()
		}
	}()
	end := c.readLoop()
	close(c.readDone)
	c.calls.Wait()
	c.finish(end)
	c.srv.log.Debug().Str("remote", c.nc.RemoteAddr().String()).Stringer("end", end).Msg("connection closed")
}

// readLoop reads and handles request lines until the connection ends. It
// answers an over-long line E900 "line too long" and goes on with the next
// line; it ignores blank lines. Its answers are buffered and flushed once no
// complete line is waiting: pipelined requests share a write, and no answer
// sits in the buffer while the loop waits for input or for calls. The idle
// deadline is re-armed whenever the loop is about to wait for input, so it
// measures time without a complete line.
func (c *conn) readLoop() readEnd {
	c.armReadDeadline()
	for {
		line, tooLong, err := c.readLine()
		switch {
		case tooLong && c.srv.inShutdown.Load():
			c.srv.noteUnparsed(line, CodeUnavailable)
			answer(c, line, CodeUnavailable, msgShuttingDown, false)
		case tooLong:
			c.srv.noteUnparsed(line, CodeMalformed)
			answer(c, line, CodeMalformed, msgLineTooLong, false)
		case len(line) > 0:
			c.serveLine(line)
		}
		if err != nil {
			c.flush()
			return c.readEndFor(err)
		}
		if !c.completeLineBuffered() {
			c.flush()
			c.armReadDeadline()
		}
	}
}

// readLine returns the next line without its "\n" or "\r\n". For a line
// longer than MaxLineBytes it returns tooLong, with line holding the line's
// TXID when its start had a valid one (else nil), after discarding the rest
// of the line. err is io.EOF with the last, unterminated line of a client
// that closed its side (which is still served), or the read error that ends
// the connection (then any partial line is dropped).
func (c *conn) readLine() (line []byte, tooLong bool, err error) {
	line, err = c.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		n := copy(c.txid[:], LeadingTxID(line))
		for err == bufio.ErrBufferFull {
			_, err = c.r.ReadSlice('\n')
		}
		if err != nil && err != io.EOF {
			return nil, false, err
		}
		return c.txid[:n], true, err
	}
	if err != nil && err != io.EOF {
		return nil, false, err
	}
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	if len(line) > c.srv.maxLineBytes {
		return LeadingTxID(line), true, err
	}
	return line, false, err
}

// completeLineBuffered reports whether the read buffer already holds a whole
// line, so reading it will not wait for the client.
func (c *conn) completeLineBuffered() bool {
	n := c.r.Buffered()
	if n == 0 {
		return false
	}
	b, _ := c.r.Peek(n)
	return bytes.IndexByte(b, '\n') >= 0
}

// serveLine answers a malformed line E900 (E906 once shutting down, like
// every line) and hands a well-formed one to dispatch. Its answers are
// buffered: the read loop flushes.
func (c *conn) serveLine(line []byte) {
	req, err := ParseRequest(line)
	if err == nil {
		c.dispatch(req)
		return
	}
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		panic("relay: ParseRequest returned a foreign error: " + err.Error())
	}
	code, msg := pe.Code, pe.Message
	if c.srv.inShutdown.Load() {
		code, msg = CodeUnavailable, msgShuttingDown
	}
	// pe.TxID, when set, is the start of line: reslicing it spares a copy.
	c.srv.noteUnparsed(line[:len(pe.TxID)], code)
	answer(c, pe.TxID, code, msg, false)
}

// armReadDeadline sets the idle deadline for the next read, unless Shutdown
// has stopped reading: its past deadline must not be replaced.
func (c *conn) armReadDeadline() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.stopped {
		_ = c.nc.SetReadDeadline(time.Now().Add(c.srv.idleTimeout))
	}
}

// stopReading makes the read loop stop once it has handled the complete
// lines already buffered (each answered E906 during shutdown).
func (c *conn) stopReading() {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	c.stopped = true
	_ = c.nc.SetReadDeadline(aLongTimeAgo)
}

// readEndFor classifies the error that ended the read loop.
func (c *conn) readEndFor(err error) readEnd {
	switch {
	case err == io.EOF:
		return endEOF
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.dmu.Lock()
		defer c.dmu.Unlock()
		if c.stopped {
			return endStopped
		}
		return endIdle
	default:
		return endError
	}
}

// finish writes what is left in the buffer and closes the connection. When
// the hub stopped reading while the client may still be sending (shutdown),
// it half-closes and drains the client's input first, so the close does not
// reset the connection and destroy answers not yet delivered.
func (c *conn) finish(end readEnd) {
	c.wmu.Lock()
	if c.werr == nil && c.w.Buffered() > 0 {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.writeTimeout))
		c.werr = c.w.Flush()
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

// answer writes one response line. flush sends it (and whatever is buffered
// before it) to the client now; without flush it waits in the buffer for
// the next flushed answer. Once a write has failed, answers are dropped: the
// client is gone or did not read within WriteTimeout, and the connection has
// been closed. Safe for concurrent use: the read loop and every call of the
// connection answer through it.
func answer[T, M ~string | ~[]byte](c *conn, txid T, code string, msg M, flush bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return
	}
	c.line = appendResponse(c.line[:0], txid, code, msg)
	c.writeLineLocked(flush)
}

// flush sends the buffered answers to the client.
func (c *conn) flush() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil || c.w.Buffered() == 0 {
		return
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.writeTimeout))
	if err := c.w.Flush(); err != nil {
		c.failLocked(err)
	}
}

// failLocked records a failed write and disconnects the client: it is gone,
// or did not read within WriteTimeout. Closing ends the read loop too; calls
// in flight go on, are recorded by their breakers, and their answers are
// dropped.
func (c *conn) failLocked(err error) {
	c.werr = err
	c.nc.Close()
	c.srv.log.Debug().Err(err).Str("remote", c.nc.RemoteAddr().String()).Msg("client write failed; connection closed")
}

// writeLineLocked writes c.line. The write deadline is set only when the
// write reaches the network (a flush, or a line that does not fit the
// buffer), because only then can the client make it block.
func (c *conn) writeLineLocked(flush bool) {
	if flush || c.w.Available() < len(c.line) {
		_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.writeTimeout))
	}
	_, err := c.w.Write(c.line)
	if err == nil && flush {
		err = c.w.Flush()
	}
	if err != nil {
		c.failLocked(err)
	}
}
