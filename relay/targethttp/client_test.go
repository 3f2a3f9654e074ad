package targethttp

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/protocol"
)

func TestDecodeAnswer(t *testing.T) {
	tests := []struct {
		name     string
		status   int
		body     string
		wantCode string
		wantMsg  string
	}{
		{name: "success", status: 200, body: `{"code":"0000","message":"balance=99500"}`, wantCode: "0000", wantMsg: "balance=99500"},
		{name: "business rejection", status: 200, body: `{"code":"B201","message":"insufficient funds"}`, wantCode: "B201", wantMsg: "insufficient funds"},
		{name: "target's own E500", status: 200, body: `{"code":"E500","message":"ledger down"}`, wantCode: "E500", wantMsg: "ledger down"},
		{name: "target's own other E code", status: 200, body: `{"code":"E123","message":"x"}`, wantCode: "E123", wantMsg: "x"},
		{name: "extra fields", status: 200, body: `{"code":"0000","message":"ok","extra":[1,2]}`, wantCode: "0000", wantMsg: "ok"},
		{name: "no message", status: 200, body: `{"code":"0000"}`, wantCode: "0000", wantMsg: ""},
		{name: "escaped newline kept raw", status: 200, body: `{"code":"0000","message":"a\nb"}`, wantCode: "0000", wantMsg: "a\nb"},
		{name: "no code", status: 200, body: `{"message":"ok"}`, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "code not a string", status: 200, body: `{"code":0}`, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "lower-case code", status: 200, body: `{"code":"b201"}`, wantCode: "E500", wantMsg: msgBadTargetCode + suffixInDoubt},
		{name: "code too long", status: 200, body: `{"code":"00000"}`, wantCode: "E500", wantMsg: msgBadTargetCode + suffixInDoubt},
		{name: "code of other letter", status: 200, body: `{"code":"X201"}`, wantCode: "E500", wantMsg: msgBadTargetCode + suffixInDoubt},
		{name: "code with letters", status: 200, body: `{"code":"B2x1"}`, wantCode: "E500", wantMsg: msgBadTargetCode + suffixInDoubt},
		{name: "not json", status: 200, body: `balance=99500`, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "json array", status: 200, body: `["0000"]`, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "empty body", status: 200, body: ``, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "trailing garbage", status: 200, body: `{"code":"0000"}x`, wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt},
		{name: "400", status: 400, body: `bad`, wantCode: "E400", wantMsg: "target refused the request: HTTP 400"},
		{name: "404 with json message", status: 404, body: `{"code":"E400","message":"no route"}`, wantCode: "E400", wantMsg: "target refused the request: HTTP 404: no route"},
		{name: "499", status: 499, body: ``, wantCode: "E400", wantMsg: "target refused the request: HTTP 499"},
		{name: "500 with json", status: 500, body: `{"code":"E500","message":"injected failure"}`, wantCode: "E500", wantMsg: "target failed: HTTP 500: injected failure"},
		{name: "500 even if json says success", status: 500, body: `{"code":"0000"}`, wantCode: "E500", wantMsg: "target failed: HTTP 500"},
		{name: "503", status: 503, body: `<html>`, wantCode: "E500", wantMsg: "target failed: HTTP 503"},
		{name: "201", status: 201, body: `{"code":"0000"}`, wantCode: "E500", wantMsg: "target answered unexpected HTTP 201"},
		{name: "204", status: 204, body: ``, wantCode: "E500", wantMsg: "target answered unexpected HTTP 204"},
		{name: "302", status: 302, body: ``, wantCode: "E500", wantMsg: "target answered unexpected HTTP 302"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := DecodeAnswer(tt.status, []byte(tt.body))
			assert.Equal(t, tt.wantCode, code)
			assert.Equal(t, tt.wantMsg, string(msg))
		})
	}
}

// waitForClientGone blocks a handler until its client hangs up. It reads the
// body first: net/http notices a closed connection (and cancels the request's
// context) only once the body has been consumed.
func waitForClientGone(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}

