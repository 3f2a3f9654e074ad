package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/sourcegraph/conc/panics"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("relay: server closed")

// Timings of connection teardown that no flag sets.
const (
	// closeLinger is how long a connection that the hub stops reading (at
	// shutdown, or turned away over the limit) keeps draining the client's
	// input after its last answer. Closing a socket with unread input makes
	// the kernel reset it, which can destroy answers not yet delivered.
	closeLinger = 500 * time.Millisecond
	// abortGrace is how long Shutdown, once its context is done and the
	// remaining target calls are cancelled, waits for their answers to be
	// written before it closes every connection.
	abortGrace = 250 * time.Millisecond
	// turnAwayWriteTimeout bounds the write of the one E906 line to a
	// connection over the limit.
	turnAwayWriteTimeout = time.Second
)

// MaxTurningAway bounds how many connections over MaxConns the hub holds
// at once while it tells them why (their TLS handshake, their E906 line,
// closeLinger): past it a connection is closed right after its E906 line,
// or at once when it needs a TLS handshake first. So a connection flood
// holds at most MaxConns plus MaxTurningAway client connections' file
// descriptors and goroutines, and a file limit can be sized for it.
const MaxTurningAway = 1024

// Server is the relay hub: it serves the client protocol on the listeners
// given to Serve and relays each admitted transaction to its target through
// that target's breaker and bulkhead. It is safe for concurrent use.
type Server struct {
	serving serving        // listeners, connections and shutdown
	table   targetTable    // the targets and their defaults
	obs     observability  // logs, metrics and the access log
	shield  shieldState    // the duplicate-TXID shield's memory and the fleet's store
	inDoubt inDoubtJournal // the calls in doubt: journal and recent ones
	resolve resolveState   // the resolver that settles them

	clock        breaker.Clock
	rand         func() float64
	onTransition func(breaker.Transition)
	probePermits bool // every breaker waits for PermitProbe (Config.ProbePermits)

	// A connection's limits, Config's, set once by New.
	maxLineBytes int
	maxConns     int
	idleTimeout  time.Duration
	writeTimeout time.Duration
	// longBufs lends *[]byte buffers of maxLineBytes+2 bytes to
	// connections while they read a line too long for a read buffer.
	longBufs sync.Pool

	// The PROXY protocol settings, Config's, set once by New.
	proxyProtocol ProxyProtocol
	proxyTrusted  []netip.Prefix

	// lane holds refusal-heavy connections back in turn (see refusalLane).
	lane refusalLane

	// started is when New ran, and probeSeq counts the synthetic probes
	// sent: both are in the probes' TXIDs.
	started  time.Time
	probeSeq atomic.Uint64

	// tls is the TLS side of the client listeners; nil serves plain TCP.
	tls *tlsServer
}

