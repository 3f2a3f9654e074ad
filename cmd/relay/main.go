// Command relay is the relayhub hub: it serves the line protocol on TCP and
// relays each transaction to its target over HTTP, each target behind its
// own circuit breaker and bulkhead. Every breaker state change is appended
// to the breaker log.
//
// Typical use:
//
//	relay --listen 127.0.0.1:9200 \
//	  --target CORE=http://127.0.0.1:9201 --target CLAIM=http://127.0.0.1:9202 \
//	  --fail-threshold 5 --reset-timeout 10s --breaker-log breaker.log
//
// Every flag has an environment variable RELAY_<FLAG_IN_UPPER_SNAKE>.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/relay"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type cli struct {
	Listen        string           `help:"Address to serve the line protocol on; port 0 picks a free port (logged as addr)." default:"127.0.0.1:9200" env:"RELAY_LISTEN"`
	AdminListen   string           `help:"Address for the admin HTTP endpoints; empty turns them off." default:"127.0.0.1:9280" env:"RELAY_ADMIN_LISTEN"`
	Target        []targetFlag     `help:"Target as NAME=URL; repeat for more. Giving any replaces the default pair. In the environment, comma-separated." placeholder:"NAME=URL" default:"CORE=http://127.0.0.1:9201,CLAIM=http://127.0.0.1:9202" env:"RELAY_TARGET"`
	FailThreshold int              `help:"Consecutive failures that open a target's breaker." default:"5" env:"RELAY_FAIL_THRESHOLD"`
	ResetTimeout  duration         `help:"How long an open breaker refuses calls before a probe; a bare number is seconds, 500ms works." default:"10s" env:"RELAY_RESET_TIMEOUT"`
	MaxInflight   int              `help:"Calls in flight per target (bulkhead size); one more is answered E905." default:"10" env:"RELAY_MAX_INFLIGHT"`
	TargetTimeout duration         `help:"Time a target has to answer one call, connect included (E901 after)." default:"3s" env:"RELAY_TARGET_TIMEOUT"`
	BreakerLog    string           `help:"File every breaker state change is appended to." default:"breaker.log" env:"RELAY_BREAKER_LOG"`
	FailureCodes  []string         `help:"Response codes that count as breaker failures, comma-separated." default:"E500,E901,E902" env:"RELAY_FAILURE_CODES"`
	MaxLineBytes  int              `help:"Longest request line, not counting the newline; longer ones get E900." default:"16384" env:"RELAY_MAX_LINE_BYTES"`
	MaxConns      int              `help:"Client connections served at once; one more gets E906 and is closed." default:"10000" env:"RELAY_MAX_CONNS"`
	IdleTimeout   duration         `help:"Close a client connection that sends no line for this long." default:"5m" env:"RELAY_IDLE_TIMEOUT"`
	DrainTimeout  duration         `help:"On SIGINT or SIGTERM, how long calls in flight may take to finish before they are cancelled." default:"10s" env:"RELAY_DRAIN_TIMEOUT"`
	WriteTimeout  duration         `help:"Disconnect a client that does not read its answers for this long." default:"30s" env:"RELAY_WRITE_TIMEOUT"`
	LogLevel      string           `help:"Log level: debug logs every call." enum:"debug,info,warn,error" default:"info" env:"RELAY_LOG_LEVEL"`
	LogFormat     string           `help:"Log format on stderr: json or console." enum:"json,console" default:"json" env:"RELAY_LOG_FORMAT"`
	Version       kong.VersionFlag `help:"Print the version and exit."`
}

// duration is a flag value in Go's duration syntax (500ms, 10s, 5m) or a
// bare number of seconds (10, 0.5).
type duration time.Duration

// Decode implements kong.MapperValue.
func (d *duration) Decode(ctx *kong.DecodeContext) error {
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
// duration.
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s != "" && strings.Trim(s, "0123456789.") == "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs > float64(1<<63-1)/float64(time.Second) {
			return 0, fmt.Errorf("duration %q: want a number of seconds or a duration like 500ms", s)
		}
		return time.Duration(secs * float64(time.Second)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a number of seconds or a duration like 500ms", s)
	}
	return v, nil
}

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
		if _, err := relay.ParseFailureCode(code); err != nil {
			return fmt.Errorf("--failure-codes: %w", err)
		}
	}
	if strings.TrimSpace(c.BreakerLog) == "" {
		return errors.New("--breaker-log: must name a file")
	}
	return nil
}

