package resolver_test

import (
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/relayhub/relayhub/relay/resolver"
)

// BenchmarkMemoryOf10000Open reports the heap one open entry takes: a
// hub with a long outage of its target holds thousands. The TXIDs are
// made before the first reading, as a hub's come from its clients.
func BenchmarkMemoryOf10000Open(b *testing.B) {
	const n = 10000
	txids := make([]string, n)
	for i := range txids {
		txids[i] = "W" + strconv.Itoa(1_000_000+i)
	}
	var perEntry float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := resolver.New(resolver.Config{Settler: &settlements{}})
		r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup})
		for i, txid := range txids {
			r.Add(resolver.Entry{Target: "CORE", TxID: txid, Since: t0.Add(time.Duration(i) * time.Millisecond)})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perEntry = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(r)
	}
	b.ReportMetric(perEntry, "bytes/entry")
}

// closedGate is a target whose breaker is open: the resolver waits.
type closedGate struct{}

func (closedGate) Allow() bool      { return false }
func (closedGate) TryAcquire() bool { return false }
func (closedGate) Release()         {}

// BenchmarkWakesWith10000Open is the resolver's cost while nothing
// settles: 10 000 open entries that went in doubt over 5 s (2000 a
// second), driven the way a hub drives it (wake at Next, Due, make the
// attempts, Done) from their first attempt on. Each op is one wake;
// cpu-% is the share of one core the wakes take, from their rate in
// simulated time.
func BenchmarkWakesWith10000Open(b *testing.B) {
	for _, tc := range []struct {
		name string
		gate resolver.Gate
	}{
		{"breaker-open", closedGate{}},               // paused: every entry waits
		{"lookups-unanswered", (resolver.Gate)(nil)}, // each attempt a Retry
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := resolver.New(resolver.Config{Settler: &settlements{}, Rand: half})
			r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup, Gate: tc.gate})
			for i := range 10000 {
				r.Add(resolver.Entry{Target: "CORE", TxID: "W" + strconv.Itoa(i), Since: t0.Add(time.Duration(i) * time.Millisecond / 2)})
			}
			now := t0.Add(resolver.DefaultResolveAfter)
			start, wakes := now, 0
			for b.Loop() {
				for _, a := range r.Due(now) {
					r.Done(a, resolver.Retry, now)
				}
				wakes++
				next, ok := r.Next()
				if !ok {
					b.Fatal("nothing scheduled")
				}
				if next.After(now) {
					now = next
				}
			}
			if sim := now.Sub(start).Seconds(); sim > 0 {
				rate := float64(wakes) / sim
				b.ReportMetric(rate, "wakes/s")
				b.ReportMetric(rate*float64(b.Elapsed().Nanoseconds())/float64(wakes)/1e9*100, "cpu-%")
			}
		})
	}
}