// New returns a Server configured by cfg, with one breaker, one bulkhead and
// one HTTP target per configured target. It fails on a config it cannot
// serve: no targets, a bad or duplicate target, a negative setting, a rate
// or jitter outside 0 to 1, a bad failure code, or a fallback that names no
// configured target, the target itself, or a target with a fallback of its
// own.
//
// Each target runs with its own settings: Target.Settings when set, else
// cfg.TargetSettings. Each target has its own pool of kept-alive
// connections, never capped (its bulkhead bounds its calls, so a full
// bulkhead's worth of calls never waits for a connection) and each closed
// once unused for the target's TargetIdleTimeout; the hub uses no
// proxy from the environment, asks for no compression and follows no
// redirects.
//
// Each breaker's ProbeTimeout is its target's TargetTimeout plus one second
// (docs/PROTOCOL.md, "Per-target settings and policies", probe liveness): a
// probe that has not reported by then has certainly been answered E901, so
// its silence can only be a lost result, and a new probe may go.
//
// With cfg.AccessLog set, New starts the access log's writer: the Server
// must then be stopped with Shutdown or Close, which end it.
func New(cfg Config) (*Server, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("relay: no targets configured")
	}
	if err := checkNonNegative(cfg); err != nil {
		return nil, err
	}
	defaults := cfg.TargetSettings.WithDefaults()
	if err := defaults.check(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	defaultCodes, err := parseFailureCodes(defaults.FailureCodes)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	defaultExpect, err := parseProbeExpect(defaults.ProbeExpect)
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	defaults.SyntheticProbes = defaults.ProbePayload != ""
	s := &Server{
		serving: serving{
			stopping:    make(chan struct{}),
			listeners:   make(map[*net.Listener]struct{}),
			conns:       make(map[net.Conn]*conn),
			stopWorkers: make(chan struct{}),
		},
		table: targetTable{defaults: defaults, defaultCodes: defaultCodes, defaultExpect: defaultExpect},
		obs: observability{
			log:     cfg.Logger.With().Str("component", "relay").Logger(),
			metrics: cfg.Metrics,
		},
		shield:       shieldState{store: cfg.DedupStore},
		inDoubt:      inDoubtJournal{journal: cfg.InDoubtLog, recent: indoubt.NewRing(inDoubtRecent)},
		started:      time.Now(),
		clock:        cfg.Clock,
		rand:         cfg.Rand,
		probePermits: cfg.ProbePermits,
		onTransition: cfg.OnTransition,
		maxLineBytes: orDefault(cfg.MaxLineBytes, DefaultMaxLineBytes),
		maxConns:     orDefault(cfg.MaxConns, DefaultMaxConns),
		idleTimeout:  orDefault(cfg.IdleTimeout, DefaultIdleTimeout),
		writeTimeout: orDefault(cfg.WriteTimeout, DefaultWriteTimeout),
	}
	shieldClock := time.Now
	if cfg.Clock != nil {
		shieldClock = cfg.Clock.Now
	}
	s.shield.mem = dedup.New(dedup.Config{MaxEntries: cfg.DedupMaxEntries, Now: shieldClock})

	if id := cfg.HubID; id != "" {
		s.inDoubt.hubID.Store(&id)
	}
	s.lane.init()

	s.obs.panicLog = s.obs.log.Sample(&zerolog.BurstSampler{Burst: panicLogBurst, Period: time.Second})
	s.obs.hubFaultLog = s.obs.log.Sample(&zerolog.BurstSampler{Burst: 1, Period: hubFaultLogPeriod})
	if cfg.TLS != nil {
		if s.tls, err = newTLSServer(*cfg.TLS, s.obs.log, cfg.Metrics); err != nil {
			return nil, err
		}
	}
	if err := s.setProxyProtocol(cfg.ProxyProtocol, cfg.ProxyTrusted); err != nil {
		return nil, err
	}
	s.table.conns = targethttp.NewConns(cfg.DialTarget)
	s.initResolve()
	routes, err := s.newTargets(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.AccessLog != nil {
		s.obs.access = newAccessLog(cfg.AccessLog, orDefault(cfg.AccessLogQueue, DefaultAccessLogQueue), cfg.Metrics, cfg.Logger, cfg.Clock)
		s.obs.accessWriter.Go(s.writeAccessLog)
	}
	s.startProbers(routes)
	s.takeUpJournal()
	s.goCatching(taskResolver, s.resolveLoop)
	return s, nil
}

// newTargets builds and publishes cfg's targets, each bound to
// its metrics once the whole configuration is known to be good.
func (s *Server) newTargets(cfg Config) ([]*target, error) {
	plans, err := s.plan(cfg.Targets)
	if err != nil {
		return nil, err
	}
	routes := make([]*target, len(plans))
	confs := make([]*targetConf, len(plans))
	for i, p := range plans {
		routes[i] = s.newTarget(p)
		if confs[i], err = s.newConf(p, routes[i], nil); err != nil {
			return nil, err
		}
	}
	// Label children are resolved once the whole configuration is known to
	// be good, so a refused Config leaves no series behind. No breaker can
	// have changed state yet, so no observer has read rt.metrics.
	if cfg.Metrics != nil {
		if err := cfg.Metrics.bind(s); err != nil {
			return nil, err
		}
		for _, rt := range routes {
			rt.metrics = cfg.Metrics.forTarget(rt.name)
		}
	}
	s.linkConfs(routes, confs)
	for i, rt := range routes {
		rt.conf.Store(confs[i])
		s.configureResolver(rt, confs[i])
	}
	s.table.list.Store(&routes)
	return routes, nil
}

// Serve accepts connections on ln and serves each in its own goroutine until
// ln fails or the Server is shut down. It always closes ln. After Shutdown or
// Close it returns ErrServerClosed; otherwise the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	defer ln.Close()
	if s.inDoubt.hubID.Load() == nil {
		id := DefaultHubID(ln.Addr())
		s.inDoubt.hubID.CompareAndSwap(nil, &id)
	}
	if !s.serving.trackListener(&ln, true) {
		return ErrServerClosed
	}
	defer s.serving.trackListener(&ln, false)

	var (
		backoff  time.Duration
		failed   int       // accepts failed in a row
		failedAt time.Time // when the first of them failed
	)
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.serving.isClosed() {
				return ErrServerClosed
			}
			// Running out of file descriptors and the like pass; back off
			// so the loop does not spin, as net/http does. The connection
			// waits in the listen queue meanwhile. Logged once a burst: a
			// hub out of descriptors fails every accept.
			if acceptRetryable(err) {
				if failed == 0 {
					failedAt = time.Now()
					s.obs.log.Error().Err(err).Msg("accept failed; retrying with backoff until it works again")
				}
				failed++
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		if failed > 0 {
			s.obs.log.Info().Int("failed", failed).Dur("after", time.Since(failedAt)).Msg("accepting again")
			failed = 0
		}
		backoff = 0
		if s.tls != nil {
			// No handshake here: it runs on the connection's goroutine,
			// after the PROXY header, if any.
			nc = s.tls.server(nc, s.proxyProtocol != ProxyOff)
		}
		if !s.startConn(nc) {
			return ErrServerClosed
		}
	}
}

