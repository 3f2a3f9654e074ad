// Command relayctl is the operator's client for the relay hub: it sends one
// transaction, load-tests the hub with latency percentiles, shows every
// target's breaker and bulkhead, steers a target's breaker by hand, makes
// the hub reload its settings file, lists the hub's recent calls in doubt,
// replays access logs through the breakers to tune their settings on real
// traffic, and reconciles the hub's in-doubt transactions with their
// targets.
//
// Typical use:
//
//	relayctl send CORE 'BAL ACC1'
//	relayctl send --txid T7 --resend-on E901 CORE 'WD ACC1 500'
//	relayctl load --conns 16 --duration 10s --mix CORE=70,CLAIM=30
//	relayctl load --rate 20000 --requests 200000 --json
//	relayctl status
//	relayctl breaker open CORE --admin-token-file ~/.relayhub/admin-token
//	relayctl breaker close CORE
//	relayctl reload
//	relayctl in-doubt
//	relayctl in-doubt --recent --since 2026-12-01T17:00:00Z
//	relayctl in-doubt resolve W1 --applied 0000
//	relayctl replay --access-log access.log --config relay.toml --compare fail_threshold=3
//	relayctl reconcile --in-doubt-log in-doubt.log --json
//
// status, breaker, reload and in-doubt ask the hub's admin port (--admin,
// default 127.0.0.1:9280, HTTPS with --tls and its kin) with the hub's
// bearer token, from --admin-token-file (a file its owner alone may read,
// as the hub's own --admin-token-file) or RELAYCTL_ADMIN_TOKEN; the
// breaker actions and reload need it whenever the hub has one, the reads
// only from beyond loopback. breaker's actions are those of POST
// /breakers/{target}: open holds the breaker open until close or enable,
// and hold is another name for it; close, disable (pass-through) and
// enable. Each prints the target as status does, reload what the hub
// added, removed and changed, in-doubt a table of the open calls in doubt
// with their attempts and next attempt (--recent: the recent calls in
// doubt, settled or not); --json prints the hub's own answer.
//
// send exits 0 for 0000 or Bnnn, 1 for any other code, 2 when the hub
// cannot be reached or does not answer in time. With --resend-on it sends
// the same line, TXID and all, again while the answer has one of those
// codes (at most --resend-max times, --resend-after apart), prints each
// answer after "try N: ", and the last answer decides. load exits 1 when
// any answer was unmatched or missing or a connection failed, 2 when it
// could not connect at all. status, breaker, reload and in-doubt exit 1
// when the hub refuses (an unknown target, a missing or wrong token, a
// settings file with a mistake, which the hub does not apply) or its
// answer is not what was asked for, 2 when they cannot ask it (a TLS or
// token file they cannot use, the admin port unreachable or silent).
// replay exits 1 when its settings or a file cannot be used; malformed
// lines are reported, not fatal. reconcile exits 0 when every in-doubt
// transaction is known, applied or not, 1 when any is unknown or a journal
// line could not be read, 2 when it could not check at all (a bad flag, a
// journal it cannot open). in-doubt resolve has the running hub settle
// the TXID (POST /in-doubt/{txid}/resolve), or, given the journal of a
// hub that is stopped (--in-doubt-log, unlocked), appends the settlement
// to it; it exits 1 when the TXID is not open, 2 when the hub cannot be
// asked or the journal cannot be read or written.
//
// load sends request lines TXID|TARGET|PAYLOAD and matches the answers by
// TXID, since the hub may answer out of order. By default it runs a closed
// loop: each connection keeps --depth requests in flight. With --rate it
// follows a fixed schedule instead and measures each latency from the time
// the request was due, so a stalled hub shows up in the percentiles rather
// than slowing the tool down with it. The engine is internal/loadgen; the
// benchmark harness, cmd/relaybench, drives reference servers with it too.
//
// A mistake in the command line exits 2, as does a RELAYCTL_ variable
// that is no flag's. Every flag also has an environment variable,
// RELAYCTL_ and the flag in upper snake case (--addr is RELAYCTL_ADDR,
// --admin-token-file is RELAYCTL_ADMIN_TOKEN_FILE).
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
	Version   kong.VersionFlag `help:"Print the version and exit."`
	Send      sendCmd          `cmd:"" help:"Send one transaction and print its answer."`
	Load      loadCmd          `cmd:"" help:"Load-test the hub and report throughput and latency percentiles."`
	Status    statusCmd        `cmd:"" help:"Show every target's breaker state and bulkhead from the admin endpoint."`
	Breaker   breakerCmd       `cmd:"" help:"Hold a target's breaker open, close it, disable it (pass-through) or enable it again, through the admin endpoint."`
	Reload    reloadCmd        `cmd:"" help:"Make the hub re-read its settings file (--config) and show what it added, removed and changed; exit 1 when the hub refuses the file."`
	InDoubt   inDoubtGroup     `cmd:"" name:"in-doubt" help:"List the hub's open calls in doubt, which may have reached their target without an answer, with their attempts; or settle one by hand (resolve)."`
	Replay    replayCmd        `cmd:"" help:"Replay access logs through the breakers, with the hub's settings or others, and show what they did or would have done."`
	Reconcile reconcileCmd     `cmd:"" help:"Ask each target whether it applied each transaction of the hub's in-doubt journal."`
}

// streams are where a command reads and writes.
type streams = cmdline.Streams

func newParser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(c, append([]kong.Option{
		kong.Name("relayctl"),
		kong.Description("Operator's client for the relay hub: send, load, status, breaker, reload, in-doubt, replay, reconcile."),
		kong.Vars{"version": version, "rate_depth": strconv.Itoa(loadgen.RateDepth)},
		kong.NamedMapper("hubduration", hubDuration{}),
	}, opts...)...)
}

func main() {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the cli struct's tags are wrong: a build defect
	}
	cmdline.Main(parser, os.Args[1:], "RELAYCTL_")
}
