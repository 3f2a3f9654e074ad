package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"syscall"
	"time"
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

// target is the HTTP side of one configured target. It is safe for
// concurrent use: its fields are set once by New.
type target struct {
	url     string // {base URL}/tx
	client  *http.Client
	timeout time.Duration
}

// call sends one transaction to the target and classifies the outcome into a
// response code and message (SPEC §3, §4). base bounds the call's life but is
// never the client connection's context: a client that goes away does not
// cancel a call that may already have reached the target. buf is scratch
// space for the answer body; the returned message may alias it.
//
// The request is sent once. The hub adds no retries, and http.Transport
// retries a POST on its own only when not a byte of it was written
// (nothingWrittenError in net/http's shouldRetryRequest), so a transaction
// that may have reached the target is never sent twice. Redirects are not
// followed (see newHTTPClient): a 307 would resend the body elsewhere.
func (t *target) call(base context.Context, txid string, payload []byte, buf []byte) (code string, msg []byte, _ []byte) {
	ctx, cancel := context.WithTimeout(base, t.timeout)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(payload))
	if err != nil {
		// The URL was validated by New, so this is a bug, not a target fault.
		panic("relay: build target request: " + err.Error())
	}
	req.Header["X-Tx-Id"] = []string{txid}
	req.Header["Content-Type"] = contentTypeText

	resp, err := t.client.Do(req)
	if err != nil {
		code, m := classifyCallError(ctx, err)
		return code, []byte(m), buf
	}
	buf, tooLarge, err := readCapped(resp.Body, buf[:0], maxAnswerBytes)
	// Closing after a read to EOF returns the connection to the pool; after
	// an error or an over-long body it discards the connection.
	resp.Body.Close()
	if err != nil {
		code, m := classifyCallError(ctx, err)
		return code, []byte(m), buf
	}
	if tooLarge {
		return CodeTargetFailed, []byte(msgAnswerTooLarge), buf
	}
	code, msg = DecodeAnswer(resp.StatusCode, buf)
	return code, msg, buf
}

// contentTypeText is shared by every request: http.Transport only reads
// request headers.
var contentTypeText = []string{"text/plain; charset=utf-8"}

// readCapped reads r to EOF, appending to buf, but no more than limit bytes:
// tooLarge reports a body longer than limit, whose rest is left unread.
func readCapped(r io.Reader, buf []byte, limit int) (_ []byte, tooLarge bool, err error) {
	for {
		if len(buf) > limit {
			return buf, true, nil
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(max(cap(buf), 512), limit+1-len(buf)))
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), limit+1)])
		buf = buf[:len(buf)+n]
		switch {
		case len(buf) > limit:
			return buf, true, nil
		case err == io.EOF:
			return buf, false, nil
		case err != nil:
			return buf, false, err
		}
	}
}

// classifyCallError maps a failed HTTP exchange to E901 (no answer in time,
// including a connect that timed out), E902 (the target could not be
// reached, or closed or reset the connection before a full answer) or E500
// (the target answered, but not in HTTP: a malformed status line or header,
// broken chunked framing, headers over the cap). ctx is the call's context,
// whose cause tells a timeout from a shutdown abort.
func classifyCallError(ctx context.Context, err error) (code, msg string) {
	if errors.Is(context.Cause(ctx), errShutdownAbort) {
		// The target may have processed the transaction; like a timeout,
		// the hub cannot tell, so the code is E901.
		return CodeTimeout, msgShutdownAbort
	}
	var (
		ne     net.Error
		opErr  *net.OpError
		dnsErr *net.DNSError
	)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return CodeTimeout, msgTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return CodeUnreachable, msgRefusedConn
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return CodeUnreachable, msgResetConn
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return CodeUnreachable, msgClosedEarly
	case errors.As(err, &opErr), errors.As(err, &dnsErr):
		// Any other socket-level failure: no route, name not found, ...
		return CodeUnreachable, msgUnreachable
	default:
		// The connection worked and bytes came back, but net/http could
		// not read them as an HTTP answer.
		return CodeTargetFailed, msgNotHTTP
	}
}

// targetAnswer is the JSON body of a target's answer (SPEC §4).
type targetAnswer struct {
	Code    *string `json:"code"`
	Message string  `json:"message"`
}

// DecodeAnswer classifies a target's HTTP answer, given its status and body,
// into the response code and message the client gets (SPEC §3, §4):
//
//   - 200 with a JSON object whose "code" is 0000, Bnnn or Ennn: that code and
//     the object's "message", relayed as they are;
//   - 4xx: E400;
//   - 5xx, a 200 body that is not such JSON, a code of another form, or any
//     other status: E500.
//
// The returned message is raw (the response writer cleans and caps it). It
// never panics, whatever the body.
func DecodeAnswer(status int, body []byte) (code string, msg []byte) {
	var a targetAnswer
	jsonErr := json.Unmarshal(body, &a)
	hasAnswer := jsonErr == nil && a.Code != nil
	switch {
	case status == http.StatusOK:
		if !hasAnswer {
			return CodeTargetFailed, []byte(msgNotProtocol)
		}
		if !validTargetCode(*a.Code) {
			return CodeTargetFailed, []byte(msgBadTargetCode)
		}
		return *a.Code, []byte(a.Message)
	case status >= 400 && status <= 499:
		return CodeRefused, statusMessage("target refused the request: HTTP ", status, a.Message, jsonErr == nil)
	case status >= 500 && status <= 599:
		return CodeTargetFailed, statusMessage("target failed: HTTP ", status, a.Message, jsonErr == nil)
	default:
		return CodeTargetFailed, statusMessage("target answered unexpected HTTP ", status, "", false)
	}
}

// statusMessage builds "<head><status>" and appends ": <detail>" when the
// target explained itself in a JSON message.
func statusMessage(head string, status int, detail string, hasDetail bool) []byte {
	b := make([]byte, 0, len(head)+3+2+len(detail))
	b = append(b, head...)
	b = strconv.AppendInt(b, int64(status), 10)
	if hasDetail && detail != "" {
		b = append(b, ": "...)
		b = append(b, detail...)
	}
	return b
}

// validTargetCode reports whether code is one a target may send: 0000, Bnnn
// or Ennn with n a decimal digit.
func validTargetCode(code string) bool {
	if len(code) != 4 {
		return false
	}
	if code == CodeOK {
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

// newHTTPClient builds the client shared by all targets when Config has none.
// The transport keeps up to maxIdlePerHost idle connections per host, and
// never caps connections per host, so a full bulkhead's worth of concurrent
// calls never waits for a connection and, once warm, never dials. It ignores proxy settings from the
// environment (a hub talks to its targets directly), asks for no
// compression, and follows no redirects.
func newHTTPClient(maxIdlePerHost int, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         dialer.DialContext,
		MaxIdleConns:        0, // no overall cap: MaxIdleConnsPerHost bounds each target
		MaxIdleConnsPerHost: max(maxIdlePerHost, http.DefaultMaxIdleConnsPerHost),
		MaxConnsPerHost:     0,
		IdleConnTimeout:     30 * time.Second,
		TLSHandshakeTimeout: timeout,
		// A healthy answer's headers are a few hundred bytes; the cap keeps
		// a broken target from making the hub buffer megabytes of them.
		MaxResponseHeaderBytes: maxAnswerBytes,
		ExpectContinueTimeout:  0,
		DisableCompression:     true,
		DisableKeepAlives:      false,
	}
	return &http.Client{
		Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