// testTarget returns a Client posting to srvURL's /tx with a pool of its
// own, for a bulkhead of 10.
func testTarget(t *testing.T, srvURL string, timeout time.Duration) *Client {
	t.Helper()
	return testTargetWith(t, Config{URL: srvURL, Timeout: timeout})
}

// testTargetWith returns the Client of cfg, whose URL is the target's base
// URL; a zero MaxInflight means 10 and a nil Conns a pool of its own.
func testTargetWith(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.URL = strings.TrimRight(cfg.URL, "/") + "/tx"
	if cfg.MaxInflight == 0 {
		cfg.MaxInflight = 10
	}
	if cfg.Conns == nil {
		cfg.Conns = NewConns(nil)
	}
	tg, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(tg.CloseIdle)
	return tg
}

func TestTargetCallSendsTheTransaction(t *testing.T) {
	type seen struct {
		method, path, txid, contentType, body string
		encoding                              string
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, r.Header.Get("X-Tx-Id"), r.Header.Get("Content-Type"), string(body), r.Header.Get("Accept-Encoding")}
		_, _ = io.WriteString(w, `{"code":"0000","message":"balance=99500"}`)
	}))
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL+"/", time.Second)

	payload := []byte("XFER 1|2 \x00\xff 3")
	code, msg := codeMsg(tg.Call([]byte("TX-1"), payload))

	assert.Equal(t, "0000", code)
	assert.Equal(t, "balance=99500", string(msg))
	s := <-got
	assert.Equal(t, http.MethodPost, s.method)
	assert.Equal(t, "/tx", s.path)
	assert.Equal(t, "TX-1", s.txid)
	assert.Equal(t, "text/plain; charset=utf-8", s.contentType)
	assert.Equal(t, string(payload), s.body, "payload must be forwarded byte for byte")
	assert.Empty(t, s.encoding, "the hub asks for no compression")
}

