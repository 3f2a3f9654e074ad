// Command relay is the relayhub hub: it serves the line protocol on TCP and
// relays each transaction to its target over HTTP, each target behind its
// own circuit breaker and bulkhead. Every breaker state change is appended
// to the breaker log. The admin port serves Prometheus metrics, health,
// readiness and a JSON status (docs/OPERATING.md).
//
// Typical use:
//
//	relay --listen 127.0.0.1:9200 --admin-listen 127.0.0.1:9280 \
//	  --target CORE=http://127.0.0.1:9201 --target CLAIM=http://127.0.0.1:9202 \
//	  --fail-threshold 5 --reset-timeout 10s --breaker-log breaker.log
//
// Per-target settings, fallbacks and the optional breaker policies come from
// flags that set every target's defaults and a TOML file that overrides them
// per target (docs/CONFIG.md):
//
//	relay --failure-rate 0.5 --min-samples 20 --window 1m \
//	  --config docs/relay.example.toml
//
// Every flag has an environment variable RELAY_<FLAG_IN_UPPER_SNAKE>.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/settingsfile"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type cli struct {
	Listen        string       `help:"Address to serve the line protocol on; port 0 picks a free port (logged as addr)." default:"127.0.0.1:9200" env:"RELAY_LISTEN"`
	AdminListen   string       `help:"Address for the admin HTTP endpoints (/metrics, /healthz, /readyz, /status); port 0 picks a free port (logged as admin_addr); empty turns them off." default:"127.0.0.1:9280" env:"RELAY_ADMIN_LISTEN"`
	Target        []targetFlag `help:"Target as NAME=URL; repeat for more. Giving any replaces the default pair. In the environment, comma-separated." placeholder:"NAME=URL" default:"CORE=http://127.0.0.1:9201,CLAIM=http://127.0.0.1:9202" env:"RELAY_TARGET"`
	FailThreshold int          `help:"Consecutive failures that open a target's breaker." default:"5" env:"RELAY_FAIL_THRESHOLD"`
	ResetTimeout  duration     `help:"How long an open breaker refuses calls before a probe; a bare number is seconds, 500ms works." default:"10s" env:"RELAY_RESET_TIMEOUT"`
	MaxInflight   int          `help:"Calls in flight per target (bulkhead size); one more is answered E905." default:"10" env:"RELAY_MAX_INFLIGHT"`
	TargetTimeout duration     `help:"Time a target has to answer one call, connect included (E901 after)." default:"3s" env:"RELAY_TARGET_TIMEOUT"`
	BreakerLog    string       `help:"File every breaker state change is appended to; locked while the relay runs, reopened on SIGHUP (for logrotate)." default:"breaker.log" env:"RELAY_BREAKER_LOG"`
	FailureCodes  []string     `help:"Response codes that count as breaker failures, comma-separated or repeated: E400, E500, E901, E902, or a target's own code from E000 to E899." default:"E500,E901,E902" env:"RELAY_FAILURE_CODES"`
	MaxLineBytes  int          `help:"Longest request line, not counting the newline; longer ones get E900." default:"16384" env:"RELAY_MAX_LINE_BYTES"`
	MaxConns      int          `help:"Client connections served at once; one more gets E906 and is closed." default:"10000" env:"RELAY_MAX_CONNS"`
	IdleTimeout   duration     `help:"Close a client connection that sends no line for this long." default:"5m" env:"RELAY_IDLE_TIMEOUT"`
	DrainTimeout  duration     `help:"On SIGINT or SIGTERM, how long calls in flight may take to finish before they are cancelled." default:"10s" env:"RELAY_DRAIN_TIMEOUT"`
	WriteTimeout  duration     `help:"Disconnect a client that does not read its answers for this long." default:"30s" env:"RELAY_WRITE_TIMEOUT"`
	LogLevel      string       `help:"Log level: debug logs every call and connection." enum:"debug,info,warn,error" default:"info" env:"RELAY_LOG_LEVEL"`
	LogFormat     string       `help:"Log format on stderr: json or console (for humans)." enum:"json,console" default:"json" env:"RELAY_LOG_FORMAT"`
	AccessLog     string       `help:"File to append one JSON line per answered transaction to, for audit; written off the answer path, lines dropped and counted when it falls behind. Empty turns it off." env:"RELAY_ACCESS_LOG"`
	InDoubtLog    string       `help:"File to append one JSON line to, and fsync, for every call that may have reached its target without an answer (E901, E902 or E500 in doubt), before the client gets its answer; for reconciliation. Locked while the relay runs, reopened on SIGHUP (for logrotate). Empty turns it off." placeholder:"FILE" env:"RELAY_IN_DOUBT_LOG"`
	StatusPage    bool         `help:"Serve the live status page on the admin port (GET / for browsers; curl still gets the text index) and keep the 15 minutes of history it draws." default:"true" negatable:"" env:"RELAY_STATUS_PAGE"`

	// Off by default: an fsync per line makes every breaker state change
	// wait for the disk (docs/OPERATING.md has the cost).
	BreakerLogSync bool `help:"fsync the breaker log after every line, not only when the relay stops." default:"false" env:"RELAY_BREAKER_LOG_SYNC"`

	// How the hub holds its pooled, kept-alive target connections.
	TargetIdleTimeout duration `help:"Close a pooled connection to a target left unused this long; keep it under the targets' keep-alive timeout." default:"4s" env:"RELAY_TARGET_IDLE_TIMEOUT"`

	// The per-target settings and policies, all off by default. The flags are the
	// defaults of every target; --config overrides them per target.
	Config          string   `help:"TOML file of per-target settings and fallbacks (docs/CONFIG.md); its keys override the flags per target, and its tables may add targets. Empty means none." placeholder:"FILE" env:"RELAY_CONFIG"`
	FailureRate     float64  `help:"Also open a breaker when at least this share (0 to 1) of the calls that ended within --window failed, once there are --min-samples of them; 0 turns it off." default:"0" env:"RELAY_FAILURE_RATE"`
	Window          duration `help:"Span of time the failure rate looks back over; 0 means 1m." default:"0" env:"RELAY_WINDOW"`
	MinSamples      int      `help:"Fewest calls in the window before the failure rate can open a breaker; 0 means 20." default:"0" env:"RELAY_MIN_SAMPLES"`
	SlowCall        duration `help:"A successful call slower than this counts as a breaker failure (the client still gets its answer); 0 turns it off." default:"0" env:"RELAY_SLOW_CALL"`
	MaxResetTimeout duration `help:"Backoff: each failed probe doubles the open period, up to this (more than --reset-timeout); 0 turns it off." default:"0" env:"RELAY_MAX_RESET_TIMEOUT"`
	ResetJitter     float64  `help:"Lengthen each open period by a random share of up to this (0 to 1), so hubs do not probe in step; 0 turns it off." default:"0" env:"RELAY_RESET_JITTER"`
	ProbePayload    string   `help:"Synthetic recovery probes: when an open breaker's period ends, the hub itself sends this payload to the target (TXID PROBE-...) and no customer transaction is ever the probe; customers get E904 until the breaker closes. Empty turns them off: the first customer call is the probe." placeholder:"PAYLOAD" env:"RELAY_PROBE_PAYLOAD"`
	ProbeExpect     []string `help:"Answer codes of a healthy synthetic probe, comma-separated or repeated: 0000, Bnnn, or a target's own code below E900 but E500; any other answer, a timeout or a transport failure is a failed probe." default:"0000" env:"RELAY_PROBE_EXPECT"`
	ProbeSuccesses  int      `help:"Healthy probes in a row that close a half-open breaker; until then it stays half-open and refuses customers." default:"1" env:"RELAY_PROBE_SUCCESSES"`
	ProbeInterval   duration `help:"How long after a probe the next one is due while the breaker has not closed: the open period after a failed probe (no backoff or jitter) and the gap between healthy probes; 0 means the breaker's open period after a failure (with backoff and jitter) and --reset-timeout between healthy probes." default:"0" env:"RELAY_PROBE_INTERVAL"`
	AdminToken      string   `help:"Bearer token every admin POST (POST /breakers/NAME, POST /reload) must carry, and every read but /healthz and /readyz from beyond loopback; required when --admin-listen is beyond loopback. Prefer the environment variable: a flag shows in the process list. Empty means no check." env:"RELAY_ADMIN_TOKEN"`

	// Fleet mode, off by default (docs/FLEET.md).
	StateStore string `help:"Fleet mode: share every target's breaker state with the other hubs through this Redis (redis://[user:pass@]host:port/db, rediss:// for TLS, ?master_name=NAME for Sentinel, ?addr=HOST:PORT for Cluster seeds). Requests never wait for it; while it is unreachable each breaker decides alone. Empty means a hub on its own." placeholder:"URL" env:"RELAY_STATE_STORE"`
	HubID      string `help:"This hub's name in the fleet, its logs and /status: 1 to 64 of A-Z a-z 0-9 . _ : -, unique in the fleet. Empty means HOSTNAME:PORT of --listen." env:"RELAY_HUB_ID"`
	// Running behind a load balancer (docs/OPERATING.md, "Behind a load
	// balancer").
	ShutdownDelay duration `help:"On SIGTERM or SIGINT, answer 503 on /readyz at once and go on serving this long before the drain, so a load balancer's health check takes the hub out of rotation first; a second signal ends the wait. 0 drains at once." default:"0" env:"RELAY_SHUTDOWN_DELAY"`
	ProxyProtocol string   `help:"Read a PROXY protocol header (v1 or v2, as HAProxy's send-proxy-v2 writes it) at the start of client connections from --proxy-trusted, and take its address as the client's: off; optional (used when present); required (refuse connections without one, and every connection from elsewhere)." enum:"off,optional,required" default:"off" env:"RELAY_PROXY_PROTOCOL"`
	ProxyTrusted  []string `help:"Addresses or CIDR ranges of the load balancers whose PROXY headers are believed, comma-separated or repeated." placeholder:"CIDR" env:"RELAY_PROXY_TRUSTED"`

	TLSFlags `embed:""`

	Version kong.VersionFlag `help:"Print the version and exit."`
}

