package relay

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay/protocol"
)

// conn is one client connection. Its read loop parses lines and answers the
// ones that need no call itself; admitted calls answer from their own
// goroutines. Answers are gathered in one write buffer under wmu, so each
// line is written whole. It is safe for concurrent use as described on each
// field.
//
// Memory: a connection holds buffers only while it has bytes in them. The
// read loop reads into a buffer of readBufSize from readBufs, taken when
// input arrives and handed back when the loop has used it all and would
// wait; a line that outgrows it moves to a buffer of MaxLineBytes+2 from the
// Server's longBufs for as long as the line needs it. On a socket (Unix) the
// loop waits for input through syscall.RawConn without holding a buffer at
// all; over TLS it waits in a one-byte read (readFirstByte), holding no
// buffer either; on other connections it holds a read buffer while it
// waits. Answers are appended to a buffer from writeBufs, handed back by
// the write that empties it. An idle connection thus holds no buffer of
// the hub's: it costs its goroutine, whose stack is the runtime's smallest
// once the connection has waited a while (serve, "Stack"), and a few small
// structures, and over TLS what crypto/tls keeps (docs/BENCHMARKS.md has
// the figures).
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

	// Set by begin and the TLS handshake, before the read loop starts and
	// the calls it admits; read-only afterwards.
	client netip.AddrPort // the client's address: the PROXY header's source when there was one, else the socket peer's
	peer   *connPeer      // what a PROXY header or a client certificate told; nil when neither did

	// Owned by the read loop.
	rc      syscall.RawConn            // nc's descriptor, to wait for input without a buffer; nil when unsupported
	rawRead func(fd uintptr) bool      // c.readRaw, bound once so that a read does not allocate
	rbuf    *[]byte                    // the read buffer; nil while no input is held
	r, w    int                        // the input not yet used is (*rbuf)[r:w]
	rerr    error                      // why the last read ended the input, reported once the input before it is used
	hint    *retryHint                 // the message of the E904 answers, kept for the next; allocated for the first
	txid    *[protocol.MaxTxIDLen]byte // TXID of an over-long line, kept while its rest is discarded; allocated for the first
	rdl     time.Time                  // the idle deadline armReadDeadline last set
	hdl     time.Time                  // the hand-off deadline armReadDeadline last set; zero while the socket's deadline is rdl

	wmu  sync.Mutex
	wbuf *[]byte   // guarded by wmu: answers not yet written, from writeBufs; nil when there are none
	werr error     // guarded by wmu: why answers can no longer be written
	wdl  time.Time // guarded by wmu: the write deadline last set

	dmu sync.Mutex

	calls    sync.WaitGroup // this connection's calls in flight
	readDone chan struct{}  // closed when the read loop has ended

	// The flags, together so that they share a word: an idle connection
	// costs its conn (docs/BENCHMARKS.md, "Idle memory").
	rlong   bool    // owned by the read loop: rbuf is from srv.longBufs, else from readBufs
	handOff bool    // owned by the read loop: hand a long wait for input to a new goroutine (serve sets it)
	stopped bool    // guarded by dmu: Shutdown told the read loop to stop
	tlsIdle bool    // set by the TLS handshake: wait for input with readFirstByte, holding no read buffer
	first   [1]byte // owned by the read loop: readFirstByte's byte
}

// connPeer is what a connection learnt about its client beyond the
// socket: set before its read loop starts, read-only afterwards. Most
// connections have none, so it is kept apart from conn.
type connPeer struct {
	proxy      netip.AddrPort // the load balancer that sent the PROXY header; zero when none
	identities []string       // the client certificate's identities (clientIdentities); nil without one
}

