// Package targethttp is the hub's HTTP side of a target: it posts one
// transaction to a target over a pool of kept-alive connections and
// classifies the outcome into a response code and message, as
// docs/PROTOCOL.md, "Target protocol", lays down. A request that may have
// reached the target is never sent again.
//
// Typical use:
//
//	conns := targethttp.NewConns(nil)
//	core, err := targethttp.New(targethttp.Config{
//		URL: "http://127.0.0.1:9201/tx", Timeout: 3 * time.Second, MaxInflight: 10, Conns: conns,
//	})
//	if err != nil {
//		return err
//	}
//	res := core.Call([]byte("T1"), []byte("BAL 1001"))
//	if res.Stage.InDoubt() {
//		// the target may have processed it: journal it
//	}
//	...
//	conns.Abort() // at shutdown: calls still out end E901 at once
package targethttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"

	"github.com/relayhub/relayhub/internal/sockio"
	"github.com/relayhub/relayhub/relay/protocol"
)

// maxAnswerBytes caps how much of a target's HTTP answer body the hub reads.
// A healthy answer is a small JSON object; anything larger is not the target
// protocol (E500), and the cap keeps a broken target from making the hub
// buffer without bound.
const maxAnswerBytes = 64 << 10

// ErrAborted is the cause that ends the calls still running when
// Conns.Abort gives up on them (a shutdown whose drain time has run out).
var ErrAborted = errors.New("targethttp: calls aborted: drain time over")

// Messages of answers made up about a call. Each failure the hub makes up
// ends with one of two suffixes: suffixNotSent when no byte of the request
// went out (the target cannot have processed it), suffixInDoubt when the
// request may have reached the target and its outcome is unknown.
const (
	suffixNotSent = "; not sent"
	suffixInDoubt = "; outcome unknown"

	msgTimeout        = "no answer within target timeout"
	msgAborted        = "no answer before shutdown"
	msgRefusedConn    = "target unreachable: connection refused"
	msgResetConn      = "target unreachable: connection reset"
	msgClosedEarly    = "target unreachable: connection closed before a full answer"
	msgUnreachable    = "target unreachable"
	msgTLSFailed      = "target unreachable: TLS handshake failed"
	msgAnswerTooLarge = "target answer too large"
	msgNotProtocol    = "target answer is not the target protocol"
	msgNotHTTP        = "target answer is not HTTP"
	msgBadTargetCode  = "target answered a code of unknown form"
)

// Stage is how far a call got: whether its request may have reached the
// target, and how much of the answer came back.
type Stage uint8

// The stages of a call, in the order a call goes through them.
const (
	// NotSent: no byte of the request was written to a connection to the
	// target (the dial failed, a kept-alive connection was found closed,
	// the TLS handshake failed, the hub gave up first). The target cannot
	// have processed it.
	NotSent Stage = iota
	// PartlySent: some bytes of the request were written, not all.
	PartlySent
	// Sent: the whole request was written, and no byte of an answer read.
	Sent
	// AnswerPartlyRead: some bytes of an answer were read, but it is
	// incomplete, not HTTP, over the cap, or not the target protocol.
	AnswerPartlyRead
	// Answered: a full answer in the target protocol was read (whatever
	// its code).
	Answered
)

// String returns the stage's name in the in-doubt journal
// ("request_sent", ...), or "not_sent" and "answered".
func (s Stage) String() string {
	switch s {
	case NotSent:
		return "not_sent"
	case PartlySent:
		return "request_partly_sent"
	case Sent:
		return "request_sent"
	case AnswerPartlyRead:
		return "answer_partly_read"
	case Answered:
		return "answered"
	default:
		return "unknown"
	}
}

// InDoubt reports whether a call that ended at this stage may have been
// processed by the target without the hub knowing its outcome: some of the
// request went out and no full answer in the target protocol came back.
func (s Stage) InDoubt() bool {
	return s == PartlySent || s == Sent || s == AnswerPartlyRead
}

// Result is the outcome of one Call. It is a plain value.
type Result struct {
	// Code and Msg are the answer the client gets; Msg is raw (the
	// response writer cleans and caps it).
	Code string
	Msg  []byte
	// Stage is how far the call got.
	Stage Stage
	// BytesSent is how many bytes of the request were written to the
	// target's connection (for https, before encryption).
	BytesSent int
	// Retried reports that the call was tried a second time because the
	// first try failed to connect (see Call).
	Retried bool
}

