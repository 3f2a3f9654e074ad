package relay

import (
	"bytes"
	"context"
	"errors"
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
)

// maxAnswerBytes caps how much of a target's HTTP answer body the hub reads.
// A healthy answer is a small JSON object; anything larger is not the target
// protocol (E500), and the cap keeps a broken target from making the hub
// buffer without bound.
const maxAnswerBytes = 64 << 10

// errShutdownAbort is the cause given to target calls still running when a
// shutdown's drain time has run out.
var errShutdownAbort = errors.New("relay: shutdown: drain time over")

// Messages of answers the hub makes up about a call. Fixed strings, so the
// common failures answer without formatting.
const (
	msgTimeout         = "no answer within target timeout"
	msgShutdownAbort   = "no answer before shutdown"
	msgRefusedConn     = "target unreachable: connection refused"
	msgResetConn       = "target unreachable: connection reset"
	msgClosedEarly     = "target unreachable: connection closed before a full answer"
	msgUnreachable     = "target unreachable"
	msgAnswerTooLarge  = "target answer too large"
	msgNotProtocol     = "target answer is not the target protocol"
	msgNotHTTP         = "target answer is not HTTP"
	msgBadTargetCode   = "target answered a code of unknown form"
	msgInternal        = "internal error; the target may or may not have processed the request"
	msgTooManyConns    = "too many connections"
	msgShuttingDown    = "shutting down"
	msgUnknownTarget   = "unknown target"
	msgBulkheadFull    = "target busy: too many calls in flight"
	msgCircuitOpenHead = "circuit open; retry after "
	msgHeldOpen        = "circuit open; held open by operator"
)

// target is the HTTP side of one configured target: a pool of kept-alive
// connections to it (fasthttp's HostClient, whose calls write the request
// and read the answer in the calling goroutine, with pooled buffers and no
// allocation of their own) and the timeout of one call. It is safe for
// concurrent use: its fields are set once by New.
type target struct {
	url     string // {base URL}/tx
	uri     *fasthttp.URI
	client  *fasthttp.HostClient
	timeout time.Duration
}

// newTarget returns the target posting to txURL (validated by New) through
// conns, whose calls last at most timeout. maxInflight is the target's
// bulkhead size, which bounds its calls and so its connections: the pool
// itself never refuses or queues a call.
func newTarget(txURL string, timeout time.Duration, maxInflight int, conns *targetConns) *target {
	u, err := url.Parse(txURL)
	if err != nil {
		panic("relay: parse a validated target URL: " + err.Error())
	}
	uri := new(fasthttp.URI)
	if err := uri.Parse(nil, []byte(txURL)); err != nil {
		panic("relay: parse a validated target URL: " + err.Error())
	}
	tls := u.Scheme == "https"
	return &target{
		url: txURL,
		uri: uri,
		client: &fasthttp.HostClient{
			Addr:                     fasthttp.AddMissingPort(u.Host, tls),
			IsTLS:                    tls,
			DialTimeout:              conns.dial,
			NoDefaultUserAgentHeader: true,
			DisablePathNormalizing:   true,
			MaxConns:                 math.MaxInt32,
			MaxIdleConnDuration:      idleTargetConnTimeout,
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
		},
		timeout: timeout,
	}
}

// idleTargetConnTimeout is how long a pooled target connection may stay
// unused before the hub closes it: under the 5 s keep-alive timeout of
// common servers (Node.js's), so that the hub usually closes first rather
// than racing the target's close with a new request. A connection the
// target closed earlier is caught before reuse (targetConn.Write) and, if
// never reused, released at this timeout.
const idleTargetConnTimeout = 4 * time.Second

// Parts of every target request.
var (
	headerTxID      = []byte("X-Tx-Id")
	contentTypeText = []byte("text/plain; charset=utf-8")
)

// call sends one transaction to the target and classifies the outcome into a
// response code and message (SPEC §3, §4). abort is done when the Server
// gives up on its calls (Close, or Shutdown past its time); it is never the
// client connection's: a client that goes away does not cancel a call that
// may already have reached the target.
//
// The request is sent once. The hub adds no retries; the pool tries a
// request again only when it met a connection the target had closed while
// it was idle, before a byte of it was written (see targetConn.Write), so a
// transaction that may have reached the target is never sent twice.
// Redirects are not followed: a 307 would resend the body elsewhere.
func (t *target) call(abort context.Context, txid, payload []byte) (code string, msg []byte) {
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
		code, m := classifyCallError(abort, err)
		return code, []byte(m)
	}
	// DecodeAnswer's message never aliases the body, which goes back to
	// the pool on return.
	return DecodeAnswer(resp.StatusCode(), resp.Body())
}

// close drops the target's idle pooled connections.
func (t *target) close() {
	t.client.CloseIdleConnections()
}

// errStaleConn is what a write on a kept-alive target connection returns
// when the target closed it while it was idle: nothing was written, so the
// request may go out on another connection.
var errStaleConn = errors.New("relay: target closed the idle connection")