// retryHint is the message of a connection's E904 answers and the retry
// hint it holds, in seconds (0: none yet): it changes once a second at
// most, so a run of E904s formats it once. Owned by the read loop.
type retryHint struct {
	msg  []byte
	secs int64
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

// Buffer sizes of a connection.
const (
	// readBufSize is the read buffer: room for the lines of a typical
	// request and a pipelined burst of them in one read, and one page, so
	// that a buffer in use costs at most a page of memory.
	readBufSize = 4 << 10
	// writeBufSize is the write buffer: a pipelined burst of answers goes
	// out in one write, as with bufio's default.
	writeBufSize = 4 << 10
	// maxAnswerLen is the longest answer line protocol.AppendResponse makes: a TXID,
	// a four-character code, a message of protocol.MaxMessageBytes and the
	// separators.
	maxAnswerLen = protocol.MaxTxIDLen + 1 + 4 + 1 + protocol.MaxMessageBytes + 1
)

// readBufs and writeBufs lend buffers to connections while they hold bytes:
// *[]byte, so that lending and returning one allocates nothing.
var (
	readBufs  = sync.Pool{New: func() any { b := make([]byte, readBufSize); return &b }}
	writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, writeBufSize); return &b }}
)

// errConnDone marks a connection whose answers are all written.
var errConnDone = errors.New("relay: connection done")

// aLongTimeAgo is a read deadline that has passed, to stop a read at once.
var aLongTimeAgo = time.Unix(1, 0)

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:      s,
		nc:       nc,
		readDone: make(chan struct{}),
	}
	if sc, ok := nc.(syscall.Conn); ok && rawReads {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.rawRead = c.readRaw
		}
	}
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
	endHandOff                // waited handOffAfter with no input held: resume goes on
)

func (e readEnd) String() string {
	return [...]string{"eof", "idle timeout", "shutdown", "error", "tls handshake failed", "handed off"}[e]
}

// serve runs the connection: the PROXY header when the Server takes one,
// the TLS handshake when it is served over TLS, the read loop, then, once reading has ended, the wait for this
// connection's calls in flight to answer, the final flush and the close.
//
// Stack: an idle connection's goroutine waits with the runtime's smallest
// stack, 2 KiB (docs/BENCHMARKS.md, "Idle memory"). The runtime does not
// shrink the stack of a goroutine parked in the poller below 4 KiB, so a
// goroutine that has served lines, and grown its stack doing so, must not
// be the one that waits for long. On a socket, serve waits for the first
// input with readWhenReadable, a wait that holds nothing and is a few
// hundred bytes deep; and a read loop that has then waited handOffAfter
// with no input held hands the connection to a new goroutine, resume,
// which waits the same way, and returns.
func (c *conn) serve() {
	defer c.endOnPanic()
	if !c.begin() {
		close(c.readDone)
		c.releaseReadBuf()
		c.nc.Close()
		c.srv.untrack(c.nc)
		return
	}
	if !c.handshake() {
		c.end(endTLS)
		return
	}
	if c.rc == nil {
		c.end(c.readLoop())
		return
	}
	if c.rbuf != nil {
		// begin read input after a PROXY header: serve it first.
		c.handOff = true
		c.end(c.readLoop())
		return
	}
	c.armReadDeadline(time.Now()) // the idle deadline only: the wait is shallow already
	c.handOff = true
	c.readWhenReadable()
}

// resume serves a connection that a read loop handed off, on a new
// goroutine whose stack starts small (see serve). The socket's deadline is
// the idle deadline, set before the hand-off.
func (c *conn) resume() {
	defer c.endOnPanic()
	c.readWhenReadable()
}

// readWhenReadable waits until the socket has input (or its end, or an
// error) without reading it, then runs the read loop, on this goroutine,
// and ends the connection when the loop ends. A wait that ends with the
// idle deadline, Shutdown's or a close ends the connection at once.
func (c *conn) readWhenReadable() {
	if err := c.rc.Read(waitReadable); err != nil {
		c.end(c.readEndFor(err))
		return
	}
	c.end(c.readLoop())
}