func TestTargetCallClassifies(t *testing.T) {
	const timeout = 100 * time.Millisecond
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		wantCode  string
		wantMsg   string
		wantStage Stage
	}{
		{
			name: "success",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			},
			wantCode: "0000", wantMsg: "ok", wantStage: Answered,
		},
		{
			name: "business rejection",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, `{"code":"B201","message":"insufficient funds"}`)
			},
			wantCode: "B201", wantMsg: "insufficient funds", wantStage: Answered,
		},
		{
			name: "fixture fail mode",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(500)
				_, _ = io.WriteString(w, `{"code":"E500","message":"injected"}`)
			},
			wantCode: "E500", wantMsg: "target failed: HTTP 500: injected", wantStage: Answered,
		},
		{
			name:     "4xx",
			handler:  func(w http.ResponseWriter, r *http.Request) { http.Error(w, "nope", http.StatusUnprocessableEntity) },
			wantCode: "E400", wantMsg: "target refused the request: HTTP 422", wantStage: Answered,
		},
		{
			name:     "not json",
			handler:  func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "OK") },
			wantCode: "E500", wantMsg: msgNotProtocol + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
		{
			name: "answer over the cap",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, `{"code":"0000","message":"`+strings.Repeat("x", maxAnswerBytes)+`"}`)
			},
			wantCode: "E500", wantMsg: msgAnswerTooLarge + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
		{
			name: "redirect not followed",
			handler: func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/tx" {
					http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
					return
				}
				_, _ = io.WriteString(w, `{"code":"0000","message":"resent"}`)
			},
			wantCode: "E500", wantMsg: "target answered unexpected HTTP 307", wantStage: Answered,
		},
		{
			name: "headers over the cap",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Padding", strings.Repeat("p", maxAnswerBytes))
				_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			},
			wantCode: "E500", wantMsg: msgNotHTTP + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
		{
			name: "no headers in time",
			handler: func(w http.ResponseWriter, r *http.Request) {
				waitForClientGone(r)
			},
			wantCode: "E901", wantMsg: msgTimeout + suffixInDoubt, wantStage: Sent,
		},
		{
			name: "body stalls",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "100")
				_, _ = io.WriteString(w, `{"code":`)
				w.(http.Flusher).Flush()
				waitForClientGone(r)
			},
			wantCode: "E901", wantMsg: msgTimeout + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
		{
			name: "closed without answer",
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					c.Close()
				}
			},
			wantCode: "E902", wantMsg: msgClosedEarly + suffixInDoubt, wantStage: Sent,
		},
		{
			// fasthttp reads a reset before the first byte of an answer as
			// the end of the stream; the connection's record tells it apart.
			name: "reset before the answer",
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					_ = c.(*net.TCPConn).SetLinger(0)
					c.Close()
				}
			},
			wantCode: "E902", wantMsg: msgResetConn + suffixInDoubt, wantStage: Sent,
		},
		{
			name: "reset mid body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, buf, err := w.(http.Hijacker).Hijack()
				if err == nil {
					_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"code\":")
					_ = buf.Flush()
					_ = c.(*net.TCPConn).SetLinger(0)
					c.Close()
				}
			},
			wantCode: "E902", wantMsg: msgResetConn + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
		{
			name: "closed mid body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				c, buf, err := w.(http.Hijacker).Hijack()
				if err == nil {
					_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"code\":")
					_ = buf.Flush()
					c.Close()
				}
			},
			wantCode: "E902", wantMsg: msgClosedEarly + suffixInDoubt, wantStage: AnswerPartlyRead,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			t.Cleanup(srv.Close)
			tg := testTarget(t, srv.URL, timeout)
			res := tg.Call([]byte("TX1"), []byte("BAL 1"))
			assert.Equal(t, tt.wantCode, res.Code)
			assert.Equal(t, tt.wantMsg, string(res.Msg))
			assert.Equal(t, tt.wantStage, res.Stage)
			assert.Equal(t, tt.wantStage.InDoubt(), res.BytesSent > 0, "bytes sent: %d", res.BytesSent)
			assert.False(t, res.Retried)
		})
	}
}

func TestTargetCallRefused(t *testing.T) {
	// Given a port nobody listens on any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	tg := testTarget(t, "http://"+addr, time.Second)
	code, msg := codeMsg(tg.Call([]byte("TX1"), nil))
	assert.Equal(t, "E902", code)
	assert.Equal(t, msgRefusedConn+suffixNotSent, string(msg))
}

func TestCallAborted(t *testing.T) {
	entered := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		waitForClientGone(r)
	}))
	t.Cleanup(srv.Close)
	conns := NewConns(nil)
	tg := testTargetWith(t, Config{URL: srv.URL, Timeout: time.Minute, Conns: conns})
	go func() {
		<-entered
		conns.Abort()
	}()

	// The call blocks reading the answer until the abort cuts its
	// connection, long before the minute of its timeout.
	res := tg.Call([]byte("TX1"), nil)
	assert.Equal(t, "E901", res.Code)
	assert.Equal(t, msgAborted+suffixInDoubt, string(res.Msg), "the target may have processed it")
	assert.Equal(t, Sent, res.Stage)

	res = tg.Call([]byte("TX2"), nil)
	assert.Equal(t, "E901", res.Code, "no call goes out once aborted")
	assert.Equal(t, msgAborted+suffixNotSent, string(res.Msg))
	assert.Equal(t, NotSent, res.Stage)
	assert.False(t, res.Retried)
}

