package hubtest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/protocol"
)

// ClientTimeout bounds every read and write of a Client's methods, so a
// missing answer fails the test instead of hanging it. It is longer than
// IOTimeout: an answer may wait out a target's timeout on a busy machine.
const ClientTimeout = 10 * time.Second

// Response is one parsed response line of the client protocol:
// TXID|CODE|MESSAGE. It is a plain value, safe to copy and share.
type Response struct {
	TxID    string
	Code    string
	Message string
}

// String returns a as its response line, without the newline.
func (a Response) String() string { return a.TxID + "|" + a.Code + "|" + a.Message }

// ParseResponse parses a response line, with or without its trailing newline,
// as protocol.ParseResponse does, and refuses any other line break: the hub
// never writes a '\r'. The message is everything after the second '|', so
// it may hold '|'.
func ParseResponse(line string) (Response, error) {
	line = strings.TrimSuffix(line, "\n")
	r, err := protocol.ParseResponse([]byte(line))
	if err != nil {
		return Response{}, fmt.Errorf("not a response line (TXID|CODE|MESSAGE): %q", line)
	}
	if strings.ContainsAny(line, "\r\n") {
		return Response{}, fmt.Errorf("response line holds a line break: %q", line)
	}
	return Response{TxID: string(r.TxID), Code: string(r.Code), Message: string(r.Message)}, nil
}

// ByTxID indexes answers by TXID, failing the test on a TXID answered
// twice.
func ByTxID(t testing.TB, answers []Response) map[string]Response {
	t.Helper()
	m := make(map[string]Response, len(answers))
	for _, a := range answers {
		if prev, dup := m[a.TxID]; dup {
			t.Fatalf("TXID %q answered twice: %q and %q", a.TxID, prev, a)
		}
		m[a.TxID] = a
	}
	return m
}

// Lines returns answers as their response lines, for comparing with the
// lines a test expects.
func Lines(answers map[string]Response) map[string]string {
	m := make(map[string]string, len(answers))
	for txid, a := range answers {
		m[txid] = a.String()
	}
	return m
}

// Client is a test's connection to a hub, speaking the line protocol: the
// test's side of a hub in the same process (Serve) or of a relay binary
// (proctest). Write and ReadLine may be called from any goroutine; the
// other methods belong on the goroutine of the test that dialled, because
// they fail it. Reads are not safe for concurrent use.
type Client struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

// newClient returns the Client of nc, which is closed when the test ends.
func newClient(t testing.TB, nc net.Conn) *Client {
	t.Cleanup(func() { _ = nc.Close() })
	return &Client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// Dial connects to the hub at addr, failing the test if it cannot. The
// connection is closed when the test ends.
func Dial(t testing.TB, addr string) *Client {
	t.Helper()
	c, err := DialErr(t, addr)
	require.NoError(t, err, "dial %s", addr)
	return c
}

// DialErr is Dial returning the error instead of failing the test, for
// tests that expect a refusal.
func DialErr(t testing.TB, addr string) (*Client, error) {
	nc, err := net.DialTimeout("tcp", addr, ClientTimeout)
	if err != nil {
		return nil, err
	}
	return newClient(t, nc), nil
}

// DialFrom connects to the hub at addr from the local address local, such
// as 127.0.0.2 (any 127.0.0.0/8 address is the loopback on Linux), so that
// one machine can play peers the hub tells apart by address. It fails the
// test if it cannot; the connection is closed when the test ends.
func DialFrom(t testing.TB, local, addr string) *Client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: ClientTimeout}
	nc, err := d.Dial("tcp", addr)
	require.NoError(t, err, "dial %s from %s", addr, local)
	return newClient(t, nc)
}

// DialTLS connects to the hub at addr over TLS with cfg and completes the
// client's side of the handshake, failing the test if it cannot. The
// connection is closed when the test ends. Under TLS 1.3 the hub checks a
// client certificate after the client's side is done, so a certificate it
// refuses shows at the first read, as the end of the stream (ExpectEOF).
func DialTLS(t testing.TB, addr string, cfg *tls.Config) *Client {
	t.Helper()
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: ClientTimeout}, "tcp", addr, cfg)
	require.NoError(t, err)
	return newClient(t, nc)
}

