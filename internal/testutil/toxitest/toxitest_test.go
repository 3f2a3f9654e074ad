package toxitest_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/toxitest"
)

// readTimeout bounds every read of these tests.
const readTimeout = 5 * time.Second

// echoServer listens on a free loopback port and writes back whatever each
// connection sends, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dial connects to addr, closing the connection when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, readTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// echo writes line and reads it back, within readTimeout.
func echo(t *testing.T, c net.Conn, line string) (string, error) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(readTimeout)))
	_, err := io.WriteString(c, line)
	require.NoError(t, err)
	return bufio.NewReader(c).ReadString('\n')
}

func TestProxyForwardsAndToxicsComeAndGo(t *testing.T) {
	srv := toxitest.Start(t)
	p := srv.Proxy(t, "echo", echoServer(t))
	assert.Equal(t, "127.0.0.1", must(net.SplitHostPort(p.Listen)))

	c := dial(t, p.Listen)
	got, err := echo(t, c, "plain\n")
	require.NoError(t, err)
	assert.Equal(t, "plain\n", got)

	// A toxic applies to a connection already open.
	p.AddToxic("slow", "latency", toxitest.Downstream, toxitest.Attributes{"latency": 300})
	start := time.Now()
	got, err = echo(t, c, "slow\n")
	require.NoError(t, err)
	assert.Equal(t, "slow\n", got)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	// Reset removes every toxic: a timeout toxic that swallows the
	// requests is gone with it.
	p.AddToxic("blackhole", "timeout", toxitest.Upstream, toxitest.Attributes{"timeout": 0})
	srv.Reset()
	got, err = echo(t, dial(t, p.Listen), "again\n")
	require.NoError(t, err)
	assert.Equal(t, "again\n", got)
}

func TestTimeoutToxicKeepsTheConnectionAndSendsNothing(t *testing.T) {
	srv := toxitest.Start(t)
	p := srv.Proxy(t, "echo", echoServer(t))
	p.AddToxic("blackhole", "timeout", toxitest.Downstream, toxitest.Attributes{"timeout": 0})

	c := dial(t, p.Listen)
	_, err := io.WriteString(c, "anyone?\n")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	n, err := c.Read(make([]byte, 16))
	assert.Zero(t, n)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded, "no byte and no close")

	p.RemoveToxic("blackhole")
	got, err := echo(t, dial(t, p.Listen), "now\n")
	require.NoError(t, err)
	assert.Equal(t, "now\n", got)
}

func TestResetPeerResetsConnectionsOpenedAfterIt(t *testing.T) {
	srv := toxitest.Start(t)
	p := srv.Proxy(t, "echo", echoServer(t))
	before := dial(t, p.Listen)
	_, err := echo(t, before, "warm\n")
	require.NoError(t, err)

	// Given a reset_peer toxic on the answers,
	p.AddToxic("rst", "reset_peer", toxitest.Downstream, toxitest.Attributes{"timeout": 0})

	// a connection opened after it is reset at the first byte of an
	// answer,
	_, err = echo(t, dial(t, p.Listen), "hello\n")
	assert.ErrorIs(t, err, syscall.ECONNRESET)

	// and one opened before it is only closed.
	_, err = echo(t, before, "hello\n")
	assert.ErrorIs(t, err, io.EOF)
}

func TestLimitDataCutsAfterItsBytes(t *testing.T) {
	for _, tt := range []struct {
		name    string
		reset   bool
		wantErr error
	}{
		{"closes", false, io.EOF},
		{"resets with ResetOnClose", true, syscall.ECONNRESET},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := toxitest.Start(t)
			p := srv.Proxy(t, "echo", echoServer(t))
			if tt.reset {
				p.ResetOnClose()
			}
			p.AddToxic("cut", "limit_data", toxitest.Downstream, toxitest.Attributes{"bytes": 3})

			c := dial(t, p.Listen)
			require.NoError(t, c.SetDeadline(time.Now().Add(readTimeout)))
			_, err := io.WriteString(c, "hello\n")
			require.NoError(t, err)
			got, err := io.ReadAll(c)
			assert.Equal(t, "hel", string(got))
			if tt.wantErr == io.EOF {
				assert.NoError(t, err, "a clean end of stream")
			} else {
				assert.ErrorIs(t, err, tt.wantErr)
			}
		})
	}
}

func TestDisableRefusesAndEnableListensAgain(t *testing.T) {
	srv := toxitest.Start(t)
	p := srv.Proxy(t, "echo", echoServer(t))
	open := dial(t, p.Listen)

	p.Disable()
	_, err := net.DialTimeout("tcp", p.Listen, readTimeout)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = echo(t, open, "still there?\n")
	assert.Error(t, err, "Disable closes the connections it carried")

	p.Enable()
	got, err := echo(t, dial(t, p.Listen), "back\n")
	require.NoError(t, err)
	assert.Equal(t, "back\n", got)
}

func TestStopEndsTheProcess(t *testing.T) {
	srv := toxitest.Start(t)
	pid := srv.Pid()
	require.NoError(t, syscall.Kill(pid, 0), "running")
	srv.Stop()
	err := syscall.Kill(pid, 0)
	assert.True(t, errors.Is(err, syscall.ESRCH), "pid %d still exists: %v", pid, err)
	srv.Stop()
}

// must returns the first of two results, the host of SplitHostPort.
func must(host, _ string, err error) string {
	if err != nil {
		return err.Error()
	}
	return host
}
