package relay

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/relayhub/relayhub/breaker"
)

// discardConn is a net.Conn that swallows writes, so a benchmark measures
// the hub's own work on a line rather than the kernel's.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error)      { return len(b), nil }
func (discardConn) SetWriteDeadline(time.Time) error { return nil }
func (discardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

var _ net.Conn = discardConn{}

// openBreakerServer returns a Server whose CORE breaker is open.
func openBreakerServer(b *testing.B) *Server {
	srv, err := New(Config{
		Targets:       []Target{{Name: "CLAIM", URL: "http://127.0.0.1:1"}, {Name: "CORE", URL: "http://127.0.0.1:1"}},
		FailThreshold: 1,
		ResetTimeout:  time.Hour,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close() })
	rt := srv.lookup([]byte("CORE"))
	ticket, err := rt.breaker.Allow()
	if err != nil {
		b.Fatal(err)
	}
	rt.breaker.Done(ticket, true)
	if rt.breaker.Snapshot().State != breaker.Open {
		b.Fatal("breaker did not open")
	}
	return srv
}

// BenchmarkFastFailLine measures the hub's path for one request line whose
// target's breaker is open: parse, route, breaker refusal, E904 message with
// its retry hint, and the buffered answer (flushed every 64 lines, as a
// pipelining client would cause).
func BenchmarkFastFailLine(b *testing.B) {
	srv := openBreakerServer(b)
	c := newConn(srv, discardConn{})
	line := []byte("TX-000123|core|XFER 1001 1002 2500")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.serveLine(line)
		if i++; i%64 == 0 {
			c.flush()
		}
	}
}

// BenchmarkFastFailLoopback measures E904 answers end to end over a loopback
// TCP connection, with 64 pipelined lines per round trip.
func BenchmarkFastFailLoopback(b *testing.B) {
	srv := openBreakerServer(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	const batch = 64
	req := []byte(strings.Repeat("TX-000123|CORE|XFER 1001 1002 2500\n", batch))
	r := bufio.NewReader(nc)
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		for range batch {
			if _, err := r.ReadSlice('\n'); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/line")
}