// duration is a flag value in Go's duration syntax (500ms, 10s, 5m) or a
// bare number of seconds (10, 0.5).
type duration time.Duration

// Decode implements kong.MapperValue.
func (d *duration) Decode(ctx *kong.DecodeContext) error {
	takeNegativeNumber(ctx.Scan)
	var s string
	if err := ctx.Scan.PopValueInto("duration", &s); err != nil {
		return err
	}
	v, err := parseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// String returns the duration in Go's syntax, for logs.
func (d duration) String() string { return time.Duration(d).String() }

// parseDuration reads a bare number as seconds and anything else as a Go
// duration, as the config file does.
func parseDuration(s string) (time.Duration, error) {
	return settingsfile.ParseDuration(s)
}

// signedNumber is the mapper of the int and float64 flags: kong's own, except
// that a negative number after the flag is taken as its value.
type signedNumber struct{ kong.Mapper }

// Decode implements kong.Mapper.
func (m signedNumber) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	takeNegativeNumber(ctx.Scan)
	return m.Mapper.Decode(ctx, target)
}

// takeNegativeNumber marks the next argument as a flag's value when it is
// a hyphen followed by a digit or a point (-1, -2s, -.5), so that
// "--fail-threshold -1" reaches the flag's own check ("must be at least 1")
// as "--fail-threshold=-1" does, rather than being read as a short flag.
// The relay has no short flag of that form. Any other argument starting with
// a hyphen is still refused as a flag's value: a flag given without its
// value must not swallow the next flag.
func takeNegativeNumber(scan *kong.Scanner) {
	t := scan.Peek()
	s, ok := t.Value.(string)
	if !ok || t.Type != kong.UntypedToken || len(s) < 2 || s[0] != '-' {
		return
	}
	if c := s[1]; c >= '0' && c <= '9' || c == '.' {
		scan.Pop()
		scan.PushTyped(s, kong.FlagValueToken)
	}
}

