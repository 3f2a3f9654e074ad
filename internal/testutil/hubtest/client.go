package hubtest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Client is a test's connection to a hub, speaking the line protocol. Its
// methods fail the test that dialled, so they belong on that test's
// goroutine, except ReadLine and writes through Conn; reads are not safe
// for concurrent use.
type Client struct {
	t  testing.TB
	nc net.Conn
	r  *bufio.Reader
}

// Dial connects to the hub at addr, failing the test if it cannot. The
// connection is closed when the test ends.
func Dial(t testing.TB, addr string) *Client {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, IOTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &Client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// DialTLS connects to the hub at addr over TLS with cfg and completes the
// client's side of the handshake, failing the test if it cannot. The
// connection is closed when the test ends. Under TLS 1.3 the hub checks a
// client certificate after the client's side is done, so a certificate it
// refuses shows at the first read, as the end of the stream (ExpectEOF).
func DialTLS(t testing.TB, addr string, cfg *tls.Config) *Client {
	t.Helper()
	nc, err := tls.DialWithDialer(&net.Dialer{Timeout: IOTimeout}, "tcp", addr, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &Client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// DialTLSAfter connects to the hub at addr, writes first in the clear (a
// PROXY header, as a load balancer in TCP mode sends it before the
// client's bytes), then completes the client's side of a TLS handshake
// with cfg over the same connection, failing the test if it cannot. cfg
// needs its ServerName. The connection is closed when the test ends.
func DialTLSAfter(t testing.TB, addr string, first []byte, cfg *tls.Config) *Client {
	t.Helper()
	raw, err := net.DialTimeout("tcp", addr, IOTimeout)
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	require.NoError(t, raw.SetDeadline(time.Now().Add(IOTimeout)))
	_, err = raw.Write(first)
	require.NoError(t, err)
	nc := tls.Client(raw, cfg)
	require.NoError(t, nc.Handshake())
	require.NoError(t, raw.SetDeadline(time.Time{}))
	return &Client{t: t, nc: nc, r: bufio.NewReader(nc)}
}

// Conn returns the connection, for writes the line methods do not make
// (a partial line, raw bytes), deadlines and closing. Reads through it
// bypass the buffer of Read and ReadLine.
func (c *Client) Conn() net.Conn { return c.nc }

// Send writes each line followed by "\n", in one write.
func (c *Client) Send(lines ...string) {
	c.t.Helper()
	require.NoError(c.t, c.nc.SetWriteDeadline(time.Now().Add(IOTimeout)))
	_, err := io.WriteString(c.nc, strings.Join(lines, "\n")+"\n")
	require.NoError(c.t, err)
}

// ReadLine returns the next line, "\n" included, waiting at most
// IOTimeout. Unlike Read it returns its error instead of failing the test,
// so it may be used off the test's goroutine.
func (c *Client) ReadLine() (string, error) {
	if err := c.nc.SetReadDeadline(time.Now().Add(IOTimeout)); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

// Read returns the next answer line without its "\n".
func (c *Client) Read() string {
	c.t.Helper()
	line, err := c.ReadLine()
	require.NoError(c.t, err, "reading an answer (got %q)", line)
	return strings.TrimSuffix(line, "\n")
}

// RoundTrip sends one line and returns the next answer. Use it only when
// no other answer can be pending on the connection.
func (c *Client) RoundTrip(line string) string {
	c.t.Helper()
	c.Send(line)
	return c.Read()
}

// ReadByTxID reads n answers and returns them keyed by TXID, failing the
// test on a TXID answered twice.
func (c *Client) ReadByTxID(n int) map[string]string {
	c.t.Helper()
	got := make(map[string]string, n)
	for range n {
		line := c.Read()
		txid, _, _ := strings.Cut(line, "|")
		require.NotContains(c.t, got, txid, "TXID %s answered twice", txid)
		got[txid] = line
	}
	return got
}

// ExpectEOF checks that the hub closes the connection with nothing more to
// say (a reset counts as closed), then closes the client's side as a
// well-behaved client does.
func (c *Client) ExpectEOF() {
	c.t.Helper()
	line, err := c.ReadLine()
	assert.Empty(c.t, line)
	assert.True(c.t, errors.Is(err, io.EOF) || isReset(err), "want end of stream, got %v", err)
	c.nc.Close()
}

// isReset reports whether err is a network error other than a timeout,
// such as a connection reset by the peer.
func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// DialFrom connects to the hub at addr from the local address local, such
// as 127.0.0.2 (any 127.0.0.0/8 address is the loopback on Linux), so that
// one machine can play peers the hub tells apart by address. It fails the
// test if it cannot; the connection is closed when the test ends.
func DialFrom(t testing.TB, local, addr string) *Client {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: IOTimeout}
	nc, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return &Client{t: t, nc: nc, r: bufio.NewReader(nc)}
}
