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
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/relayhub/relayhub/relay/protocol"
)

// maxAnswerBytes caps how much of a target's HTTP answer the hub reads: its
// body, and its headers (the read buffer holds them whole). A healthy
// answer is a small JSON object; anything larger is not the target
// protocol (E500), and the cap keeps a broken target from making the hub
// buffer without bound.
const maxAnswerBytes = 64 << 10

// ErrAborted is the cause that ends the calls still running when
// Conns.Abort gives up on them (a shutdown whose drain time has run out).
var ErrAborted = errors.New("targethttp: calls aborted: drain time over")

// DefaultIdleTimeout is how long a pooled target connection may stay unused
// before the hub closes it, unless Config.IdleTimeout says otherwise: under
// the 5 s keep-alive timeout of common servers (Node.js's), so that the hub
// usually closes first rather than racing the target's close with a new
// request. A connection the target closed earlier is caught before reuse
// (targetConn.stale) and, if never reused, released at this timeout.
const DefaultIdleTimeout = 4 * time.Second

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
	// LateAnswerGrace is how long a connection whose call timed out with
	// the whole request sent and no byte of an answer read is kept and
	// read on, past the call's timeout, for the answer the target may yet
	// give (docs/PROTOCOL.md, "In-doubt journal"). Zero means none:
	// the connection is closed at the timeout. It needs OnLateAnswer.
	LateAnswerGrace time.Duration
	// OnLateAnswer receives the answer of such a call when it arrives in
	// full within the grace, from the goroutine reading it, after which
	// the connection is closed; an answer cut short, not HTTP, or not the
	// target protocol is not delivered. Nil means no late reading.
	OnLateAnswer func(LateAnswer)
}

// LateAnswer is a target's answer that arrived after its call's timeout.
// A plain value.
type LateAnswer struct {
	// TxID is the call's transaction.
	TxID string
	// Code and Msg are the answer as a call's is classified (Answered):
	// the target's 0000, Bnnn or Ennn and its message, or E400 or E500
	// for an HTTP 4xx or 5xx.
	Code string
	Msg  []byte
	// At is when it was read.
	At time.Time
}

// Client is the HTTP side of one target: a pool of kept-alive connections
// to it, the timeout of one call and how long a connection may idle. A call
// takes a connection out of the pool, writes its request and reads the
// answer in the calling goroutine (fasthttp parses the answer, with pooled
// buffers), and puts the connection back. It is safe for concurrent use:
// its fields are set once by New.
type Client struct {
	addr    string      // host:port to dial
	head    string      // the request up to the X-Tx-Id header's value
	tls     *tls.Config // for an https target: its connections' TLS; nil for http
	timeout time.Duration
	pool    *pool
	conns   *Conns
	onDial  func() // nil: none
	// Late reading: zero lateGrace or nil onLate means none. lateReaders
	// counts the connections read on, at most lateMax (MaxInflight): each
	// holds a descriptor for up to the grace, and a target that times out
	// call after call must not run the hub out of them.
	lateGrace   time.Duration
	onLate      func(LateAnswer)
	lateReaders atomic.Int64
	lateMax     int64
}

// New returns the Client posting to cfg.URL. It fails on a URL that is not
// http or https with a host, on a missing Conns, Timeout or MaxInflight, and
// on a negative IdleTimeout or LateAnswerGrace.
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
	if cfg.LateAnswerGrace < 0 {
		return nil, fmt.Errorf("targethttp: LateAnswerGrace must not be negative, got %s", cfg.LateAnswerGrace)
	}
	idleTimeout := cfg.IdleTimeout
	if idleTimeout == 0 {
		idleTimeout = DefaultIdleTimeout
	}
	port := u.Port()
	switch {
	case port != "":
	case u.Scheme == "https":
		port = "443"
	default:
		port = "80"
	}
	t := &Client{
		addr: net.JoinHostPort(u.Hostname(), port),
		// The request is the same for every call but for the TXID and the
		// body (docs/PROTOCOL.md, "Target protocol"): no User-Agent, no
		// Accept-Encoding.
		head:    "POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: text/plain; charset=utf-8\r\nX-Tx-Id: ",
		timeout: cfg.Timeout,
		pool:    newPool(idleTimeout, cfg.MaxInflight),
		conns:   cfg.Conns,
		onDial:  cfg.OnDial,
	}
	if cfg.LateAnswerGrace > 0 && cfg.OnLateAnswer != nil {
		t.lateGrace, t.onLate = cfg.LateAnswerGrace, cfg.OnLateAnswer
		t.lateMax = int64(cfg.MaxInflight)
	}
	if u.Scheme == "https" {
		t.tls = &tls.Config{}
		if cfg.TLS != nil {
			t.tls = cfg.TLS.Clone()
		}
		if t.tls.ServerName == "" {
			t.tls.ServerName = u.Hostname()
		}
	}
	return t, nil
}

