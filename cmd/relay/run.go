package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/appendfile"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/fleet"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/settingsfile"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// adminShutdownTimeout bounds the admin server's shutdown, which only waits
// for scrapes and status requests in progress.
const adminShutdownTimeout = 2 * time.Second

// run serves until ctx is done, then drains for up to --drain-timeout and
// closes the breaker log and the access log. ready, when not nil, is called
// with the bound addresses once the listeners are open (adminAddr is empty
// when the admin port is off).
func run(ctx context.Context, c *cli, logger zerolog.Logger, ready func(addr, adminAddr string)) (err error) {
	p := &process{c: c, log: logger}
	// The configuration is read first: a bad one stops the relay before it
	// touches any file.
	if err := p.configure(); err != nil {
		return err
	}
	if p.logs, err = openLogs(c, logger); err != nil {
		return err
	}
	// Deferred closes run last, after the relay has stopped writing.
	defer func() {
		if cerr := p.logs.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	hangup := append(p.logs.reopens(logger), p.htls.reloads(logger)...)
	defer onHangup(append(hangup, p.token.rereadOnHangup, p.rl.reloadOnHangup)...)()
	if err := p.newHub(); err != nil {
		return err
	}
	// From here on srv may own the access log's writer: every return stops
	// it first. The fleet and the status page are closed on every return
	// too, after the hub has drained: the breakers' last changes are still
	// shared.
	defer p.closeExtras()
	if err := p.listen(); err != nil {
		return err
	}
	p.logStart()
	p.htls.log(logger, c, p.targets)
	if ready != nil {
		ready(p.addr, p.adminAddr)
	}
	return p.serve(ctx)
}

// process is what run builds, in the order it builds it. run's goroutine
// owns it; it is not safe for concurrent use.
type process struct {
	c   *cli
	log zerolog.Logger

	// Read from the configuration by configure.
	codes   []string // --failure-codes, canonical
	targets []relay.Target
	htls    hubTLS
	token   *adminToken
	rl      *reloader

	logs *logFiles

	// Built by newHub.
	reg     *prometheus.Registry
	shared  fleetObserver // the fleet's side of the hub, pointed at the fleet once it is built
	rec     *statuspage.Recorder
	hubConf relay.Config
	srv     *relay.Server

	// Built by listen.
	ln        net.Listener
	addr      string
	fl        *fleet.Fleet // nil without --state-store
	hub       admin.Hub    // srv as the admin port sees it
	page      *statuspage.Page
	admin     *http.Server // nil when the admin port is off
	adminLn   net.Listener
	adminAddr string
}

// configure reads the flags' failure codes, the targets, the settings file
// and the TLS files and admin token they name. A settings file that cannot
// be read counts as a mistake in the configuration too.
func (p *process) configure() (err error) {
	c := p.c
	p.codes = make([]string, len(c.FailureCodes))
	for i, code := range c.FailureCodes {
		if p.codes[i], err = protocol.ParseFailureCode(code); err != nil {
			return usageError{fmt.Errorf("--failure-codes: %w", err)}
		}
	}
	p.targets = baseTargets(c)
	if c.Config != "" {
		// The flags are every target's defaults; the file overrides them
		// per target and may add targets.
		if p.targets, err = settingsfile.Load(c.Config, c.targetDefaults(p.codes), p.targets); err != nil {
			return usageError{err}
		}
	}
	if p.htls, err = c.loadTLS(p.targets); err != nil {
		return usageError{err}
	}
	if p.token, err = newAdminToken(c, p.log); err != nil {
		return usageError{err}
	}
	p.rl = &reloader{path: c.Config, defaults: c.targetDefaults(p.codes), base: baseTargets(c), mutualTLS: c.TLSClientCA != "", log: p.log}
	return nil
}

// logFiles are the files the relay appends to: the breaker log, always,
// through its queue; the access log and the in-doubt journal, nil when
// off.
type logFiles struct {
	breaker      *breakerlog.Log
	breakerQueue *breakerlog.Queue
	access       *appendfile.File
	inDoubt      *indoubt.Journal
}

// openLogs opens the files the flags name. On an error it closes what it
// had opened.
func openLogs(c *cli, logger zerolog.Logger) (_ *logFiles, err error) {
	l := &logFiles{}
	blog, err := breakerlog.New(breakerlog.Config{Path: c.BreakerLog, Sync: c.BreakerLogSync})
	if err != nil {
		return nil, fmt.Errorf("--breaker-log: %w", err)
	}
	// The breakers only queue their changes; the queue's writer writes
	// them, so that a full or stalled disk never holds an answer back.
	l.breaker = blog
	l.breakerQueue = breakerlog.NewQueue(breakerlog.QueueConfig{Sink: blog, Logger: logger})
	defer func() {
		if err != nil {
			_ = l.close()
		}
	}()
	if c.AccessLog != "" {
		if l.access, err = appendfile.Open(c.AccessLog); err != nil {
			return nil, fmt.Errorf("--access-log: %w", err)
		}
	}
	if c.InDoubtLog != "" {
		if l.inDoubt, err = indoubt.Open(indoubt.Config{Path: c.InDoubtLog, Logger: logger}); err != nil {
			return nil, fmt.Errorf("--in-doubt-log: %w", err)
		}
	}
	return l, nil
}

// reopens returns what SIGHUP does to the logs: each is reopened, so that
// logrotate can move it away.
func (l *logFiles) reopens(logger zerolog.Logger) []func() {
	hangup := []func(){func() { reopenLog("breaker log", "breaker_log", l.breaker, logger) }}
	if l.access != nil {
		hangup = append(hangup, func() { reopenLog("access log", "access_log", l.access, logger) })
	}
	if l.inDoubt != nil {
		hangup = append(hangup, func() { reopenLog("in-doubt journal", "in_doubt_log", l.inDoubt, logger) })
	}
	return hangup
}

// close closes the in-doubt journal (after the hub has stopped, so the
// calls cut off by the end of the drain are journalled too), the access
// log and the breaker log, and returns the first error.
func (l *logFiles) close() error {
	var first error
	if l.inDoubt != nil {
		if err := l.inDoubt.Close(); err != nil {
			first = fmt.Errorf("--in-doubt-log: close: %w", err)
		}
	}
	if l.access != nil {
		if err := l.access.Close(); err != nil && first == nil {
			first = fmt.Errorf("--access-log: close: %w", err)
		}
	}
	if err := closeBreakerLog(l.breakerQueue); err != nil && first == nil {
		first = fmt.Errorf("--breaker-log: close: %w", err)
	}
	return first
}

// newHub builds the metrics and the hub, and checks that the file limit can
// hold what the hub may open.
func (p *process) newHub() error {
	c := p.c
	reg, metrics, err := newMetrics()
	if err != nil {
		return err
	}
	if err := registerOpsMetrics(reg, p.htls, p.logs.breakerQueue); err != nil {
		return err
	}
	p.reg = reg
	// The fleet is built once the hub's port is known (it names the hub);
	// its observer is in place before the hub can change a breaker.
	cfg := relay.Config{
		Targets:        p.targets,
		TargetSettings: c.targetDefaults(p.codes),
		MaxLineBytes:   c.MaxLineBytes,
		MaxConns:       c.MaxConns,
		IdleTimeout:    time.Duration(c.IdleTimeout),
		WriteTimeout:   time.Duration(c.WriteTimeout),
		Logger:         p.log,
		OnTransition:   chainObservers(p.logs.breakerQueue.Observe, p.shared.Observe),
		Metrics:        metrics,
		ProbePermits:   c.StateStore != "",
		InDoubtLog:     p.logs.inDoubt,
		HubID:          c.HubID,

		DedupMaxEntries: c.DedupMaxEntries,
	}
	if c.StateStore != "" {
		cfg.DedupStore = &p.shared
	}
	p.rec = statusPageRecorder(c)
	if p.rec != nil {
		cfg.OnTransition = alsoObserve(cfg.OnTransition, p.rec.Observe)
	}
	p.rl.rec = p.rec
	if p.logs.access != nil {
		cfg.AccessLog = p.logs.access
	}
	cfg.ProxyProtocol, cfg.ProxyTrusted = c.proxyConfig()
	cfg.TLS = p.htls.relayConfig(c)
	p.hubConf = cfg
	if p.srv, err = relay.New(cfg); err != nil {
		// New refuses only a configuration it cannot run with.
		return usageError{err}
	}
	p.rl.srv.Store(p.srv)
	if err := checkFileLimit(p.srv, c.MaxConns, c.StateStore); err != nil {
		_ = p.srv.Close()
		return usageError{err}
	}
	return nil
}

// listen opens the client port, starts the fleet, and opens the admin port
// with the status page. On an error it closes the ports and the hub.
func (p *process) listen() (err error) {
	c := p.c
	if p.ln, err = net.Listen("tcp", c.Listen); err != nil {
		_ = p.srv.Close()
		return fmt.Errorf("--listen: %w", err)
	}
	p.addr = p.ln.Addr().String()
	if p.fl, err = startFleet(c, p.ln.Addr(), p.srv, p.reg, &p.shared, p.log); err != nil {
		_ = p.ln.Close()
		_ = p.srv.Close()
		return usageError{err}
	}
	p.hub = p.srv
	if p.fl != nil {
		p.hub = fleetHub{Server: p.srv, fleet: p.fl}
	}
	p.page = newStatusPage(p.hub, p.reg, p.rec, p.token.value() != "", p.log)
	if c.AdminListen == "" {
		return nil
	}
	if p.adminLn, err = net.Listen("tcp", c.AdminListen); err != nil {
		_ = p.ln.Close()
		_ = p.srv.Close()
		return fmt.Errorf("--admin-listen: %w", err)
	}
	p.adminAddr = p.adminLn.Addr().String()
	p.adminLn = adminProxyListener(p.adminLn, p.hubConf.ProxyProtocol, p.hubConf.ProxyTrusted)
	// The PROXY header comes first, in the clear; the TLS handshake
	// follows it.
	p.adminLn = p.htls.adminListener(p.adminLn, c)
	if p.admin, err = newAdminServer(p.hub, p.reg, p.token, p.rl, p.page, p.logs.breakerQueue, p.log); err != nil {
		_ = p.adminLn.Close()
		_ = p.ln.Close()
		_ = p.srv.Close()
		return err
	}
	return nil
}

// closeExtras closes the status page, then the fleet, those of them that
// run built.
func (p *process) closeExtras() {
	if p.page != nil {
		p.page.Close()
	}
	if p.fl != nil {
		_ = p.fl.Close()
	}
}

// logStart logs the start-up line: where the relay listens and every
// setting it runs with.
func (p *process) logStart() {
	c := p.c
	names := make([]string, len(p.targets))
	for i, t := range p.srv.Targets() {
		names[i] = t.Name + "=" + t.URL
		if t.Fallback != "" {
			names[i] += " (fallback " + t.Fallback + ")"
		}
	}
	// The breaker settings every target without its own runs with: the
	// flags' values with their defaults filled in (--window 0 is 1m once
	// the failure rate is on). A policy that is off shows as 0, all its
	// fields included (window and min_samples when failure_rate is 0).
	policy := c.targetDefaults(p.codes).Policy.Effective()
	start := p.log.Info().Str("addr", p.addr).Str("version", version).Strs("targets", names).
		Int("fail_threshold", policy.FailThreshold).Stringer("reset_timeout", policy.ResetTimeout).
		Int("max_inflight", c.MaxInflight).Str("adaptive_limit", c.AdaptiveLimit).Int("min_inflight", c.MinInflight).Stringer("target_timeout", c.TargetTimeout).
		Stringer("target_idle_timeout", c.TargetIdleTimeout).
		Str("breaker_log", absPath(c.BreakerLog)).Bool("breaker_log_sync", c.BreakerLogSync).Strs("failure_codes", p.codes).
		Int("max_line_bytes", c.MaxLineBytes).Int("max_conns", c.MaxConns).
		Stringer("idle_timeout", c.IdleTimeout).Stringer("drain_timeout", c.DrainTimeout).
		Stringer("write_timeout", c.WriteTimeout).Str("admin_listen", c.AdminListen).
		Str("access_log", c.AccessLog).Str("in_doubt_log", absPath(c.InDoubtLog)).Str("log_level", c.LogLevel).Str("log_format", c.LogFormat).
		Str("config", c.Config).Float64("failure_rate", policy.FailureRate).Stringer("window", policy.Window).
		Int("min_samples", policy.MinSamples).Stringer("slow_call", policy.SlowCall).
		Stringer("max_reset_timeout", policy.MaxResetTimeout).Float64("reset_jitter", policy.ResetJitter).
		Bool("admin_token", p.token.value() != "").Str("admin_token_file", c.AdminTokenFile).
		Bool("dedup", c.Dedup).Stringer("dedup_window", dedupWindow(c.DedupWindow)).Str("dedup_scope", c.DedupScope).Int("dedup_max_entries", c.DedupMaxEntries).
		Str("probe_payload", c.ProbePayload).Strs("probe_expect", c.probeExpect()).
		Int("probe_successes", max(policy.ProbeSuccesses, 1)).Stringer("probe_interval", policy.ProbeInterval)
	start = start.Stringer("shutdown_delay", c.ShutdownDelay).Str("proxy_protocol", p.hubConf.ProxyProtocol.String()).
		Strs("proxy_trusted", c.ProxyTrusted)
	start = start.Bool("status_page", p.page != nil)
	if p.fl != nil {
		start = start.Str("state_store", redactURL(c.StateStore)).Str("hub_id", p.fl.HubID())
	}
	if p.adminAddr != "" {
		start = start.Str("admin_addr", p.adminAddr)
	}
	start.Msg("relay listening")
}

// serve serves the client port and the admin port until ctx is done or
// either fails; then, after ctx, it drains the hub.
func (p *process) serve(ctx context.Context) error {
	served := make(chan error, 1)
	go func() { served <- p.srv.Serve(p.ln) }()
	adminServed := make(chan error, 1)
	if p.admin != nil {
		go func() { adminServed <- p.admin.Serve(p.adminLn) }()
	}
	select {
	case err := <-served:
		_ = p.srv.Close()
		if p.admin != nil {
			closeAdmin(p.admin)
			<-adminServed
		}
		return fmt.Errorf("serve %s: %w", p.addr, err)
	case err := <-adminServed:
		_ = p.srv.Close()
		<-served
		return fmt.Errorf("serve admin %s: %w", p.adminAddr, err)
	case <-ctx.Done():
	}
	p.drain(served, adminServed)
	return nil
}

// drain stops the hub after the shutdown delay, letting calls in flight
// finish for up to --drain-timeout, then the admin server; served and
// adminServed deliver how their Serve ended.
func (p *process) drain(served, adminServed <-chan error) {
	// The admin server outlives the drain, so /readyz answers 503 while it
	// lasts and /status shows the calls still in flight.
	delayShutdown(p.srv, time.Duration(p.c.ShutdownDelay), p.log)
	p.log.Info().Stringer("drain_timeout", p.c.DrainTimeout).Msg("shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(p.c.DrainTimeout))
	defer cancel()
	if err := p.srv.Shutdown(ctx); err != nil {
		// Calls still out were cancelled and answered E901; the relay still
		// stops cleanly, as an operator's SIGTERM asked.
		p.log.Warn().Err(err).Msg("drain time over; remaining calls cancelled")
	}
	if err := <-served; !errors.Is(err, relay.ErrServerClosed) {
		p.log.Error().Err(err).Msg("serve ended with an error")
	}
	closeAdmin(p.admin)
	if p.admin != nil {
		if err := <-adminServed; !errors.Is(err, http.ErrServerClosed) {
			p.log.Error().Err(err).Msg("admin serve ended with an error")
		}
	}
	p.log.Info().Msg("stopped")
}
