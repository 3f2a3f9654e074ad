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
//	code, msg := core.Call([]byte("T1"), []byte("BAL 1001"))
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

// Messages of answers made up about a call. Fixed strings, so the common
// failures answer without formatting.
const (
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
	tls := u.Scheme == "https"
	maxInflight := cfg.MaxInflight
	t := &Client{
		uri:         uri,
		conns:       cfg.Conns,
		onDial:      cfg.OnDial,
		timeout:     cfg.Timeout,
		idleTimeout: idleTimeout,
	}
	t.client = &fasthttp.HostClient{
		Addr:                     fasthttp.AddMissingPort(u.Host, tls),
		IsTLS:                    tls,
		TLSConfig:                cfg.TLS,
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
		// closed (errStaleConn). Each such try discards that
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
// (targetConn.Write) and, if never reused, released at this timeout.
const DefaultIdleTimeout = 4 * time.Second

// dial is the pool's dial function: Conns.dial, and OnDial for each
// connection opened.
func (t *Client) dial(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := t.conns.dial(addr, timeout)
	if err == nil && t.onDial != nil {
		t.onDial()
	}
	return c, err
}

// Parts of every target request.
var (
	headerTxID      = []byte("X-Tx-Id")
	contentTypeText = []byte("text/plain; charset=utf-8")
)

// Call sends one transaction to the target and classifies the outcome into a
// response code and message (docs/PROTOCOL.md, "Target protocol"). Only
// Conns.Abort cuts it short; nothing of the client's connection does: a
// client that goes away does not cancel a call that may already have
// reached the target.
//
// The request is sent once. The hub adds no retries; the pool tries a
// request again only when it met a connection the target had closed while
// it was idle, before a byte of it was written (see targetConn.Write), so a
// transaction that may have reached the target is never sent twice.
// Redirects are not followed: a 307 would resend the body elsewhere.
func (t *Client) Call(txid, payload []byte) (code string, msg []byte) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetURI(t.uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentTypeBytes(contentTypeText)
	req.Header.SetCanonical(headerTxID, txid)
	req.SetBodyRaw(payload)

	if err := t.client.DoTimeout(req, resp, t.timeout); err != nil {
		code, m := classifyCallError(t.conns.abort, err)
		return code, []byte(m)
	}
	// DecodeAnswer's message never aliases the body, which goes back to
	// the pool on return.
	return DecodeAnswer(resp.StatusCode(), resp.Body())
}

// CloseIdle drops the target's idle pooled connections.
func (t *Client) CloseIdle() {
	t.client.CloseIdleConnections()
}

// errStaleConn is what a write on a kept-alive target connection returns
// when the target closed it while it was idle: nothing was written, so the
// request may go out on another connection.
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
func (tc *Conns) dial(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(tc.abort, timeout)
	defer cancel()
	nc, err := tc.dialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &targetConn{Conn: nc, set: tc}
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
		c.Conn.Close()
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
// The check peeks through syscall.RawConn.Control, not RawConn.Read: Read
// fails at once, without looking at the socket, when the read deadline has
// passed, and the pool leaves the last call's deadline on an idle
// connection, so every connection idle for longer than the call timeout
// would be given up, healthy or not. Control ignores deadlines (the peek
// never waits, so it needs none) and costs no more: the one peek syscall.
type targetConn struct {
	net.Conn
	set      *Conns
	rc       syscall.RawConn  // the socket, for the idle check; nil: no check
	peek     func(fd uintptr) // c.peekIdle, bound once so that a check does not allocate
	peekBuf  [1]byte
	gone     bool // set by peekIdle: the target closed the connection or sent unasked bytes
	answered bool // a read happened since the last write: the next write starts a request
}

// watchIdle turns on the idle check when the connection is a socket.
func (c *targetConn) watchIdle() {
	if !canPeek {
		return
	}
	if sc, ok := c.Conn.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc, c.peek = rc, c.peekIdle
		}
	}
}

func (c *targetConn) Read(p []byte) (int, error) {
	c.answered = true
	return c.Conn.Read(p)
}

func (c *targetConn) Write(p []byte) (int, error) {
	if c.answered {
		c.answered = false
		if c.rc != nil {
			c.gone = false
			if err := c.rc.Control(c.peek); err != nil || c.gone {
				return 0, errStaleConn
			}
		}
	}
	return c.Conn.Write(p)
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
	c.gone = peekReadable(fd, c.peekBuf[:])
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
//     other status: E500.
//
// The returned message is raw (the response writer cleans and caps it) and
// never aliases body. It never panics, whatever the body.
func DecodeAnswer(status int, body []byte) (code string, msg []byte) {
	p := answerParsers.Get()
	defer answerParsers.Put(p)
	a := parseAnswer(p, body)
	switch {
	case status == http.StatusOK:
		if !a.valid || a.code == nil {
			return protocol.CodeTargetFailed, []byte(msgNotProtocol)
		}
		if !protocol.ValidTargetCode(a.code) {
			return protocol.CodeTargetFailed, []byte(msgBadTargetCode)
		}
		return targetCode(a.code), bytes.Clone(a.message)
	case status >= 400 && status <= 499:
		return protocol.CodeRefused, statusMessage("target refused the request: HTTP ", status, a.message)
	case status >= 500 && status <= 599:
		return protocol.CodeTargetFailed, statusMessage("target failed: HTTP ", status, a.message)
	default:
		return protocol.CodeTargetFailed, statusMessage("target answered unexpected HTTP ", status, nil)
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
