package proctest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relayhub/relayhub/relay/protocol"
)

// ReadTimeout bounds every read of Conn's convenience methods, so a missing
// answer fails the test instead of hanging it.
const ReadTimeout = 10 * time.Second

// Answer is one parsed response line of the client protocol:
// TXID|CODE|MESSAGE. It is a plain value, safe to copy and share.
type Answer struct {
	TxID    string
	Code    string
	Message string
}

// String returns a as its response line, without the newline.
func (a Answer) String() string { return a.TxID + "|" + a.Code + "|" + a.Message }

// ParseAnswer parses a response line, with or without its trailing newline,
// as protocol.ParseResponse does, and refuses any other line break: the hub
// never writes a '\r'. The message is everything after the second '|', so
// it may hold '|'.
func ParseAnswer(line string) (Answer, error) {
	line = strings.TrimSuffix(line, "\n")
	r, err := protocol.ParseResponse([]byte(line))
	if err != nil {
		return Answer{}, fmt.Errorf("not a response line (TXID|CODE|MESSAGE): %q", line)
	}
	if strings.ContainsAny(line, "\r\n") {
		return Answer{}, fmt.Errorf("response line holds a line break: %q", line)
	}
	return Answer{TxID: string(r.TxID), Code: string(r.Code), Message: string(r.Message)}, nil
}

// Conn is a client connection to the relay. Write may be called from any
// goroutine; the other methods belong on the goroutine of the test that
// dialled, because they fail it. Reads are not safe for concurrent use.
type Conn struct {
	t testing.TB
	c *net.TCPConn
	r *bufio.Reader
}

// Dial connects to addr, failing the test if it cannot. The connection is
// closed when the test ends.
func Dial(t testing.TB, addr string) *Conn {
	t.Helper()
	c, err := DialErr(t, addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return c
}

// DialErr is Dial returning the error instead of failing the test, for
// tests that expect a refusal.
func DialErr(t testing.TB, addr string) (*Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, ReadTimeout)
	if err != nil {
		return nil, err
	}
	c := &Conn{t: t, c: nc.(*net.TCPConn), r: bufio.NewReader(nc)}
	t.Cleanup(func() { _ = nc.Close() })
	return c, nil
}

// Write writes p as it is.
func (c *Conn) Write(p []byte) (int, error) {
	if err := c.c.SetWriteDeadline(time.Now().Add(ReadTimeout)); err != nil {
		return 0, err
	}
	return c.c.Write(p)
}

// Send writes each line followed by "\n", in one write, failing the test
// on error.
func (c *Conn) Send(lines ...string) {
	c.t.Helper()
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		c.t.Fatalf("send %d lines: %v", len(lines), err)
	}
}

// ReadLine reads one line, newline included, waiting at most d.
func (c *Conn) ReadLine(d time.Duration) (string, error) {
	if err := c.c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	return c.r.ReadString('\n')
}

// ReadAnswer reads and parses one response line within ReadTimeout,
// failing the test otherwise.
func (c *Conn) ReadAnswer() Answer {
	c.t.Helper()
	line, err := c.ReadLine(ReadTimeout)
	if err != nil {
		c.t.Fatalf("read answer: %v (partial line %q)", err, line)
	}
	a, err := ParseAnswer(line)
	if err != nil {
		c.t.Fatalf("read answer: %v", err)
	}
	return a
}

// ReadAnswers reads n answers, in the order they arrive.
func (c *Conn) ReadAnswers(n int) []Answer {
	c.t.Helper()
	out := make([]Answer, 0, n)
	for range n {
		out = append(out, c.ReadAnswer())
	}
	return out
}

// Exchange sends one line and reads one answer. Use it only when no other
// answer can be pending on the connection.
func (c *Conn) Exchange(line string) Answer {
	c.t.Helper()
	c.Send(line)
	return c.ReadAnswer()
}

// ExpectClosed reads until the peer closes the connection, within
// ReadTimeout, and returns what was read; the test fails if the connection
// stays open. A reset counts as closed.
func (c *Conn) ExpectClosed() string {
	c.t.Helper()
	if err := c.c.SetReadDeadline(time.Now().Add(ReadTimeout)); err != nil {
		c.t.Fatalf("set deadline: %v", err)
	}
	b, err := io.ReadAll(c.r)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection still open after %v; read %q", ReadTimeout, b)
	}
	return string(b)
}

// CloseWrite shuts down the writing side, so the peer reads end of input.
func (c *Conn) CloseWrite() {
	c.t.Helper()
	if err := c.c.CloseWrite(); err != nil {
		c.t.Fatalf("close write: %v", err)
	}
}

// Close closes the connection.
func (c *Conn) Close() { _ = c.c.Close() }

// ByTxID indexes answers by TXID, failing the test on a TXID answered
// twice.
func ByTxID(t testing.TB, answers []Answer) map[string]Answer {
	t.Helper()
	m := make(map[string]Answer, len(answers))
	for _, a := range answers {
		if prev, dup := m[a.TxID]; dup {
			t.Fatalf("TXID %q answered twice: %q and %q", a.TxID, prev, a)
		}
		m[a.TxID] = a
	}
	return m
}

// DialFrom is Dial from the local address local, such as 127.0.0.2 (any
// 127.0.0.0/8 address is the loopback on Linux), so that one machine can
// play peers the relay tells apart by address.
func DialFrom(t testing.TB, local, addr string) *Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: ReadTimeout}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, local, err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &Conn{t: t, c: nc.(*net.TCPConn), r: bufio.NewReader(nc)}
}