// TestTargetCallSkipsConnectionsClosedWhileIdle has the target close every
// kept-alive connection once it has answered, as servers do when a
// connection stays idle past their keep-alive timeout: the next transaction
// must not be lost to the dead connection (E902) but go out, once, on a
// fresh one. Over TLS the target's close sends a close_notify first. The
// close is caught whether or not the last call's deadline has passed.
func TestTargetCallSkipsConnectionsClosedWhileIdle(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, tt := range []struct {
		name   string
		useTLS bool
		idle   time.Duration // after the close, before the next call
	}{
		{name: "http", useTLS: false},
		{name: "https", useTLS: true},
		{name: "http idle past the timeout", useTLS: false, idle: 2 * timeout},
		{name: "https idle past the timeout", useTLS: true, idle: 2 * timeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				_, _ = io.ReadAll(r.Body)
				_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			}))
			closed := make(chan struct{}, 10)
			var dials atomic.Int32
			srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
				switch st {
				case http.StateNew:
					dials.Add(1)
				case http.StateIdle:
					c.Close()
				case http.StateClosed:
					closed <- struct{}{}
				}
			}
			startServer(srv, tt.useTLS)
			t.Cleanup(srv.Close)
			tg := testTarget(t, srv.URL, timeout)
			trustTestServer(tg, srv, tt.useTLS)

			for i := range 3 {
				code, msg := codeMsg(tg.Call([]byte("TX"), []byte("DEP 1 5")))
				require.Equal(t, "0000", code, "call %d: %s", i, msg)
				select {
				case <-closed:
				case <-time.After(5 * time.Second):
					t.Fatal("the target did not close the connection")
				}
				// Only real time expires the last call's deadline.
				time.Sleep(tt.idle)
			}
			assert.Equal(t, int32(3), calls.Load(), "each transaction reaches the target exactly once")
			assert.Equal(t, int32(3), dials.Load(), "each transaction after the first needs a fresh connection")
		})
	}
}

// TestTargetCallReusesConnectionsIdleLongerThanTheTimeout leaves a
// kept-alive connection idle for twice the call timeout, so that the
// deadline of its last call has passed, and calls again: the healthy
// connection must carry the call, not be given up for a new handshake.
func TestTargetCallReusesConnectionsIdleLongerThanTheTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[useTLS], func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.ReadAll(r.Body)
				_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			}))
			dials := countDials(srv)
			startServer(srv, useTLS)
			t.Cleanup(srv.Close)
			tg := testTarget(t, srv.URL, timeout)
			trustTestServer(tg, srv, useTLS)

			for i := range 3 {
				if i > 0 {
					// Only real time expires the previous call's deadline.
					time.Sleep(2 * timeout)
				}
				code, msg := codeMsg(tg.Call([]byte("TX"), []byte("BAL 1")))
				require.Equal(t, "0000", code, "call %d: %s", i, msg)
			}
			assert.Equal(t, int32(1), dials.Load(), "the idle connection is reused")
		})
	}
}

// TestTargetIdleTimeout checks that the Client closes a connection left
// unused for its IdleTimeout, and not before.
func TestTargetIdleTimeout(t *testing.T) {
	const idle = 150 * time.Millisecond
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
	}))
	closed := make(chan time.Time, 1)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			closed <- time.Now()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	tg := testTargetWith(t, Config{URL: srv.URL, Timeout: time.Second, IdleTimeout: idle})
	require.Equal(t, idle, tg.IdleTimeout())

	start := time.Now()
	code, msg := codeMsg(tg.Call([]byte("TX"), nil))
	require.Equal(t, "0000", code, string(msg))

	select {
	case at := <-closed:
		assert.GreaterOrEqual(t, at.Sub(start), idle, "closed before it was idle for IdleTimeout")
	case <-time.After(DefaultIdleTimeout / 2):
		t.Fatal("the idle connection was not closed after IdleTimeout")
	}
}

func TestNewIdleTimeout(t *testing.T) {
	base := Config{URL: "http://127.0.0.1:1/tx", Timeout: time.Second, MaxInflight: 1, Conns: NewConns(nil)}
	tg, err := New(base)
	require.NoError(t, err)
	assert.Equal(t, DefaultIdleTimeout, tg.IdleTimeout(), "zero means the default")

	bad := base
	bad.IdleTimeout = -time.Second
	_, err = New(bad)
	assert.ErrorContains(t, err, "IdleTimeout must not be negative")
}

