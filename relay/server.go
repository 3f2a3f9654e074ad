package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/sourcegraph/conc"
	"github.com/sourcegraph/conc/panics"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultFailThreshold = 5
	DefaultResetTimeout  = 10 * time.Second
	DefaultMaxInflight   = 10
	DefaultTargetTimeout = 3 * time.Second
	DefaultMaxLineBytes  = 16384
	DefaultMaxConns      = 10000
	DefaultIdleTimeout   = 5 * time.Minute
	DefaultWriteTimeout  = 30 * time.Second
)

// DefaultTargetIdleTimeout is how long a pooled target connection may stay
// unused before the hub closes it, unless TargetIdleTimeout says otherwise.
const DefaultTargetIdleTimeout = targethttp.DefaultIdleTimeout

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
	// maxLingering bounds how many turned-away connections may linger at
	// once; past it they are closed right after their E906 line, so a
	// connection flood cannot pile up goroutines.
	maxLingering = 1024
)

// Target names one back end and where it listens, and optionally its own
// settings and a fallback. It is a plain value; New copies what Settings
// points to.
type Target struct {
	// Name is the target's name. Clients match it case-insensitively; New
	// makes it upper case, the canonical form. 1 to 64 characters of
	// A-Z a-z 0-9 . _ : -.
	Name string
	// URL is the target's base URL, http:// or https:// with a host and no
	// query or fragment; transactions are posted to URL + "/tx".
	URL string
	// Settings, when not nil, are this target's settings in full: the
	// Config's TargetSettings do not apply to it, and a zero field selects
	// the default its comment gives. settingsfile.Load fills it from the
	// flags' defaults and the file. Nil means the Config's TargetSettings.
	Settings *TargetSettings
	// Fallback, when not empty, names another configured target (matched
	// case-insensitively) that takes this target's requests while this
	// target's breaker refuses them (docs/PROTOCOL.md, "Per-target settings and policies"). The fallback must not have
	// a fallback of its own: one step, no chains, no cycles.
	Fallback string
	// AllowedClients, when not empty, are the only clients that may send
	// requests to the target: patterns matched against the identities of
	// the client's verified certificate (its URI SANs, DNS SANs and
	// subject CN) with MatchClientPattern. Any other client's request is
	// answered E908. They need TLS with ClientCAs. Empty means every
	// client may.
	AllowedClients []string
	// TLS, when set, configures the connections to an https target: the
	// CAs it is verified against, the client certificate presented to it,
	// the server name. Nil means the system's roots and the URL's host.
	// Only for https URLs.
	TLS *tls.Config
}

// Validate reports whether t is a usable target: a valid name and an http or
// https URL with a host.
func (t Target) Validate() error {
	_, _, err := t.canonical()
	return err
}

// canonical returns t's upper-case name and the URL transactions are posted
// to.
func (t Target) canonical() (name, txURL string, err error) {
	if !protocol.ValidTxID([]byte(t.Name)) {
		return "", "", fmt.Errorf("target name %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", t.Name)
	}
	u, err := ParseTargetURL(t.URL)
	if err != nil {
		return "", "", fmt.Errorf("target %s: %w", t.Name, err)
	}
	return strings.ToUpper(t.Name), strings.TrimRight(u.String(), "/") + "/tx", nil
}

// ParseTargetURL parses a target's base URL: http or https, with a host, no
// query and no fragment.
func ParseTargetURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("URL %q does not parse", raw)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return nil, fmt.Errorf("URL %q: want http:// or https:// with a host", raw)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return nil, fmt.Errorf("URL %q: want no query or fragment", raw)
	}
	return u, nil
}

