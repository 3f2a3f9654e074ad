package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startRawTarget serves a rawTarget on a loopback port for the test's
// lifetime and returns its address.
func startRawTarget(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tg := &rawTarget{}
	served := make(chan error, 1)
	go func() { served <- tg.Serve(ln) }()
	t.Cleanup(func() {
		tg.Close()
		assert.ErrorIs(t, <-served, errTargetClosed)
	})
	return ln.Addr().String()
}

func TestRawTargetAnswersPipelinedRequestsInOrder(t *testing.T) {
	addr := startRawTarget(t)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))

	// Three requests in one write: two transactions and a wrong path.
	_, err = io.WriteString(c,
		"POST /tx HTTP/1.1\r\nHost: t\r\nX-Tx-Id: A1\r\nContent-Length: 8\r\n\r\nBAL ACC1"+
			"POST /tx HTTP/1.1\r\nHost: t\r\ncontent-length: 0\r\n\r\n"+
			"GET /_stats HTTP/1.1\r\nHost: t\r\n\r\n")
	require.NoError(t, err)

	br := bufio.NewReader(c)
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusNotFound} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "answer %d", i)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, want, resp.StatusCode, "answer %d", i)
		assert.False(t, resp.Close, "answer %d keeps the connection", i)
		if want == http.StatusOK {
			var a struct{ Code, Message string }
			require.NoError(t, json.Unmarshal(body, &a), string(body))
			assert.Equal(t, "0000", a.Code)
		}
	}

	// A line that is not HTTP gets a 400, and the connection is closed.
	_, err = io.WriteString(c, "hello\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
}

func TestRawTargetHonoursConnectionClose(t *testing.T) {
	addr := startRawTarget(t)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))

	_, err = io.WriteString(c, "POST /tx HTTP/1.1\r\nConnection: close\r\nContent-Length: 1\r\n\r\nX")
	require.NoError(t, err)

	all, err := io.ReadAll(c)
	require.NoError(t, err, "the target closes after its answer")
	assert.Equal(t, string(targetAnswer), string(all))
}

func TestTargetCommandServesTheLoadTool(t *testing.T) {
	// Given the target command running, its address read from its log line,
	ctx, cancel := context.WithCancel(t.Context())
	_, kctx, err := parse(t, "target")
	require.NoError(t, err)
	logR, logW := io.Pipe()
	kctx.BindTo(ctx, (*context.Context)(nil))
	done := make(chan error, 1)
	go func() {
		done <- kctx.Run(&streams{Out: io.Discard, Err: logW})
		logW.Close()
	}()
	line, err := bufio.NewReader(logR).ReadString('\n')
	require.NoError(t, err)
	go io.Copy(io.Discard, logR)
	var logged struct{ Addr string }
	require.NoError(t, json.Unmarshal([]byte(line), &logged), line)
	require.True(t, strings.HasPrefix(logged.Addr, "127.0.0.1:"), logged.Addr)

	// When the load tool sends it pipelined transactions over HTTP,
	out, _, code, err := run(t, "load", "--addr", logged.Addr, "--protocol", "http",
		"--conns", "3", "--depth", "4", "--requests", "600", "--quiet")

	// Then every one is answered 0000, and the command ends cleanly with
	// its context.
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "sent 600, answered 600")
	assert.Regexp(t, `\ncodes +0000 600\n`, out)
	cancel()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the target command did not stop with its context")
	}
}

func TestTargetCommandReportsABusyAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })

	_, _, code, err := run(t, "target", "--listen", ln.Addr().String())

	var opErr *net.OpError
	assert.True(t, errors.As(err, &opErr), "%v", err)
	assert.Equal(t, 1, code)
}