// Config configures a Client. It is a plain value.
type Config struct {
	// URL is where transactions are posted: the target's base URL + "/tx",
	// http or https, with a host.
	URL string
	// TLS configures the connections to an https URL: the CAs the target
	// is verified against, a client certificate, a server name. Nil means
	// the system's roots, no client certificate and the URL's host.
	TLS *tls.Config
	// Timeout bounds one call: connect, request, answer. Required.
	Timeout time.Duration
	// MaxInflight is the target's bulkhead size, which bounds its calls and
	// so its connections: the pool itself never refuses or queues a call.
	// Required.
	MaxInflight int
	// Conns dials and tracks the connections. Required; every target of a
	// hub shares one, so that one Abort cuts all their calls.
	Conns *Conns
	// IdleTimeout is how long a pooled connection may stay unused before
	// the Client closes it. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// OnDial, if set, is called once for each connection opened to the
	// target, after the connect and before the connection carries a
	// request (for https, before the TLS handshake). It runs in the
	// goroutine of the call that needed the connection, so it must be fast:
	// a counter's increment. Nil means none.
	OnDial func()
}

// Client is the HTTP side of one target: a pool of kept-alive connections
// to it (fasthttp's HostClient, whose calls write the request and read the
// answer in the calling goroutine, with pooled buffers and no allocation of
// their own), the timeout of one call and how long a connection may idle.
// It is safe for concurrent use: its fields are set once by New.
type Client struct {
	uri         *fasthttp.URI
	client      *fasthttp.HostClient
	tls         *tls.Config // for an https target: its connections' TLS; nil for http
	timeout     time.Duration
	idleTimeout time.Duration
	conns       *Conns
	onDial      func() // nil: none
}

// New returns the Client posting to cfg.URL. It fails on a URL that is not
// http or https with a host, on a missing Conns, Timeout or MaxInflight, and
// on a negative IdleTimeout.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("targethttp: URL %q: want http:// or https:// with a host", cfg.URL)
	}
	if cfg.Conns == nil || cfg.Timeout <= 0 || cfg.MaxInflight <= 0 {
		return nil, errors.New("targethttp: Config needs Conns, a Timeout and a MaxInflight")
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("targethttp: IdleTimeout must not be negative, got %s", cfg.IdleTimeout)
	}
	idleTimeout := cfg.IdleTimeout
	if idleTimeout == 0 {
		idleTimeout = DefaultIdleTimeout
	}
	uri := new(fasthttp.URI)
	if err := uri.Parse(nil, []byte(cfg.URL)); err != nil {
		return nil, fmt.Errorf("targethttp: URL %q: %w", cfg.URL, err)
	}
	isTLS := u.Scheme == "https"
	maxInflight := cfg.MaxInflight
	t := &Client{
		uri:         uri,
		conns:       cfg.Conns,
		onDial:      cfg.OnDial,
		timeout:     cfg.Timeout,
		idleTimeout: idleTimeout,
	}
	if isTLS {
		// The connections make their TLS themselves (see Client.dial), so
		// that they count the request's bytes rather than the handshake's.
		t.tls = &tls.Config{}
		if cfg.TLS != nil {
			t.tls = cfg.TLS.Clone()
		}
		if t.tls.ServerName == "" {
			t.tls.ServerName = u.Hostname()
		}
	}
	t.client = &fasthttp.HostClient{
		Addr:                     fasthttp.AddMissingPort(u.Host, isTLS),
		IsTLS:                    isTLS,
		DialTimeout:              t.dial,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxConns:                 math.MaxInt32,
		MaxIdleConnDuration:      idleTimeout,
		ConnPoolStrategy:         fasthttp.LIFO,
		// A healthy answer's headers are a few hundred bytes; the read
		// buffer bounds them, so a broken target cannot make the hub
		// buffer megabytes of them.
		ReadBufferSize:      maxAnswerBytes,
		MaxResponseBodySize: maxAnswerBytes,
		// Only a request that was never written is tried again: one
		// that met a kept-alive connection the target had already
		// closed (errStaleConn from Write; a held request's read
		// reports it as a close, and Client.do tries again instead,
		// within the same bound). Each such try discards that
		// connection, so a pool of them all stale still ends.
		MaxIdemponentCallAttempts: maxInflight + 1,
		RetryIfErr: func(_ *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) {
			return false, errors.Is(err, errStaleConn)
		},
	}
	return t, nil
}

// Timeout returns the bound on one call.
func (t *Client) Timeout() time.Duration { return t.timeout }