// newParser returns the relay's command-line parser for c, with opts after
// its own.
func newParser(c *cli, opts ...kong.Option) (*kong.Kong, error) {
	numbers := kong.NewRegistry().RegisterDefaults()
	return kong.New(c, append([]kong.Option{
		kong.Name("relay"),
		kong.Description("TCP transaction relay hub: one line per transaction in, one line per answer out, each target behind its own circuit breaker and bulkhead."),
		kong.Vars{"version": version},
		kong.KindMapper(reflect.Int, signedNumber{numbers.ForType(reflect.TypeFor[int]())}),
		kong.KindMapper(reflect.Float64, signedNumber{numbers.ForType(reflect.TypeFor[float64]())}),
		kong.ValueMapper(&c.FailureCodes, failureCodesMapper{}),
		kong.ValueMapper(&c.ProbeExpect, failureCodesMapper{}),
	}, opts...)...)
}

// failureCodesMapper reads --failure-codes as kong reads any list: each
// value holds one or more codes, comma-separated, and a repeated flag adds
// to the list. Unlike kong's own, it shows the default in --help as it is,
// without the ",..." that would suggest more default codes.
type failureCodesMapper struct{}

// Decode implements kong.Mapper.
func (failureCodesMapper) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("failure codes", &s); err != nil {
		return err
	}
	for code := range strings.SplitSeq(s, ",") {
		target.Set(reflect.Append(target, reflect.ValueOf(code)))
	}
	return nil
}