// TestTargetOnDialCountsConnectionsOpened checks that OnDial is called once
// per connection opened: not for a kept-alive connection reused, and not
// for a connect that failed.
func TestTargetOnDialCountsConnectionsOpened(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
	}))
	accepted := countDials(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	var opened atomic.Int32
	tg := testTargetWith(t, Config{URL: srv.URL, Timeout: time.Second, OnDial: func() { opened.Add(1) }})

	for range 3 {
		code, msg := codeMsg(tg.Call([]byte("TX"), nil))
		require.Equal(t, "0000", code, string(msg))
	}
	assert.Equal(t, int32(1), opened.Load(), "one connection, kept alive")

	srv.CloseClientConnections()
	code, msg := codeMsg(tg.Call([]byte("TX"), nil))
	require.Equal(t, "0000", code, string(msg))
	assert.Equal(t, int32(2), opened.Load(), "a fresh connection once the target closed the first")
	assert.Equal(t, accepted.Load(), opened.Load(), "as many as the target accepted")

	srv.Close()
	code, _ = codeMsg(tg.Call([]byte("TX"), nil))
	require.Equal(t, "E902", code)
	assert.Equal(t, int32(2), opened.Load(), "a refused connect opens nothing")
}

// startServer starts srv, over TLS when useTLS.
func startServer(srv *httptest.Server, useTLS bool) {
	if useTLS {
		srv.StartTLS()
	} else {
		srv.Start()
	}
}

// trustTestServer makes tg trust srv's own certificate when useTLS: the
// test server's certificate is its own.
func trustTestServer(tg *Client, srv *httptest.Server, useTLS bool) {
	if useTLS {
		tg.tls.RootCAs = srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	}
}

// TestTargetCallSkipsEveryStaleConnection fills the pool with connections,
// has the target close them all (as a target restarting does), and sends
// one more transaction: it must try the dead connections one by one without
// writing to any, then reach the target, once, on a fresh one.
func TestTargetCallSkipsEveryStaleConnection(t *testing.T) {
	const pooled = 4
	var calls atomic.Int32
	entered := make(chan struct{}, pooled)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= pooled {
			entered <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
	}))
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, 5*time.Second)
	for _, code := range callsTogether(tg, pooled, entered, func() { close(release) }) {
		require.Equal(t, "0000", code)
	}

	srv.CloseClientConnections()
	code, msg := codeMsg(tg.Call([]byte("TX-LAST"), []byte("DEP 1 5")))

	assert.Equal(t, "0000", code, string(msg))
	assert.Equal(t, int32(pooled+1), calls.Load(), "the last transaction reaches the target exactly once")
}

// TestTargetCallNeverRetries sends a transaction over a kept-alive connection
// that the target closes after reading the request: net/http could retry a
// request on a reused connection, but must not for a POST that was written.
func TestTargetCallNeverRetries(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		_, _ = io.ReadAll(r.Body)
		if n == 1 {
			_, _ = io.WriteString(w, `{"code":"0000","message":"first"}`)
			return
		}
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			c.Close()
		}
	}))
	dials := countDials(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, time.Second)

	code, _ := codeMsg(tg.Call([]byte("TX1"), []byte("DEP 1 5")))
	require.Equal(t, "0000", code)
	code, msg := codeMsg(tg.Call([]byte("TX2"), []byte("DEP 1 5")))

	assert.Equal(t, "E902", code)
	assert.Equal(t, msgClosedEarly+suffixInDoubt, string(msg))
	assert.Equal(t, int32(2), calls.Load(), "the second transaction must reach the target exactly once")
	assert.Equal(t, int32(1), dials.Load(), "the second call must have used the kept-alive connection")
}

// countDials counts the connections an unstarted test server accepts.
func countDials(srv *httptest.Server) *atomic.Int32 {
	var dials atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			dials.Add(1)
		}
	}
	return &dials
}