// targetConns dials the hub's connections to its targets and keeps the set
// of those open, so that calls the Server gives up on can be cut: a call
// blocked reading an answer has no context to cancel. It is safe for
// concurrent use.
type targetConns struct {
	abort       context.Context // done when the Server gives up on its calls, before closeAll
	dialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	mu          sync.Mutex
	open        map[*targetConn]struct{} // guarded by mu; nil once aborted
}

// newTargetConns returns a targetConns that dials with dial (nil: TCP,
// with keep-alive probes), each dial bounded by abort.
func newTargetConns(abort context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *targetConns {
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	return &targetConns{abort: abort, dialContext: dial, open: make(map[*targetConn]struct{})}
}

// dial is the pools' dial function: it connects within timeout (and
// before the Server gives up on its calls) and tracks the connection.
func (tc *targetConns) dial(addr string, timeout time.Duration) (net.Conn, error) {
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
		return nil, errShutdownAbort
	}
	tc.open[c] = struct{}{}
	return c, nil
}

// closeAll closes every target connection and refuses new ones.
func (tc *targetConns) closeAll() {
	tc.mu.Lock()
	open := tc.open
	tc.open = nil
	tc.mu.Unlock()
	for c := range open {
		c.Conn.Close()
	}
}

// forget removes c from the open set.
func (tc *targetConns) forget(c *targetConn) {
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
type targetConn struct {
	net.Conn
	set      *targetConns
	rc       syscall.RawConn       // the socket, for the idle check; nil: no check
	peek     func(fd uintptr) bool // c.peekIdle, bound once so that a check does not allocate
	peekBuf  [1]byte
	gone     bool // set by peekIdle: the target closed the connection or sent unasked bytes
	answered bool // a read happened since the last write: the next write starts a request
}

// watchIdle turns on the idle check when the connection is a socket.
func (c *targetConn) watchIdle() {
	if !rawReads {
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
			if err := c.rc.Read(c.peek); err != nil || c.gone {
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

// peekIdle is the idle check's syscall.RawConn callback: anything to read
// on a connection between requests (the end of the stream, a reset, or
// bytes nobody asked for) means it cannot carry another request. It never
// waits.
func (c *targetConn) peekIdle(fd uintptr) bool {
	c.gone = peekReadable(fd, c.peekBuf[:])
	return true
}

// classifyCallError maps a failed HTTP exchange to E901 (no answer in time,
// including a connect that timed out), E902 (the target could not be
// reached, or closed or reset the connection before a full answer) or E500
// (the target answered, but not in HTTP: a malformed status line or header,
// broken chunked framing, headers or body over the cap). A reset before the
// first byte of an answer reads as a close: the HTTP client reports both
// alike. abort is done with errShutdownAbort when the Server gave up on the
// call.
func classifyCallError(abort context.Context, err error) (code, msg string) {
	if errors.Is(context.Cause(abort), errShutdownAbort) {
		// The target may have processed the transaction; like a timeout,
		// the hub cannot tell, so the code is E901.
		return CodeTimeout, msgShutdownAbort
	}
	var (
		timeout interface{ Timeout() bool } // net.Error's, and fasthttp.ErrTimeout's
		opErr   *net.OpError
		dnsErr  *net.DNSError
	)
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return CodeTargetFailed, msgAnswerTooLarge
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &timeout) && timeout.Timeout():
		return CodeTimeout, msgTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return CodeUnreachable, msgRefusedConn
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return CodeUnreachable, msgResetConn
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, errStaleConn):
		return CodeUnreachable, msgClosedEarly
	case errors.As(err, &opErr), errors.As(err, &dnsErr):
		// Any other socket-level failure: no route, name not found, ...
		return CodeUnreachable, msgUnreachable
	default:
		// The connection worked and bytes came back, but they could not
		// be read as an HTTP answer.
		return CodeTargetFailed, msgNotHTTP
	}
}

// answerParsers hold the JSON parsers of target answers: fastjson parses
// in place, without reflection or allocation, where encoding/json took a
// tenth of a call's CPU.
var answerParsers fastjson.ParserPool

// DecodeAnswer classifies a target's HTTP answer, given its status and body,
// into the response code and message the client gets (SPEC §3, §4):
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
			return CodeTargetFailed, []byte(msgNotProtocol)
		}
		if !validTargetCode(a.code) {
			return CodeTargetFailed, []byte(msgBadTargetCode)
		}
		return targetCode(a.code), bytes.Clone(a.message)
	case status >= 400 && status <= 499:
		return CodeRefused, statusMessage("target refused the request: HTTP ", status, a.message)
	case status >= 500 && status <= 599:
		return CodeTargetFailed, statusMessage("target failed: HTTP ", status, a.message)
	default:
		return CodeTargetFailed, statusMessage("target answered unexpected HTTP ", status, nil)
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
	if string(code) == CodeOK {
		return CodeOK
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

// validTargetCode reports whether code is one a target may send: 0000, Bnnn
// or Ennn with n a decimal digit.
func validTargetCode[T ~string | ~[]byte](code T) bool {
	if len(code) != 4 {
		return false
	}
	if string(code) == CodeOK {
		return true
	}
	if code[0] != 'B' && code[0] != 'E' {
		return false
	}
	for i := 1; i < 4; i++ {
		if code[i] < '0' || code[i] > '9' {
			return false
		}
	}
	return true
}