// IdleTimeout returns how long a pooled connection may stay unused.
func (t *Client) IdleTimeout() time.Duration { return t.idleTimeout }

// DefaultIdleTimeout is how long a pooled target connection may stay unused
// before the hub closes it, unless Config.IdleTimeout says otherwise: under
// the 5 s keep-alive timeout of common servers (Node.js's), so that the hub
// usually closes first rather than racing the target's close with a new
// request. A connection the target closed earlier is caught before reuse
// (targetConn's idle check) and, if never reused, released at this timeout.
const DefaultIdleTimeout = 4 * time.Second

// dial is the pool's dial function: Conns.dial, and OnDial for each
// connection opened. For an https target the connection carries TLS over
// the socket, its handshake made by the first write: the pool, seeing a
// connection that has a Handshake method, does not wrap it again.
func (t *Client) dial(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.conns.dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	if t.tls != nil {
		c.startTLS(t.tls)
	}
	if t.onDial != nil {
		t.onDial()
	}
	return c, nil
}

// Parts of every target request.
var (
	headerTxID      = []byte("X-Tx-Id")
	contentTypeText = []byte("text/plain; charset=utf-8")
)

// Call sends one transaction to the target and classifies the outcome into a
// response code and message (docs/PROTOCOL.md, "Target protocol"), with how
// far the call got. Only Conns.Abort cuts it short; nothing of the
// client's connection does: a client that goes away does not cancel a call
// that may already have reached the target.
//
// A request that may have reached the target is never sent again. It is
// tried again only when no byte of it was written: the call moves on to
// another connection when the one it took was closed by the target while
// idle (see targetConn and do), and Call tries once more when the connect
// itself was refused or reset, within what is left of the timeout.
// Redirects are not followed: a 307 would resend the body elsewhere.
//
// The message of a failure the hub makes up says which it was: it ends
// "; not sent" when the request never went out, "; outcome unknown" when
// the result's Stage is in doubt.
func (t *Client) Call(txid, payload []byte) Result {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetURI(t.uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentTypeBytes(contentTypeText)
	req.Header.SetCanonical(headerTxID, txid)
	req.SetBodyRaw(payload)

	start := time.Now()
	err := t.do(req, resp, start, t.timeout)
	retried := false
	if err != nil && connectFailed(resp, err) && t.conns.abort.Err() == nil {
		now := time.Now()
		if left := t.timeout - now.Sub(start); left > 0 {
			retried = true
			err = t.do(req, resp, now, left)
		}
	}
	if err != nil {
		stage, sent, writeErr := progressOf(resp)
		if writeErr != nil {
			// The HTTP client reports a failed write of a held request,
			// made by a read, as the connection closed.
			err = writeErr
		}
		code, m := classifyCallError(t.conns.abort, err)
		return Result{Code: code, Msg: withSuffix(m, stage), Stage: stage, BytesSent: sent, Retried: retried}
	}
	// decodeAnswer's message never aliases the body, which goes back to
	// the pool on return.
	code, msg, malformed := decodeAnswer(resp.StatusCode(), resp.Body())
	if malformed {
		// The whole request went out (the connection may already carry
		// another call, so its counts are not read here).
		return Result{Code: code, Msg: msg, Stage: AnswerPartlyRead,
			BytesSent: len(req.Header.Header()) + len(payload), Retried: retried}
	}
	return Result{Code: code, Msg: msg, Stage: Answered, Retried: retried}
}

// do makes one try of a call (see Call), bounded by timeout from start:
// the pool's DoTimeout, again on another connection each time
// the one it took was found stale by the read that was to write the
// request (targetConn.exchange), which wrote nothing. A stale connection
// found by Write the pool itself skips (RetryIfErr); one found by a read it
// would report as closed, the request in doubt, so do tries again, within
// the same bound on tries as the pool's own and what is left of the
// timeout; once no time is left, the call has timed out, as the pool's
// own tries end.
func (t *Client) do(req *fasthttp.Request, resp *fasthttp.Response, start time.Time, timeout time.Duration) error {
	err := t.client.DoTimeout(req, resp, timeout)
	for tries := 1; err != nil && foundStale(resp) && tries < t.client.MaxIdemponentCallAttempts; tries++ {
		left := timeout - time.Since(start)
		if left <= 0 {
			return fasthttp.ErrTimeout
		}
		err = t.client.DoTimeout(req, resp, left)
	}
	return err
}

// foundStale reports whether the last try of a call, whose answer is resp,
// took a connection that its idle check found stale before writing the
// request: nothing was written (see targetConn.exchange).
func foundStale(resp *fasthttp.Response) bool {
	a, ok := resp.LocalAddr().(*connAddr)
	return ok && a.conn.staleHeld && a.conn.sent == 0
}

// connectFailed reports whether a call that failed with err never had a
// connection to write on (the pool's try left no connection's address on
// resp) because the connect was refused or reset: a failure that is safe to
// try once more.
func connectFailed(resp *fasthttp.Response, err error) bool {
	return resp.LocalAddr() == nil &&
		(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET))
}

