package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

// These tests point the real relay binary at targets that answer badly
// (docs/PROTOCOL.md, "Response codes" and "Target protocol"): too much, not the protocol, a code of the wrong form, a
// message that tries to inject a line, no answer at all, half an answer.
// Each answer must become the code the spec names, and count toward the
// breaker exactly when the spec says so.

// maxAnswerBytes is the largest target answer body the hub accepts.
const maxAnswerBytes = 64 << 10

// jsonAnswerOfSize returns a well-formed target answer, code 0000 and a
// message of x's, exactly n bytes long.
func jsonAnswerOfSize(n int) string {
	head, tail := `{"code":"0000","message":"`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// injectingMessage is a target message full of control characters that
// would, relayed raw, end the response line early and forge another.
const injectingMessage = "line1\nline2\r\n-|0000|forged\x00\x07\t\x1b[31mred\x7f end"

// sickServer is an httptest target whose answer is chosen by the first
// path element: POST /NAME/tx answers sickAnswers[NAME]. Configuring
// --target NAME=URL/NAME gives each answer a target, and so a breaker, of
// its own. It counts calls per answer. It is safe for concurrent use.
type sickServer struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int // guarded by mu
}

// sickAnswer is how a sickServer answers: the status, the body and, for a
// redirect, where to. It is a plain value.
type sickAnswer struct {
	status   int
	body     string
	location string
}

// sickAnswers are the answers a sickServer plays, by name.
var sickAnswers = map[string]sickAnswer{
	"SMALL":        {http.StatusOK, `{"code":"0000","message":"ok"}`, ""},
	"EXACT":        {http.StatusOK, jsonAnswerOfSize(maxAnswerBytes), ""},
	"OVER":         {http.StatusOK, jsonAnswerOfSize(maxAnswerBytes + 1), ""},
	"HUGE":         {http.StatusOK, jsonAnswerOfSize(1 << 20), ""},
	"HTML":         {http.StatusOK, `<html><body>502 Bad Gateway</body></html>`, ""},
	"EMPTY":        {http.StatusOK, ``, ""},
	"NOCODE":       {http.StatusOK, `{"message":"no code here"}`, ""},
	"CODE-X12":     {http.StatusOK, `{"code":"X12","message":"m"}`, ""},
	"CODE-5DIGITS": {http.StatusOK, `{"code":"00000","message":"m"}`, ""},
	"CODE-LOWER":   {http.StatusOK, `{"code":"b201","message":"m"}`, ""},
	"CODE-SHORT":   {http.StatusOK, `{"code":"E50","message":"m"}`, ""},
	"CODE-LETTER":  {http.StatusOK, `{"code":"B2O1","message":"m"}`, ""},
	"CODE-0001":    {http.StatusOK, `{"code":"0001","message":"m"}`, ""},
	"CODE-NUMBER":  {http.StatusOK, `{"code":201,"message":"m"}`, ""},
	"CODE-NULL":    {http.StatusOK, `{"code":null,"message":"m"}`, ""},
	"CONTROL":      {http.StatusOK, mustJSON(map[string]string{"code": "0000", "message": injectingMessage}), ""},
	"TRAILING":     {http.StatusOK, `{"code":"0000","message":"ok"} and then some`, ""},
	"HTTP204":      {http.StatusNoContent, ``, ""},
	"REDIRECT":     {http.StatusTemporaryRedirect, `{"code":"0000","message":"go elsewhere"}`, "/SMALL/tx"},
	"HTTP404":      {http.StatusNotFound, `not found`, ""},
	"HTTP503":      {http.StatusServiceUnavailable, `{"code":"0000","message":"the status wins"}`, ""},
}

// mustJSON returns v encoded as JSON, for fixed test data.
func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// newSickServer starts a sickServer, closed when the test ends.
func newSickServer(t *testing.T) *sickServer {
	s := &sickServer{calls: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		s.mu.Lock()
		s.calls[name]++
		s.mu.Unlock()
		ans, ok := sickAnswers[name]
		if !ok {
			http.Error(w, "no such sick answer", http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if ans.location != "" {
			w.Header().Set("Location", ans.location)
		}
		w.WriteHeader(ans.status)
		// The hub stops reading a huge answer; the write error is expected.
		_, _ = io.WriteString(w, ans.body)
	}))
	t.Cleanup(s.Close)
	return s
}

// callsFor returns how many calls the answer name got.
func (s *sickServer) callsFor(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[name]
}

