package relay

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
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
	// subject CN) with clientcert.Match. Any other client's request is
	// answered E908. They need TLS with ClientCAs. Empty means every
	// client may.
	AllowedClients []string
	// StatusURL, when not empty, is where the hub asks the target about
	// one transaction when a client resends a TXID whose first call ended
	// in doubt (TargetSettings.Dedup): an http or https URL holding
	// "{txid}", which becomes the TXID, answered like the fixture's
	// GET /tx/{txid}. Empty means such a resend is answered E901 "outcome
	// still unknown; do not resend yet" without a call.
	StatusURL string
	// ReverseURL, when not empty, is where the hub posts the reversal of a
	// transaction in doubt under the reverse policy
	// (TargetSettings.Resolve): an http or https URL holding "{txid}"
	// once (targethttp.CheckReverseURL). Empty means no reversals.
	ReverseURL string
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
	if t.StatusURL != "" {
		if err := CheckStatusURL(t.StatusURL); err != nil {
			return "", "", fmt.Errorf("target %s: %w", t.Name, err)
		}
	}
	if t.ReverseURL != "" {
		if err := targethttp.CheckReverseURL(t.ReverseURL); err != nil {
			return "", "", fmt.Errorf("target %s: reverse URL %w", t.Name, err)
		}
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

// ResolvePolicy returns how t's transactions in doubt are settled under
// ts: ts.Resolve, or by default lookup when t has a StatusURL, else manual.
// It fails when the policy cannot work: lookup without a StatusURL,
// reverse without a ReverseURL, or a name that is no policy.
func (t Target) ResolvePolicy(ts TargetSettings) (resolver.Policy, error) {
	switch ts.Resolve {
	case "":
		if t.StatusURL != "" {
			return resolver.PolicyLookup, nil
		}
		return resolver.PolicyManual, nil
	case resolver.PolicyLookup:
		if t.StatusURL == "" {
			return "", fmt.Errorf("target %s: resolve lookup needs a status URL", t.Name)
		}
	case resolver.PolicyReverse:
		if t.ReverseURL == "" {
			return "", fmt.Errorf("target %s: resolve reverse needs a reverse URL", t.Name)
		}
	case resolver.PolicyManual:
	default:
		return "", fmt.Errorf("target %s: resolve %q: want lookup, reverse or manual", t.Name, ts.Resolve)
	}
	return ts.Resolve, nil
}

// StatusTxID is the placeholder of a Target's StatusURL that becomes the
// TXID: the same as a ReverseURL's.
const StatusTxID = targethttp.TxIDPlaceholder

// CheckStatusURL reports whether raw is a usable status URL: http or https
// with a host, holding StatusTxID once.
func CheckStatusURL(raw string) error {
	if strings.Count(raw, StatusTxID) != 1 {
		return fmt.Errorf("status URL %q: want %s exactly once", raw, StatusTxID)
	}
	u, err := url.Parse(strings.Replace(raw, StatusTxID, "T1", 1))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return fmt.Errorf("status URL %q: want http:// or https:// with a host", raw)
	}
	return nil
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
	// DedupMaxEntries bounds the TXIDs the duplicate-TXID shield
	// remembers, over every target; past it answered ones are forgotten
	// first, and counted; one in flight or in doubt never is, and while
	// nothing else is left a new TXID is answered E906. Zero means
	// dedup.DefaultMaxEntries.
	DedupMaxEntries int
	// DedupStore, when set, shares the shield with the other hubs of a
	// fleet: a shielded call is claimed in it before it is made and
	// settled there after it is answered. While it fails each hub shields
	// on its own memory, and counts it. Nil means the hub's memory only.
	DedupStore dedup.Store
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

// DedupScope says whose TXIDs the duplicate-TXID shield keeps apart.
type DedupScope uint8

// Scopes of the shield.
const (
	// DedupByIdentity: under mutual TLS each client identity has TXIDs of
	// its own, so that no client gets another's answers, or learns which
	// TXIDs another uses; a client without a certificate shares the
	// target's, as with DedupByTarget.
	DedupByIdentity DedupScope = iota
	// DedupByTarget: a target's TXIDs are shared by all its clients.
	DedupByTarget
)

// DedupScopeNames are the names ParseDedupScope takes, by DedupScope.
var DedupScopeNames = [...]string{DedupByIdentity: "identity", DedupByTarget: "target"}

// String returns the scope's name.
func (d DedupScope) String() string {
	if int(d) < len(DedupScopeNames) {
		return DedupScopeNames[d]
	}
	return "DedupScope(" + strconv.Itoa(int(d)) + ")"
}

// ParseDedupScope reads a scope's name: identity or target.
func ParseDedupScope(name string) (DedupScope, error) {
	for i, n := range DedupScopeNames {
		if n == name {
			return DedupScope(i), nil
		}
	}
	return 0, fmt.Errorf("%q: want identity or target", name)
}

// DefaultLateAnswerGrace is TargetSettings.LateAnswerGrace's zero value's
// meaning.
const DefaultLateAnswerGrace = 30 * time.Second

// ResolveTarget returns the resolver's settings for a target whose
// transactions in doubt are settled by policy under ts: the durations with
// their defaults, gate left to the caller.
func (ts TargetSettings) ResolveTarget(policy resolver.Policy) resolver.Target {
	return resolver.Target{
		Policy:       policy,
		ResolveAfter: orDefault(ts.ResolveAfter, resolver.DefaultResolveAfter),
		MaxInterval:  orDefault(ts.ResolveMaxInterval, resolver.DefaultMaxInterval),
		Expire:       orDefault(ts.ResolveExpire, resolver.DefaultExpire),
	}
}

// LateGrace is how long a timed-out call's connection is read on: zero
// when NoLateAnswer, else LateAnswerGrace or its default.
func (ts TargetSettings) LateGrace() time.Duration {
	if ts.NoLateAnswer {
		return 0
	}
	return orDefault(ts.LateAnswerGrace, DefaultLateAnswerGrace)
}

// shieldWindow is DedupWindow, or its default when zero. Like
// TargetIdleTimeout, a zero window stays zero in the settings.
func (ts TargetSettings) shieldWindow() time.Duration {
	return orDefault(ts.DedupWindow, dedup.DefaultWindow)
}

// check refuses negative limits and durations and a rate or jitter outside
// 0 to 1 (NaN included), naming the field.
func (ts TargetSettings) check() error {
	if err := firstNegative([]negativeCheck{
		{"FailThreshold", ts.FailThreshold < 0},
		{"ResetTimeout", ts.ResetTimeout < 0},
		{"MaxInflight", ts.MaxInflight < 0},
		{"MinInflight", ts.MinInflight < 0},
		{"TargetTimeout", ts.TargetTimeout < 0},
		{"TargetIdleTimeout", ts.TargetIdleTimeout < 0},
		{"Window", ts.Window < 0},
		{"MinSamples", ts.MinSamples < 0},
		{"SlowCall", ts.SlowCall < 0},
		{"MaxResetTimeout", ts.MaxResetTimeout < 0},
		{"ProbeSuccesses", ts.ProbeSuccesses < 0},
		{"ProbeInterval", ts.ProbeInterval < 0},
		{"DedupWindow", ts.DedupWindow < 0},
		{"ResolveAfter", ts.ResolveAfter < 0},
		{"ResolveMaxInterval", ts.ResolveMaxInterval < 0},
		{"ResolveExpire", ts.ResolveExpire < 0},
		{"LateAnswerGrace", ts.LateAnswerGrace < 0},
	}); err != nil {
		return err
	}
	switch ts.Resolve {
	case "", resolver.PolicyLookup, resolver.PolicyReverse, resolver.PolicyManual:
	default:
		return fmt.Errorf("resolve policy %q: want lookup, reverse or manual", ts.Resolve)
	}
	if err := checkProbePayload(ts.ProbePayload); err != nil {
		return err
	}
	if ts.AdaptiveLimit > LimitObserve {
		return fmt.Errorf("AdaptiveLimit %d is no LimitMode", ts.AdaptiveLimit)
	}
	if !(ts.FailureRate >= 0 && ts.FailureRate <= 1) {
		return fmt.Errorf("FailureRate must be between 0 and 1, got %v", ts.FailureRate)
	}
	if !(ts.ResetJitter >= 0 && ts.ResetJitter <= 1) {
		return fmt.Errorf("ResetJitter must be between 0 and 1, got %v", ts.ResetJitter)
	}
	if ts.DedupScope > DedupByTarget {
		return fmt.Errorf("DedupScope must be DedupByIdentity or DedupByTarget, got %v", ts.DedupScope)
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
		{"DedupMaxEntries", cfg.DedupMaxEntries < 0},
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
	// means 10. With an adaptive limit it is the ceiling.
	MaxInflight int
	// AdaptiveLimit lets the bulkhead's limit follow the target's capacity,
	// computed from its latency and its calls in doubt between MinInflight
	// and MaxInflight (bulkhead.Adaptive). LimitStatic, the zero value,
	// keeps MaxInflight.
	AdaptiveLimit LimitMode
	// MinInflight is the adaptive limit's floor, capped at MaxInflight.
	// Zero means 2.
	MinInflight int
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
	// Dedup turns on the duplicate-TXID shield (docs/PROTOCOL.md,
	// "Resending a transaction"): a copy of a call in flight joins it, a
	// TXID answered within DedupWindow gets its answer again, one reused
	// with another payload gets E909, and one in doubt is looked up at the
	// target's StatusURL. False means off: every line is a call.
	Dedup bool
	// DedupWindow is how long the shield remembers an answered or
	// in-doubt TXID. Zero means 10 min.
	DedupWindow time.Duration
	// DedupScope is whose TXIDs the shield keeps apart when clients
	// present certificates. Zero is DedupByIdentity.
	DedupScope DedupScope
	// Resolve is how the hub settles the target's transactions in doubt
	// (docs/PROTOCOL.md, "In-doubt journal"): resolver.PolicyLookup,
	// PolicyReverse (needs Target.ReverseURL) or PolicyManual. Empty means
	// lookup when the target has a StatusURL, else manual
	// (Target.ResolvePolicy).
	Resolve resolver.Policy
	// ResolveAfter is the wait from a call going in doubt to the first
	// attempt to settle it, and the base of the backoff after it. Zero
	// means 5 s.
	ResolveAfter time.Duration
	// ResolveMaxInterval caps the wait between two attempts. Zero means
	// 1 min.
	ResolveMaxInterval time.Duration
	// ResolveExpire is how long after going in doubt the hub gives an
	// entry up (unresolved_expired). Zero means 24 h.
	ResolveExpire time.Duration
	// LateAnswerGrace is how long the connection of a call that timed out
	// is read on for the target's late answer. Zero means 30 s; see
	// NoLateAnswer.
	LateAnswerGrace time.Duration
	// NoLateAnswer turns late reading off: the connection is closed at
	// the timeout (late_answer_grace = 0 in the settings file). False
	// means on.
	NoLateAnswer bool
	// Policy is when the target's breaker opens and how long it stays open
	// (threshold, reset timeout and the optional policies, the probes'
	// included); its comments give the defaults. Embedded, so that its
	// fields read and set as the settings' own (ts.FailThreshold).
	breaker.Policy
}
