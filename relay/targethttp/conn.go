package targethttp

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// DialFunc opens a connection to a target; ctx bounds the dial.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Conns dials the connections of a hub's targets and keeps the set of those
// open, so that Abort can cut the calls still out: a call blocked reading an
// answer has no context to cancel. It is safe for concurrent use.
type Conns struct {
	abort       context.Context // done once Abort has begun, before the connections close
	cancel      context.CancelCauseFunc
	dialContext DialFunc
	mu          sync.Mutex
	open        map[*targetConn]struct{} // guarded by mu; nil once aborted
	late        sync.WaitGroup           // the late readers (readLate); added to under mu
}

// NewConns returns a Conns that dials with dial: nil means TCP with
// keep-alive probes.
func NewConns(dial DialFunc) *Conns {
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	abort, cancel := context.WithCancelCause(context.Background())
	return &Conns{abort: abort, cancel: cancel, dialContext: dial, open: make(map[*targetConn]struct{})}
}

// Abort gives up on every call: dials in progress stop, every connection is
// closed, which ends the reads and writes calls are blocked in, and each
// such call answers E901 "no answer before shutdown" (the target may have
// processed it). No connection is opened afterwards.
func (tc *Conns) Abort() {
	tc.cancel(ErrAborted)
	tc.mu.Lock()
	open := tc.open
	tc.open = nil
	tc.mu.Unlock()
	for c := range open {
		c.raw.Close()
	}
}

// dial connects to addr before deadline (and before Abort) and tracks the
// connection.
func (tc *Conns) dial(addr string, deadline time.Time) (*targetConn, error) {
	ctx, cancel := context.WithDeadline(tc.abort, deadline)
	defer cancel()
	nc, err := tc.dialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &targetConn{Conn: nc, raw: nc, set: tc}
	if sc, ok := nc.(syscall.Conn); ok && idleCheckSupported {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.peek = c.peekIdle
		}
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.open == nil {
		nc.Close()
		return nil, ErrAborted
	}
	tc.open[c] = struct{}{}
	return c, nil
}

// targetConn is one connection to a target, and the record of the call it
// carries: one call at a time holds it (it is out of the pool meanwhile),
// resets the record when it starts, and reads it when it ends, before
// handing the connection back. The record counts the request bytes
// written and the answer bytes read through the connection (for https,
// those of the request and answer, not of TLS), which is how the call
// knows whether the target may have processed it. Close may run at any
// time (Conns.Abort).
type targetConn struct {
	net.Conn          // what the call writes and reads: raw, or TLS over raw
	raw      net.Conn // the socket
	set      *Conns

	// The idle check (stale): nil rc means none, for a connection that is
	// not a socket.
	rc       syscall.RawConn
	peek     func(fd uintptr) // c.peekIdle, bound once so that a check does not allocate
	peekBuf  [1]byte
	readable bool // set by peekIdle

	idleFrom time.Time // when it went back to the pool
	req      []byte    // the request last written, its buffer kept for the next

	progress // of the call it carries
}

// progress is how far the call on a connection got.
type progress struct {
	sent        int   // request bytes written
	recv        int   // answer bytes read
	writeFailed bool  // a write of the request failed: it may have gone out in part
	readErr     error // the last error a read returned; the answer's parser hides it (callError)
}

// stage returns how far a call that failed got, given its progress.
func (p progress) stage() Stage {
	switch {
	case p.recv > 0:
		return AnswerPartlyRead
	case p.sent == 0:
		return NotSent
	case p.writeFailed:
		return PartlySent
	default:
		return Sent
	}
}

func (c *targetConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.sent += n
	if err != nil {
		c.writeFailed = true
	}
	return n, err
}

func (c *targetConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.recv += n
	if err != nil {
		c.readErr = err
	}
	return n, err
}

// callError returns the error that ended a call, given err, the one the
// exchange failed with. fasthttp's answer parser reports any failure to
// read an answer's first byte as io.EOF, so a target that reset the
// connection before answering would read as one that closed it; the
// connection's own read error tells them apart.
func (p progress) callError(err error) error {
	if p.recv == 0 && errors.Is(err, io.EOF) && errors.Is(p.readErr, syscall.ECONNRESET) {
		return p.readErr
	}
	return err
}

func (c *targetConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.open, c)
	c.set.mu.Unlock()
	return c.Conn.Close()
}

// stale reports whether a connection taken from the pool cannot carry a
// request: the target closed or reset it while it was idle, or sent bytes
// nobody asked for. HTTP servers close idle kept-alive connections (Node.js
// after 5 s), and a target that restarts closes them all at once, however
// recently used; a request written into one would be in doubt although the
// target never saw it. So the check is made before every reuse. It is one
// non-blocking peek at the socket (below TLS, whose own messages then count
// as something to read: a healthy connection wrongly given up costs a dial,
// never a transaction), through RawConn.Control, which ignores the
// deadline the last call left on the connection.
func (c *targetConn) stale() bool {
	if c.rc == nil {
		return false
	}
	err := c.rc.Control(c.peek)
	return err != nil || c.readable
}

// pool holds a Client's idle connections. The last one handed back is
// taken first: the most recently used is the least likely to have been
// closed by the target, and the others age out. A connection idle for
// idleTimeout is closed by the reaper, a timer that runs only while the
// pool holds connections. It never refuses or queues a call: the target's
// bulkhead bounds how many connections are in use. It is safe for
// concurrent use.
type pool struct {
	idleTimeout time.Duration
	reaper      *time.Timer // runs reap
	mu          sync.Mutex
	idle        []*targetConn // guarded by mu; in the order they came back
	reaping     bool          // guarded by mu: the reaper is set
}

// newPool returns a pool for up to maxInflight connections in use at once
// (the bulkhead's bound), and so as many idle.
func newPool(idleTimeout time.Duration, maxInflight int) *pool {
	p := &pool{idleTimeout: idleTimeout, idle: make([]*targetConn, 0, maxInflight)}
	p.reaper = time.AfterFunc(time.Hour, p.reap)
	p.reaper.Stop()
	return p
}

// get returns the connection last handed back, nil when there is none.
func (p *pool) get() *targetConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	c := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	return c
}

// put hands c back, idle from now.
func (p *pool) put(c *targetConn) {
	c.idleFrom = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idle = append(p.idle, c)
	if !p.reaping {
		p.reaping = true
		p.reaper.Reset(p.idleTimeout)
	}
}

// reap closes the connections idle for idleTimeout, and sets the reaper
// again for the oldest of the others.
func (p *pool) reap() {
	now := time.Now()
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleFrom) >= p.idleTimeout {
		n++
	}
	expired := append([]*targetConn(nil), p.idle[:n]...)
	m := copy(p.idle, p.idle[n:])
	clear(p.idle[m:])
	p.idle = p.idle[:m]
	if m > 0 {
		p.reaper.Reset(p.idleTimeout - now.Sub(p.idle[0].idleFrom))
	} else {
		p.reaping = false
	}
	p.mu.Unlock()
	for _, c := range expired {
		c.Close()
	}
}

// closeIdle closes every idle connection.
func (p *pool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}