// PlaceHolder implements kong.PlaceHolderProvider.
func (failureCodesMapper) PlaceHolder(f *kong.Flag) string { return f.Default }

var _ kong.PlaceHolderProvider = failureCodesMapper{}

// targetFlag is one --target NAME=URL.
type targetFlag relay.Target

// Decode implements kong.MapperValue.
func (t *targetFlag) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("target", &s); err != nil {
		return err
	}
	name, url, ok := strings.Cut(s, "=")
	if !ok {
		return fmt.Errorf("%q: want NAME=URL", s)
	}
	tg := relay.Target{Name: strings.TrimSpace(name), URL: strings.TrimSpace(url)}
	if err := tg.Validate(); err != nil {
		return err
	}
	*t = targetFlag(tg)
	return nil
}

// Validate checks what the tags cannot; each error names its flag.
func (c *cli) Validate() error {
	for _, f := range []struct {
		flag  string
		value int
	}{
		{"--fail-threshold", c.FailThreshold},
		{"--max-inflight", c.MaxInflight},
		{"--max-line-bytes", c.MaxLineBytes},
		{"--max-conns", c.MaxConns},
	} {
		if f.value <= 0 {
			return fmt.Errorf("%s: must be at least 1, got %d", f.flag, f.value)
		}
	}
	for _, f := range []struct {
		flag  string
		value duration
	}{
		{"--reset-timeout", c.ResetTimeout},
		{"--target-timeout", c.TargetTimeout},
		{"--target-idle-timeout", c.TargetIdleTimeout},
		{"--idle-timeout", c.IdleTimeout},
		{"--drain-timeout", c.DrainTimeout},
		{"--write-timeout", c.WriteTimeout},
	} {
		if f.value <= 0 {
			return fmt.Errorf("%s: must be more than zero, got %s", f.flag, time.Duration(f.value))
		}
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("--listen %q: want HOST:PORT", c.Listen)
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			return fmt.Errorf("--admin-listen %q: want HOST:PORT, or empty to turn it off", c.AdminListen)
		}
	}
	if len(c.Target) == 0 {
		return errors.New("--target: name at least one target")
	}
	seen := make(map[string]bool, len(c.Target))
	for _, t := range c.Target {
		name := strings.ToUpper(t.Name)
		if seen[name] {
			return fmt.Errorf("--target: %s given twice", name)
		}
		seen[name] = true
	}
	if len(c.FailureCodes) == 0 {
		return errors.New("--failure-codes: name at least one code")
	}
	for _, code := range c.FailureCodes {
		if _, err := protocol.ParseFailureCode(code); err != nil {
			return fmt.Errorf("--failure-codes: %w", err)
		}
	}
	if strings.TrimSpace(c.BreakerLog) == "" {
		return errors.New("--breaker-log: must name a file")
	}
	if c.AccessLog != "" && strings.TrimSpace(c.AccessLog) == "" {
		return errors.New("--access-log: must name a file, or be empty to turn it off")
	}
	if c.InDoubtLog != "" && strings.TrimSpace(c.InDoubtLog) == "" {
		return errors.New("--in-doubt-log: must name a file, or be empty to turn it off")
	}
	if err := c.validateService(); err != nil {
		return err
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	return c.validatePolicies()
}

// validatePolicies checks the policy flags (docs/PROTOCOL.md, "Per-target settings and policies"); each error names its flag.
// Zero turns each policy off, so only values that cannot mean anything are
// refused.
func (c *cli) validatePolicies() error {
	for _, f := range []struct {
		flag  string
		value float64
	}{
		{"--failure-rate", c.FailureRate},
		{"--reset-jitter", c.ResetJitter},
	} {
		if !(f.value >= 0 && f.value <= 1) {
			return fmt.Errorf("%s: must be from 0 (off) to 1, got %v", f.flag, f.value)
		}
	}
	for _, f := range []struct {
		flag  string
		value duration
	}{
		{"--window", c.Window},
		{"--slow-call", c.SlowCall},
		{"--max-reset-timeout", c.MaxResetTimeout},
	} {
		if f.value < 0 {
			return fmt.Errorf("%s: must not be negative, got %s", f.flag, time.Duration(f.value))
		}
	}
	if c.MinSamples < 0 {
		return fmt.Errorf("--min-samples: must not be negative, got %d", c.MinSamples)
	}
	if err := c.validateProbes(); err != nil {
		return err
	}
	if c.MaxResetTimeout > 0 && c.MaxResetTimeout <= c.ResetTimeout {
		return fmt.Errorf("--max-reset-timeout: must be more than --reset-timeout (%s) for backoff to apply, or 0 for none, got %s", c.ResetTimeout, c.MaxResetTimeout)
	}
	if c.Config != "" && strings.TrimSpace(c.Config) == "" {
		return errors.New("--config: must name a file, or be empty for none")
	}
	if c.AdminToken != "" && strings.TrimSpace(c.AdminToken) != c.AdminToken {
		return errors.New("--admin-token: must not begin or end with spaces")
	}
	return c.validateFleet()
}

