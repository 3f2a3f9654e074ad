package targethttp

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/protocol"
)

// flakyDial returns a DialFunc that fails its first fails dials with err
// (as a refused or reset connect does, wrapped in a *net.OpError) and then
// dials TCP; dials counts every attempt.
func flakyDial(fails int32, err error, dials *atomic.Int32) DialFunc {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) <= fails {
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.OpError{Op: "connect", Err: err}}
		}
		return d.DialContext(ctx, network, addr)
	}
}

// TestTargetCallTriesAFailedConnectOnceMore checks the one safe retry: a
// connect refused or reset is tried once more, which reaches the target
// once; a second failed connect ends the call, not sent, after two dials.
func TestTargetCallTriesAFailedConnectOnceMore(t *testing.T) {
	for _, tt := range []struct {
		name      string
		err       error
		fails     int32
		wantCode  string
		wantMsg   string
		wantCalls int32
		wantDials int32
	}{
		{"refused once", syscall.ECONNREFUSED, 1, "0000", "ok", 1, 2},
		{"reset during connect once", syscall.ECONNRESET, 1, "0000", "ok", 1, 2},
		{"refused twice", syscall.ECONNREFUSED, 2, "E902", msgRefusedConn + suffixNotSent, 0, 2},
		{"reset twice", syscall.ECONNRESET, 2, "E902", msgResetConn + suffixNotSent, 0, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var calls, dials atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				_, _ = io.ReadAll(r.Body)
				_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			}))
			t.Cleanup(srv.Close)
			tg := testTargetWith(t, Config{URL: srv.URL, Timeout: 5 * time.Second, Conns: NewConns(flakyDial(tt.fails, tt.err, &dials))})

			res := tg.Call([]byte("TX1"), []byte("DEP 1 5"))

			assert.Equal(t, tt.wantCode, res.Code)
			assert.Equal(t, tt.wantMsg, string(res.Msg))
			assert.True(t, res.Retried)
			assert.Equal(t, tt.wantCalls, calls.Load(), "the transaction reaches the target at most once")
			assert.Equal(t, tt.wantDials, dials.Load(), "one retry, never more")
			if tt.wantCode != "0000" {
				assert.Equal(t, NotSent, res.Stage)
				assert.Zero(t, res.BytesSent)
			}
		})
	}
}

// TestTargetCallDoesNotRetryOtherFailures checks that failures other than
// a failed connect are not tried again: a timeout to connect (the target
// may be overloaded), and anything once a byte was written.
func TestTargetCallDoesNotRetryOtherFailures(t *testing.T) {
	var dials atomic.Int32
	conns := NewConns(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	})
	tg := testTargetWith(t, Config{URL: "http://127.0.0.1:9", Timeout: 50 * time.Millisecond, Conns: conns})

	res := tg.Call([]byte("TX1"), []byte("DEP 1 5"))

	assert.Equal(t, protocol.CodeTimeout, res.Code)
	assert.Equal(t, msgTimeout+suffixNotSent, string(res.Msg))
	assert.Equal(t, NotSent, res.Stage)
	assert.False(t, res.Retried)
	assert.Equal(t, int32(1), dials.Load())
}

// cutConn is a connection whose first write sends only its first n bytes
// and then fails as a reset connection does.
type cutConn struct {
	net.Conn
	n int
}

func (c *cutConn) Write(p []byte) (int, error) {
	if c.n < 0 || len(p) <= c.n {
		return c.Conn.Write(p)
	}
	w, err := c.Conn.Write(p[:c.n])
	c.n = -1
	if err != nil {
		return w, err
	}
	return w, &net.OpError{Op: "write", Err: syscall.ECONNRESET}
}

