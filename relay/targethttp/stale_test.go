package targethttp

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawAnswer is a full keep-alive answer of the target protocol.
const rawAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"code\":\"0000\"}"

// rawTarget listens for a target whose connections the test serves itself:
// each accepted connection is handed over on the returned channel.
func rawTarget(t *testing.T) (url string, accepted <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			ch <- c
		}
	}()
	return "http://" + ln.Addr().String(), ch
}

// answerOne reads one request ending in payload from c, then writes
// answer.
func answerOne(c net.Conn, payload, answer string) error {
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.HasSuffix(got, []byte(payload)) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return err
		}
	}
	_, err := io.WriteString(c, answer)
	return err
}

// callThrough makes a call on tg with payload and, if it opens a new
// connection to the target meanwhile, answers on that one. It returns the
// result and the target's end of the new connection, nil when the call
// opened none.
func callThrough(t *testing.T, tg *Client, accepted <-chan net.Conn, payload string) (Result, net.Conn) {
	t.Helper()
	done := make(chan Result, 1)
	go func() { done <- tg.Call([]byte("TX"), []byte(payload)) }()
	select {
	case res := <-done:
		return res, nil
	case c := <-accepted:
		require.NoError(t, answerOne(c, payload, rawAnswer))
		return <-done, c
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not end")
		return Result{}, nil
	}
}

// TestPooledConnectionFoundStaleIsNotWrittenTo has the target give up a
// kept-alive connection while it sits in the pool, in each way a target
// can: the next call must find it before writing, and go out, once, on a
// new connection. Written on the dead one, the call would be in doubt
// (closed, reset), or read the unasked bytes as its answer.
func TestPooledConnectionFoundStaleIsNotWrittenTo(t *testing.T) {
	if !idleCheckSupported {
		t.Skip("no idle check on this system")
	}
	for _, tt := range []struct {
		name string
		gone func(t *testing.T, srv net.Conn)
	}{
		{"closed", func(t *testing.T, srv net.Conn) { require.NoError(t, srv.Close()) }},
		{"reset", func(t *testing.T, srv net.Conn) {
			require.NoError(t, srv.(*net.TCPConn).SetLinger(0))
			require.NoError(t, srv.Close())
		}},
		{"unasked bytes", func(t *testing.T, srv net.Conn) {
			_, err := io.WriteString(srv, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
			require.NoError(t, err)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			url, accepted := rawTarget(t)
			tg := testTarget(t, url, 5*time.Second)
			res, first := callThrough(t, tg, accepted, "BAL 1")
			require.Equal(t, "0000", res.Code, "%s", res.Msg)
			require.NotNil(t, first)

			// Given the target gave up the kept-alive connection.
			tt.gone(t, first)

			// When the next call goes out.
			res, second := callThrough(t, tg, accepted, "DEP 1 5")

			// Then it went out on a new connection, answered, nothing
			// written on the dead one.
			assert.Equal(t, "0000", res.Code, "%s", res.Msg)
			assert.Equal(t, Answered, res.Stage)
			assert.NotNil(t, second, "the call went out on a new connection")
			assert.False(t, res.Retried, "a stale connection is not a failed connect")
			if tt.name == "unasked bytes" {
				// The hub's close of a connection with bytes unread
				// resets it; until then, a read would return what came.
				require.NoError(t, first.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
				n, err := first.Read(make([]byte, 64))
				assert.Zero(t, n, "nothing was written on the stale connection")
				assert.Error(t, err)
			}
		})
	}
}

// TestTargetCallDropsAConnectionWithBytesAfterTheAnswer has the target
// send bytes after its answer, unasked: the connection cannot carry
// another request (those bytes would be read as its answer), so the next
// call opens a new one.
func TestTargetCallDropsAConnectionWithBytesAfterTheAnswer(t *testing.T) {
	url, accepted := rawTarget(t)
	tg := testTarget(t, url, 5*time.Second)
	done := make(chan Result, 1)
	go func() { done <- tg.Call([]byte("TX1"), []byte("BAL 1")) }()
	first := <-accepted
	require.NoError(t, answerOne(first, "BAL 1", rawAnswer+rawAnswer))
	require.Equal(t, "0000", (<-done).Code)

	res, second := callThrough(t, tg, accepted, "BAL 2")

	assert.Equal(t, "0000", res.Code, "%s", res.Msg)
	assert.NotNil(t, second, "a new connection")
}

// TestProgressStage checks how far a failed call got, from its
// connection's record.
func TestProgressStage(t *testing.T) {
	for _, tt := range []struct {
		p    progress
		want Stage
	}{
		{progress{}, NotSent},
		{progress{writeFailed: true}, NotSent},
		{progress{sent: 20, writeFailed: true}, PartlySent},
		{progress{sent: 90}, Sent},
		{progress{sent: 90, recv: 1}, AnswerPartlyRead},
	} {
		assert.Equal(t, tt.want, tt.p.stage(), "%+v", tt.p)
	}
}

// TestTargetCallSendsALargeRequest sends requests of 12 KiB, more than a
// socket write may take at once, on one kept-alive connection: the target
// gets every byte in order.
func TestTargetCallSendsALargeRequest(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789"), 1200)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		code := "0000"
		if !bytes.Equal(body, payload) {
			code = "B999"
		}
		_, _ = io.WriteString(w, `{"code":"`+code+`","message":"`+strconv.Itoa(len(body))+`"}`)
	}))
	dials := countDials(srv)
	srv.Start()
	t.Cleanup(srv.Close)
	tg := testTarget(t, srv.URL, 5*time.Second)

	for i := range 3 {
		res := tg.Call([]byte("TX"), payload)
		require.Equal(t, "0000", res.Code, "call %d: the target got %s bytes, not the %d sent", i, res.Msg, len(payload))
	}
	assert.Equal(t, int32(1), dials.Load(), "one kept-alive connection")
}
