//go:build linux

package targethttp

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/relayhub/relayhub/internal/sockio"
)

// threadSyscalls returns how many read and write syscalls the calling
// thread has made (/proc/thread-self/io: syscr counts read(2), EAGAIN
// included; syscw write(2); neither counts recvfrom, the idle check's peek).
func threadSyscalls(t *testing.T) (reads, writes int) {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/io")
	require.NoError(t, err)
	for line := range bytes.Lines(b) {
		name, value, _ := bytes.Cut(bytes.TrimSpace(line), []byte(": "))
		n, _ := strconv.Atoi(string(value))
		switch string(name) {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// TestTargetCallReadsOnceAndWritesOncePerCall counts the read and write
// syscalls of calls on a kept-alive connection: one write of the request
// and one read of its answer each. Written from Write, the request would
// be followed by a read that finds nothing yet (EAGAIN) before the wait:
// two reads per call.
func TestTargetCallReadsOnceAndWritesOncePerCall(t *testing.T) {
	const calls = 40
	tg := testTarget(t, rawAnswerTarget(t, time.Millisecond), 5*time.Second)
	txid, payload := []byte("TX1"), []byte("BAL 1")
	// The call's syscalls are made by the calling goroutine, on its
	// thread once locked to it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.Equal(t, "0000", tg.Call(txid, payload).Code, "the first call opens the connection")

	r0, w0 := threadSyscalls(t)
	r1, w1 := threadSyscalls(t) // what reading the counts itself costs
	for i := range calls {
		res := tg.Call(txid, payload)
		require.Equal(t, "0000", res.Code, "call %d: %s", i, res.Msg)
	}
	r2, w2 := threadSyscalls(t)

	reads := (r2 - r1) - (r1 - r0)
	writes := (w2 - w1) - (w1 - w0)
	t.Logf("%d calls: %d reads, %d writes", calls, reads, writes)
	assert.Equal(t, calls, writes, "one write per request")
	// A readiness the poller noted before a call can wake its wait once
	// early: a read then finds nothing and the call waits again.
	assert.LessOrEqual(t, reads, calls+calls/4, "one read per answer, not a read that finds nothing first")
	assert.GreaterOrEqual(t, reads, calls)
}

// heldConn returns a kept-alive connection to a raw target, the target's
// end of it, and a reader of what the target receives: one request
// written and answered, so that the next request is held.
func heldConn(t *testing.T) (*targetConn, net.Conn) {
	t.Helper()
	// Small socket buffers, so that a full send buffer stays full while
	// the target does not read: its receive window cannot open much.
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return smallBuffer(rc, syscall.SO_RCVBUF)
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	conns := NewConns(nil)
	c, err := conns.dial(ln.Addr().String(), time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.True(t, c.holds, "a plain TCP connection holds requests")
	require.NoError(t, smallBuffer(c.rc, syscall.SO_SNDBUF))
	srv := <-accepted
	t.Cleanup(func() { srv.Close() })

	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	require.NoError(t, srv.SetDeadline(time.Now().Add(5*time.Second)))
	_, err = c.Write([]byte("first"))
	require.NoError(t, err)
	got := make([]byte, 5)
	_, err = io.ReadFull(srv, got)
	require.NoError(t, err)
	_, err = srv.Write([]byte("answer"))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, 6))
	require.NoError(t, err)
	return c, srv
}

// smallBuffer sets the socket buffer opt (SO_RCVBUF or SO_SNDBUF) of rc
// to its least.
func smallBuffer(rc syscall.RawConn, opt int) error {
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 1)
	}); cerr != nil {
		return cerr
	}
	return err
}

// fillSendBuffer writes junk on c's socket, past the connection's counts,
// until the send buffer takes no more: the target does not read. It
// returns the junk's length.
func fillSendBuffer(t *testing.T, c *targetConn) int {
	t.Helper()
	junk := make([]byte, 64<<10)
	total := 0
	require.NoError(t, c.rc.Control(func(fd uintptr) {
		for {
			n, wouldBlock, err := sockio.Write(fd, junk)
			total += n
			if wouldBlock || err != nil {
				require.NoError(t, err)
				return
			}
		}
	}))
	return total
}

