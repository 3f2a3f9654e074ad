// Package loadgen load-tests the relay hub and reports throughput, latency
// percentiles and answer codes. It is the engine of `relayctl load` and of
// the benchmark command relaybench.
//
// A Generator opens Config.Conns connections and sends request lines
// TXID|TARGET|PAYLOAD with TXIDs L<conn>-<seq>, the target picked by a
// weighted Mix and the payload built from a Template, and matches answers
// by TXID, since the hub may answer out of order. By default it runs a
// closed loop: each connection keeps Config.Depth requests in flight. With
// Config.Rate it follows a fixed schedule instead and measures each
// latency from the time the request was due, not from when it was written,
// so a stalled hub shows up in the percentiles rather than slowing the
// generator down with it (coordinated omission). Only the generator's own
// timer lateness (Go timers fire up to about 1ms late) is left out: a
// request that fell due while its sender slept is measured from the
// wake-up. Answers that are unmatched, malformed or missing, and failed
// connections, are counted, never guessed at.
//
// For benchmarks the same connections, pacing and histogram can speak to
// reference servers (Config.Protocol: redis-ping, or http straight to a
// target) and report the CPU time of given processes per answer
// (Config.ServerPIDs). An IdleProbe holds many silent connections open and
// reports the hub's resident memory per connection.
//
// Typical use:
//
//	mix, _ := loadgen.ParseMix("CORE=70,CLAIM=30")
//	bal, _ := loadgen.ParseTemplate("BAL ACC{conn}")
//	claim, _ := loadgen.ParseTemplate("SUBMIT P{conn} {n}")
//	g, err := loadgen.New(loadgen.Config{
//		Addr:     "127.0.0.1:9200",
//		Conns:    16,
//		Duration: 10 * time.Second,
//		Drain:    5 * time.Second, // for the answers still out at the end
//		Mix:      mix,
//		Payloads: []loadgen.Template{bal, claim},
//	})
//	if err != nil { ... }
//	res, err := g.Run(ctx)
//	if err != nil { ... }
//	sum := g.Summary(res)
//	sum.WriteText(os.Stdout) // throughput, p50..p99.9, codes
//	if bad := sum.Problems(); bad != "" { ... }
package loadgen