// acceptRetryable reports whether an accept that failed with err may be
// tried again: the hub is short of descriptors or memory for now, or the
// error says it is temporary (a connection reset before it was accepted).
func acceptRetryable(err error) bool {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) {
		return true
	}
	te, ok := err.(interface{ Temporary() bool })
	return ok && te.Temporary()
}

// startConn starts serving nc, or turns it away when MaxConns connections are
// already served. It reports false, closing nc, when the Server is closed.
// The goroutine is started under mu, after the closed check, so that
// Shutdown's wait for all goroutines can never miss one.
func (s *Server) startConn(nc net.Conn) bool {
	s.serving.mu.Lock()
	defer s.serving.mu.Unlock()
	if s.serving.closed {
		nc.Close()
		return false
	}
	if s.serving.served >= s.maxConns {
		s.serving.conns[nc] = nil
		brief := s.serving.turningAway.Add(1) > MaxTurningAway
		s.goCatching(taskTurnAway, func() { s.turnAway(nc, brief) })
		return true
	}
	c := newConn(s, nc)
	s.serving.conns[nc] = c
	s.serving.served++
	// Not goCatching: serve catches its own panics (endOnPanic).
	s.serving.clientWork.Go(c.serve)
	return true
}

// untrack forgets a connection that has been closed.
func (s *Server) untrack(nc net.Conn) {
	s.serving.mu.Lock()
	defer s.serving.mu.Unlock()
	if c, ok := s.serving.conns[nc]; ok {
		if c != nil {
			s.serving.served--
		}
		delete(s.serving.conns, nc)
	}
}

// turnAway answers a connection over MaxConns with its one E906 line and
// closes it. It accepts rather than leaving the connection in the accept
// queue, so the client learns at once why it is not served. brief, past
// MaxTurningAway, holds the connection no longer than the write of its
// line to a fresh socket, which never waits: no TLS handshake, no linger.
func (s *Server) turnAway(nc net.Conn, brief bool) {
	defer s.serving.turningAway.Add(-1)
	defer s.untrack(nc)
	if _, isTLS := nc.(*tls.Conn); brief && isTLS {
		s.obs.log.Debug().Str("remote", nc.RemoteAddr().String()).Msg("connection turned away unanswered: too many being turned away")
		nc.Close()
		return
	}
	if !s.handshakeTurnedAway(nc) {
		nc.Close()
		return
	}
	s.obs.metrics.countUnrouted(protocol.CodeUnavailable)
	s.obs.log.Debug().Str("remote", nc.RemoteAddr().String()).Msg("connection turned away: too many connections")
	_ = nc.SetWriteDeadline(time.Now().Add(turnAwayWriteTimeout))
	if _, err := nc.Write(tooManyConnsLine); err != nil {
		nc.Close()
		return
	}
	if brief {
		nc.Close()
		return
	}
	closeAfterLinger(nc, closeLinger)
}

// tooManyConnsLine is the whole conversation with a connection over MaxConns.
var tooManyConnsLine = protocol.AppendResponse(nil, protocol.NoTxID, protocol.CodeUnavailable, protocol.MsgTooManyConns)

// closeAfterLinger half-closes nc, so the client sees every answer and then
// end of stream, and reads and drops the client's input until the client
// closes too or linger passes. Closing at once with unread input would
// make the kernel reset the connection and drop answers not yet delivered.
func closeAfterLinger(nc net.Conn, linger time.Duration) {
	defer nc.Close()
	cw, ok := nc.(interface{ CloseWrite() error })
	if !ok || cw.CloseWrite() != nil {
		return
	}
	_ = nc.SetReadDeadline(time.Now().Add(linger))
	var buf [512]byte
	for {
		if _, err := nc.Read(buf[:]); err != nil {
			return
		}
	}
}