// Config configures a Server. The zero value of each field selects the
// default given in its comment; negative numbers and durations are refused by
// New. New copies the Config: changing it afterwards has no effect. A Config
// is a plain value, not meant to be changed while another goroutine reads it.
type Config struct {
	// Targets are the back ends the hub serves, at least one. Names must be
	// unique, case-insensitively.
	Targets []Target
	// TargetSettings are the settings of every target without Settings of
	// its own; each field's comment gives its default. Embedded, so that
	// its fields read and set as the Config's own (cfg.MaxInflight).
	TargetSettings
	// Rand is the random source of the jitter, returning values in [0, 1);
	// it is shared by every breaker, so it must be safe for concurrent use.
	// Nil means math/rand/v2.
	Rand func() float64
	// MaxLineBytes is the longest request line accepted, not counting its
	// line terminator. Zero means 16384.
	MaxLineBytes int
	// MaxConns is how many client connections are served at once; one more
	// gets "-|E906|too many connections" and is closed. Zero means 10000.
	MaxConns int
	// IdleTimeout closes a connection that sends no complete line for this
	// long (once its calls in flight are answered), or up to
	// min(1 s, IdleTimeout/8) longer: the deadline is moved only that
	// often. Zero means 5 min.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write of answers to a client. A client that
	// does not read for this long (or up to min(1 s, WriteTimeout/8)
	// longer) is disconnected; its calls in flight still complete and are
	// recorded by the breaker. Zero means 30 s.
	WriteTimeout time.Duration
	// Clock is the breakers' clock. Nil means the system clock.
	Clock breaker.Clock
	// DialTarget, when set, opens the connections to targets in place of a
	// TCP dial (an in-memory target, a test that needs to fail a dial). ctx
	// bounds the dial: it ends at the call's timeout or when the Server
	// gives up on its calls. Nil means TCP with keep-alive probes.
	DialTarget func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives the hub's logs. The zero Logger logs nothing.
	Logger zerolog.Logger
	// OnTransition, if set, is called for every state change of every
	// target's breaker. It runs under that breaker's lock, so each target's
	// changes arrive in order; it must be fast and must never call back into
	// the Server or a breaker. The Server also logs each change and, with
	// Metrics, counts it; OnTransition is called first.
	OnTransition func(breaker.Transition)
	// Metrics receives the hub's Prometheus metrics (see NewMetrics). A
	// Metrics serves one Server. Nil means no metrics.
	Metrics *Metrics
	// AccessLog, if set, receives one JSON line per answered request line,
	// written by a goroutine of the Server so that answers never wait for
	// it (see DefaultAccessLogQueue). Shutdown and Close write what is
	// queued and flush; closing the writer is the caller's job once they
	// have returned. Nil means no access log.
	AccessLog io.Writer
	// AccessLogQueue is how many access log lines may wait for the writer;
	// a line that finds the queue full is dropped and counted. Zero means
	// DefaultAccessLogQueue.
	AccessLogQueue int
	// TLS, when set, serves TLS to clients on every listener given to
	// Serve (see TLSConfig). Nil means plain TCP.
	TLS *TLSConfig
	// ProbePermits makes every target's breaker wait for
	// breaker.Breaker.PermitProbe before it admits a probe
	// (breaker.Settings.ProbePermits): once its open period has passed it
	// goes on refusing, with a retry hint of a second, until whoever shares
	// the breaker's state with other hubs permits the probe. Whoever turns
	// it on must give the permits (see Breaker), or the breakers stay open
	// for good. False means each breaker probes on its own, as a single hub
	// does.
	ProbePermits bool
	// ProxyProtocol says whether client connections open with a PROXY
	// protocol header from a load balancer, whose source address is then
	// the client's in the access log and the logs. Zero is ProxyOff.
	ProxyProtocol ProxyProtocol
	// ProxyTrusted are the addresses whose PROXY headers are believed (the
	// load balancers); required unless ProxyProtocol is ProxyOff.
	ProxyTrusted []netip.Prefix
	// InDoubtLog, when set, is the in-doubt journal: every call whose
	// request may have reached its target and whose outcome is unknown is
	// appended to it, and fsynced, before the client gets its answer (see
	// call.run). A journal that fails is logged and counted, and the
	// answer still goes out. Closing it is the caller's job, once Shutdown
	// or Close has returned. Nil means no journal: such calls are still
	// counted and listed by InDoubt.
	InDoubtLog *indoubt.Journal
	// HubID names the hub in the in-doubt records. Empty means
	// DefaultHubID of the first listener given to Serve.
	HubID string
}

