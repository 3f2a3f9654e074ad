package relay

import (
	"bufio"
	"context"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/relayhub/relayhub/breaker"
)

// discardConn is a net.Conn that swallows writes, so a benchmark measures
// the hub's own work on a line rather than the kernel's.
type discardConn struct{ net.Conn }

func (discardConn) Write(b []byte) (int, error)      { return len(b), nil }
func (discardConn) SetWriteDeadline(time.Time) error { return nil }
func (discardConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

var _ net.Conn = discardConn{}

// benchVariants are the configurations every path is measured in: bare,
// with metrics, and with metrics and an access log.
var benchVariants = []struct {
	name            string
	metrics, access bool
}{
	{name: "metrics=off"},
	{name: "metrics=on", metrics: true},
	{name: "metrics=on,access_log=on", metrics: true, access: true},
}

// benchServer returns a Server for CLAIM and CORE, both served by client,
// with metrics on a registry of its own and an access log to io.Discard as
// asked.
func benchServer(b *testing.B, cfg Config, metrics, access bool) *Server {
	cfg.Targets = []Target{{Name: "CLAIM", URL: "http://127.0.0.1:1"}, {Name: "CORE", URL: "http://127.0.0.1:1"}}
	if metrics {
		m, err := NewMetrics(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		cfg.Metrics = m
	}
	if access {
		cfg.AccessLog = io.Discard
	}
	srv, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = srv.Close() })
	return srv
}

// openBreakerServer returns a Server whose CORE breaker is open.
func openBreakerServer(b *testing.B, metrics, access bool) *Server {
	srv := benchServer(b, Config{TargetSettings: TargetSettings{Policy: breaker.Policy{FailThreshold: 1, ResetTimeout: time.Hour}}}, metrics, access)
	rt := srv.table.lookup([]byte("CORE"))
	ticket, _, err := rt.breaker.Allow()
	if err != nil {
		b.Fatal(err)
	}
	rt.breaker.Done(ticket, true, 0)
	if rt.breaker.Snapshot().State != breaker.Open {
		b.Fatal("breaker did not open")
	}
	return srv
}

// benchLines serves line over and over on c, in batches of 64 lines as a
// pipelining client would cause: each batch ends, as in serveInput, with a
// flush and a fresh reading of the breakers' clock for the next.
func benchLines(b *testing.B, c *conn, line []byte) {
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		c.serveLine(line)
		if i++; i%64 == 0 {
			c.out.flush(time.Now())
			c.adm.endBatch()
		}
	}
}

// BenchmarkFastFailLine measures the hub's path for one request line whose
// target's breaker is open: parse, route, breaker refusal, E904 message with
// its retry hint, and the buffered answer.
func BenchmarkFastFailLine(b *testing.B) {
	for _, v := range benchVariants {
		b.Run(v.name, func(b *testing.B) {
			srv := openBreakerServer(b, v.metrics, v.access)
			benchLines(b, newConn(srv, discardConn{}), []byte("TX-000123|core|XFER 1001 1002 2500"))
		})
	}
}

// BenchmarkBulkheadFullLine measures the E905 path: the breaker admits, the
// bulkhead is full, the ticket goes back.
func BenchmarkBulkheadFullLine(b *testing.B) {
	for _, v := range benchVariants {
		b.Run(v.name, func(b *testing.B) {
			srv := benchServer(b, Config{TargetSettings: TargetSettings{MaxInflight: 1}}, v.metrics, v.access)
			rt := srv.table.lookup([]byte("CORE"))
			if !rt.bulkhead.TryAcquire() {
				b.Fatal("bulkhead already full")
			}
			b.Cleanup(rt.bulkhead.Release)
			benchLines(b, newConn(srv, discardConn{}), []byte("TX-000123|core|XFER 1001 1002 2500"))
		})
	}
}

// memTarget serves the target protocol over in-memory connections and
// answers every transaction 0000, and returns the Config.DialTarget that
// reaches it, so that a benchmark measures the hub's side of a call, its
// HTTP client included, without the kernel. The server is fasthttp's, which
// allocates nothing per request: allocations counted are the hub's.
func memTarget(b *testing.B) func(context.Context, string, string) (net.Conn, error) {
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBodyString(memAnswer)
	}}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Shutdown() })
	return func(context.Context, string, string) (net.Conn, error) { return ln.Dial() }
}