// progressOf returns how far the failed call whose answer is resp got, how
// many request bytes it wrote and why a write of it failed (nil: none
// did), from the counts of the connection its last try used. The pool
// records each try's connection on resp (its LocalAddr, which targetConn
// makes its own connAddr), and a connection whose call failed is closed,
// never reused, so its counts are this call's. No connection means
// nothing was sent.
func progressOf(resp *fasthttp.Response) (Stage, int, error) {
	a, ok := resp.LocalAddr().(*connAddr)
	if !ok {
		return NotSent, 0, nil
	}
	c := a.conn
	switch {
	case c.recv > 0:
		return AnswerPartlyRead, c.sent, c.writeErr
	case c.sent == 0:
		return NotSent, 0, c.writeErr
	case c.writeFailed:
		return PartlySent, c.sent, c.writeErr
	default:
		return Sent, c.sent, c.writeErr
	}
}

// withSuffix returns msg followed by the suffix of stage: "; not sent" or
// "; outcome unknown".
func withSuffix(msg string, stage Stage) []byte {
	suffix := suffixNotSent
	if stage.InDoubt() {
		suffix = suffixInDoubt
	}
	b := make([]byte, 0, len(msg)+len(suffix))
	return append(append(b, msg...), suffix...)
}

// CloseIdle drops the target's idle pooled connections.
func (t *Client) CloseIdle() {
	t.client.CloseIdleConnections()
}

// errStaleConn is what a write on a kept-alive target connection returns,
// or the read that was to write a held request, when the target closed it
// while it was idle: nothing was written, so the request may go out on
// another connection.
var errStaleConn = errors.New("targethttp: target closed the idle connection")

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
	tc.closeAll()
}

// dial connects within timeout (and before Abort) and tracks the
// connection; each Client's own dial calls it.
func (tc *Conns) dial(addr string, timeout time.Duration) (*targetConn, error) {
	ctx, cancel := context.WithTimeout(tc.abort, timeout)
	defer cancel()
	nc, err := tc.dialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &targetConn{Conn: nc, raw: nc, set: tc}
	c.addr = connAddr{Addr: nc.LocalAddr(), conn: c}
	c.watchIdle()
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.open == nil {
		nc.Close()
		return nil, ErrAborted
	}
	tc.open[c] = struct{}{}
	return c, nil
}

// closeAll closes every target connection and refuses new ones.
func (tc *Conns) closeAll() {
	tc.mu.Lock()
	open := tc.open
	tc.open = nil
	tc.mu.Unlock()
	for c := range open {
		c.raw.Close()
	}
}

// forget removes c from the open set.
func (tc *Conns) forget(c *targetConn) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	delete(tc.open, c)
}

