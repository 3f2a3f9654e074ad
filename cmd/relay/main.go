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
	"fmt"
	"io"
	stdlog "log"
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