const memAnswer = `{"code":"0000","message":"balance=99500"}`

// BenchmarkCallLine measures a whole admitted call against an in-memory
// target: parse, admission, the call's goroutine, the HTTP request and its
// answer decoded, the breaker's record, the slot's release and the answer.
// Lines go in bursts of the bulkhead's size, each burst waited for.
func BenchmarkCallLine(b *testing.B) {
	for _, v := range benchVariants {
		b.Run(v.name, func(b *testing.B) {
			srv := benchServer(b, Config{DialTarget: memTarget(b)}, v.metrics, v.access)
			c := newConn(srv, discardConn{})
			line := []byte("TX-000123|core|XFER 1001 1002 2500")
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c.serveLine(line)
				if i++; i%DefaultMaxInflight == 0 {
					c.adm.calls.Wait()
				}
			}
			c.adm.calls.Wait()
		})
	}
}

// BenchmarkFastFailLoopback measures E904 answers end to end over a loopback
// TCP connection, with 64 pipelined lines per round trip.
func BenchmarkFastFailLoopback(b *testing.B) {
	srv := openBreakerServer(b, false, false)
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

// BenchmarkMetricsOverhead compares each request path with metrics off and
// on, interleaved: every iteration runs a chunk of lines on the bare Server
// and a chunk on the Server with metrics, in alternating order, and the
// medians of the per-line times of the chunks are reported, with the
// overhead in percent. Interleaving makes both sides share whatever else
// the machine is doing, which sequential benchmarks do not.
func BenchmarkMetricsOverhead(b *testing.B) {
	line := []byte("TX-000123|core|XFER 1001 1002 2500")
	serve := func(c *conn, wait bool) func(n int) {
		return func(n int) {
			for i := range n {
				c.serveLine(line)
				if (i+1)%DefaultMaxInflight == 0 {
					if wait {
						c.adm.calls.Wait()
					} else {
						c.out.flush(time.Now())
					}
				}
			}
			c.adm.calls.Wait()
			c.out.flush(time.Now())
		}
	}
	paths := []struct {
		name  string
		chunk int
		setup func(b *testing.B, metrics bool) func(n int)
	}{
		{name: "E904", chunk: 2000, setup: func(b *testing.B, metrics bool) func(int) {
			return serve(newConn(openBreakerServer(b, metrics, false), discardConn{}), false)
		}},
		{name: "E905", chunk: 2000, setup: func(b *testing.B, metrics bool) func(int) {
			srv := benchServer(b, Config{TargetSettings: TargetSettings{MaxInflight: 1}}, metrics, false)
			rt := srv.table.lookup([]byte("CORE"))
			if !rt.bulkhead.TryAcquire() {
				b.Fatal("bulkhead already full")
			}
			b.Cleanup(rt.bulkhead.Release)
			return serve(newConn(srv, discardConn{}), false)
		}},
		{name: "call", chunk: 200, setup: func(b *testing.B, metrics bool) func(int) {
			srv := benchServer(b, Config{DialTarget: memTarget(b)}, metrics, false)
			return serve(newConn(srv, discardConn{}), true)
		}},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			off, on := p.setup(b, false), p.setup(b, true)
			off(p.chunk) // warm pools and connections
			on(p.chunk)
			var offNs, onNs []float64
			timed := func(run func(int)) float64 {
				start := time.Now()
				run(p.chunk)
				return float64(time.Since(start).Nanoseconds()) / float64(p.chunk)
			}
			i := 0
			for b.Loop() {
				if i++; i%2 == 0 {
					offNs = append(offNs, timed(off))
					onNs = append(onNs, timed(on))
				} else {
					onNs = append(onNs, timed(on))
					offNs = append(offNs, timed(off))
				}
			}
			mOff, mOn := median(offNs), median(onNs)
			b.ReportMetric(mOff, "off-ns/line")
			b.ReportMetric(mOn, "on-ns/line")
			b.ReportMetric(100*(mOn-mOff)/mOff, "overhead-%")
		})
	}
}

// median returns the median of xs, which it sorts.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}