// Shutdown stops the Server gracefully (docs/PROTOCOL.md, "Shutdown"). It closes the listeners at
// once; from then on every request line read is answered E906 "shutting
// down". Calls already admitted run to their end and are answered. Then each
// connection is flushed, half-closed and closed. If ctx is done first, the
// remaining target calls are cancelled and answered E901 "no answer before
// shutdown" (the target may have processed them, so like a timeout it is
// not a definite failure), every connection is closed, and ctx's error is
// returned. Shutdown returns once every goroutine of the Server has ended
// and the access log, if any, is written out and flushed.
func (s *Server) Shutdown(ctx context.Context) error {
	// The listeners close before lines are answered E906, so a client that
	// has been told "shutting down" can no longer connect.
	lnErr := s.beginStop()

	err := poll(ctx, func() bool { return s.serving.activeCalls.Load() == 0 })
	if err == nil {
		for _, c := range s.serving.connsSnapshot() {
			c.stopReading()
		}
		err = poll(ctx, func() bool { return s.serving.connCount() == 0 })
	}
	if err != nil {
		s.abortCalls()
		graceCtx, cancel := context.WithTimeout(context.Background(), abortGrace)
		_ = poll(graceCtx, func() bool { return s.serving.activeCalls.Load() == 0 })
		cancel()
		s.closeConns()
	}
	s.endStop()
	if err != nil {
		return err
	}
	return lnErr
}

// Close stops the Server at once: it closes the listeners and every
// connection and cancels the target calls in flight, whose answers are lost.
// It returns once every goroutine of the Server has ended and the access
// log, if any, is written out and flushed.
func (s *Server) Close() error {
	err := s.beginStop()
	s.abortCalls()
	s.closeConns()
	s.endStop()
	return err
}

// beginStop closes the listeners and turns new work away: lines read from
// now on are answered E906, probers and waits in the refusal lane end, and
// the resolver stops. Shutdown and Close begin with it.
func (s *Server) beginStop() error {
	err := s.serving.closeListeners()
	s.serving.inShutdown.Store(true)
	s.serving.stoppingOnce.Do(func() { close(s.serving.stopping) })
	s.resolve.cancel()
	return err
}

// endStop ends the Server once its connections are closing: idle call
// workers end, every goroutine serving clients is waited for, then the
// late reads, the access log and the idle target connections. Shutdown and
// Close end with it.
func (s *Server) endStop() {
	s.serving.stopWorkersOnce.Do(func() { close(s.serving.stopWorkers) })
	s.serving.clientWork.Wait()
	s.stopLateReads()
	s.stopAccessLog()
	s.closeIdleHTTP()
}

// hubFaultLogPeriod is how often at most the hub logs a call it did not
// make for want of its own resources (logHubFault).
const hubFaultLogPeriod = 10 * time.Second

// panicLogBurst is how many caught panics a second are logged with their
// stacks; the metric counts every one.
const panicLogBurst = 5

// goCatching runs f on clientWork, the WaitGroup that owns it, and catches a panic
// where it happens: logged with its stack and counted in
// relay_panics_total{task} at once, rather than held by conc until Wait
// re-panics it at shutdown. What f holds is released by its own defers,
// which run before the panic is caught.
func (s *Server) goCatching(t task, f func()) {
	s.serving.clientWork.Go(func() { s.catchPanic(t, f) })
}

// catchPanic runs f and reports whether it panicked, logging and counting
// the panic.
func (s *Server) catchPanic(t task, f func()) bool {
	var pc panics.Catcher
	pc.Try(f)
	r := pc.Recovered()
	if r == nil {
		return false
	}
	s.logPanic(t, r.Value, r.Stack)
	return true
}

// closeConns closes every connection at once, unblocking their reads and
// writes.
func (s *Server) closeConns() {
	s.serving.mu.Lock()
	defer s.serving.mu.Unlock()
	for nc := range s.serving.conns {
		nc.Close()
	}
}

// abortCalls gives up on the target calls in flight (Close, or Shutdown
// when its time runs out): dials stop and their connections are closed,
// which ends the reads and writes they are blocked in. Each is answered
// E901 "no answer before shutdown".
func (s *Server) abortCalls() {
	s.table.conns.Abort()
}

// stopLateReads closes the target connections still read on for a late
// answer and waits for their readers, so that none settles an entry once
// the Server has stopped. The calls are over by then.
func (s *Server) stopLateReads() {
	s.table.conns.Abort()
	s.table.conns.WaitLate()
}

// closeIdleHTTP drops the idle pooled target connections.
func (s *Server) closeIdleHTTP() {
	for _, rt := range s.table.all() {
		rt.conf.Load().client.CloseIdle()
	}
}

// poll waits until done reports true or ctx is done, checking at intervals
// that start short (so a quick drain returns quickly) and grow to 50 ms.
func poll(ctx context.Context, done func() bool) error {
	interval := time.Millisecond
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		if done() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			interval = min(2*interval, 50*time.Millisecond)
			t.Reset(interval)
		}
	}
}