// validateProbes checks the synthetic probe flags (docs/PROTOCOL.md,
// "Synthetic recovery probes"); each error names its flag.
func (c *cli) validateProbes() error {
	if strings.ContainsAny(c.ProbePayload, "\r\n") {
		return errors.New("--probe-payload: must be one line, with no line break")
	}
	if len(c.ProbeExpect) == 0 {
		return errors.New("--probe-expect: name at least one code")
	}
	for _, code := range c.ProbeExpect {
		if _, err := relay.ParseProbeCode(code); err != nil {
			return fmt.Errorf("--probe-expect: %w", err)
		}
	}
	if c.ProbeSuccesses < 1 {
		return fmt.Errorf("--probe-successes: must be at least 1, got %d", c.ProbeSuccesses)
	}
	if c.ProbeInterval < 0 {
		return fmt.Errorf("--probe-interval: must not be negative, got %s", time.Duration(c.ProbeInterval))
	}
	return nil
}

func main() {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the cli struct's tags are wrong: a bug, not a user's mistake
	}
	kctx, err := parser.Parse(os.Args[1:])
	if err != nil {
		parser.FatalIfErrorf(usageError{err})
	}
	logger := newLogger(os.Stderr, c.LogLevel, c.LogFormat)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.FatalIfErrorf(run(ctx, &c, logger, nil))
}

// exitUsage is the relay's exit status when its configuration is wrong: a
// flag, an environment variable or the settings file; running it again
// unchanged cannot help (docs/PROTOCOL.md, "Configuration"). Any other
// error stops the relay with status 1, kong's status for an error without
// an ExitCode method: a port in use, a log it cannot open or that another
// relay holds.
const exitUsage = 2

// usageError marks an error in the relay's configuration, which makes the
// relay exit with exitUsage.
type usageError struct{ error }

// Unwrap returns the error about the configuration.
func (e usageError) Unwrap() error { return e.error }

// ExitCode implements kong.ExitCoder.
func (usageError) ExitCode() int { return exitUsage }

var _ kong.ExitCoder = usageError{}

// newLogger builds the process logger on w (stderr): JSON lines, or lines
// for humans with format "console", coloured only on a terminal.
func newLogger(w io.Writer, level, format string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	if format == "console" {
		f, isFile := w.(*os.File)
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05.000", NoColor: !isFile || !isatty.IsTerminal(f.Fd())}
	}
	return zerolog.New(w).Level(lvl).Hook(millisTimestamp{})
}

// millisTimestamp stamps each logged line with a "time" field in
// relay.TimeFormat (RFC 3339 UTC with milliseconds), the format of the
// breaker and access logs, so lines of all three can be matched up. A hook
// rather than zerolog's Timestamp, whose format is a package-level
// variable. It is a plain value, safe for concurrent use.
type millisTimestamp struct{}

// Run implements zerolog.Hook.
func (millisTimestamp) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().UTC().Format(relay.TimeFormat))
}

var _ zerolog.Hook = millisTimestamp{}

// adminShutdownTimeout bounds the admin server's shutdown, which only waits
// for scrapes and status requests in progress.
const adminShutdownTimeout = 2 * time.Second