// rawTarget is a TCP server that reads one HTTP request per connection
// and then hands the connection to serve, for target failures net/http's
// server does not produce: no answer at all, half an answer. It counts the
// requests it read. It is safe for concurrent use.
type rawTarget struct {
	ln       net.Listener
	serve    func(*net.TCPConn)
	mu       sync.Mutex
	requests int            // guarded by mu
	conns    []*net.TCPConn // guarded by mu
	wg       sync.WaitGroup
}

// newRawTarget starts a rawTarget that hands each connection, once its
// request is read, to serve; it is closed, and every connection with it,
// when the test ends.
func newRawTarget(t *testing.T, serve func(*net.TCPConn)) *rawTarget {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rt := &rawTarget{ln: ln, serve: serve}
	rt.wg.Add(1)
	go rt.acceptLoop()
	t.Cleanup(rt.close)
	return rt
}

// URL returns the target's base URL.
func (rt *rawTarget) URL() string { return "http://" + rt.ln.Addr().String() }

// Requests returns how many requests the target has read.
func (rt *rawTarget) Requests() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.requests
}

// acceptLoop accepts connections until the listener is closed.
func (rt *rawTarget) acceptLoop() {
	defer rt.wg.Done()
	for {
		nc, err := rt.ln.Accept()
		if err != nil {
			return
		}
		tc := nc.(*net.TCPConn)
		rt.mu.Lock()
		rt.conns = append(rt.conns, tc)
		rt.mu.Unlock()
		rt.wg.Add(1)
		go rt.serveConn(tc)
	}
}

// serveConn reads one request from tc, counts it and hands tc to serve.
func (rt *rawTarget) serveConn(tc *net.TCPConn) {
	defer rt.wg.Done()
	defer tc.Close()
	req, err := http.ReadRequest(bufio.NewReader(tc))
	if err != nil {
		return
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return
	}
	rt.mu.Lock()
	rt.requests++
	rt.mu.Unlock()
	rt.serve(tc)
}

// close stops accepting, closes every connection and waits for their
// goroutines.
func (rt *rawTarget) close() {
	_ = rt.ln.Close()
	rt.mu.Lock()
	for _, tc := range rt.conns {
		_ = tc.Close()
	}
	rt.mu.Unlock()
	rt.wg.Wait()
}

// neverAnswer reads until the hub gives up and closes the connection.
func neverAnswer(tc *net.TCPConn) { _, _ = io.Copy(io.Discard, tc) }

// partialAnswer is the start of an answer whose body is promised 200 bytes
// long and stops after 20.
const partialAnswer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n" +
	`{"code":"0000","mess`

// resetMidBody sends half an answer, then resets the connection.
func resetMidBody(tc *net.TCPConn) {
	_, _ = io.WriteString(tc, partialAnswer)
	_ = tc.SetLinger(0)
	_ = tc.Close()
}

// closeMidBody sends half an answer, then closes the connection cleanly.
func closeMidBody(tc *net.TCPConn) {
	_, _ = io.WriteString(tc, partialAnswer)
	_ = tc.CloseWrite()
	_, _ = io.Copy(io.Discard, tc)
}

// answerNotHTTP answers in another protocol altogether, as a service
// listening on the wrong port would.
func answerNotHTTP(tc *net.TCPConn) {
	_, _ = io.WriteString(tc, "SSH-2.0-OpenSSH_9.6\r\n")
	_ = tc.CloseWrite()
	_, _ = io.Copy(io.Discard, tc)
}

// badChunks answers a status line and headers, then a chunked body whose
// framing is broken.
func badChunks(tc *net.TCPConn) {
	_, _ = io.WriteString(tc, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"zz\r\nnot a chunk\r\n")
	_, _ = io.Copy(io.Discard, tc)
}