// end finishes the connection once its read loop has ended: the wait for
// its calls in flight to answer, the final flush and the close. When the
// read loop handed off instead, it starts resume on a new goroutine, which
// the Server's WaitGroup owns like the first.
func (c *conn) end(end readEnd) {
	if end == endHandOff {
		c.srv.wg.Go(c.resume)
		return
	}
	close(c.readDone)
	c.calls.Wait()
	c.finish(end)
	c.logAddrs(c.srv.log.Debug()).Stringer("end", end).Msg("connection closed")
	c.srv.untrack(c.nc)
}

// endOnPanic, deferred by the goroutine serving the connection, catches a
// panic: logged and counted, the connection closed and forgotten.
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

// readLoop reads and handles request lines until the connection ends. It
// answers an over-long line E900 "line too long" and goes on with the next
// line; it ignores blank lines. Its answers are buffered and flushed once no
// complete line is waiting: pipelined requests share a write, and no answer
// sits in the buffer while the loop waits for input or for calls. The idle
// deadline is re-armed whenever the loop is about to wait for input, so it
// measures time without a complete line; the flush and the re-arm share one
// clock read.
func (c *conn) readLoop() readEnd {
	defer c.releaseReadBuf()
	c.armReadDeadline(time.Now())
	for {
		line, tooLong, err := c.readLine()
		switch {
		case tooLong && c.srv.inShutdown.Load():
			c.noteUnparsed(line, protocol.CodeUnavailable)
			answer(c, line, protocol.CodeUnavailable, protocol.MsgShuttingDown, false)
		case tooLong:
			c.noteUnparsed(line, protocol.CodeMalformed)
			answer(c, line, protocol.CodeMalformed, protocol.MsgLineTooLong, false)
		case len(line) > 0:
			c.serveLine(line)
		}
		if err != nil {
			c.flush()
			return c.readEndFor(err)
		}
		if !c.completeLineBuffered() {
			now := time.Now()
			c.flushAt(now)
			c.armReadDeadline(now)
		}
	}
}

// readLine returns the next line without its "\n" or "\r\n"; it is valid
// until the next readLine. For a line longer than MaxLineBytes it returns
// tooLong, with line holding the line's TXID when its start had a valid one
// (else nil), after discarding the rest of the line. err is io.EOF with the
// last, unterminated line of a client that closed its side (which is still
// served), or the read error that ends the connection (then any partial
// line is dropped).
//
// A line is over-long once MaxLineBytes+2 bytes (room for its "\r\n") have
// come without a "\n", so the hub never holds more of a line than that; the
// TXID is read from those first bytes.
func (c *conn) readLine() (line []byte, tooLong bool, err error) {
	limit := c.srv.maxLineBytes + 2
	scanned := 0 // bytes at the start of the input known to hold no '\n'
	for {
		in := c.input()
		if i := bytes.IndexByte(in[scanned:], '\n'); i >= 0 {
			i += scanned
			c.r += i + 1
			line, tooLong = c.checkLine(in[:i])
			return line, tooLong, nil
		}
		scanned = len(in)
		if len(in) >= limit {
			return c.discardLine()
		}
		if c.rerr != nil {
			err, c.rerr = c.rerr, nil
			c.r = c.w
			if err != io.EOF {
				return nil, false, err
			}
			line, tooLong = c.checkLine(in)
			return line, tooLong, io.EOF
		}
		c.fill()
	}
}

// checkLine trims the '\r' before a line's end and refuses the line when
// it is longer than MaxLineBytes, returning instead the TXID at its start,
// read from the bytes an over-long line would have been cut to.
func (c *conn) checkLine(raw []byte) (line []byte, tooLong bool) {
	line = bytes.TrimSuffix(raw, []byte{'\r'})
	if len(line) <= c.srv.maxLineBytes {
		return line, false
	}
	return protocol.LeadingTxID(raw[:min(len(raw), c.srv.maxLineBytes+2)]), true
}