// TestTargetCallReusesConnections checks that a bulkhead's worth of
// concurrent calls, repeated, is served by as many pooled connections.
func TestTargetCallReusesConnections(t *testing.T) {
	const concurrent = 10
	entered := make(chan struct{}, concurrent)
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
	}))
	dials := countDials(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, 5*time.Second)

	for range 3 {
		codes := callsTogether(tg, concurrent, entered, func() {
			for range concurrent {
				release <- struct{}{}
			}
		})
		for _, code := range codes {
			assert.Equal(t, "0000", code)
		}
	}
	assert.Equal(t, int32(concurrent), dials.Load())
}

// callsTogether makes n calls on tg at once, waits until the target has
// them all inside (one receive on entered each), lets them answer with
// release, and returns their codes.
func callsTogether(tg *Client, n int, entered <-chan struct{}, release func()) []string {
	done := make(chan string, n)
	for range n {
		go func() {
			code, _ := codeMsg(tg.Call([]byte("TX"), nil))
			done <- code
		}()
	}
	for range n {
		<-entered
	}
	release()
	codes := make([]string, 0, n)
	for range n {
		codes = append(codes, <-done)
	}
	return codes
}

// TestTargetCallOverTLS posts to an https target: the pool makes the TLS
// connection itself and keeps it alive, the idle check finding nothing to
// read between requests.
func TestTargetCallOverTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{"code":"0000","message":"over tls"}`)
	}))
	dials := countDials(srv)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, 5*time.Second)
	require.NotNil(t, tg.tls, "an https target")
	trustTestServer(tg, srv, true)

	for i := range 3 {
		code, msg := codeMsg(tg.Call([]byte("TX"), []byte("BAL 1")))
		require.Equal(t, "0000", code, "call %d: %s", i, msg)
		assert.Equal(t, "over tls", string(msg))
	}
	assert.Equal(t, int32(1), dials.Load(), "the TLS connection is kept alive")
}

// FuzzDecodeAnswer checks that any target answer classifies to a code of the
// target protocol's form without panicking, that only a 200 relays a
// target's own code, and that the answer line written from it is one line.
func FuzzDecodeAnswer(f *testing.F) {
	for _, s := range []struct {
		status int
		body   string
	}{
		{200, `{"code":"0000","message":"balance=99500"}`},
		{200, `{"code":"B201","message":"insufficient funds"}`},
		{200, `{"code":"E500","message":"x\r\ny"}`},
		{200, `{"code":"X999"}`},
		{200, `not json`},
		{200, `{"code":5}`},
		{404, `{"code":"E400","message":"no such route"}`},
		{503, ``},
		{302, `{"code":"0000"}`},
	} {
		f.Add(s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		code, msg := DecodeAnswer(status, body)
		if !protocol.ValidTargetCode(code) {
			t.Fatalf("code %q is not of the target protocol's form", code)
		}
		switch {
		case status >= 400 && status <= 499:
			if code != protocol.CodeRefused {
				t.Fatalf("status %d gave %s, want E400", status, code)
			}
		case status != 200:
			if code != protocol.CodeTargetFailed {
				t.Fatalf("status %d gave %s, want E500", status, code)
			}
		}
		checkOneLine(t, protocol.AppendResponse(nil, []byte("TX1"), code, msg))
	})
}

// checkOneLine fails unless out is exactly one line: one '\n', at its end,
// with no '\r' anywhere.
func checkOneLine(t *testing.T, out []byte) {
	t.Helper()
	if bytes.Count(out, []byte{'\n'}) != 1 || out[len(out)-1] != '\n' || bytes.IndexByte(out, '\r') >= 0 {
		t.Fatalf("answer %q is not exactly one line", out)
	}
}

// codeMsg returns the code and message of r, for tests that check only
// those.
func codeMsg(r Result) (string, []byte) { return r.Code, r.Msg }
