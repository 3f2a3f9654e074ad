package relay

import (
	"bufio"
	"net"
	"testing"
)

// BenchmarkFastFailLoopbackDepth1 measures E904 answers end to end over
// loopback TCP connections that each keep one line in flight, as a depth-1
// client does: every answer costs each side a read, a write and a wake-up.
// Connections run in parallel (b.RunParallel, 8 per CPU); ns/op is the
// wall time per answer of the hub and its clients together.
func BenchmarkFastFailLoopbackDepth1(b *testing.B) {
	srv := openBreakerServer(b, false, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	req := []byte("TX-000123|CORE|XFER 1001 1002 2500\n")
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		nc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer nc.Close()
		r := bufio.NewReader(nc)
		for pb.Next() {
			if _, err := nc.Write(req); err != nil {
				b.Error(err)
				return
			}
			if _, err := r.ReadSlice('\n'); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