// DefaultHubID is HOSTNAME:PORT of addr, a bound listen address, made of
// the characters a hub id may hold (those of a TXID) and at most 64 long.
func DefaultHubID(addr net.Addr) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "hub"
	}
	port := "0"
	if a, ok := addr.(*net.TCPAddr); ok {
		port = strconv.Itoa(a.Port)
	}
	b := []byte(host)
	for i, ch := range b {
		if !protocol.ValidTxID([]byte{ch}) {
			b[i] = '-'
		}
	}
	id := string(b) + ":" + port
	if len(id) > 64 {
		id = id[len(id)-64:]
	}
	return id
}

// Server is the relay hub: it serves the client protocol on the listeners
// given to Serve and relays each admitted transaction to its target through
// that target's breaker and bulkhead. It is safe for concurrent use.
type Server struct {
	// routes is the table of targets, replaced whole by Reload: the hot
	// path reads it without a lock.
	routes       atomic.Pointer[[]*route]
	defaults     TargetSettings // effective settings of a target without its own
	defaultCodes []string       // the failure codes of defaults, parsed
	// defaultExpect are the probe codes of defaults, parsed.
	defaultExpect []string
	clock         breaker.Clock
	rand          func() float64
	onTransition  func(breaker.Transition)
	probePermits  bool       // every breaker waits for PermitProbe (Config.ProbePermits)
	reloadMu      sync.Mutex // held by Reload: one at a time
	// retired holds the routes of targets a reload removed, by name, so
	// that a target added back gets its breaker back: its state and its
	// line of the breaker log go on where they stopped. Guarded by
	// reloadMu.
	retired      map[string]*route
	maxLineBytes int
	maxConns     int
	idleTimeout  time.Duration
	writeTimeout time.Duration
	log          zerolog.Logger
	panicLog     zerolog.Logger // log sampled to panicLogBurst lines a second
	metrics      *Metrics       // nil without metrics
	access       *accessLog     // nil without an access log
	// longBufs lends *[]byte buffers of maxLineBytes+2 bytes to
	// connections while they read a line too long for a read buffer.
	longBufs sync.Pool

	// The PROXY protocol settings, Config's, set once by New, and the log
	// of the connections they refuse, sampled to proxyLogBurst lines a
	// second.
	proxyProtocol ProxyProtocol
	proxyTrusted  []netip.Prefix
	proxyLog      zerolog.Logger

	// targetConns holds every open target connection, so that abortCalls
	// can cut the calls blocked on them.
	targetConns *targethttp.Conns

	// The calls in doubt: the journal (nil: none), the recent ones, and
	// the hub's name in their records (set by New or the first Serve).
	inDoubtLog    *indoubt.Journal
	inDoubtRecent *indoubt.Ring
	hubID         atomic.Pointer[string]

	// lane holds refusal-heavy connections back in turn (see refusalLane).
	lane refusalLane

	inShutdown  atomic.Bool  // set by Shutdown and Close: new lines get E906
	withdrawn   atomic.Bool  // set by Withdraw: Draining reports true, serving goes on
	activeCalls atomic.Int64 // requests between admission and their answer
	lingering   atomic.Int64 // turned-away connections still draining

	mu        sync.Mutex
	closed    bool                       // guarded by mu: no more listeners or connections
	listeners map[*net.Listener]struct{} // guarded by mu
	conns     map[net.Conn]*conn         // guarded by mu; nil for a turned-away connection
	served    int                        // guarded by mu: connections being served (non-nil in conns)

	// wg owns every goroutine the Server starts to serve clients: one per
	// connection, one per turned-away connection, the call workers.
	wg conc.WaitGroup
	// stopWorkers is closed when the Server stops, ending idle call
	// workers.
	stopWorkers     chan struct{}
	stopWorkersOnce sync.Once
	// stopping is closed when the Server begins to stop (Shutdown or
	// Close): the probers send no more probes and end, and no connection
	// waits any longer for a turn in the refusal lane.
	stopping     chan struct{}
	stoppingOnce sync.Once
	// started is when New ran, and probeSeq counts the synthetic probes
	// sent: both are in the probes' TXIDs.
	started  time.Time
	probeSeq atomic.Uint64
	// bg owns the access log's writer, which outlives wg's goroutines: it
	// writes what they recorded until they have all ended.
	bg conc.WaitGroup

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
		defaults:      defaults,
		defaultCodes:  defaultCodes,
		defaultExpect: defaultExpect,
		stopping:      make(chan struct{}),
		started:       time.Now(),
		clock:         cfg.Clock,
		rand:          cfg.Rand,
		probePermits:  cfg.ProbePermits,
		onTransition:  cfg.OnTransition,
		maxLineBytes:  orDefault(cfg.MaxLineBytes, DefaultMaxLineBytes),
		maxConns:      orDefault(cfg.MaxConns, DefaultMaxConns),
		idleTimeout:   orDefault(cfg.IdleTimeout, DefaultIdleTimeout),
		writeTimeout:  orDefault(cfg.WriteTimeout, DefaultWriteTimeout),
		log:           cfg.Logger.With().Str("component", "relay").Logger(),
		metrics:       cfg.Metrics,
		listeners:     make(map[*net.Listener]struct{}),
		conns:         make(map[net.Conn]*conn),
		stopWorkers:   make(chan struct{}),
		inDoubtLog:    cfg.InDoubtLog,
		inDoubtRecent: indoubt.NewRing(inDoubtRecent),
	}
	if id := cfg.HubID; id != "" {
		s.hubID.Store(&id)
	}
	s.lane.init()

	s.panicLog = s.log.Sample(&zerolog.BurstSampler{Burst: panicLogBurst, Period: time.Second})
	if cfg.TLS != nil {
		if s.tls, err = newTLSServer(*cfg.TLS, s.log, cfg.Metrics); err != nil {
			return nil, err
		}
	}
	if err := s.setProxyProtocol(cfg.ProxyProtocol, cfg.ProxyTrusted); err != nil {
		return nil, err
	}
	s.targetConns = targethttp.NewConns(cfg.DialTarget)
	plans, err := s.plan(cfg.Targets)
	if err != nil {
		return nil, err
	}
	routes := make([]*route, len(plans))
	confs := make([]*routeConf, len(plans))
	for i, p := range plans {
		routes[i] = s.newRoute(p)
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
	}
	s.routes.Store(&routes)
	if cfg.AccessLog != nil {
		s.access = newAccessLog(cfg.AccessLog, orDefault(cfg.AccessLogQueue, DefaultAccessLogQueue), cfg.Metrics, cfg.Logger, cfg.Clock)
		s.bg.Go(s.writeAccessLog)
	}
	s.startProbers(routes)
	return s, nil
}

