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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/internal/sockio"
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
	rc         syscall.RawConn       // nc's descriptor, to wait for input without a buffer; nil when unsupported
	rawRead    func(fd uintptr) bool // c.readRaw, bound once (readCallback) so that a read does not allocate
	onReadable func(fd uintptr) bool // c.serveReadable, bound once likewise (serveCallback)
	fd         uintptr               // nc's descriptor while serveReadable runs
	rbuf       *[]byte               // the read buffer; nil while no input is held
	r, w       int                   // the input not yet used is (*rbuf)[r:w]
	scanned    int                   // the first scanned bytes of the input hold no '\n'
	rerr       error                 // why the last read ended the input, reported once the input before it is used
	hint       *retryHint            // what follows the TXID in an E904 answer, kept for the next; allocated for the first
	long       *longTxID             // TXID of an over-long line, kept while its rest is discarded; allocated for the first
	armedAt    time.Time             // when armReadDeadline last ran: the idle deadline is IdleTimeout after it
	run        time.Time             // the breakers' clock for the lines handled since the loop last waited or an answer was written (Breaker.AdmitIn); zero until a breaker reads it
	rdl        time.Time             // the read deadline last set
	seat       *laneSeat             // the connection's place in the refusal lane; nil until it is first refusal-heavy

	wmu  sync.Mutex
	wbuf *[]byte   // guarded by wmu: answers not yet written, from writeBufs; nil when there are none
	werr error     // guarded by wmu: why answers can no longer be written
	wdl  time.Time // guarded by wmu: the write deadline last set

	// A socket's answers are written through rc (writeRaw), or, by the read
	// loop inside serveReadable, on the descriptor it holds (flushSession).
	rawWrite func(fd uintptr) bool // guarded by wmu: c.writeRaw, bound once (writeCallback) so that a write does not allocate
	woutErr  error                 // guarded by wmu: why writeRaw stopped short

	writes atomic.Uint32 // writes of answers so far: a run (see run) ends at each

	dmu  sync.Mutex
	halt atomic.Bool // stopped or broken: the read loop reads no more

	calls    sync.WaitGroup // this connection's calls in flight
	readDone chan struct{}  // closed when the read loop has ended

	runWrites uint32 // owned by the read loop: writes when run began

	// The flags, together so that they share a word with runWrites: an
	// idle connection costs its conn (docs/BENCHMARKS.md, "Idle memory").
	inSession  bool    // owned by the read loop: serveReadable is running: fill reads fd itself and may ask to wait
	waitNext   bool    // owned by the read loop: the last read took all the input there was: the next fill waits instead of reading
	end        readEnd // owned by the read loop: why serveReadable ended the loop, when it did
	rlong      bool    // owned by the read loop: rbuf is from srv.longBufs, else from readBufs
	discarding bool    // owned by the read loop: the input is the rest of an over-long line, dropped up to its '\n'
	handOff    bool    // owned by the read loop: hand a long wait for input to a new goroutine (serve sets it)
	stopped    bool    // guarded by dmu: Shutdown told the read loop to stop
	broken     bool    // guarded by dmu: a write failed; the read loop is to stop and the connection close
	tlsIdle    bool    // set by the TLS handshake: wait for input with readFirstByte, holding no read buffer
	first      [1]byte // owned by the read loop: readFirstByte's byte
	refusals   uint8   // owned by the read loop: lines refused in a row, up to laneAfter: refusal-heavy at laneAfter
}

// connPeer is what a connection learnt about its client beyond the
// socket: set before its read loop starts, read-only afterwards. Most
// connections have none, so it is kept apart from conn.
type connPeer struct {
	proxy      netip.AddrPort // the load balancer that sent the PROXY header; zero when none
	identities []string       // the client certificate's identities (clientIdentities); nil without one
}

// retryHint is what follows the TXID in a connection's E904 answers
// (protocol.AppendResponseTail) and the retry hint it holds, in seconds
// (0: none yet, -1: held open): it changes once a second at most, so a
// run of E904s builds it once. Owned by the read loop.
type retryHint struct {
	tail []byte
	secs int64
}