// run serves until ctx is done, then drains for up to --drain-timeout and
// closes the breaker log and the access log. ready, when not nil, is called
// with the bound addresses once the listeners are open (adminAddr is empty
// when the admin port is off).
func run(ctx context.Context, c *cli, logger zerolog.Logger, ready func(addr, adminAddr string)) (err error) {
	// The configuration is read first: a bad one stops the relay before it
	// touches any file. A settings file that cannot be read counts as a
	// mistake in the configuration too.
	codes := make([]string, len(c.FailureCodes))
	for i, code := range c.FailureCodes {
		if codes[i], err = protocol.ParseFailureCode(code); err != nil {
			return usageError{fmt.Errorf("--failure-codes: %w", err)}
		}
	}
	targets := baseTargets(c)
	if c.Config != "" {
		// The flags are every target's defaults; the file overrides them
		// per target and may add targets.
		if targets, err = settingsfile.Load(c.Config, c.targetDefaults(codes), targets); err != nil {
			return usageError{err}
		}
	}
	htls, err := c.loadTLS(targets)
	if err != nil {
		return usageError{err}
	}

	rl := &reloader{path: c.Config, defaults: c.targetDefaults(codes), base: baseTargets(c), mutualTLS: c.TLSClientCA != "", log: logger}

	blog, err := breakerlog.New(breakerlog.Config{Path: c.BreakerLog, Sync: c.BreakerLogSync})
	if err != nil {
		return fmt.Errorf("--breaker-log: %w", err)
	}
	// Deferred closes run last, after the relay has stopped writing.
	defer func() {
		if cerr := blog.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("--breaker-log: close: %w", cerr)
		}
	}()
	hangup := []func(){func() { reopenLog("breaker log", "breaker_log", blog, logger) }}
	var accessLog *appendFile
	if c.AccessLog != "" {
		accessLog, err = openAppendFile(c.AccessLog)
		if err != nil {
			return fmt.Errorf("--access-log: %w", err)
		}
		defer func() {
			if cerr := accessLog.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("--access-log: close: %w", cerr)
			}
		}()
		hangup = append(hangup, func() { reopenLog("access log", "access_log", accessLog, logger) })
	}
	var inDoubtLog *indoubt.Journal
	if c.InDoubtLog != "" {
		if inDoubtLog, err = indoubt.Open(indoubt.Config{Path: c.InDoubtLog, Logger: logger}); err != nil {
			return fmt.Errorf("--in-doubt-log: %w", err)
		}
		// Closed after the hub has stopped: the calls cut off by the end
		// of the drain are journalled too.
		defer func() {
			if cerr := inDoubtLog.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("--in-doubt-log: close: %w", cerr)
			}
		}()
		hangup = append(hangup, func() { reopenLog("in-doubt journal", "in_doubt_log", inDoubtLog, logger) })
	}
	hangup = append(hangup, htls.reloads(logger)...)
	defer onHangup(append(hangup, rl.reloadOnHangup)...)()
	reg, metrics, err := newMetrics()
	if err != nil {
		return err
	}
	// The fleet is built once the hub's port is known (it names the hub);
	// its observer is in place before the hub can change a breaker.
	var shared fleetObserver
	cfg := relay.Config{
		Targets:        targets,
		TargetSettings: c.targetDefaults(codes),
		MaxLineBytes:   c.MaxLineBytes,
		MaxConns:       c.MaxConns,
		IdleTimeout:    time.Duration(c.IdleTimeout),
		WriteTimeout:   time.Duration(c.WriteTimeout),
		Logger:         logger,
		OnTransition:   chainObservers(transitionObserver(blog, logger), shared.Observe),
		Metrics:        metrics,
		ProbePermits:   c.StateStore != "",
		InDoubtLog:     inDoubtLog,
		HubID:          c.HubID,
	}
	rec := statusPageRecorder(c)
	if rec != nil {
		cfg.OnTransition = alsoObserve(cfg.OnTransition, rec.Observe)
	}
	rl.rec = rec
	if accessLog != nil {
		cfg.AccessLog = accessLog
	}
	cfg.ProxyProtocol, cfg.ProxyTrusted = c.proxyConfig()
	cfg.TLS = htls.relayConfig(c)
	srv, err := relay.New(cfg)
	if err != nil {
		// New refuses only a configuration it cannot run with.
		return usageError{err}
	}
	rl.srv.Store(srv)
	checkFileLimit(srv, c.MaxConns, logger)
	// From here on srv may own the access log's writer: every return stops
	// it first.
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("--listen: %w", err)
	}
	fl, err := startFleet(c, ln.Addr(), srv, reg, &shared, logger)
	if err != nil {
		_ = ln.Close()
		_ = srv.Close()
		return usageError{err}
	}
	if fl != nil {
		// Deferred, so it runs after the hub has drained: the breakers'
		// last changes are still shared.
		defer fl.Close()
	}
	var hub admin.Hub = srv
	if fl != nil {
		hub = fleetHub{Server: srv, fleet: fl}
	}
	var (
		admin     *http.Server
		adminLn   net.Listener
		adminAddr string
	)
	// Closed on every return from here, after the admin server.
	page := newStatusPage(hub, reg, rec, c.AdminToken != "", logger)
	if page != nil {
		defer page.Close()
	}
	if c.AdminListen != "" {
		if adminLn, err = net.Listen("tcp", c.AdminListen); err != nil {
			_ = ln.Close()
			_ = srv.Close()
			return fmt.Errorf("--admin-listen: %w", err)
		}
		adminAddr = adminLn.Addr().String()
		adminLn = adminProxyListener(adminLn, cfg.ProxyProtocol, cfg.ProxyTrusted)
		// The PROXY header comes first, in the clear; the TLS handshake
		// follows it.
		adminLn = htls.adminListener(adminLn, c)
		if admin, err = newAdminServer(hub, reg, c.AdminToken, rl, page, logger); err != nil {
			_ = adminLn.Close()
			_ = ln.Close()
			_ = srv.Close()
			return err
		}
	}

	addr := ln.Addr().String()
	names := make([]string, len(targets))
	for i, t := range srv.Targets() {
		names[i] = t.Name + "=" + t.URL
		if t.Fallback != "" {
			names[i] += " (fallback " + t.Fallback + ")"
		}
	}
	// The breaker settings every target without its own runs with: the
	// flags' values with their defaults filled in (--window 0 is 1m once
	// the failure rate is on). A policy that is off shows as 0, all its
	// fields included (window and min_samples when failure_rate is 0).
	policy := c.targetDefaults(codes).Policy.Effective()
	start := logger.Info().Str("addr", addr).Str("version", version).Strs("targets", names).
		Int("fail_threshold", policy.FailThreshold).Stringer("reset_timeout", policy.ResetTimeout).
		Int("max_inflight", c.MaxInflight).Stringer("target_timeout", c.TargetTimeout).
		Stringer("target_idle_timeout", c.TargetIdleTimeout).
		Str("breaker_log", c.BreakerLog).Bool("breaker_log_sync", c.BreakerLogSync).Strs("failure_codes", codes).
		Int("max_line_bytes", c.MaxLineBytes).Int("max_conns", c.MaxConns).
		Stringer("idle_timeout", c.IdleTimeout).Stringer("drain_timeout", c.DrainTimeout).
		Stringer("write_timeout", c.WriteTimeout).Str("admin_listen", c.AdminListen).
		Str("access_log", c.AccessLog).Str("in_doubt_log", c.InDoubtLog).Str("log_level", c.LogLevel).Str("log_format", c.LogFormat).
		Str("config", c.Config).Float64("failure_rate", policy.FailureRate).Stringer("window", policy.Window).
		Int("min_samples", policy.MinSamples).Stringer("slow_call", policy.SlowCall).
		Stringer("max_reset_timeout", policy.MaxResetTimeout).Float64("reset_jitter", policy.ResetJitter).
		Bool("admin_token", c.AdminToken != "").
		Str("probe_payload", c.ProbePayload).Strs("probe_expect", c.probeExpect()).
		Int("probe_successes", max(policy.ProbeSuccesses, 1)).Stringer("probe_interval", policy.ProbeInterval)
	start = start.Stringer("shutdown_delay", c.ShutdownDelay).Str("proxy_protocol", cfg.ProxyProtocol.String()).
		Strs("proxy_trusted", c.ProxyTrusted)
	start = start.Bool("status_page", page != nil)
	if fl != nil {
		start = start.Str("state_store", redactURL(c.StateStore)).Str("hub_id", fl.HubID())
	}
	if adminAddr != "" {
		start = start.Str("admin_addr", adminAddr)
	}
	start.Msg("relay listening")
	htls.log(logger, c, targets)
	if ready != nil {
		ready(addr, adminAddr)
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	adminServed := make(chan error, 1)
	if admin != nil {
		go func() { adminServed <- admin.Serve(adminLn) }()
	}
	select {
	case err := <-served:
		_ = srv.Close()
		if admin != nil {
			closeAdmin(admin)
			<-adminServed
		}
		return fmt.Errorf("serve %s: %w", addr, err)
	case err := <-adminServed:
		_ = srv.Close()
		<-served
		return fmt.Errorf("serve admin %s: %w", adminAddr, err)
	case <-ctx.Done():
	}

	// The admin server outlives the drain, so /readyz answers 503 while it
	// lasts and /status shows the calls still in flight.
	delayShutdown(srv, time.Duration(c.ShutdownDelay), logger)
	logger.Info().Stringer("drain_timeout", c.DrainTimeout).Msg("shutting down")
	drain, cancel := context.WithTimeout(context.Background(), time.Duration(c.DrainTimeout))
	defer cancel()
	if err := srv.Shutdown(drain); err != nil {
		// Calls still out were cancelled and answered E901; the relay still
		// stops cleanly, as an operator's SIGTERM asked.
		logger.Warn().Err(err).Msg("drain time over; remaining calls cancelled")
	}
	if err := <-served; !errors.Is(err, relay.ErrServerClosed) {
		logger.Error().Err(err).Msg("serve ended with an error")
	}
	closeAdmin(admin)
	if admin != nil {
		if err := <-adminServed; !errors.Is(err, http.ErrServerClosed) {
			logger.Error().Err(err).Msg("admin serve ended with an error")
		}
	}
	logger.Info().Msg("stopped")
	return nil
}