// parseFailureCodes checks failure codes with protocol.ParseFailureCode and
// returns them in canonical form; none means the default set.
func parseFailureCodes(in []string) ([]string, error) {
	if len(in) == 0 {
		in = protocol.DefaultFailureCodes[:]
	}
	codes := make([]string, 0, len(in))
	for _, c := range in {
		code, err := protocol.ParseFailureCode(c)
		if err != nil {
			return nil, err
		}
		codes = append(codes, code)
	}
	return codes, nil
}

// WithDefaults returns ts with its zero limits and timeouts replaced by the
// package defaults; the policies stay as they are, off when zero, and the
// breaker fills in Window and MinSamples when the failure rate is on. A zero
// TargetIdleTimeout also stays zero: the target's HTTP client reads it as
// DefaultTargetIdleTimeout, and the target's snapshot shows that value.
func (ts TargetSettings) WithDefaults() TargetSettings {
	ts.MaxInflight = orDefault(ts.MaxInflight, DefaultMaxInflight)
	ts.FailThreshold = orDefault(ts.FailThreshold, DefaultFailThreshold)
	ts.ResetTimeout = orDefault(ts.ResetTimeout, DefaultResetTimeout)
	ts.TargetTimeout = orDefault(ts.TargetTimeout, DefaultTargetTimeout)
	if len(ts.FailureCodes) == 0 {
		ts.FailureCodes = protocol.DefaultFailureCodes[:]
	}
	ts.FailureCodes = slices.Clone(ts.FailureCodes)
	ts.ProbeExpect = slices.Clone(ts.ProbeExpect)
	return ts
}