// longTxID is the TXID of an over-long line, kept while the rest of the
// line is discarded. Owned by the read loop.
type longTxID struct {
	b [protocol.MaxTxIDLen]byte
	n uint8
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
	if sc, ok := nc.(syscall.Conn); ok && sockio.Supported {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
		}
	}
	return c
}

// readCallback, serveCallback and writeCallback return the connection's
// RawConn callbacks, bound the first time each is needed, not by newConn: a
// bound method is an allocation, and a connection that never sends a line
// (an idle one) needs none of them (docs/BENCHMARKS.md, "Idle memory").
// The first two are the read loop's; writeCallback is called under wmu.
func (c *conn) readCallback() func(fd uintptr) bool {
	if c.rawRead == nil {
		c.rawRead = c.readRaw
	}
	return c.rawRead
}

func (c *conn) serveCallback() func(fd uintptr) bool {
	if c.onReadable == nil {
		c.onReadable = c.serveReadable
	}
	return c.onReadable
}

func (c *conn) writeCallback() func(fd uintptr) bool {
	if c.rawWrite == nil {
		c.rawWrite = c.writeRaw
	}
	return c.rawWrite
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
		c.ended(endTLS)
		return
	}
	if c.rc == nil {
		c.ended(c.readLoop())
		return
	}
	c.handOff = true
	if c.rbuf != nil {
		// begin read input after a PROXY header: serve it first.
		c.ended(c.readLoop())
		return
	}
	c.armReadDeadline(time.Now())
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
// idle deadline, Shutdown's, a failed write's or a close ends the
// connection at once.
func (c *conn) readWhenReadable() {
	if err := c.rc.Read(sockio.Readable); err != nil {
		c.ended(c.readEndFor(err))
		return
	}
	c.ended(c.readLoop())
}

// ended finishes the connection once its read loop has ended: the wait
// for its calls in flight to answer, the final flush and the close. When
// the read loop handed off instead, it starts resume on a new goroutine,
// which the Server's WaitGroup owns like the first.
func (c *conn) ended(end readEnd) {
	if end == endHandOff {
		c.srv.wg.Go(c.resume)
		return
	}
	close(c.readDone)
	if c.writeFailed() {
		c.nc.Close() // now, not after the calls in flight: see failLocked
	}
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
//
// On a socket read through syscall.RawConn the loop runs inside one
// RawConn.Read (serveReadable) for as long as the poller's deadlines let
// it, so that a read which took all the input there was can be followed by
// a wait rather than by a read that finds nothing (see fillSession).
//
// A refusal-heavy connection reads in its turn in the refusal lane while
// the lane is in force (see refusalLane): once its socket is readable it
// leaves the callback to wait for a turn (laneRead), reads once in the
// turn and answers every line of that read, and leaves the callback again
// after the flush to end the turn (serveInput); laneStep takes both steps,
// and the loop starts a new RawConn.Read.
func (c *conn) readLoop() readEnd {
	defer c.releaseReadBuf()
	defer c.leaveLane()
	if c.armedAt.IsZero() {
		// Else serve armed it, or this loop follows a hand-off, which
		// leaves the idle measure running.
		c.armReadDeadline(time.Now())
	}
	if c.rc == nil {
		end, _ := c.serveInput()
		return end
	}
	for {
		err := c.rc.Read(c.serveCallback())
		if err == nil {
			if !c.seat.leftFor() {
				return c.end
			}
			c.laneStep()
			continue
		}
		// The wait ended early: a deadline passed, or the connection was
		// closed. The check deadline of a wait after a read that may have
		// left the end of the input unseen is no reason to stop, nor is the
		// hand-off deadline, which ends the loop only for resume to wait.
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if goOn, handOff := c.rearmAfterCheck(); handOff {
				return endHandOff
			} else if goOn {
				continue
			}
		}
		c.rerr = err
		end, _ := c.serveInput()
		return end
	}
}