// Timeout returns the bound on one call.
func (t *Client) Timeout() time.Duration { return t.timeout }

// IdleTimeout returns how long a pooled connection may stay unused.
func (t *Client) IdleTimeout() time.Duration { return t.pool.idleTimeout }

// CloseIdle drops the target's idle pooled connections.
func (t *Client) CloseIdle() { t.pool.closeIdle() }

// Call sends one transaction to the target and classifies the outcome into a
// response code and message (docs/PROTOCOL.md, "Target protocol"), with how
// far the call got. Only Conns.Abort cuts it short; nothing of the
// client's connection does: a client that goes away does not cancel a call
// that may already have reached the target. txid is a valid TXID
// (protocol.ValidTxID), so it cannot break the request's header.
//
// A request that may have reached the target is never sent again. It is
// tried again only when no byte of it was written: a pooled connection the
// target closed while it was idle is given up before anything is written
// on it (take), and a connect refused or reset is tried once more, within
// what is left of the timeout. Redirects are not followed: a 307 would
// resend the body elsewhere.
//
// The message of a failure the hub makes up says which it was: it ends
// "; not sent" when the request never went out, "; outcome unknown" when
// the result's Stage is in doubt. A call that failed for want of the hub's
// own resources before any byte went out (out of descriptors, say) is no
// failure of the target: E906 "hub overloaded; not sent", with its
// Result.Fault.
func (t *Client) Call(txid, payload []byte) Result {
	deadline := time.Now().Add(t.timeout)
	c, fresh, err := t.take(deadline)
	retried := false
	if err != nil && connectFailed(err) && t.conns.abort.Err() == nil && time.Now().Before(deadline) {
		retried = true
		c, fresh, err = t.take(deadline)
	}
	if err != nil {
		if f := t.hubFault(err); f != NoHubFault {
			return hubOverloaded(f, err, retried)
		}
		code, m := classifyCallError(t.conns.abort, err)
		return Result{Code: code, Msg: withSuffix(m, NotSent), Stage: NotSent, Retried: retried}
	}
	res := t.exchange(c, fresh, txid, payload, deadline)
	res.Retried = retried
	return res
}

// take returns a connection for a call: a pooled one that the idle check
// finds healthy, or else a new one (fresh). Each pooled connection found
// stale is closed, nothing written on it, and the next is tried, so a pool
// whose connections the target closed all at once (a restart) costs
// dials, never a transaction.
func (t *Client) take(deadline time.Time) (c *targetConn, fresh bool, err error) {
	for c = t.pool.get(); c != nil; c = t.pool.get() {
		if !c.stale() {
			return c, false, nil
		}
		c.Close()
	}
	c, err = t.conns.dial(t.addr, deadline)
	if err != nil {
		return nil, false, err
	}
	if t.onDial != nil {
		t.onDial()
	}
	if t.tls != nil {
		// Over the socket, under the counts: they are of the request's
		// bytes, not of TLS's.
		c.Conn = tls.Client(c.raw, t.tls)
	}
	return c, true, nil
}

// connectFailed reports whether a dial failed because the connect was
// refused or reset: the target never saw the request, so the call may try
// once more.
func connectFailed(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// hubFault returns the hub's own fault behind err, the error of a call that
// sent nothing, or NoHubFault when the network or the target may be to
// blame. A call Abort gave up on is no fault of the hub's resources.
func (t *Client) hubFault(err error) HubFault {
	if t.conns.abort.Err() != nil {
		return NoHubFault
	}
	return hubFaultOf(err)
}

// hubFaultOf tells the hub's own faults from err by their errno, or by the
// system call that failed before any connect (socket, setsockopt): those
// happen on the hub's machine whatever the target does.
func hubFaultOf(err error) HubFault {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return FaultDescriptors
	case errors.Is(err, syscall.ENOMEM), errors.Is(err, syscall.ENOBUFS):
		return FaultMemory
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return FaultPorts
	}
	var se *os.SyscallError
	if errors.As(err, &se) && (se.Syscall == "socket" || se.Syscall == "setsockopt") {
		return FaultSocket
	}
	return NoHubFault
}