// discardLine ends an over-long line whose first MaxLineBytes+2 bytes are
// the input: it keeps the line's TXID and drops input up to the line's
// '\n', or to the end of the input when the client closed its side. It
// returns as readLine does.
func (c *conn) discardLine() (txid []byte, tooLong bool, err error) {
	if c.txid == nil {
		c.txid = new([protocol.MaxTxIDLen]byte)
	}
	n := copy(c.txid[:], protocol.LeadingTxID(c.input()[:c.srv.maxLineBytes+2]))
	for {
		if i := bytes.IndexByte(c.input(), '\n'); i >= 0 {
			c.r += i + 1
			return c.txid[:n], true, nil
		}
		c.r = c.w
		if c.rerr != nil {
			err, c.rerr = c.rerr, nil
			if err != io.EOF {
				return nil, false, err
			}
			return c.txid[:n], true, io.EOF
		}
		c.fill()
	}
}

// input returns the bytes read and not yet used.
func (c *conn) input() []byte {
	if c.rbuf == nil {
		return nil
	}
	return (*c.rbuf)[c.r:c.w]
}

// completeLineBuffered reports whether the input already holds a whole
// line, so reading it will not wait for the client.
func (c *conn) completeLineBuffered() bool {
	return bytes.IndexByte(c.input(), '\n') >= 0
}

// fill reads more input after the input already held, recording in rerr
// why the input ends when it does. The caller has used every complete line
// and kept fewer than MaxLineBytes+2 bytes, so there is room for more once
// the held bytes move to the start of the buffer, or to a long-line buffer
// when they fill a read buffer.
func (c *conn) fill() {
	c.makeRoom()
	if c.rc != nil {
		for {
			err := c.rc.Read(c.rawRead)
			if err == nil {
				return
			}
			// The wait ended: a deadline passed, or the connection closed.
			if err = c.waitEnded(err); err != nil {
				c.rerr = err
				return
			}
		}
	}
	if c.tlsIdle {
		c.parkReadBuf()
		if c.rbuf == nil {
			c.readFirstByte()
			return
		}
	}
	c.holdReadBuf()
	// As bufio does, a connection that keeps reading nothing is given up
	// on rather than spun on.
	for range maxEmptyReads {
		n, err := c.nc.Read((*c.rbuf)[c.w:])
		c.w += n
		if n > 0 || err != nil {
			c.rerr = err
			return
		}
	}
	c.rerr = io.ErrNoProgress
}

// maxEmptyReads is how many reads in a row may return no bytes and no error
// before the connection counts as broken.
const maxEmptyReads = 100

// makeRoom readies the held read buffer for a read, if there is one: a
// buffer with nothing left in it starts over (a long-line buffer goes
// back), the input left moves to the start, and input that fills a read
// buffer moves to a long-line buffer.
func (c *conn) makeRoom() {
	switch {
	case c.rbuf == nil:
	case c.r == c.w && c.rlong:
		c.releaseReadBuf()
	case c.r > 0:
		c.w = copy(*c.rbuf, (*c.rbuf)[c.r:c.w])
		c.r = 0
	case c.w == len(*c.rbuf):
		// Only a read buffer fills up this way: a long-line buffer full of
		// a line is over-long, which readLine handles before reading.
		long := c.srv.longBuf()
		c.w = copy(*long, c.input())
		readBufs.Put(c.rbuf)
		c.rbuf, c.rlong = long, true
	}
}

// readRaw is the read loop's syscall.RawConn callback. It reads the socket
// into the held read buffer, taking one if none is held, and reports true
// with the bytes read, or with the end of the input in rerr. When the
// socket has nothing to read yet it reports false, so that the runtime
// parks the loop until the socket is readable; before that, parkReadBuf
// trims what the loop holds to the line it has begun.
//
// A read that returns fewer bytes than asked for does not prove the socket
// drained, so the loop reads again, until EAGAIN, before it waits: the
// client's close (or a reset) read together with its last bytes raises no
// further readiness on the runtime's edge-triggered poller, and each
// RawConn.Read forgets readiness noted before it began (internal/poll's
// prepareRead), so a wait in place of that read could sleep until the idle
// deadline with input, or the end of it, waiting.
func (c *conn) readRaw(fd uintptr) bool {
	c.holdReadBuf()
	n, wouldBlock, err := readFD(fd, (*c.rbuf)[c.w:])
	switch {
	case wouldBlock:
		c.parkReadBuf()
		return false
	case err != nil:
		c.rerr = err
	case n == 0:
		c.rerr = io.EOF
	}
	c.w += n
	return true
}

