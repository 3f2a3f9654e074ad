package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/fakeclock"
)

// ioTimeout bounds every wait for I/O in these tests; it is only reached
// when a test is about to fail.
const ioTimeout = 5 * time.Second

// fakeTarget is an HTTP target whose behaviour a test switches at run time.
type fakeTarget struct {
	*httptest.Server
	calls   atomic.Int32
	entered chan string // TXIDs of calls as they arrive, when the handler blocks
	release chan struct{}
	once    sync.Once // closes release
	mu      sync.Mutex
	answer  func(w http.ResponseWriter, r *http.Request, payload []byte) // guarded by mu
}

// newFakeTarget starts a target answering with answer.
func newFakeTarget(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, payload []byte)) *fakeTarget {
	t.Helper()
	ft := &fakeTarget{entered: make(chan string, 1024), release: make(chan struct{}), answer: answer}
	ft.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ft.calls.Add(1)
		payload, _ := io.ReadAll(r.Body)
		ft.mu.Lock()
		a := ft.answer
		ft.mu.Unlock()
		a(w, r, payload)
	}))
	t.Cleanup(func() {
		ft.unblockAll()
		ft.Close()
	})
	return ft
}

// set switches the target's behaviour for the calls that follow.
func (ft *fakeTarget) set(answer func(w http.ResponseWriter, r *http.Request, payload []byte)) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.answer = answer
}

// unblockAll releases every blocked call, now and later.
func (ft *fakeTarget) unblockAll() {
	ft.once.Do(func() { close(ft.release) })
}

// answerCode answers 200 with code and message.
func answerCode(code, msg string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		_, _ = io.WriteString(w, `{"code":"`+code+`","message":"`+msg+`"}`)
	}
}

// answerStatus answers with an HTTP status and a JSON body.
func answerStatus(status int) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"code":"E500","message":"injected"}`)
	}
}

// echo answers 0000 with "got <payload>".
func echo(w http.ResponseWriter, _ *http.Request, payload []byte) {
	_, _ = io.WriteString(w, `{"code":"0000","message":"got `+string(payload)+`"}`)
}

// blockThen reports the call on entered, waits for release, then answers.
func (ft *fakeTarget) blockThen(then func(http.ResponseWriter, *http.Request, []byte)) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, payload []byte) {
		ft.entered <- r.Header.Get("X-Tx-Id")
		<-ft.release
		then(w, r, payload)
	}
}

// waitEntered waits until n blocked calls have arrived and returns their
// TXIDs.
func (ft *fakeTarget) waitEntered(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	timeout := time.After(ioTimeout)
	for len(got) < n {
		select {
		case id := <-ft.entered:
			got = append(got, id)
		case <-timeout:
			t.Fatalf("only %d of %d calls reached the target", len(got), n)
		}
	}
	return got
}

// testConfig returns a Config for the given targets with a fake clock and a
// test logger.
func testConfig(t *testing.T, targets ...Target) (Config, *fakeclock.Clock) {
	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	return Config{
		Targets: targets,
		Clock:   clk,
		Logger:  zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel),
	}, clk
}

// startServer serves cfg on a loopback listener until the test ends.
func startServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	srv, err := New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		assert.NoError(t, srv.Close())
		select {
		case err := <-served:
			assert.ErrorIs(t, err, ErrServerClosed)
		case <-time.After(ioTimeout):
			t.Error("Serve did not return after Close")
		}
	})
	return srv, ln.Addr().String()
}

// client is a test's connection to the hub.
type client struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, ioTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// send writes each line followed by "\n".
func (c *client) send(lines ...string) {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetWriteDeadline(time.Now().Add(ioTimeout)))
	_, err := io.WriteString(c.nc, strings.Join(lines, "\n")+"\n")
	require.NoError(c.t, err)
}

// read returns the next answer line without its "\n".
func (c *client) read() string {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetReadDeadline(time.Now().Add(ioTimeout)))
	line, err := c.r.ReadString('\n')
	require.NoError(c.t, err, "reading an answer (got %q)", line)
	return strings.TrimSuffix(line, "\n")
}

// roundTrip sends one line and returns the next answer.
func (c *client) roundTrip(line string) string {
	c.t.Helper()
	c.send(line)
	return c.read()
}

// readByTxID reads n answers and returns them keyed by TXID, failing on a
// TXID answered twice.
func (c *client) readByTxID(n int) map[string]string {
	c.t.Helper()
	got := make(map[string]string, n)
	for range n {
		line := c.read()
		txid, _, _ := strings.Cut(line, "|")
		require.NotContains(c.t, got, txid, "TXID %s answered twice", txid)
		got[txid] = line
	}
	return got
}

// expectEOF checks that the hub closes the connection with nothing more to
// say, then closes the client's side as a well-behaved client does.
func (c *client) expectEOF() {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetReadDeadline(time.Now().Add(ioTimeout)))
	line, err := c.r.ReadString('\n')
	assert.Empty(c.t, line)
	assert.True(c.t, errors.Is(err, io.EOF) || isReset(err), "want end of stream, got %v", err)
	c.nc.Close()
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// eventually polls cond until it holds or ioTimeout passes.
func eventually(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(time.Millisecond)
	}
}

// transitions records breaker transitions as "NAME:FROM->TO".
type transitions struct {
	mu  sync.Mutex
	got []string
}

func (tr *transitions) observe(t breaker.Transition) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, t.Name+":"+t.From.String()+"->"+t.To.String())
}

func (tr *transitions) list() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.got...)
}

// status returns the named target's status.
func status(t *testing.T, srv *Server, name string) TargetSnapshot {
	t.Helper()
	for _, ts := range srv.Targets() {
		if ts.Name == name {
			return ts
		}
	}
	t.Fatalf("no target %s", name)
	return TargetSnapshot{}
}

// shutdownAsync starts Shutdown with a context of the given timeout.
func shutdownAsync(srv *Server, timeout time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- srv.Shutdown(ctx)
	}()
	return done
}