// check refuses negative limits and durations and a rate or jitter outside
// 0 to 1 (NaN included), naming the field.
func (ts TargetSettings) check() error {
	if err := firstNegative([]negativeCheck{
		{"FailThreshold", ts.FailThreshold < 0},
		{"ResetTimeout", ts.ResetTimeout < 0},
		{"MaxInflight", ts.MaxInflight < 0},
		{"TargetTimeout", ts.TargetTimeout < 0},
		{"TargetIdleTimeout", ts.TargetIdleTimeout < 0},
		{"Window", ts.Window < 0},
		{"MinSamples", ts.MinSamples < 0},
		{"SlowCall", ts.SlowCall < 0},
		{"MaxResetTimeout", ts.MaxResetTimeout < 0},
		{"ProbeSuccesses", ts.ProbeSuccesses < 0},
		{"ProbeInterval", ts.ProbeInterval < 0},
	}); err != nil {
		return err
	}
	if err := checkProbePayload(ts.ProbePayload); err != nil {
		return err
	}
	if !(ts.FailureRate >= 0 && ts.FailureRate <= 1) {
		return fmt.Errorf("FailureRate must be between 0 and 1, got %v", ts.FailureRate)
	}
	if !(ts.ResetJitter >= 0 && ts.ResetJitter <= 1) {
		return fmt.Errorf("ResetJitter must be between 0 and 1, got %v", ts.ResetJitter)
	}
	return nil
}

// ProbeGrace is what a probe gets on top of the target timeout before the
// breaker may replace it: time for the timed-out call to be classified and
// reported. A breaker's ProbeTimeout is its target's TargetTimeout plus
// ProbeGrace.
const ProbeGrace = time.Second

// failLogBurst is how many failed calls per target and second are logged at
// warn; past it they are counted by the metrics and logged at debug only,
// so a flapping target cannot flood the log.
const failLogBurst = 5

// checkNonNegative refuses negative numbers and durations among the
// Config's own fields (TargetSettings.check does its settings), which have
// no meaning and would otherwise be mistaken for "use the default".
func checkNonNegative(cfg Config) error {
	if err := firstNegative([]negativeCheck{
		{"MaxLineBytes", cfg.MaxLineBytes < 0},
		{"MaxConns", cfg.MaxConns < 0},
		{"IdleTimeout", cfg.IdleTimeout < 0},
		{"WriteTimeout", cfg.WriteTimeout < 0},
		{"AccessLogQueue", cfg.AccessLogQueue < 0},
	}); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return nil
}

// negativeCheck is one field for firstNegative: its name, and whether its
// value is negative.
type negativeCheck struct {
	name     string
	negative bool
}

// firstNegative returns "NAME must not be negative" for the first check
// that found a negative value, else nil.
func firstNegative(checks []negativeCheck) error {
	for _, c := range checks {
		if c.negative {
			return fmt.Errorf("%s must not be negative", c.name)
		}
	}
	return nil
}

// orDefault returns v, or def when v is zero.
func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// TargetSnapshot is one target at one instant: its configuration, its
// breaker and its bulkhead, for status pages. It is a plain value, a copy
// that no later change touches.
type TargetSnapshot struct {
	// Name is the canonical (upper-case) target name.
	Name string
	// URL is the target's base URL as configured.
	URL string
	// Fallback is the canonical name of the target that takes this one's
	// requests while its breaker refuses them; empty when none.
	Fallback string
	// Snapshot is the breaker's state: CLOSED, OPEN or HALF_OPEN, the
	// failure count, the retry hint, and whether an operator holds or
	// disabled it. Embedded, so that its fields read as the target's own
	// (ts.State).
	breaker.Snapshot
	// InFlight is the number of calls holding a bulkhead slot.
	InFlight int
	// MaxInFlight is the bulkhead's size.
	MaxInFlight int
	// ProbeTimeout is how long a half-open probe may stay silent before
	// another is admitted: the target timeout plus one second.
	ProbeTimeout time.Duration
	// Settings are the settings the target runs with, every default
	// filled in and every field of a policy that is off zero. MaxInflight
	// is set only for a target with settings of its own (it is zero
	// otherwise; the bulkhead size of every target is MaxInFlight).
	Settings TargetSettings
	// LastFailure is the target's most recent failed call; its At is zero
	// when there has been none.
	LastFailure Failure
	// InDoubt is how many of the target's calls ended in doubt since the
	// hub started: the request may have reached the target, the outcome
	// is unknown.
	InDoubt int64
	// LastProbe is the target's latest synthetic probe; its At is zero
	// when the hub has sent none.
	LastProbe ProbeResult
}

