// Command relaybench is the benchmark harness of the relay hub: it drives
// the hub, or a reference server, with the load generator of `relayctl
// load`, measures the CPU time the servers spend per answer, and measures
// what idle connections cost the hub in memory. scripts/bench.sh runs it.
//
// Typical use:
//
//	relaybench load --conns 64 --depth 16 --duration 5s --server-pid "$(pidof relay)"
//	relaybench load --addr 127.0.0.1:6379 --protocol redis-ping --conns 64 --duration 5s
//	relaybench load --addr 127.0.0.1:9201 --protocol http --conns 16 --payload 'BAL ACC{conn}'
//	relaybench idle --conns 10000 --hold 10s --server-pid "$(pidof relay)"
//	relaybench connect --workers 8 --duration 5s --tls --ca hub-ca.pem --resume --server-pid "$(pidof relay)"
//	relaybench target --listen 127.0.0.1:9301
//
// load takes every flag of `relayctl load`, and its output and exit status
// are the same, plus --protocol (relay, the hub's line protocol; redis-ping,
// inline PING to a redis server; http, POST /tx straight to a target, as
// the hub does), --server-pid (repeatable: report the CPU time of that
// process per answer), --phase NAME=DURATION (repeatable: report each
// stretch of the run apart, as when a benchmark cuts its target's capacity
// midway) and --watch-url with --watch-series (read one series of a
// metrics page once a second and report per phase where it settled). idle exits 1 when a connection could not be opened
// or did not survive the hold, 2 when none could be opened. connect exits
// 1 when a connection failed, 2 when none succeeded. target serves a raw
// keep-alive HTTP/1.1 target (every POST /tx answered {"code":"0000",...},
// pipelined requests answered with one write) until SIGINT or SIGTERM, and
// logs the address it listens on as a JSON line on stderr. load, idle and
// connect speak TLS with --tls (and --ca, --cert, --key, --server-name). Every flag also
// has an environment variable, RELAYBENCH_ and the flag in upper snake case;
// a mistake in the command line, or a RELAYBENCH_ variable that is no
// flag's, exits 2.
package main

import (
	"os"
	"strconv"

	"github.com/alecthomas/kong"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// cli is the command line, filled by kong. Not for concurrent use.
type cli struct {
	Version kong.VersionFlag `help:"Print the version and exit."`
	Load    loadCmd          `cmd:"" help:"Load-test the hub, or a reference server, and report throughput, latency percentiles and server CPU."`
	Idle    idleCmd          `cmd:"" help:"Hold many silent connections open and report the hub's memory per connection."`
	Connect connectCmd       `cmd:"" help:"Connect, send one line and hang up, over and over: connections (TLS handshakes, full or resumed) per second and their server CPU."`
	Target  targetCmd        `cmd:"" help:"Serve a raw keep-alive HTTP target that answers every POST /tx with 0000 in a few microseconds, for measuring proxies in front of it."`
}

// HubFlags are the flags that idle and connect share: the hub's address,
// TLS to it, and the summary as JSON. Filled by kong, not for concurrent
// use.
type HubFlags struct {
	Addr string `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"RELAYBENCH_ADDR"`
	JSON bool   `name:"json" help:"Print the summary as JSON." env:"RELAYBENCH_JSON"`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYBENCH_"`
}

// streams are where a command reads and writes.
type streams = cmdline.Streams

func newParser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("relaybench"),
		kong.Description("Benchmark harness for the relay hub: load (also against reference servers), idle, connect, and a raw target."),
		kong.Vars{"version": version, "rate_depth": strconv.Itoa(loadgen.RateDepth)},
	}, opts...)...)
}

func main() {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the cli struct's tags are wrong: a build defect
	}
	cmdline.Main(parser, os.Args[1:], "RELAYBENCH_")
}