// DialTLSAfter connects to the hub at addr, writes first in the clear (a
// PROXY header, as a load balancer in TCP mode sends it before the
// client's bytes), then completes the client's side of a TLS handshake
// with cfg over the same connection, failing the test if it cannot. cfg
// needs its ServerName. The connection is closed when the test ends.
func DialTLSAfter(t testing.TB, addr string, first []byte, cfg *tls.Config) *Client {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, ClientTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	require.NoError(t, raw.SetDeadline(time.Now().Add(ClientTimeout)))
	_, err = raw.Write(first)
	require.NoError(t, err)
	nc := tls.Client(raw, cfg)
	require.NoError(t, nc.Handshake())
	require.NoError(t, raw.SetDeadline(time.Time{}))
	return newClient(t, nc)
}

// Conn returns the connection, for what the line methods do not do:
// deadlines, socket options (a *net.TCPConn unless dialled over TLS),
// closing. Reads through it bypass the buffer of ReadLine and ReadResponse.
func (c *Client) Conn() net.Conn { return c.nc }

// Write writes p as it is, within ClientTimeout: a partial line, raw
// bytes.
func (c *Client) Write(p []byte) (int, error) {
	if err := c.nc.SetWriteDeadline(time.Now().Add(ClientTimeout)); err != nil {
		return 0, err
	}
	return c.nc.Write(p)
}

// Send writes each line followed by "\n", in one write, failing the test
// on error.
func (c *Client) Send(lines ...string) {
	c.t.Helper()
	_, err := c.Write([]byte(strings.Join(lines, "\n") + "\n"))
	require.NoError(c.t, err, "send %d lines", len(lines))
}

// ReadLine returns the next line, "\n" included, waiting at most d. It
// returns its error instead of failing the test, so it may be used off the
// test's goroutine.
func (c *Client) ReadLine(d time.Duration) (string, error) {
	if err := c.nc.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

// ReadResponse reads and parses one response line within ClientTimeout,
// failing the test otherwise.
func (c *Client) ReadResponse() Response {
	c.t.Helper()
	line, err := c.ReadLine(ClientTimeout)
	require.NoError(c.t, err, "read answer (partial line %q)", line)
	a, err := ParseResponse(line)
	require.NoError(c.t, err, "read answer")
	return a
}

// ReadResponses reads n answers, in the order they arrive.
func (c *Client) ReadResponses(n int) []Response {
	c.t.Helper()
	out := make([]Response, 0, n)
	for range n {
		out = append(out, c.ReadResponse())
	}
	return out
}

// ReadByTxID reads n answers and returns them by TXID, failing the test on
// a TXID answered twice.
func (c *Client) ReadByTxID(n int) map[string]Response {
	c.t.Helper()
	return ByTxID(c.t, c.ReadResponses(n))
}

// Exchange sends one line and reads one answer. Use it only when no other
// answer can be pending on the connection.
func (c *Client) Exchange(line string) Response {
	c.t.Helper()
	c.Send(line)
	return c.ReadResponse()
}

// ExpectClosed reads until the hub closes the connection, within
// ClientTimeout, and returns what was read; the test fails if the
// connection stays open. A reset counts as closed.
func (c *Client) ExpectClosed() string {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetReadDeadline(time.Now().Add(ClientTimeout)))
	b, err := io.ReadAll(c.r)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection still open after %v; read %q", ClientTimeout, b)
	}
	return string(b)
}

// ExpectEOF checks that the hub closes the connection with nothing more to
// say (a reset counts as closed), then closes the client's side as a
// well-behaved client does.
func (c *Client) ExpectEOF() {
	c.t.Helper()
	assert.Empty(c.t, c.ExpectClosed(), "the hub said more before closing")
	c.Close()
}

// CloseWrite shuts down the writing side, so the hub reads end of input.
func (c *Client) CloseWrite() {
	c.t.Helper()
	cw, ok := c.nc.(interface{ CloseWrite() error })
	require.True(c.t, ok, "%T has no CloseWrite", c.nc)
	require.NoError(c.t, cw.CloseWrite(), "close write")
}

// Close closes the connection.
func (c *Client) Close() { _ = c.nc.Close() }