// TargetSettings are a target's bulkhead, call and breaker settings: the
// one definition that the flags, the settings file, the status and the
// breaker share. Embedded in Config they are the settings of every target
// without Settings of its own; in Target.Settings they are one target's
// settings in full. Given either way, a zero field selects the default its
// comment gives, and New refuses a negative limit or duration and a rate or
// jitter outside 0 to 1. It is a plain value; New and Targets copy
// FailureCodes.
type TargetSettings struct {
	// MaxInflight is the bulkhead size: calls to the target at a time. Zero
	// means 10.
	MaxInflight int
	// TargetTimeout bounds one target call: connect, request, answer. Zero
	// means 3 s.
	TargetTimeout time.Duration
	// TargetIdleTimeout is how long a pooled connection to the target may
	// stay unused before the hub closes it. Keep it under the target's own
	// keep-alive timeout, so that the hub rather than the target usually
	// ends an idle connection. Zero means 4 s.
	TargetIdleTimeout time.Duration
	// FailureCodes are the response codes that count as breaker failures,
	// each accepted by protocol.ParseFailureCode. Empty means E500, E901,
	// E902.
	FailureCodes []string
	// ProbePayload, when not empty, turns on synthetic recovery probes
	// (docs/PROTOCOL.md, "Synthetic recovery probes"): when the breaker's
	// open period ends the hub itself sends this payload to the target,
	// with a TXID of its own (ProbeTxIDPrefix), and no customer's
	// transaction is ever the probe; customers get E904 until the breaker
	// closes. It sets Policy.SyntheticProbes, whatever that field says. It
	// must hold no line break. Empty means off: the first customer call
	// after the open period is the probe.
	ProbePayload string
	// ProbeExpect are the answer codes of a healthy synthetic probe, each
	// accepted by ParseProbeCode; any other answer, a timeout or a
	// transport failure is a failed probe. Empty means 0000.
	ProbeExpect []string
	// Policy is when the target's breaker opens and how long it stays open
	// (threshold, reset timeout and the optional policies, the probes'
	// included); its comments give the defaults. Embedded, so that its
	// fields read and set as the settings' own (ts.FailThreshold).
	breaker.Policy
}

// Targets returns a snapshot of every target, in configuration order.
func (s *Server) Targets() []TargetSnapshot {
	routes := s.routeList()
	out := make([]TargetSnapshot, 0, len(routes))
	for _, r := range routes {
		out = append(out, s.snapshot(r))
	}
	return out
}

// Breaker returns the breaker of the target named name, matched
// case-insensitively, or nil when there is none. It is for whoever shares
// the target's breaker state with other hubs (AdoptOpen, AdoptClose,
// PermitProbe); the relay's own requests go through it as before. Every
// change made through it reaches Config.OnTransition and the metrics at
// once, like any other, and the relay's log with the target's next call.
func (s *Server) Breaker(name string) *breaker.Breaker {
	r := s.lookup([]byte(name))
	if r == nil {
		return nil
	}
	return r.breaker
}

// Target returns a snapshot of the target named name, matched
// case-insensitively; false when there is none.
func (s *Server) Target(name string) (TargetSnapshot, bool) {
	r := s.lookup([]byte(name))
	if r == nil {
		return TargetSnapshot{}, false
	}
	return s.snapshot(r), true
}