// TestTargetCallReportsAPartlySentRequest cuts the request after 20
// bytes: the call is in doubt, partly sent, its 20 bytes counted, and it
// is not tried again.
func TestTargetCallReportsAPartlySentRequest(t *testing.T) {
	accepted := make(chan []byte, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		got, _ := io.ReadAll(c)
		accepted <- got
	}()
	var dials atomic.Int32
	var d net.Dialer
	conns := NewConns(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cutConn{Conn: c, n: 20}, nil
	})
	tg := testTargetWith(t, Config{URL: "http://" + ln.Addr().String(), Timeout: 5 * time.Second, Conns: conns})

	res := tg.Call([]byte("TX1"), []byte("DEP 1 5"))

	assert.Equal(t, protocol.CodeUnreachable, res.Code)
	assert.Equal(t, msgResetConn+suffixInDoubt, string(res.Msg))
	assert.Equal(t, PartlySent, res.Stage)
	assert.Equal(t, 20, res.BytesSent)
	assert.False(t, res.Retried)
	assert.Equal(t, int32(1), dials.Load())
	select {
	case got := <-accepted:
		assert.Len(t, got, 20, "the target got the 20 bytes written")
	case <-time.After(5 * time.Second):
		t.Fatal("the target's connection was not closed")
	}
}

// TestTargetCallCountsEachRequestOnItsOwn checks that a kept-alive
// connection's counts start again with each request: a call that times out
// after a successful one on the same connection reports its own bytes.
func TestTargetCallCountsEachRequestOnItsOwn(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			_, _ = io.WriteString(w, `{"code":"0000","message":"ok"}`)
			return
		}
		waitForClientGone(r)
	}))
	dials := countDials(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, 200*time.Millisecond)

	require.Equal(t, "0000", tg.Call([]byte("TX1"), []byte("DEP 1 5")).Code)
	res := tg.Call([]byte("TX2"), []byte("DEP 1 5"))

	assert.Equal(t, protocol.CodeTimeout, res.Code)
	assert.Equal(t, Sent, res.Stage)
	assert.Equal(t, int32(1), dials.Load(), "both calls used the one connection")
	req := fasthttpRequestLen(t, "TX2", "DEP 1 5")
	assert.Equal(t, req, res.BytesSent, "the second request's bytes only")
}

// fasthttpRequestLen is the length of the request Call writes for txid and
// payload to a target at 127.0.0.1, measured by a target that records it.
func fasthttpRequestLen(t *testing.T, txid, payload string) int {
	t.Helper()
	got := make(chan int, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var buf bytes.Buffer
		b := make([]byte, 4096)
		for !bytes.HasSuffix(buf.Bytes(), []byte(payload)) {
			n, err := c.Read(b)
			buf.Write(b[:n])
			if err != nil {
				break
			}
		}
		got <- buf.Len()
	}()
	tg := testTarget(t, "http://"+ln.Addr().String(), 200*time.Millisecond)
	tg.Call([]byte(txid), []byte(payload))
	return <-got
}

// TestTargetCallDoesNotAllocate checks that a call answered in full, its
// progress counted, allocates nothing of its own: the pool's buffers and
// the connection's counters are reused.
func TestTargetCallDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	tg := testTarget(t, rawAnswerTarget(t, 0), 5*time.Second)
	txid, payload := []byte("TX1"), []byte("BAL 1")
	require.Equal(t, "0000", tg.Call(txid, payload).Code)

	var failed string
	allocs := testing.AllocsPerRun(200, func() {
		if res := tg.Call(txid, payload); res.Code != "0000" || res.Stage != Answered {
			failed = res.Code + " " + string(res.Msg)
		}
	})
	require.Empty(t, failed)
	assert.Zero(t, allocs)
}

// rawAnswerTarget serves a raw keep-alive HTTP target that answers each
// request 0000, delay after it arrived (with a delay, as a real target
// does: by the time the answer comes, the hub is waiting for it), and
// returns its URL. Each request arrives in one write of the hub's.
func rawAnswerTarget(t testing.TB, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"code\":\"0000\"}")
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			time.Sleep(delay)
			if _, err := c.Write(answer); err != nil {
				return
			}
		}
	}()
	return "http://" + ln.Addr().String()
}