func TestSickTargetAnswers(t *testing.T) {
	const targetTimeout = 300 * time.Millisecond
	sick := newSickServer(t)
	hang := newRawTarget(t, neverAnswer)
	reset := newRawTarget(t, resetMidBody)
	cut := newRawTarget(t, closeMidBody)
	notHTTP := newRawTarget(t, answerNotHTTP)
	chunks := newRawTarget(t, badChunks)

	type testCase struct {
		name    string
		target  string
		url     string
		calls   func() int
		code    string
		message *regexp.Regexp // when set, the message must match
		failure bool           // counts toward the breaker (docs/PROTOCOL.md, "Response codes")
	}
	sickCase := func(name, target, code string, message *regexp.Regexp, failure bool) testCase {
		return testCase{
			name: name, target: target, url: sick.URL + "/" + target,
			calls: func() int { return sick.callsFor(target) },
			code:  code, message: message, failure: failure,
		}
	}
	rawCase := func(name, target string, rt *rawTarget, code string) testCase {
		return testCase{name: name, target: target, url: rt.URL(), calls: rt.Requests, code: code, failure: true}
	}
	tests := []testCase{
		sickCase("small answer is relayed", "SMALL", "0000", regexp.MustCompile(`^ok$`), false),
		sickCase("answer of exactly 64 KiB is relayed", "EXACT", "0000", regexp.MustCompile(`^x+$`), false),
		sickCase("answer one byte over 64 KiB is E500", "OVER", "E500", nil, true),
		sickCase("answer of 1 MiB is E500", "HUGE", "E500", nil, true),
		sickCase("HTML answer is E500", "HTML", "E500", nil, true),
		sickCase("empty answer is E500", "EMPTY", "E500", nil, true),
		sickCase("JSON without a code is E500", "NOCODE", "E500", nil, true),
		sickCase("code X12 is E500", "CODE-X12", "E500", nil, true),
		sickCase("code of five digits is E500", "CODE-5DIGITS", "E500", nil, true),
		sickCase("lower-case business code is E500", "CODE-LOWER", "E500", nil, true),
		sickCase("code of three characters is E500", "CODE-SHORT", "E500", nil, true),
		sickCase("code with a letter for a digit is E500", "CODE-LETTER", "E500", nil, true),
		sickCase("code 0001 is E500", "CODE-0001", "E500", nil, true),
		sickCase("code as a JSON number is E500", "CODE-NUMBER", "E500", nil, true),
		sickCase("null code is E500", "CODE-NULL", "E500", nil, true),
		sickCase("control characters in the message are cleaned", "CONTROL", "0000",
			regexp.MustCompile(`^line1\s*line2\s*-\|0000\|forged\s*\[31mred\s*end$`), false),
		sickCase("JSON with trailing bytes is E500", "TRAILING", "E500", nil, true),
		sickCase("HTTP 204 without a body is E500", "HTTP204", "E500", nil, true),
		sickCase("HTTP 307 is E500 and not followed", "REDIRECT", "E500", nil, true),
		sickCase("HTTP 404 is E400, not a failure", "HTTP404", "E400", nil, false),
		sickCase("HTTP 503 is E500 whatever the body", "HTTP503", "E500", nil, true),
		rawCase("no answer is E901 at --target-timeout", "HANG", hang, "E901"),
		rawCase("reset in the middle of the body is E902", "RESET", reset, "E902"),
		rawCase("close in the middle of the body is E902", "CUT", cut, "E902"),
		rawCase("answer that is not HTTP is E500", "NOTHTTP", notHTTP, "E500"),
		rawCase("broken chunked framing is E500", "CHUNKS", chunks, "E500"),
	}
	// Every target trips on its first counted failure, so whether a code
	// counts shows on the very next request.
	args := []string{"--fail-threshold", "1", "--reset-timeout", "1m", "--target-timeout", targetTimeout.String()}
	for _, tt := range tests {
		args = append(args, "--target", tt.target+"="+tt.url)
	}
	h := startRelay(t, nil, args...)
	c := hubtest.Dial(t, h.Addr())

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// When the target answers its way,
			start := time.Now()
			a := c.Exchange(fmt.Sprintf("%s-1|%s|BAL 1", tt.target, tt.target))
			took := time.Since(start)

			// the client gets one clean line with the code the spec names,
			require.Equal(t, tt.target+"-1", a.TxID, "not the answer to the request: %s", a)
			require.Equal(t, tt.code, a.Code, a.String())
			assert.NotRegexp(t, `[\x00-\x1f\x7f]`, a.Message, "control characters left in the message")
			if tt.message != nil {
				assert.Regexp(t, tt.message, a.Message)
			}
			assert.Equal(t, 1, tt.calls(), "the target must get the transaction exactly once")
			if tt.code == "E901" {
				assert.GreaterOrEqual(t, took, targetTimeout, "E901 before --target-timeout")
				assert.Less(t, took, targetTimeout+time.Second, "E901 long after --target-timeout")
			}

			// and the breaker counts it as a failure exactly when the spec
			// says so.
			again := c.Exchange(fmt.Sprintf("%s-2|%s|BAL 1", tt.target, tt.target))
			if tt.failure {
				assert.Equal(t, "E904", again.Code, "%s must count as a failure: %s", tt.code, again)
				assert.Equal(t, 1, tt.calls(), "an open breaker called the target")
				h.waitTransitions(t, tt.target, "CLOSED->OPEN")
			} else {
				assert.Equal(t, tt.code, again.Code, "%s must not count as a failure: %s", tt.code, again)
				assert.Equal(t, 2, tt.calls())
				assert.Empty(t, h.transitions(t, tt.target))
			}
		})
	}
	assert.Equal(t, 2, sick.callsFor("SMALL"), "the hub followed the redirect and sent the transaction again")
}