// targetConn is one connection to a target. Before writing a request on a
// connection that has already carried one, it checks that the target has
// not closed it meanwhile: HTTP servers close idle kept-alive connections
// (Node.js after 5 s, many proxies after a minute), and a request written
// into such a connection would fail as E902 although the target never saw
// it. Under TLS the check sits below the TLS layer, whose own messages
// (a close_notify, say) also count as "something to read": a connection
// wrongly given up costs a new connection, never a transaction. The pool
// hands a connection to one call at a time, so Read and Write never run
// concurrently; Close may run at any time.
//
// It also counts, for the request it carries, the bytes written and the
// answer bytes read (for https, those of the request and answer, not of
// TLS): how far a failed call got, so that the hub knows whether the
// target may have processed it. The counts start again with each request,
// at its first write after the previous answer was read.
//
// The check is one peek at the socket (a recvfrom with MSG_PEEK that never
// waits). For a request held (below) it is made by exchange, inside the
// syscall.RawConn.Read that writes the request, right before the write:
// by then the HTTP client has set the call's read deadline, and the
// callback is there anyway, so the check costs the peek alone. Otherwise
// (TLS, a request too large to hold) Write makes it through
// syscall.RawConn.Control, not RawConn.Read: Read fails at once, without
// looking at the socket, when the read deadline has passed, and the pool
// leaves the last call's deadline on an idle connection, so every
// connection idle for longer than the call timeout would be given up,
// healthy or not. Control ignores deadlines (the peek never waits, so it
// needs none). A held request found stale is not written; the read reports
// errStaleConn, which the HTTP client reports as a close, and Client.do,
// seeing that this connection was found stale (staleHeld) with nothing
// sent, tries the call on another connection as the pool does for a Write.
//
// On a kept-alive plain TCP connection a request is not written by Write
// but by the Read that waits for its answer (see exchange): Write keeps a
// copy of the request and reports it written, and the first Read writes it
// and waits for the answer in one syscall.RawConn.Read. The HTTP client
// reads at once after writing, before the target can have answered, so
// writing from Write costs a read that finds nothing (EAGAIN) before the
// wait; exchange does without it. The counts stay exact: sent counts the
// bytes that reached the socket, so a request held and never written
// (the call timed out first, the connection was closed) is not sent.
type targetConn struct {
	net.Conn          // what requests go through: raw, or TLS over raw
	raw      net.Conn // the socket
	set      *Conns
	addr     connAddr         // LocalAddr's answer, which leads progressOf back here
	rc       syscall.RawConn  // the socket, for the idle check; nil: no check
	peek     func(fd uintptr) // c.peekIdle, bound once so that a check does not allocate
	gone     bool             // set by peekIdle: the target closed the connection or sent unasked bytes
	answered bool             // a read happened since the last write: the next write starts a request

	// A request held by Write for the Read after it to write (exchange),
	// on plain TCP only.
	holds     bool                  // requests may be held: raw is a TCP socket carrying no TLS
	exch      func(fd uintptr) bool // c.exchange, bound once so that a read does not allocate
	held      []byte                // the request bytes held, not yet written: a part of hold
	unchecked bool                  // the held request's connection is still to be checked (exchange or writeHeld)
	staleHeld bool                  // the read that was to write the held request found the connection stale
	hold      []byte                // the held request's buffer, kept for the next request
	wdl       time.Time             // the write deadline last set
	wdlLazy   bool                  // wdl is not yet the socket's: write sets it first
	rdl       time.Time             // the read deadline last set
	readBuf   []byte                // exchange: Read's buffer
	readN     int                   // exchange: bytes read into readBuf
	readErr   error                 // exchange: why the read failed; io.EOF at the end of the stream
	awaiting  bool                  // exchange: the request is written, the answer awaited

	// The current request's progress, read by progressOf once the call
	// has failed and the connection is closed.
	sent        int   // request bytes written
	recv        int   // answer bytes read
	writeFailed bool  // a write of the request failed
	writeErr    error // why a held request's write failed (the HTTP client reports it as a close)
}

// maxHeld is the largest request a connection holds for its Read to write:
// the HTTP client's write buffer, so that a request it writes in one piece
// is held whole. A request written in more pieces goes out as they come.
const maxHeld = 4 << 10

// connAddr is a target connection's local address, as its LocalAddr gives
// it: the socket's, and the connection itself. The pool stores it on each
// response (fasthttp.Response.LocalAddr), which is how Call finds the
// connection its call used without a lookup or an allocation.
type connAddr struct {
	net.Addr
	conn *targetConn
}

// watchIdle turns on the idle check when the connection is a socket, and
// the holding of requests when it is a TCP socket (startTLS turns that
// off).
func (c *targetConn) watchIdle() {
	if !sockio.Supported {
		return
	}
	if sc, ok := c.raw.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc, c.peek = rc, c.peekIdle
		}
	}
	if _, ok := c.raw.(*net.TCPConn); ok && c.rc != nil {
		c.holds, c.exch = true, c.exchange
	}
}

// startTLS makes the connection carry TLS over its socket, configured by
// cfg: requests go through TLS, so none is held (Read could not write it).
func (c *targetConn) startTLS(cfg *tls.Config) {
	c.Conn = tls.Client(c.raw, cfg)
	c.holds, c.exch = false, nil
}

// LocalAddr returns the socket's local address as a *connAddr.
func (c *targetConn) LocalAddr() net.Addr { return &c.addr }

// Handshake makes the TLS handshake of an https connection, if not yet
// made; for http it does nothing. Its presence tells the pool that the
// connection makes its own TLS.
func (c *targetConn) Handshake() error {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.Handshake()
	}
	return nil
}