// parkReadBuf hands back what the loop need not hold while it waits for
// input: the read buffer when it holds no input, or the long-line buffer
// when the input left fits a read buffer.
func (c *conn) parkReadBuf() {
	switch {
	case c.r == c.w:
		c.releaseReadBuf()
	case c.rlong && c.w-c.r < readBufSize:
		buf := readBufs.Get().(*[]byte)
		n := copy(*buf, c.input())
		c.srv.longBufs.Put(c.rbuf)
		c.rbuf, c.rlong, c.r, c.w = buf, false, 0, n
	}
}

// holdReadBuf takes a read buffer unless one is held.
func (c *conn) holdReadBuf() {
	if c.rbuf == nil {
		c.rbuf, c.rlong, c.r, c.w = readBufs.Get().(*[]byte), false, 0, 0
	}
}

// releaseReadBuf hands back the read buffer, dropping any input in it.
func (c *conn) releaseReadBuf() {
	if c.rbuf == nil {
		return
	}
	if c.rlong {
		c.srv.longBufs.Put(c.rbuf)
	} else {
		readBufs.Put(c.rbuf)
	}
	c.rbuf, c.rlong, c.r, c.w = nil, false, 0, 0
}

// longBuf returns a buffer of MaxLineBytes+2 bytes from s.longBufs.
func (s *Server) longBuf() *[]byte {
	if b, ok := s.longBufs.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, s.maxLineBytes+2)
	return &b
}