// serveReadable is the read loop's RawConn.Read callback: it serves the
// input until it must wait for more, reporting false so that the runtime
// parks the loop until the socket is readable, or until the connection's
// end, reporting true with the end in c.end, or until the lane needs a
// step outside the callback, reporting true with the seat's toLane set.
func (c *conn) serveReadable(fd uintptr) bool {
	c.fd, c.inSession = fd, true
	end, done := c.serveInput()
	c.inSession = false
	c.end = end
	return done
}

// serveInput reads and handles lines until the connection ends (done, with
// why), or, inside serveReadable only (where alone turns are taken), until
// the loop must wait for input, or until it leaves the callback for the
// refusal lane (done, with toLane set: see readLoop).
func (c *conn) serveInput() (end readEnd, done bool) {
	for {
		line, tooLong, err := c.readLine()
		if err == errWait {
			return 0, c.seat.leftFor()
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
			c.flush()
			return c.readEndFor(err), true
		}
		if !c.completeLineBuffered() {
			if c.inSession {
				now := c.batchNow()
				c.flushSession()
				c.armReadDeadline(now)
			} else {
				now := time.Now()
				c.flushAt(now)
				c.armReadDeadline(now)
			}
			c.run = time.Time{} // the loop may wait before its next line
			if c.seat.hasTurn() {
				// The lines of the turn's read are answered: the turn
				// ends, outside the callback (laneStep).
				c.seat.toLane = true
				return 0, true
			}
		}
	}
}

// batchNow returns, inside serveReadable, the clock reading that restarts
// the idle measure once a batch of lines is answered: the run's reading
// (see run) when the breakers read the system clock into it and no answer
// has been written since, else a fresh one. Each read of the loop follows
// the flush that ends the run before it, so a run's reading is taken after
// the read that brought its lines: an idle measure armed at it starts after
// the last complete line, as armReadDeadline requires, and a batch of
// refusals costs one clock reading, not two. A write since may have waited
// for the client (see serveLine), and an injected clock (Config.Clock) is
// not the system's: then the clock is read.
func (c *conn) batchNow() time.Time {
	if c.run.IsZero() || c.srv.clock != nil || c.writes.Load() != c.runWrites {
		return time.Now()
	}
	return c.run
}

// errWait is readLine's answer inside serveReadable when it has no complete
// line and must wait for input: the input is kept, and the next readLine,
// after the wait, goes on where this one stopped.
var errWait = errors.New("relay: wait for input")

