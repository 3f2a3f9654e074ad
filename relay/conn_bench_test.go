package relay

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"strconv"
	"testing"
)

// BenchmarkFastFailLoopbackDepth1 measures E904 answers end to end over
// loopback TCP connections that each keep one line in flight, as a depth-1
// client does: every answer costs each side a read, a write and a wake-up.
// Connections run in parallel (b.RunParallel, 8 per CPU); ns/op is the
// wall time per answer of the hub and its clients together. Where
// /proc/self/io exists it also reports the read and write system calls of
// the whole process (hub and clients) per answer.
func BenchmarkFastFailLoopbackDepth1(b *testing.B) {
	srv := openBreakerServer(b, false, false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	reads, writes, counted := syscallCounts()
	depth1Clients(b, ln.Addr().String(), nil)
	if reads2, writes2, ok := syscallCounts(); ok && counted {
		b.ReportMetric(float64(reads2-reads)/float64(b.N), "reads/op")
		b.ReportMetric(float64(writes2-writes)/float64(b.N), "writes/op")
	}
}

// depth1Clients runs b's loop on connections to addr in parallel (8 per
// CPU), each writing hello once (nothing when nil), then an E904 request
// line at a time and waiting for its answer.
func depth1Clients(b *testing.B, addr string, hello []byte) {
	req := []byte("TX-000123|CORE|XFER 1001 1002 2500\n")
	b.SetParallelism(8)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer nc.Close()
		if _, err := nc.Write(hello); err != nil {
			b.Error(err)
			return
		}
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

// syscallCounts returns the read and write system calls the process has
// made so far, from /proc/self/io; ok is false where that is not available.
func syscallCounts() (reads, writes int64, ok bool) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0, false
	}
	field := func(name string) (int64, bool) {
		_, rest, found := bytes.Cut(b, []byte(name+": "))
		if !found {
			return 0, false
		}
		v, _, _ := bytes.Cut(rest, []byte("\n"))
		n, err := strconv.ParseInt(string(v), 10, 64)
		return n, err == nil
	}
	reads, okR := field("syscr")
	writes, okW := field("syscw")
	return reads, writes, okR && okW
}