// serveLine answers a malformed line E900 (E906 once shutting down, like
// every line) and hands a well-formed one to dispatch. Its answers are
// buffered: the read loop flushes.
func (c *conn) serveLine(line []byte) {
	req, err := protocol.ParseRequest(line)
	if err == nil {
		c.dispatch(req)
		return
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
}

// deadlineSlack is how much later than its timeout a connection's deadline
// may fire. A deadline is moved only when it would come too early, and then
// this much later than needed, so that a busy connection updates its
// runtime timer about once per slack rather than for every line and every
// answer. Short timeouts (in tests, say) get a small share of themselves,
// which keeps them precise.
func deadlineSlack(timeout time.Duration) time.Duration {
	return min(time.Second, timeout/8)
}

// handOffAfter is how long a read loop that may hand off (conn.handOff)
// waits for input before it hands the connection to resume: between this
// and twice this after it began to wait. A second (deadlineSlack: an
// eighth of a shorter idle timeout), against idle timeouts of minutes: a
// connection whose lines come more often keeps its goroutine, since a
// hand-off costs tens of microseconds (a new goroutine, a peek at the
// socket, the stack growing again for the next line; docs/BENCHMARKS.md,
// "Idle memory against redis"), while one that goes quiet soon gives up
// the stack it grew serving.
func handOffAfter(idleTimeout time.Duration) time.Duration {
	return deadlineSlack(idleTimeout)
}

// armReadDeadline makes the idle deadline for the next read at least
// IdleTimeout after now, unless Shutdown has stopped reading: its past
// deadline must not be replaced. So a connection is closed between
// IdleTimeout and IdleTimeout plus deadlineSlack after its last complete
// line: never before. A read loop that may hand off also gets a hand-off
// deadline, at least handOffAfter after now and moved by as much again
// when it would come too early; the socket's deadline is the earlier of
// the two, and waitEnded tells them apart.
func (c *conn) armReadDeadline(now time.Time) {
	moved := false
	if due := now.Add(c.srv.idleTimeout); due.After(c.rdl) {
		c.rdl = due.Add(deadlineSlack(c.srv.idleTimeout))
		moved = true
	}
	if c.handOff {
		h := handOffAfter(c.srv.idleTimeout)
		if due := now.Add(h); due.After(c.hdl) {
			c.hdl = due.Add(h)
			moved = true
		}
	}
	if !moved {
		return
	}
	dl := c.rdl
	if !c.hdl.IsZero() && c.hdl.Before(dl) {
		dl = c.hdl
	}
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.stopped {
		_ = c.nc.SetReadDeadline(dl)
	}
}

// errHandOff ends a read loop that has waited handOffAfter for input
// holding none: resume waits for the rest of the idle timeout.
var errHandOff = errors.New("relay: wait for input handed off")

// waitEnded decides what a wait for input that ended with err means. When
// the hand-off deadline passed (not the idle deadline, nor Shutdown's), the
// socket's deadline becomes the idle deadline, and the read loop hands off
// (errHandOff) if it holds no input, else waits on (nil). Any other err is
// returned as it is.
func (c *conn) waitEnded(err error) error {
	if c.hdl.IsZero() || !errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(c.rdl) {
		return err
	}
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.stopped {
		return err
	}
	c.hdl = time.Time{}
	_ = c.nc.SetReadDeadline(c.rdl)
	if c.r == c.w {
		return errHandOff
	}
	return nil
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
	case err == errHandOff:
		return endHandOff
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
	if c.wbuf != nil && len(*c.wbuf) > cap(*c.wbuf)-maxAnswerLen {
		// The buffer may not have room for this answer: send what it holds.
		if err := c.writeOutLocked(time.Now()); err != nil {
			c.failLocked(err)
			return
		}
	}
	if c.wbuf == nil {
		c.wbuf = writeBufs.Get().(*[]byte)
	}
	*c.wbuf = protocol.AppendResponse(*c.wbuf, txid, code, msg)
	if flush {
		if err := c.writeOutLocked(time.Now()); err != nil {
			c.failLocked(err)
		}
	}
}

// flush sends the buffered answers to the client.
func (c *conn) flush() {
	c.flushAt(time.Now())
}

// flushAt is flush for a caller that has just read the clock: now.
func (c *conn) flushAt(now time.Time) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil || c.wbuf == nil {
		return
	}
	if err := c.writeOutLocked(now); err != nil {
		c.failLocked(err)
	}
}

// writeOutLocked writes the buffered answers, at now, and hands the buffer
// back, whether or not the write succeeds. The write deadline is set only
// here, when answers reach the network, because only then can the client
// make the hub wait. Like the idle deadline it moves only when it would
// give the write less than WriteTimeout, and then by deadlineSlack more, so
// a write that the client blocks fails between WriteTimeout and
// WriteTimeout plus the slack after it began.
func (c *conn) writeOutLocked(now time.Time) error {
	b := *c.wbuf
	var err error
	if len(b) > 0 {
		if wt := c.srv.writeTimeout; c.wdl.Sub(now) < wt {
			c.wdl = now.Add(wt + deadlineSlack(wt))
			_ = c.nc.SetWriteDeadline(c.wdl)
		}
		var n int
		n, err = c.nc.Write(b)
		if err == nil && n < len(b) {
			err = io.ErrShortWrite
		}
	}
	if cap(b) == writeBufSize {
		*c.wbuf = b[:0]
		writeBufs.Put(c.wbuf)
	}
	c.wbuf = nil
	return err
}

// failLocked records a failed write and disconnects the client: it is gone,
// or did not read within WriteTimeout. Closing ends the read loop too; calls
// in flight go on, are recorded by their breakers, and their answers are
// dropped.
func (c *conn) failLocked(err error) {
	c.werr = err
	c.nc.Close()
	c.logAddrs(c.srv.log.Debug().Err(err)).Msg("client write failed; connection closed")
}