// targetDefaults returns the settings the flags give every target, as
// relay.Config and settingsfile.Load take them; codes are the parsed
// --failure-codes.
func (c *cli) targetDefaults(codes []string) relay.TargetSettings {
	return relay.TargetSettings{
		MaxInflight:       c.MaxInflight,
		TargetTimeout:     time.Duration(c.TargetTimeout),
		TargetIdleTimeout: time.Duration(c.TargetIdleTimeout),
		FailureCodes:      codes,
		ProbePayload:      c.ProbePayload,
		ProbeExpect:       c.probeExpect(),
		Policy: breaker.Policy{
			FailThreshold:   c.FailThreshold,
			ResetTimeout:    time.Duration(c.ResetTimeout),
			FailureRate:     c.FailureRate,
			Window:          time.Duration(c.Window),
			MinSamples:      c.MinSamples,
			SlowCall:        time.Duration(c.SlowCall),
			MaxResetTimeout: time.Duration(c.MaxResetTimeout),
			ResetJitter:     c.ResetJitter,
			ProbeSuccesses:  c.ProbeSuccesses,
			ProbeInterval:   time.Duration(c.ProbeInterval),
		},
	}
}

// probeExpect returns --probe-expect in canonical form; Validate has
// checked every code.
func (c *cli) probeExpect() []string {
	out := make([]string, 0, len(c.ProbeExpect))
	for _, code := range c.ProbeExpect {
		if canon, err := relay.ParseProbeCode(code); err == nil {
			out = append(out, canon)
		}
	}
	return out
}