func (c *targetConn) Read(p []byte) (int, error) {
	c.answered = true
	if len(c.held) > 0 && len(p) > 0 {
		return c.writeHeldAndRead(p)
	}
	n, err := c.Conn.Read(p)
	c.recv += n
	return n, err
}

func (c *targetConn) Write(p []byte) (int, error) {
	if c.answered {
		c.answered = false
		c.sent, c.recv, c.writeFailed, c.writeErr = 0, 0, false, nil
		c.unchecked, c.staleHeld = false, false
		if c.holds && len(p) <= maxHeld {
			// The idle check is made by whatever writes the request:
			// the read that awaits the answer (exchange), or writeHeld.
			c.hold = append(c.hold[:0], p...)
			c.held, c.unchecked = c.hold, true
			return len(p), nil
		}
		if c.stale() {
			return 0, errStaleConn
		}
	}
	if len(c.held) > 0 {
		// The request goes on in another piece: what is held goes first.
		if err := c.writeHeld(); err != nil {
			return 0, err
		}
	}
	return c.write(p)
}

// write writes p through the connection, counting what went out.
func (c *targetConn) write(p []byte) (int, error) {
	if c.wdlLazy {
		c.wdlLazy = false
		if err := c.Conn.SetWriteDeadline(c.wdl); err != nil {
			c.writeFailed = true
			c.writeErr = err
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	c.sent += n
	if err != nil {
		c.writeFailed = true
		c.writeErr = err
	}
	return n, err
}

// writeHeld writes what is held of the request through the connection: a
// blocking write, bounded by the write deadline. A request not yet checked
// (the HTTP client writes it in more pieces than the one held) is checked
// first, and not written on a stale connection.
func (c *targetConn) writeHeld() error {
	held := c.held
	c.held = nil
	if c.unchecked {
		c.unchecked = false
		if c.stale() {
			return errStaleConn
		}
	}
	_, err := c.write(held)
	return err
}

// stale makes the idle check of a connection about to carry a request,
// when it has a socket: it reports whether the target closed the
// connection while it was idle, or sent bytes nobody asked for.
func (c *targetConn) stale() bool {
	if c.rc == nil {
		return false
	}
	c.gone = false
	err := c.rc.Control(c.peek)
	return err != nil || c.gone
}

func (c *targetConn) SetDeadline(t time.Time) error {
	c.wdl, c.wdlLazy, c.rdl = t, false, t
	return c.Conn.SetDeadline(t)
}

func (c *targetConn) SetReadDeadline(t time.Time) error {
	c.rdl = t
	return c.Conn.SetReadDeadline(t)
}

// SetWriteDeadline sets the deadline of the writes through the connection.
// On a connection that holds requests it is set on the socket only when a
// write through the connection needs it (write): a held request is written
// by a write that never waits (exchange), and setting a deadline on the
// socket moves a runtime timer, on every call.
func (c *targetConn) SetWriteDeadline(t time.Time) error {
	c.wdl = t
	if c.holds {
		c.wdlLazy = true
		return nil
	}
	return c.Conn.SetWriteDeadline(t)
}

// writeDeadlinePassed reports whether the write deadline has passed. It
// reads no clock when the read deadline is set no later (the HTTP client
// sets both to the call's deadline): the RawConn.Read that would write a
// held request then fails at once, before writing, as a write would.
func (c *targetConn) writeDeadlinePassed() bool {
	if c.wdl.IsZero() || (!c.rdl.IsZero() && !c.rdl.After(c.wdl)) {
		return false
	}
	return !time.Now().Before(c.wdl)
}

// writeHeldAndRead is Read of the first answer bytes of a held request: it
// writes the request and reads the answer in one RawConn.Read (exchange).
// If the write deadline has passed, or the write could not finish at once,
// what is left of the request goes out with a blocking write, as it would
// have from Write, and the read follows it.
func (c *targetConn) writeHeldAndRead(p []byte) (int, error) {
	if c.writeDeadlinePassed() {
		// The blocking write fails at once with the deadline's error,
		// nothing sent.
		if err := c.writeHeld(); err != nil {
			c.staleHeld = err == errStaleConn
			return 0, err
		}
	} else {
		c.readBuf, c.readN, c.readErr, c.awaiting = p, 0, nil, false
		err := c.rc.Read(c.exch)
		c.readBuf = nil
		switch {
		case err != nil:
			// The read deadline passed or the connection was closed
			// (Conns.Abort), before the write (nothing sent: the rest
			// is dropped) or while awaiting the answer.
			c.held = nil
			return 0, err
		case c.staleHeld:
			return 0, errStaleConn
		case c.writeErr != nil:
			return 0, c.writeErr
		case c.awaiting:
			c.recv += c.readN
			return c.readN, c.readErr
		}
		if err := c.writeHeld(); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	c.recv += n
	return n, err
}

// exchange is the syscall.RawConn.Read callback that writes a held request
// and reads the first bytes of its answer into readBuf. Its first call
// makes the idle check (a peek: found stale, it writes nothing and reports
// true with staleHeld set), then writes the request with one
// non-blocking write and reports false, so
// that the runtime parks the call until the socket is readable; its later
// calls read the answer, reporting false again while there is nothing to
// read. A write that moves less than the whole request (the send buffer
// is full) reports true with the rest still held, for writeHeldAndRead to
// finish with a blocking write.
//
// No answer can be missed by waiting without a read first: RawConn.Read
// forgets the socket's readiness before it calls exchange the first time
// (internal/poll's RawRead calls prepareRead, which resets the runtime's
// read semaphore, runtime.poll_runtime_pollReset), and every readiness
// the edge-triggered poller reports after that reset is kept until the
// wait consumes it (runtime.netpollblock takes a pdReady set meanwhile
// and returns at once). The answer can only arrive after the request is
// written, so after the reset: its readiness wakes the wait. A readiness
// left over from before makes a wait return early; the read then finds
// nothing and waits again.
func (c *targetConn) exchange(fd uintptr) bool {
	if !c.awaiting {
		if c.unchecked {
			c.unchecked = false
			if sockio.Readable(fd) {
				// Stale: nothing is written, and the call tries another
				// connection (Client.do).
				c.held = nil
				c.staleHeld = true
				return true
			}
		}
		n, wouldBlock, err := sockio.Write(fd, c.held)
		c.sent += n
		c.held = c.held[n:]
		switch {
		case err != nil:
			c.held = nil
			c.writeFailed = true
			c.writeErr = c.opError("write", err)
			return true
		case wouldBlock || len(c.held) > 0:
			return true
		}
		c.awaiting = true
		return false
	}
	n, wouldBlock, err := sockio.Read(fd, c.readBuf)
	switch {
	case wouldBlock:
		return false
	case err != nil:
		c.readErr = c.opError("read", err)
	case n == 0:
		c.readErr = io.EOF
	}
	c.readN = n
	return true
}

// opError wraps err, the *os.SyscallError of the socket operation op, as
// the net package would.
func (c *targetConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.raw.LocalAddr(), Addr: c.raw.RemoteAddr(), Err: err}
}

func (c *targetConn) Close() error {
	c.set.forget(c)
	return c.Conn.Close()
}

// peekIdle is the idle check's syscall.RawConn.Control callback: anything
// to read on a connection between requests (the end of the stream, a
// reset, or bytes nobody asked for) means it cannot carry another request.
// It never waits.
func (c *targetConn) peekIdle(fd uintptr) {
	c.gone = sockio.Readable(fd)
}

// classifyCallError maps a failed HTTP exchange to E901 (no answer in time,
// including a connect that timed out), E902 (the target could not be
// reached, or closed or reset the connection before a full answer) or E500
// (the target answered, but not in HTTP: a malformed status line or header,
// broken chunked framing, headers or body over the cap). A reset before the
// first byte of an answer reads as a close: the HTTP client reports both
// alike. abort is done with ErrAborted when Abort gave up on the call.
func classifyCallError(abort context.Context, err error) (code, msg string) {
	if errors.Is(context.Cause(abort), ErrAborted) {
		// The target may have processed the transaction; like a timeout,
		// the hub cannot tell, so the code is E901.
		return protocol.CodeTimeout, msgAborted
	}
	var (
		timeout interface{ Timeout() bool } // net.Error's, and fasthttp.ErrTimeout's
		opErr   *net.OpError
		dnsErr  *net.DNSError
	)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return protocol.CodeTargetFailed, msgAnswerTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &timeout) && timeout.Timeout():
		return protocol.CodeTimeout, msgTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return protocol.CodeUnreachable, msgRefusedConn
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return protocol.CodeUnreachable, msgResetConn
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, errStaleConn):
		return protocol.CodeUnreachable, msgClosedEarly
	case isTLSFailure(err):
		return protocol.CodeUnreachable, msgTLSFailed
	case errors.As(err, &opErr), errors.As(err, &dnsErr):
		// Any other socket-level failure: no route, name not found, ...
		return protocol.CodeUnreachable, msgUnreachable
	default:
		// The connection worked and bytes came back, but they could not
		// be read as an HTTP answer.
		return protocol.CodeTargetFailed, msgNotHTTP
	}
}