// readLine returns the next line without its "\n" or "\r\n"; it is valid
// until the next readLine. For a line longer than MaxLineBytes it returns
// tooLong, with line holding the line's TXID when its start had a valid one
// (else nil), after discarding the rest of the line. err is io.EOF with the
// last, unterminated line of a client that closed its side (which is still
// served), or the read error that ends the connection (then any partial
// line is dropped), or errWait (see there).
//
// A line is over-long once MaxLineBytes+2 bytes (room for its "\r\n") have
// come without a "\n", so the hub never holds more of a line than that; the
// TXID is read from those first bytes.
func (c *conn) readLine() (line []byte, tooLong bool, err error) {
	if c.discarding {
		return c.discardLine()
	}
	limit := c.srv.maxLineBytes + 2
	for {
		in := c.input()
		if i := bytes.IndexByte(in[c.scanned:], '\n'); i >= 0 {
			i += c.scanned
			c.r += i + 1
			c.scanned = 0
			line, tooLong = c.checkLine(in[:i])
			return line, tooLong, nil
		}
		c.scanned = len(in)
		if len(in) >= limit {
			c.scanned = 0
			return c.discardLine()
		}
		if c.rerr != nil {
			err, c.rerr = c.rerr, nil
			c.r, c.scanned = c.w, 0
			if err != io.EOF {
				return nil, false, err
			}
			line, tooLong = c.checkLine(in)
			return line, tooLong, io.EOF
		}
		if c.fill() {
			return nil, false, errWait
		}
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
// returns as readLine does; after errWait, readLine comes back here.
func (c *conn) discardLine() (txid []byte, tooLong bool, err error) {
	if !c.discarding {
		if c.long == nil {
			c.long = new(longTxID)
		}
		c.long.n = uint8(copy(c.long.b[:], protocol.LeadingTxID(c.input()[:c.srv.maxLineBytes+2])))
		c.discarding = true
	}
	for {
		if i := bytes.IndexByte(c.input(), '\n'); i >= 0 {
			c.r += i + 1
			c.discarding = false
			return c.long.b[:c.long.n], true, nil
		}
		c.r = c.w
		if c.rerr != nil {
			err, c.rerr = c.rerr, nil
			c.discarding = false
			if err != io.EOF {
				return nil, false, err
			}
			return c.long.b[:c.long.n], true, io.EOF
		}
		if c.fill() {
			return nil, false, errWait
		}
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
// when they fill a read buffer. Inside serveReadable it reports wait when
// the loop is to wait for input instead (fillSession).
func (c *conn) fill() (wait bool) {
	c.makeRoom()
	if c.inSession {
		return c.fillSession()
	}
	if c.rc != nil {
		if err := c.rc.Read(c.readCallback()); err != nil {
			c.rerr = err // the wait ended: deadline passed, or connection closed
		}
		return false
	}
	if c.tlsIdle {
		c.parkReadBuf()
		if c.rbuf == nil {
			c.readFirstByte()
			return false
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
			return false
		}
	}
	c.rerr = io.ErrNoProgress
	return false
}

// fillSession is fill inside serveReadable: it reads the socket once, or
// reports wait when the loop is to wait for input, having handed back what
// the loop need not hold meanwhile and set the deadline of the wait. It
// waits when the read found nothing (EAGAIN), when the read before it took
// all the input there was (it left room in the buffer), and once reading
// has stopped (Shutdown, or a failed write: the wait ends at once).
//
// A wait after a read that took all the input is what saves a read per
// wake-up: within one RawConn.Read the runtime's poller keeps readiness
// raised after the call began, so input that arrives after the read, while
// its lines are handled, ends the wait at once. What it does not raise
// again is the end of the input (the client's FIN, or a reset) when that
// came together with the bytes read, one edge-triggered event covering
// both. Such a wait therefore has a deadline endCheckAfter away; when it
// passes, readLoop starts a new RawConn.Read, which reads again and finds
// the end if it came. A wait after a read that found nothing needs only
// the idle deadline: nothing, not even an end, was waiting unread.
//
// A refusal-heavy connection reads only in its turn in the refusal lane
// (laneRead): it reports wait, with the seat's toLane set, when the loop
// is to leave serveReadable for a step in the lane instead.
func (c *conn) fillSession() (wait bool) {
	if c.turnSpent() {
		return true
	}
	if c.waitNext || c.halt.Load() {
		c.waitNext = false
		c.parkReadBuf()
		c.armEndCheckDeadline()
		return true
	}
	if c.laneRead() {
		return true
	}
	c.holdReadBuf()
	w, room := c.w, len(*c.rbuf)-c.w
	if !c.readRaw(c.fd) {
		if c.turnSpent() {
			// Nothing to read after all: the turn ends rather than waits.
			return true
		}
		c.armIdleDeadline()
		return true
	}
	c.waitNext = c.w-w < room
	return false
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
// deadline with input, or the end of it, waiting. (serveReadable, which
// keeps one RawConn.Read across its waits, need not: see fillSession.)
func (c *conn) readRaw(fd uintptr) bool {
	c.holdReadBuf()
	n, wouldBlock, err := sockio.Read(fd, (*c.rbuf)[c.w:])
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
	c.rbuf, c.rlong, c.r, c.w, c.scanned = nil, false, 0, 0, 0
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
// buffered: the read loop flushes. It reports whether the line was
// admitted: handed to a call, which answers it.
func (c *conn) serveLine(line []byte) (admitted bool) {
	if w := c.writes.Load(); w != c.runWrites {
		// A write may have waited for the client: the run's clock reading
		// is no longer now.
		c.run, c.runWrites = time.Time{}, w
	}
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

// deadlineSlack is how much later than its timeout a connection's deadline
// may fire. A deadline is moved only when it would come too early, and then
// this much later than needed, so that a busy connection updates its
// runtime timer about once per slack rather than for every line and every
// answer. Short timeouts (in tests, say) get a small share of themselves,
// which keeps them precise.
func deadlineSlack(timeout time.Duration) time.Duration {
	return min(time.Second, timeout/8)
}

// armReadDeadline restarts the idle measure at now: the connection is
// closed between IdleTimeout and IdleTimeout plus deadlineSlack after its
// last complete line, never before. Outside serveReadable it makes the
// deadline for the next read at least IdleTimeout after now; inside, the
// deadline is set by fillSession when the loop is about to wait, since
// only then is it known which deadline the wait needs.
func (c *conn) armReadDeadline(now time.Time) {
	c.armedAt = now
	if c.inSession {
		return
	}
	if due := now.Add(c.srv.idleTimeout); due.After(c.rdl) {
		c.setReadDeadline(due.Add(deadlineSlack(c.srv.idleTimeout)))
	}
}

// armIdleDeadline gives a wait inside serveReadable the idle deadline: no
// earlier than IdleTimeout after armedAt. A wait that may end in a hand-off
// (mayHandOff) gets the hand-off deadline instead, between handOffAfter
// and twice that after armedAt, moved only when it leaves that span: a
// busy connection moves it once per handOffAfter at most, as it does the
// idle one.
func (c *conn) armIdleDeadline() {
	if c.mayHandOff() {
		h := handOffAfter(c.srv.idleTimeout)
		if due := c.armedAt.Add(h); c.rdl.Before(due) || c.rdl.After(due.Add(h)) {
			c.setReadDeadline(due.Add(h))
		}
		return
	}
	if due := c.armedAt.Add(c.srv.idleTimeout); c.rdl.Before(due) {
		c.setReadDeadline(due.Add(deadlineSlack(c.srv.idleTimeout)))
	}
}

// handOffAfter is how long a read loop that may hand off waits for input
// before it hands the connection to resume: between this and twice this
// after it began to wait. A second (deadlineSlack: an eighth of a shorter
// idle timeout), against idle timeouts of minutes: a connection whose
// lines come more often keeps its goroutine, since a hand-off costs tens
// of microseconds (a new goroutine, a peek at the socket, the stack
// growing again for the next line; docs/BENCHMARKS.md, "Idle memory
// against redis"), while one that goes quiet soon gives up the stack it
// grew serving.
func handOffAfter(idleTimeout time.Duration) time.Duration {
	return deadlineSlack(idleTimeout)
}

// mayHandOff reports whether the read loop may hand the connection off
// while it waits: serve allowed it (a socket), and no input is held.
func (c *conn) mayHandOff() bool {
	return c.handOff && c.rbuf == nil
}

// endCheckAfter bounds a wait that may have an end of input unseen before
// it (fillSession): a client that sent its last line and its FIN together
// sees the hub close its side at most this long after its last answer. A
// busy connection pays for the check (a deadline set and passed, a read)
// once per endCheckAfter, not per line.
const endCheckAfter = 20 * time.Millisecond

// armEndCheckDeadline gives a wait inside serveReadable a deadline at most
// endCheckAfter away, unless the deadline set is that close already, and
// never later than the idle one. It runs before most waits of a busy
// connection, so it compares by Sub, which for two readings of the
// monotonic clock is a subtraction, where Add would build a Time.
func (c *conn) armEndCheckDeadline() {
	if c.rdl.Sub(c.armedAt) > endCheckAfter {
		c.setReadDeadline(time.Now().Add(min(endCheckAfter, c.srv.idleTimeout)))
	}
}

// rearmAfterCheck reports whether the deadline that ended a wait inside
// serveReadable was armEndCheckDeadline's or armIdleDeadline's hand-off
// deadline, and not the idle deadline's nor a stop; if so it sets the idle
// deadline again, so that the loop can go on reading (goOn), or, when the
// loop may hand off and has waited handOffAfter, so that resume can wait
// for the rest of the idle timeout (handOff). A loop that may hand off
// later goes on with the hand-off deadline (armIdleDeadline), so that a
// connection whose waits pass the end check does not move it twice.
func (c *conn) rearmAfterCheck() (goOn, handOff bool) {
	now := time.Now()
	due := c.armedAt.Add(c.srv.idleTimeout)
	if !now.Before(due) {
		return false, false
	}
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.stopped || c.broken {
		return false, false
	}
	c.rdl = due.Add(deadlineSlack(c.srv.idleTimeout))
	if c.mayHandOff() {
		h := handOffAfter(c.srv.idleTimeout)
		if at := c.armedAt.Add(h); now.Before(at) {
			c.rdl = at.Add(h)
		} else {
			handOff = true
		}
	}
	_ = c.nc.SetReadDeadline(c.rdl)
	return !handOff, handOff
}

// setReadDeadline sets the read deadline to t unless reading has stopped:
// the past deadline that stops it must not be replaced.
func (c *conn) setReadDeadline(t time.Time) {
	c.rdl = t
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if !c.stopped && !c.broken {
		_ = c.nc.SetReadDeadline(t)
	}
}

// stopReading makes the read loop stop once it has handled the complete
// lines already buffered (each answered E906 during shutdown).
func (c *conn) stopReading() { c.haltReading(false) }

// haltReading stops the read loop as stopReading says; broken says a failed
// write is why, and serve then closes the connection at once.
func (c *conn) haltReading(broken bool) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if broken {
		c.broken = true
	} else {
		c.stopped = true
	}
	c.halt.Store(true)
	_ = c.nc.SetReadDeadline(aLongTimeAgo)
}

// writeFailed reports whether a failed write stopped the read loop.
func (c *conn) writeFailed() bool {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	return c.broken
}

// readEndFor classifies the error that ended the read loop.
func (c *conn) readEndFor(err error) readEnd {
	switch {
	case err == io.EOF:
		return endEOF
	case errors.Is(err, os.ErrDeadlineExceeded):
		c.dmu.Lock()
		defer c.dmu.Unlock()
		switch {
		case c.broken:
			return endError
		case c.stopped:
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
	if !c.roomLocked() {
		return
	}
	*c.wbuf = protocol.AppendResponse(*c.wbuf, txid, code, msg)
	if flush {
		if err := c.writeOutLocked(time.Now()); err != nil {
			c.failLocked(err)
		}
	}
}

// answerTail is answer, buffered, for a request whose TXID ParseRequest
// accepted, with the rest of the line prebuilt by
// protocol.AppendResponseTail: a run of refusals is answered by copying.
func (c *conn) answerTail(txid, tail []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.roomLocked() {
		*c.wbuf = append(append(*c.wbuf, txid...), tail...)
	}
}

// roomLocked readies the write buffer for one answer of at most
// maxAnswerLen bytes, sending what it holds when it may not have room. It
// reports false when answers are dropped: a write has failed.
func (c *conn) roomLocked() bool {
	if c.werr != nil {
		return false
	}
	if c.wbuf != nil && len(*c.wbuf) > cap(*c.wbuf)-maxAnswerLen {
		if err := c.writeOutLocked(time.Now()); err != nil {
			c.failLocked(err)
			return false
		}
	}
	if c.wbuf == nil {
		c.wbuf = writeBufs.Get().(*[]byte)
	}
	return true
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

// flushSession is flush for the read loop inside serveReadable, which holds
// the socket's descriptor, c.fd: it writes the answers with write(2) on
// that descriptor itself (writeRaw), under wmu like every writer, and only
// when the socket cannot take them all at once goes through
// writeOutLocked's RawConn.Write, which sets the write deadline and waits
// for room. A write that the socket takes whole cannot make the hub wait,
// so it needs no write deadline (see writeOutLocked), and it spares the
// RawConn.Write around it (the descriptor's write lock, its poller
// preparation, the callback) and the clock reading for the deadline.
//
// Why the direct write is sound beside RawConn.Write (internal/poll,
// fd_unix.go and fd_mutex.go): RawConn.Read, which runs serveReadable,
// holds a reference to the descriptor (its read lock), so the descriptor
// is not closed, nor its number reused, until the callback returns; a
// Close meanwhile only marks it closing and waits for that reference. The
// descriptor's write lock orders writers within the runtime, but every
// writer of a connection's answers holds wmu first (answer, the calls'
// goroutines, finish), so wmu alone orders them, and no write of ours ever
// runs beside another. The write deadline and the poller's readiness
// concern only a writer that waits, and one that must wait here goes on
// through RawConn.Write, with the deadline set as before, after the direct
// write has moved the rest of the answers to the front of *c.wbuf.
func (c *conn) flushSession() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil || c.wbuf == nil {
		return
	}
	if err := c.writeOutLocked(time.Time{}); err != nil {
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
//
// A zero now is flushSession's: the read loop, inside serveReadable, first
// writes on its descriptor itself, and sets the write deadline, at a fresh
// clock reading, only when the socket cannot take every answer at once.
func (c *conn) writeOutLocked(now time.Time) error {
	b := *c.wbuf
	var err error
	if len(b) > 0 {
		c.writes.Add(1)
		if now.IsZero() {
			if c.writeRaw(c.fd) {
				err = c.woutErr
				c.woutErr = nil
				c.releaseWriteBufLocked(b)
				return err
			}
			now = time.Now()
		}
		if wt := c.srv.writeTimeout; c.wdl.Sub(now) < wt {
			c.wdl = now.Add(wt + deadlineSlack(wt))
			_ = c.nc.SetWriteDeadline(c.wdl)
		}
		if c.rc != nil {
			// writeRaw shortens *c.wbuf as it writes; b keeps the buffer
			// whole, for the pool.
			if err = c.rc.Write(c.writeCallback()); err == nil {
				err = c.woutErr
			}
			c.woutErr = nil
		} else {
			var n int
			n, err = c.nc.Write(b)
			if err == nil && n < len(b) {
				err = io.ErrShortWrite
			}
		}
	}
	c.releaseWriteBufLocked(b)
	return err
}

// releaseWriteBufLocked hands back the write buffer, whose whole slice is
// b, to writeBufs when it came from there.
func (c *conn) releaseWriteBufLocked(b []byte) {
	if cap(b) == writeBufSize {
		*c.wbuf = b[:0]
		writeBufs.Put(c.wbuf)
	}
	c.wbuf = nil
}

// writeRaw is writeOutLocked's syscall.RawConn callback for a socket: it
// writes what is left of *c.wbuf, reporting false, so that the runtime
// parks the writer until the socket is writable or the write deadline
// passes, when the socket's buffer is full. flushSession's write calls it
// directly first, on the descriptor the read loop holds.
func (c *conn) writeRaw(fd uintptr) bool {
	for out := *c.wbuf; len(out) > 0; out = *c.wbuf {
		n, wouldBlock, err := sockio.Write(fd, out)
		switch {
		case wouldBlock:
			return false
		case err != nil:
			c.woutErr = err
			return true
		case n == 0:
			c.woutErr = io.ErrShortWrite
			return true
		}
		*c.wbuf = out[n:]
	}
	return true
}

// failLocked records a failed write and disconnects the client: it is gone,
// or did not read within WriteTimeout. Calls in flight go on, are recorded
// by their breakers, and their answers are dropped. While the read loop
// runs, the connection is not closed here but stopped (haltReading)
// and closed by serve as soon as the loop has ended: a close waits for the
// descriptor's reads to return, and the loop may be the caller, or be
// waiting for wmu, inside its RawConn.Read.
func (c *conn) failLocked(err error) {
	c.werr = err
	select {
	case <-c.readDone:
		c.nc.Close()
	default:
		c.haltReading(true)
	}
	c.logAddrs(c.srv.log.Debug().Err(err)).Msg("client write failed; connection closed")
}