// TestHeldRequestIsNotSentBeforeTheRead checks that a held request goes
// out only with the read of its answer, and that it is then counted sent.
func TestHeldRequestIsNotSentBeforeTheRead(t *testing.T) {
	c, srv := heldConn(t)
	req := []byte("POST /tx HTTP/1.1\r\nContent-Length: 5\r\n\r\nBAL 1")

	n, err := c.Write(req)
	require.NoError(t, err)
	assert.Equal(t, len(req), n)
	assert.Zero(t, c.sent, "held, not written")
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err = srv.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing reached the target before the read")

	go func() {
		got := make([]byte, len(req))
		_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(srv, got); err == nil && bytes.Equal(got, req) {
			_, _ = srv.Write([]byte("HTTP/1.1 200 OK"))
		}
	}()
	answer, err := bufio.NewReader(c).ReadString('K')
	require.NoError(t, err)
	assert.Equal(t, "HTTP/1.1 200 OK", answer)
	assert.Equal(t, len(req), c.sent)
	assert.Equal(t, len(answer), c.recv)
}

// TestHeldRequestFinishesAWriteTheSocketCannotTakeAtOnce fills the send
// buffer before a held request goes out: the read that writes it finishes
// the write once the target reads again, and then reads the answer.
func TestHeldRequestFinishesAWriteTheSocketCannotTakeAtOnce(t *testing.T) {
	c, srv := heldConn(t)
	junk := fillSendBuffer(t, c)
	req := bytes.Repeat([]byte("r"), maxHeld)
	_, err := c.Write(req)
	require.NoError(t, err)
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(5*time.Second)))

	go func() {
		// The target reads again once the read has begun to wait.
		time.Sleep(20 * time.Millisecond)
		got := make([]byte, junk+len(req))
		if _, err := io.ReadFull(srv, got); err == nil && bytes.Equal(got[junk:], req) {
			_, _ = srv.Write([]byte("answer"))
		}
	}()
	got := make([]byte, 6)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "answer", string(got))
	assert.Equal(t, len(req), c.sent)
	assert.False(t, c.writeFailed)
}

// TestHeldRequestWriteIsBoundedByTheWriteDeadline has the target never
// read: the held request cannot go out, and the write deadline, not the
// read's, ends the read that writes it, the write failed.
func TestHeldRequestWriteIsBoundedByTheWriteDeadline(t *testing.T) {
	c, _ := heldConn(t)
	fillSendBuffer(t, c)
	_, err := c.Write(bytes.Repeat([]byte("r"), maxHeld))
	require.NoError(t, err)
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))

	_, err = c.Read(make([]byte, 64))

	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.True(t, c.writeFailed)
	assert.Less(t, c.sent, maxHeld, "the request did not go out whole")
}