func main() {
	var c cli
	kctx := kong.Parse(&c,
		kong.Name("relay"),
		kong.Description("TCP transaction relay hub: one line per transaction in, one line per answer out, each target behind its own circuit breaker and bulkhead."),
		kong.Vars{"version": version},
	)
	logger := newLogger(c.LogLevel, c.LogFormat)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.FatalIfErrorf(run(ctx, &c, logger, nil))
}

// newLogger builds the process logger on stderr.
func newLogger(level, format string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	if format == "console" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339}).
			Level(lvl).With().Timestamp().Logger()
	}
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
}

// run serves until ctx is done, then drains for up to --drain-timeout and
// closes the breaker log. ready, when not nil, is called with the bound
// address once the listener is open.
func run(ctx context.Context, c *cli, logger zerolog.Logger, ready func(addr string)) error {
	blog, err := breakerlog.Open(c.BreakerLog)
	if err != nil {
		return fmt.Errorf("--breaker-log: %w", err)
	}
	codes := make([]string, len(c.FailureCodes))
	for i, code := range c.FailureCodes {
		if codes[i], err = relay.ParseFailureCode(code); err != nil {
			_ = blog.Close()
			return fmt.Errorf("--failure-codes: %w", err)
		}
	}
	targets := make([]relay.Target, len(c.Target))
	for i, t := range c.Target {
		targets[i] = relay.Target(t)
	}
	srv, err := relay.New(relay.Config{
		Targets:       targets,
		FailThreshold: c.FailThreshold,
		ResetTimeout:  time.Duration(c.ResetTimeout),
		MaxInflight:   c.MaxInflight,
		TargetTimeout: time.Duration(c.TargetTimeout),
		FailureCodes:  codes,
		MaxLineBytes:  c.MaxLineBytes,
		MaxConns:      c.MaxConns,
		IdleTimeout:   time.Duration(c.IdleTimeout),
		WriteTimeout:  time.Duration(c.WriteTimeout),
		Logger:        logger,
		OnTransition:  transitionObserver(blog, logger),
	})
	if err != nil {
		_ = blog.Close()
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		_ = blog.Close()
		return fmt.Errorf("--listen: %w", err)
	}

	addr := ln.Addr().String()
	names := make([]string, len(targets))
	for i, t := range srv.Targets() {
		names[i] = t.Name + "=" + t.URL
	}
	logger.Info().Str("addr", addr).Str("version", version).Strs("targets", names).
		Int("fail_threshold", c.FailThreshold).Stringer("reset_timeout", c.ResetTimeout).
		Int("max_inflight", c.MaxInflight).Stringer("target_timeout", c.TargetTimeout).
		Str("breaker_log", c.BreakerLog).Strs("failure_codes", codes).
		Int("max_line_bytes", c.MaxLineBytes).Int("max_conns", c.MaxConns).
		Stringer("idle_timeout", c.IdleTimeout).Stringer("drain_timeout", c.DrainTimeout).
		Stringer("write_timeout", c.WriteTimeout).Str("admin_listen", c.AdminListen).
		Msg("relay listening")
	if c.AdminListen != "" {
		logger.Warn().Str("admin_listen", c.AdminListen).Msg("admin endpoints are not served by this build")
	}
	if ready != nil {
		ready(addr)
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		_ = srv.Close()
		_ = blog.Close()
		return fmt.Errorf("serve %s: %w", addr, err)
	case <-ctx.Done():
	}

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
	if err := blog.Close(); err != nil {
		return fmt.Errorf("--breaker-log: close: %w", err)
	}
	logger.Info().Msg("stopped")
	return nil
}

// transitionObserver appends each breaker state change to the breaker log
// and logs it. It runs under the breaker's lock: one write and one log line,
// never a call back into the relay. A failed write is logged and serving
// goes on (SPEC §7).
func transitionObserver(blog *breakerlog.Log, logger zerolog.Logger) func(breaker.Transition) {
	return func(t breaker.Transition) {
		if err := blog.Write(t); err != nil {
			logger.Error().Err(err).Str("target", t.Name).Msg("breaker log write failed")
		}
		logger.Info().Str("target", t.Name).Stringer("from", t.From).Stringer("to", t.To).
			Time("at", t.At).Msg("breaker state changed")
	}
}