// newMetrics builds the process's own registry (never the global one) with
// the Go runtime and process collectors, a relay_build_info series, and the
// hub's metrics.
func newMetrics() (*prometheus.Registry, *relay.Metrics, error) {
	reg := prometheus.NewRegistry()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "relay_build_info",
		Help:        "Always 1; the labels say which build of the relay is running.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	})
	buildInfo.Set(1)
	for _, col := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo,
	} {
		if err := reg.Register(col); err != nil {
			return nil, nil, fmt.Errorf("metrics: %w", err)
		}
	}
	m, err := relay.NewMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	return reg, m, nil
}

// newAdminServer returns the HTTP server of the admin port, where token,
// when not empty, guards every POST and rl serves POST /reload, with the
// status page when page is not nil. Its timeouts keep a slow or idle admin
// client from holding a connection for long; its own errors (a client that
// sends garbage) are logged at debug.
func newAdminServer(hub admin.Hub, reg *prometheus.Registry, token string, rl *reloader, page *statuspage.Page, logger zerolog.Logger) (*http.Server, error) {
	h, err := admin.New(admin.Config{Hub: hub, Gatherer: reg, Logger: logger, Token: token, Reload: rl.reloadForAdmin, Page: pageHandler(page)})
	if err != nil {
		return nil, err
	}
	return withStatusPage(&http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		ErrorLog:          stdlog.New(debugWriter{logger.With().Str("component", "admin").Logger()}, "", 0),
		ConnContext:       admin.ConnContext,
	}, page), nil
}

// closeAdmin shuts the admin server down, waiting briefly for requests in
// progress. A nil server is off.
func closeAdmin(admin *http.Server) {
	if admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	if admin.Shutdown(ctx) != nil {
		_ = admin.Close()
	}
}

// debugWriter turns the lines of a standard library logger into zerolog
// debug lines. Like the Logger it holds, it is safe for concurrent use.
type debugWriter struct{ log zerolog.Logger }

var _ io.Writer = debugWriter{}

func (w debugWriter) Write(p []byte) (int, error) {
	w.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// transitionObserver appends each breaker state change to the breaker log.
// It runs under the breaker's lock: one write, never a call back into the
// relay. A failed write is logged and serving goes on (docs/PROTOCOL.md, "Breaker log"). The relay
// itself logs each change, with its failure count and retry hint.
func transitionObserver(blog *breakerlog.Log, logger zerolog.Logger) func(breaker.Transition) {
	return func(t breaker.Transition) {
		if err := blog.Write(t); err != nil {
			logger.Error().Err(err).Str("target", t.Name).Msg("breaker log write failed")
		}
	}
}