// TestHeldRequestIsNotSentWhenTheDeadlineHasPassed checks that a request
// held past the call's deadline is never written: the call is not sent.
func TestHeldRequestIsNotSentWhenTheDeadlineHasPassed(t *testing.T) {
	c, srv := heldConn(t)
	_, err := c.Write([]byte("POST /tx HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, c.SetDeadline(aLongTimeAgo))

	_, err = c.Read(make([]byte, 64))

	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Zero(t, c.sent)
	require.NoError(t, c.Close())
	got, err := io.ReadAll(srv)
	require.NoError(t, err)
	assert.Empty(t, got, "nothing reached the target")
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// TestTargetCallSendsARequestLargerThanAHold sends requests too large to
// be held whole, on one kept-alive connection: the HTTP client writes each
// in pieces, the first held and written before the next, and the target
// gets every byte in order.
func TestTargetCallSendsARequestLargerThanAHold(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789"), 3*maxHeld/10)
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

// goneBeforeTheWrite are the ways a target gives up a kept-alive connection
// between a request's Write and its Read: each must stop the request from
// being written.
var goneBeforeTheWrite = []struct {
	name string
	gone func(t *testing.T, srv net.Conn)
}{
	{"closed", func(t *testing.T, srv net.Conn) { require.NoError(t, srv.Close()) }},
	{"reset", func(t *testing.T, srv net.Conn) {
		require.NoError(t, srv.(*net.TCPConn).SetLinger(0))
		require.NoError(t, srv.Close())
	}},
	{"unasked bytes", func(t *testing.T, srv net.Conn) {
		_, err := srv.Write([]byte("HTTP/1.1 408 Request Timeout\r\n\r\n"))
		require.NoError(t, err)
	}},
}

// waitGone polls c's socket until what the target did has reached it.
func waitGone(t *testing.T, c *targetConn) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var readable bool
		require.NoError(t, c.rc.Control(func(fd uintptr) { readable = sockio.Readable(fd) }))
		if readable {
			return
		}
		require.True(t, time.Now().Before(deadline), "the target's close or bytes did not arrive")
		time.Sleep(time.Millisecond)
	}
}

// assertNothingReached checks, when the target's end is still open, that
// no byte of a request reached it.
func assertNothingReached(t *testing.T, srv net.Conn, open bool) {
	t.Helper()
	if !open {
		return
	}
	require.NoError(t, srv.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err := srv.Read(make([]byte, 1))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "nothing reached the target")
}

// TestHeldRequestIsCheckedByTheReadThatWritesIt has the target give up a
// kept-alive connection after the HTTP client handed it a request (held)
// and before the read that writes it: the check is made right before the
// write, inside that read, so the request is not written, not counted
// sent, and the read reports the connection stale for the call to try
// another.
func TestHeldRequestIsCheckedByTheReadThatWritesIt(t *testing.T) {
	for _, tt := range goneBeforeTheWrite {
		t.Run(tt.name, func(t *testing.T) {
			c, srv := heldConn(t)
			_, err := c.Write([]byte("POST /tx HTTP/1.1\r\nContent-Length: 5\r\n\r\nBAL 1"))
			require.NoError(t, err, "held: the check comes with the write")
			tt.gone(t, srv)
			waitGone(t, c)

			_, err = c.Read(make([]byte, 64))

			require.ErrorIs(t, err, errStaleConn)
			assert.Zero(t, c.sent)
			assert.False(t, c.writeFailed)
			var resp fasthttp.Response
			resp.ParseNetConn(c) // as the HTTP client records the connection a try used
			assert.True(t, foundStale(&resp), "the call tries another connection")
			stage, sent, writeErr := progressOf(&resp)
			assert.Equal(t, NotSent, stage)
			assert.Zero(t, sent)
			assert.NoError(t, writeErr, "no write was made to fail")
			assertNothingReached(t, srv, tt.name == "unasked bytes")
		})
	}
}

// TestHeldRequestInPiecesIsCheckedBeforeItsFirstPiece has the target give
// up the connection while the HTTP client writes a request larger than a
// hold: the piece held is checked before it goes out with the next, and
// neither is written.
func TestHeldRequestInPiecesIsCheckedBeforeItsFirstPiece(t *testing.T) {
	for _, tt := range goneBeforeTheWrite {
		t.Run(tt.name, func(t *testing.T) {
			c, srv := heldConn(t)
			_, err := c.Write(bytes.Repeat([]byte("a"), maxHeld))
			require.NoError(t, err, "the first piece is held")
			tt.gone(t, srv)
			waitGone(t, c)

			_, err = c.Write([]byte("the rest"))

			require.ErrorIs(t, err, errStaleConn)
			assert.Zero(t, c.sent)
			assertNothingReached(t, srv, tt.name == "unasked bytes")
		})
	}
}

// TestRequestTooLargeToHoldIsBoundedByTheWriteDeadline has the target
// never read while a request too large to hold is written: the write
// deadline, which a connection that holds requests sets on its socket only
// when a write needs it, ends the write.
func TestRequestTooLargeToHoldIsBoundedByTheWriteDeadline(t *testing.T) {
	c, _ := heldConn(t)
	fillSendBuffer(t, c)
	require.NoError(t, c.SetDeadline(time.Time{}), "no deadline on the socket")
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))

	done := make(chan error, 1)
	go func() {
		_, err := c.Write(bytes.Repeat([]byte("r"), 2*maxHeld))
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("the write was not bounded by its deadline") // the cleanup's close ends it
	}
	assert.True(t, c.writeFailed)
	assert.Less(t, c.sent, 2*maxHeld, "the request did not go out whole")
}

// TestHeldRequestPastItsWriteDeadlineIsCheckedToo has the target close a
// kept-alive connection and the request's write deadline pass before the
// read that was to write it: the request is not written, and the call
// sees the connection found stale, as when the read writes it.
func TestHeldRequestPastItsWriteDeadlineIsCheckedToo(t *testing.T) {
	c, srv := heldConn(t)
	_, err := c.Write([]byte("POST /tx HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, srv.Close())
	waitGone(t, c)
	require.NoError(t, c.SetWriteDeadline(aLongTimeAgo))
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Hour)))

	_, err = c.Read(make([]byte, 64))

	require.ErrorIs(t, err, errStaleConn)
	assert.Zero(t, c.sent)
	var resp fasthttp.Response
	resp.ParseNetConn(c)
	assert.True(t, foundStale(&resp))
}