// hubOverloaded is the Result of a call that failed for want of the hub's
// own resources, f, with err, before any byte of it went out.
func hubOverloaded(f HubFault, err error, retried bool) Result {
	return Result{Code: protocol.CodeUnavailable, Msg: withSuffix(msgHubOverloaded, NotSent), Stage: NotSent,
		Retried: retried, Fault: f, Err: err}
}

// exchange writes the request on c, reads the answer and classifies it,
// and puts c back in the pool when it can carry another call, else closes
// it. c's record of the call is read before c goes back, since another
// call may take it at once.
func (t *Client) exchange(c *targetConn, fresh bool, txid, payload []byte, deadline time.Time) Result {
	c.progress = progress{}
	// One deadline for the write and the read: the runtime keeps a single
	// timer for both when they are equal.
	err := c.SetDeadline(deadline)
	if err == nil && fresh {
		err = c.handshake()
	}
	if err == nil {
		c.req = t.appendRequest(c.req[:0], txid, payload)
		_, err = c.Write(c.req)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	reuse := false
	if err == nil {
		br := acquireReader(c)
		err = resp.ReadLimitBody(br, maxAnswerBytes)
		// Bytes after the answer were never asked for: the connection
		// cannot carry another request.
		reuse = err == nil && br.Buffered() == 0 && !resp.ConnectionClose()
		releaseReader(br)
	}
	p := c.progress
	if err != nil {
		stage := p.stage()
		if f := t.hubFault(err); f != NoHubFault && stage == NotSent {
			c.Close()
			return hubOverloaded(f, err, false)
		}
		code, m := classifyCallError(t.conns.abort, p.callError(err))
		late := code == protocol.CodeTimeout && stage == Sent && t.readLate(c, txid, deadline)
		if !late {
			c.Close()
		}
		return Result{Code: code, Msg: withSuffix(m, stage), Stage: stage, BytesSent: p.sent, LateRead: late}
	}
	if reuse {
		t.pool.put(c)
	} else {
		c.Close()
	}
	// decodeAnswer's message never aliases the body, which goes back to
	// the pool on return.
	code, msg, malformed := decodeAnswer(resp.StatusCode(), resp.Body())
	if malformed {
		return Result{Code: code, Msg: msg, Stage: AnswerPartlyRead, BytesSent: p.sent}
	}
	return Result{Code: code, Msg: msg, Stage: Answered}
}

// handshake makes the TLS handshake of a new https connection, within the
// deadline set on it; for http it does nothing. A handshake that fails has
// written no byte of the request.
func (c *targetConn) handshake() error {
	if tc, ok := c.Conn.(*tls.Conn); ok {
		return tc.Handshake()
	}
	return nil
}

// appendRequest appends the request of one transaction to b.
func (t *Client) appendRequest(b, txid, payload []byte) []byte {
	b = append(b, t.head...)
	b = append(b, txid...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(payload)), 10)
	b = append(b, "\r\n\r\n"...)
	return append(b, payload...)
}

// answerReaders hold the buffered readers of target answers, each of
// maxAnswerBytes, which bounds an answer's headers: a healthy answer's
// are a few hundred bytes, and a broken target cannot make the hub buffer
// megabytes of them.
var answerReaders sync.Pool

func acquireReader(r io.Reader) *bufio.Reader {
	if br, ok := answerReaders.Get().(*bufio.Reader); ok {
		br.Reset(r)
		return br
	}
	return bufio.NewReaderSize(r, maxAnswerBytes)
}

func releaseReader(br *bufio.Reader) {
	br.Reset(nil)
	answerReaders.Put(br)
}

// classifyCallError maps a failed HTTP exchange to E901 (no answer in time,
// including a connect that timed out), E902 (the target could not be
// reached, or closed or reset the connection before a full answer) or E500
// (the target answered, but not in HTTP: a malformed status line or header,
// broken chunked framing, headers or body over the cap). A reset before the
// first byte of an answer is told from a close by the connection's own read
// error (progress.callError), not by err. abort is done with ErrAborted when
// Abort gave up on the call.
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
	case errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF):
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