// answerParsers hold the JSON parsers of target answers: fastjson parses
// in place, without reflection or allocation, where encoding/json took a
// tenth of a call's CPU.
var answerParsers fastjson.ParserPool

// DecodeAnswer classifies a target's HTTP answer, given its status and body,
// into the response code and message the client gets (docs/PROTOCOL.md,
// "Target protocol"):
//
//   - 200 with a JSON object whose "code" is 0000, Bnnn or Ennn: that code and
//     the object's "message", relayed as they are;
//   - 4xx: E400;
//   - 5xx, a 200 body that is not such JSON, a code of another form, or any
//     other status: E500; a 200 that is not such JSON is in doubt, and its
//     message ends "; outcome unknown".
//
// The returned message is raw (the response writer cleans and caps it) and
// never aliases body. It never panics, whatever the body.
func DecodeAnswer(status int, body []byte) (code string, msg []byte) {
	code, msg, _ = decodeAnswer(status, body)
	return code, msg
}

// decodeAnswer is DecodeAnswer, and reports a 200 whose body is not the
// target protocol: the target took the request, but what it did is unknown.
func decodeAnswer(status int, body []byte) (code string, msg []byte, malformed bool) {
	p := answerParsers.Get()
	defer answerParsers.Put(p)
	a := parseAnswer(p, body)
	switch {
	case status == http.StatusOK:
		if !a.valid || a.code == nil {
			return protocol.CodeTargetFailed, withSuffix(msgNotProtocol, AnswerPartlyRead), true
		}
		if !protocol.ValidTargetCode(a.code) {
			return protocol.CodeTargetFailed, withSuffix(msgBadTargetCode, AnswerPartlyRead), true
		}
		return targetCode(a.code), bytes.Clone(a.message), false
	case status >= 400 && status <= 499:
		return protocol.CodeRefused, statusMessage("target refused the request: HTTP ", status, a.message), false
	case status >= 500 && status <= 599:
		return protocol.CodeTargetFailed, statusMessage("target failed: HTTP ", status, a.message), false
	default:
		return protocol.CodeTargetFailed, statusMessage("target answered unexpected HTTP ", status, nil), false
	}
}

