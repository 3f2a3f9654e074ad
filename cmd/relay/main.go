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
// Every flag has an environment variable RELAY_<FLAG_IN_UPPER_SNAKE>; any
// other RELAY_ variable stops the relay at start, naming the nearest one.
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
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/envcheck"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/settingsfile"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	var c cli
	parser, err := newParser(&c)
	if err != nil {
		panic(err) // the cli struct's tags are wrong: a bug, not a user's mistake
	}
	kctx, err := parser.Parse(os.Args[1:])
	if err == nil {
		// kong reads only the variables it knows: a misspelt one would
		// leave its flag at the default without a word.
		err = envcheck.Check(parser.Model, envPrefix, os.Environ())
	}
	if err != nil {
		parser.FatalIfErrorf(usageError{err})
	}
	logger := newLogger(os.Stderr, c.LogLevel, c.LogFormat)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kctx.FatalIfErrorf(run(ctx, &c, logger, nil))
}

// envPrefix begins the name of every environment variable of a relay
// flag; any other variable that begins with it is a mistake.
const envPrefix = "RELAY_"

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
	token, err := newAdminToken(c, logger)
	if err != nil {
		return usageError{err}
	}

	rl := &reloader{path: c.Config, defaults: c.targetDefaults(codes), base: baseTargets(c), mutualTLS: c.TLSClientCA != "", log: logger}

	blog, err := breakerlog.New(breakerlog.Config{Path: c.BreakerLog, Sync: c.BreakerLogSync})
	if err != nil {
		return fmt.Errorf("--breaker-log: %w", err)
	}
	// The breakers only queue their changes; the queue's writer writes
	// them, so that a full or stalled disk never holds an answer back.
	blogQueue := breakerlog.NewQueue(breakerlog.QueueConfig{Sink: blog, Logger: logger})
	// Deferred closes run last, after the relay has stopped writing.
	defer func() {
		if cerr := closeBreakerLog(blogQueue); cerr != nil && err == nil {
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
	defer onHangup(append(hangup, token.rereadOnHangup, rl.reloadOnHangup)...)()
	reg, metrics, err := newMetrics()
	if err != nil {
		return err
	}
	if err := registerOpsMetrics(reg, htls, blogQueue); err != nil {
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
		OnTransition:   chainObservers(blogQueue.Observe, shared.Observe),
		Metrics:        metrics,
		ProbePermits:   c.StateStore != "",
		InDoubtLog:     inDoubtLog,
		HubID:          c.HubID,

		DedupMaxEntries: c.DedupMaxEntries,
	}
	if c.StateStore != "" {
		cfg.DedupStore = &shared
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
	if err := checkFileLimit(srv, c.MaxConns, c.StateStore); err != nil {
		_ = srv.Close()
		return usageError{err}
	}
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
	page := newStatusPage(hub, reg, rec, token.value() != "", logger)
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
		if admin, err = newAdminServer(hub, reg, token, rl, page, blogQueue, logger); err != nil {
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
		Int("max_inflight", c.MaxInflight).Str("adaptive_limit", c.AdaptiveLimit).Int("min_inflight", c.MinInflight).Stringer("target_timeout", c.TargetTimeout).
		Stringer("target_idle_timeout", c.TargetIdleTimeout).
		Str("breaker_log", absPath(c.BreakerLog)).Bool("breaker_log_sync", c.BreakerLogSync).Strs("failure_codes", codes).
		Int("max_line_bytes", c.MaxLineBytes).Int("max_conns", c.MaxConns).
		Stringer("idle_timeout", c.IdleTimeout).Stringer("drain_timeout", c.DrainTimeout).
		Stringer("write_timeout", c.WriteTimeout).Str("admin_listen", c.AdminListen).
		Str("access_log", c.AccessLog).Str("in_doubt_log", absPath(c.InDoubtLog)).Str("log_level", c.LogLevel).Str("log_format", c.LogFormat).
		Str("config", c.Config).Float64("failure_rate", policy.FailureRate).Stringer("window", policy.Window).
		Int("min_samples", policy.MinSamples).Stringer("slow_call", policy.SlowCall).
		Stringer("max_reset_timeout", policy.MaxResetTimeout).Float64("reset_jitter", policy.ResetJitter).
		Bool("admin_token", token.value() != "").Str("admin_token_file", c.AdminTokenFile).
		Bool("dedup", c.Dedup).Stringer("dedup_window", dedupWindow(c.DedupWindow)).Str("dedup_scope", c.DedupScope).Int("dedup_max_entries", c.DedupMaxEntries).
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
// when it holds one, guards every POST (and follows its rotations) and rl
// serves POST /reload, with the status page when page is not nil. Its
// timeouts keep a slow or idle admin client from holding a connection for
// long; its own errors (a client that sends garbage) are logged at debug.
func newAdminServer(hub admin.Hub, reg *prometheus.Registry, token *adminToken, rl *reloader, page *statuspage.Page, blog *breakerlog.Queue, logger zerolog.Logger) (*http.Server, error) {
	h, err := admin.New(admin.Config{Hub: hub, Gatherer: reg, Logger: logger, Token: token.value(), Reload: rl.reloadForAdmin, Page: pageHandler(page),
		BreakerLog: func() admin.BreakerLog { return breakerLogStatus(blog.Status()) }})
	if err != nil {
		return nil, err
	}
	token.attach(h)
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

// breakerLogCloseTimeout bounds how long a stopping relay waits for the
// breaker log's last lines: a stalled disk must not keep it from exiting.
const breakerLogCloseTimeout = 2 * time.Second

// closeBreakerLog writes the lines queued for the breaker log and closes
// it, within breakerLogCloseTimeout.
func closeBreakerLog(q *breakerlog.Queue) error {
	ctx, cancel := context.WithTimeout(context.Background(), breakerLogCloseTimeout)
	defer cancel()
	return q.Close(ctx)
}

// breakerLogStatus is st as /status shows it.
func breakerLogStatus(st breakerlog.QueueStatus) admin.BreakerLog {
	return admin.BreakerLog{Pending: st.Pending, OldestPendingSeconds: st.OldestPending.Seconds(),
		Dropped: st.Dropped, WriteErrors: st.WriteErrors, LastError: st.LastError}
}

// dedupWindow is --dedup-window as the shield uses it: 0 means
// dedup.DefaultWindow.
func dedupWindow(d duration) time.Duration {
	if d == 0 {
		return dedup.DefaultWindow
	}
	return time.Duration(d)
}

// absPath is path made absolute for the start-up line, so that an operator
// reads where a file is whatever the working directory was; empty (off)
// stays empty.
func absPath(path string) string {
	if path == "" {
		return ""
	}
	if abs, err := filepath.Abs(path); err == nil {
		return abs
	}
	return path
}
