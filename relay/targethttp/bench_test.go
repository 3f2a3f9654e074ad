package targethttp

import (
	"testing"
	"time"
)

// BenchmarkTargetCall measures one call on a kept-alive loopback
// connection to a raw target that answers at once: the request built,
// the idle check, the write, the wait and read of the answer, its
// decoding. The target runs in the same process, so its share is in the
// figures too.
func BenchmarkTargetCall(b *testing.B) {
	tg := newBenchTarget(b)
	txid, payload := []byte("TX1"), []byte("BAL 1")
	b.ReportAllocs()
	for b.Loop() {
		if res := tg.Call(txid, payload); res.Code != "0000" {
			b.Fatalf("%s %s", res.Code, res.Msg)
		}
	}
}

// BenchmarkStale measures the idle check a pooled connection gets before
// each reuse (targetConn.stale, one non-blocking peek) on a healthy
// kept-alive loopback connection: docs/DESIGN.md, "The target client",
// cites its figure.
func BenchmarkStale(b *testing.B) {
	tg := newBenchTarget(b)
	c := tg.pool.get()
	if c == nil {
		b.Fatal("no pooled connection")
	}
	defer tg.pool.put(c)
	if c.rc == nil {
		b.Skip("no idle check on this platform")
	}
	b.ReportAllocs()
	for b.Loop() {
		if c.stale() {
			b.Fatal("a healthy connection found stale")
		}
	}
}

// newBenchTarget returns a Client for a raw answering target, its one
// connection opened.
func newBenchTarget(b *testing.B) *Client {
	b.Helper()
	tg, err := New(Config{URL: rawAnswerTarget(b, 0), Timeout: 5 * time.Second, MaxInflight: 1, Conns: NewConns(nil)})
	if err != nil {
		b.Fatal(err)
	}
	if res := tg.Call([]byte("TX0"), nil); res.Code != "0000" {
		b.Fatalf("%s %s", res.Code, res.Msg)
	}
	return tg
}