// targetAnswer is what parseAnswer read of a target's JSON answer. Its
// slices point into the parser's memory.
type targetAnswer struct {
	valid   bool   // the body is JSON, and "code" and "message" are strings when present
	code    []byte // nil when absent or null
	message []byte // empty when absent or null
}

// parseAnswer reads body as a target's JSON answer, {"code": "...",
// "message": "..."}. Other members are ignored; a body that is not JSON, a
// JSON value that is not an object, or a "code" or "message" that is
// neither a string nor null is not valid.
func parseAnswer(p *fastjson.Parser, body []byte) targetAnswer {
	v, err := p.ParseBytes(body)
	if err != nil {
		return targetAnswer{}
	}
	obj, err := v.Object()
	if err != nil {
		return targetAnswer{valid: v.Type() == fastjson.TypeNull}
	}
	a := targetAnswer{valid: true}
	var ok bool
	if a.code, ok = stringMember(obj, "code"); !ok {
		return targetAnswer{}
	}
	if a.message, ok = stringMember(obj, "message"); !ok {
		return targetAnswer{}
	}
	return a
}

// stringMember returns the string member key of obj, nil when it is absent
// or null; ok is false when it is of another type.
func stringMember(obj *fastjson.Object, key string) (_ []byte, ok bool) {
	v := obj.Get(key)
	if v == nil || v.Type() == fastjson.TypeNull {
		return nil, true
	}
	b, err := v.StringBytes()
	return b, err == nil
}

// targetCode returns code, valid, as a string: 0000 without allocating.
func targetCode(code []byte) string {
	if string(code) == protocol.CodeOK {
		return protocol.CodeOK
	}
	return string(code)
}

// statusMessage builds "<head><status>" and appends ": <detail>" when the
// target explained itself in a JSON message.
func statusMessage(head string, status int, detail []byte) []byte {
	b := make([]byte, 0, len(head)+3+2+len(detail))
	b = append(b, head...)
	b = strconv.AppendInt(b, int64(status), 10)
	if len(detail) > 0 {
		b = append(b, ": "...)
		b = append(b, detail...)
	}
	return b
}