// snapshot returns r's state now.
func (s *Server) snapshot(r *route) TargetSnapshot {
	rc := r.conf.Load()
	bs := r.breaker.Settings()
	settings := TargetSettings{
		TargetTimeout:     rc.client.Timeout(),
		TargetIdleTimeout: rc.client.IdleTimeout(),
		FailureCodes:      append([]string(nil), rc.failureCodes...),
		Policy:            bs.Policy,
	}
	if rc.own {
		settings.MaxInflight = r.bulkhead.Limit()
	}
	if rc.probePayload != nil {
		settings.ProbePayload = string(rc.probePayload)
		settings.ProbeExpect = slices.Clone(rc.probeExpect)
	}
	return TargetSnapshot{
		Name:         r.name,
		URL:          rc.url,
		Fallback:     rc.fallbackName,
		Snapshot:     r.breaker.Snapshot(),
		InFlight:     r.bulkhead.InFlight(),
		MaxInFlight:  r.bulkhead.Limit(),
		ProbeTimeout: bs.ProbeTimeout,
		Settings:     settings,
		LastFailure:  r.lastFailure.load(),
		InDoubt:      r.inDoubt.Load(),
		LastProbe:    r.lastProbe(),
	}
}

// lastProbe returns r's latest synthetic probe; zero At when none.
func (r *route) lastProbe() ProbeResult {
	if p := r.prober.last.Load(); p != nil {
		return *p
	}
	return ProbeResult{}
}

// Draining reports whether the Server is leaving service: Withdraw has
// been called (it still serves), or Shutdown or Close has begun (it no
// longer accepts connections and answers new lines E906).
func (s *Server) Draining() bool {
	return s.withdrawn.Load() || s.inShutdown.Load()
}

// ConnectionsOpen returns the number of client connections being served,
// not counting those turned away over MaxConns.
func (s *Server) ConnectionsOpen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served
}

// Serve accepts connections on ln and serves each in its own goroutine until
// ln fails or the Server is shut down. It always closes ln. After Shutdown or
// Close it returns ErrServerClosed; otherwise the listener's error.
func (s *Server) Serve(ln net.Listener) error {
	defer ln.Close()
	if s.hubID.Load() == nil {
		id := DefaultHubID(ln.Addr())
		s.hubID.CompareAndSwap(nil, &id)
	}
	if !s.trackListener(&ln, true) {
		return ErrServerClosed
	}
	defer s.trackListener(&ln, false)

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			// Running out of file descriptors and the like pass; back off
			// so the loop does not spin, as net/http does.
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept failed")
				time.Sleep(backoff)
				continue
			}
			return err
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

// trackListener adds or removes ln from the listeners Shutdown closes. It
// reports false when adding to a Server that is already closed.
func (s *Server) trackListener(ln *net.Listener, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !add {
		delete(s.listeners, ln)
		return true
	}
	if s.closed {
		return false
	}
	s.listeners[ln] = struct{}{}
	return true
}

// startConn starts serving nc, or turns it away when MaxConns connections are
// already served. It reports false, closing nc, when the Server is closed.
// The goroutine is started under mu, after the closed check, so that
// Shutdown's wait for all goroutines can never miss one.
func (s *Server) startConn(nc net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		nc.Close()
		return false
	}
	if s.served >= s.maxConns {
		s.conns[nc] = nil
		s.goCatching(taskTurnAway, func() { s.turnAway(nc) })
		return true
	}
	c := newConn(s, nc)
	s.conns[nc] = c
	s.served++
	// Not goCatching: serve catches its own panics (endOnPanic).
	s.wg.Go(c.serve)
	return true
}

// untrack forgets a connection that has been closed.
func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.conns[nc]; ok {
		if c != nil {
			s.served--
		}
		delete(s.conns, nc)
	}
}

// turnAway answers a connection over MaxConns with its one E906 line and
// closes it. It accepts rather than leaving the connection in the accept
// queue, so the client learns at once why it is not served.
func (s *Server) turnAway(nc net.Conn) {
	defer s.untrack(nc)
	if !s.handshakeTurnedAway(nc) {
		nc.Close()
		return
	}
	s.metrics.countUnrouted(protocol.CodeUnavailable)
	s.log.Debug().Str("remote", nc.RemoteAddr().String()).Msg("connection turned away: too many connections")
	_ = nc.SetWriteDeadline(time.Now().Add(turnAwayWriteTimeout))
	if _, err := nc.Write(tooManyConnsLine); err != nil {
		nc.Close()
		return
	}
	if s.lingering.Add(1) > maxLingering {
		s.lingering.Add(-1)
		nc.Close()
		return
	}
	defer s.lingering.Add(-1)
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
	lnErr := s.closeListeners()
	s.inShutdown.Store(true)
	s.stoppingOnce.Do(func() { close(s.stopping) })

	err := poll(ctx, func() bool { return s.activeCalls.Load() == 0 })
	if err == nil {
		for _, c := range s.connsSnapshot() {
			c.stopReading()
		}
		err = poll(ctx, func() bool { return s.connCount() == 0 })
	}
	if err != nil {
		s.abortCalls()
		graceCtx, cancel := context.WithTimeout(context.Background(), abortGrace)
		_ = poll(graceCtx, func() bool { return s.activeCalls.Load() == 0 })
		cancel()
		s.closeConns()
	}
	s.stopWorkersOnce.Do(func() { close(s.stopWorkers) })
	s.wg.Wait()
	s.stopAccessLog()
	s.closeIdleHTTP()
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
	err := s.closeListeners()
	s.inShutdown.Store(true)
	s.stoppingOnce.Do(func() { close(s.stopping) })
	s.abortCalls()
	s.closeConns()
	s.stopWorkersOnce.Do(func() { close(s.stopWorkers) })
	s.wg.Wait()
	s.stopAccessLog()
	s.closeIdleHTTP()
	return err
}

// panicLogBurst is how many caught panics a second are logged with their
// stacks; the metric counts every one.
const panicLogBurst = 5

// goCatching runs f on wg, the WaitGroup that owns it, and catches a panic
// where it happens: logged with its stack and counted in
// relay_panics_total{task} at once, rather than held by conc until Wait
// re-panics it at shutdown. What f holds is released by its own defers,
// which run before the panic is caught.
func (s *Server) goCatching(t task, f func()) {
	s.wg.Go(func() { s.catchPanic(t, f) })
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
	s.notePanic(t, r.Value, r.Stack)
	return true
}

// notePanic logs a panic caught in a goroutine doing t, with its stack, and
// counts it.
func (s *Server) notePanic(t task, value any, stack []byte) {
	s.panicLog.Error().Str("task", taskNames[t]).Interface("panic", value).Bytes("stack", stack).Msg("goroutine panicked")
	s.metrics.countPanic(t)
}

// writeAccessLog runs the access log's writer until its queue is closed and
// written out, restarting it after a panic, so the access log never stops
// in silence. The lines the writer held unflushed at the panic are lost and
// counted as dropped.
func (s *Server) writeAccessLog() {
	for s.catchPanic(taskAccessLog, s.access.writeLoop) {
		s.access.dropBuffered()
		s.panicLog.Warn().Msg("access log writer restarted after a panic")
	}
}

// stopAccessLog writes and flushes the access log's queue and ends its
// writer. It runs once every goroutine that records has ended.
func (s *Server) stopAccessLog() {
	if s.access != nil {
		s.access.close()
	}
	s.bg.Wait()
}

// closeListeners closes every listener and marks the Server closed, so no
// listener or connection is added afterwards.
func (s *Server) closeListeners() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for ln := range s.listeners {
		if err := (*ln).Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isClosed reports whether Shutdown or Close has closed the listeners.
func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// connsSnapshot returns the connections being served.
func (s *Server) connsSnapshot() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// connCount returns the number of open connections, served or turned away.
func (s *Server) connCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// closeConns closes every connection at once, unblocking their reads and
// writes.
func (s *Server) closeConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for nc := range s.conns {
		nc.Close()
	}
}

// abortCalls gives up on the target calls in flight (Close, or Shutdown
// when its time runs out): dials stop and their connections are closed,
// which ends the reads and writes they are blocked in. Each is answered
// E901 "no answer before shutdown".
func (s *Server) abortCalls() {
	s.targetConns.Abort()
}

// closeIdleHTTP drops the idle pooled target connections.
func (s *Server) closeIdleHTTP() {
	for _, rt := range s.routeList() {
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
