package main

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/fleet"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/settingsfile"
)

type cli struct {
	Listen        string       `help:"Address to serve the line protocol on; port 0 picks a free port (logged as addr)." default:"127.0.0.1:9200" env:"RELAY_LISTEN"`
	AdminListen   string       `help:"Address for the admin HTTP endpoints (/metrics, /healthz, /readyz, /status); port 0 picks a free port (logged as admin_addr); empty turns them off." default:"127.0.0.1:9280" env:"RELAY_ADMIN_LISTEN"`
	Target        []targetFlag `help:"Target as NAME=URL; repeat for more. Giving any replaces the default pair. In the environment, comma-separated." placeholder:"NAME=URL" default:"CORE=http://127.0.0.1:9201,CLAIM=http://127.0.0.1:9202" env:"RELAY_TARGET"`
	FailThreshold int          `help:"Consecutive failures that open a target's breaker." default:"5" env:"RELAY_FAIL_THRESHOLD"`
	ResetTimeout  duration     `help:"How long an open breaker refuses calls before a probe; a bare number is seconds, 500ms works." default:"10s" env:"RELAY_RESET_TIMEOUT"`
	MaxInflight   int          `help:"Calls in flight per target (bulkhead size); one more is answered E905." default:"10" env:"RELAY_MAX_INFLIGHT"`
	AdaptiveLimit string       `help:"Let each target's bulkhead limit follow its capacity, from its latency and its calls in doubt, between --min-inflight and --max-inflight: on, off, or observe (computed and shown, --max-inflight enforced)." enum:"off,on,observe" default:"off" env:"RELAY_ADAPTIVE_LIMIT"`
	MinInflight   int          `help:"Floor of the adaptive limit." default:"2" env:"RELAY_MIN_INFLIGHT"`
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
	InDoubtLog    string       `help:"File to append one JSON line to, and fsync, for every call that may have reached its target without an answer (E901, E902 or E500 in doubt), before the client gets its answer; for reconciliation. Locked while the relay runs, reopened on SIGHUP (for logrotate). Empty turns it off." default:"in-doubt.log" placeholder:"FILE" env:"RELAY_IN_DOUBT_LOG"`
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
	Dedup           bool     `help:"Duplicate-TXID shield for every target (a settings file's dedup sets it per target): a resend of a TXID in flight joins its call, one answered within --dedup-window gets the same answer without a call, one reused with another payload gets E909, one in doubt is looked up at the target's status_url (docs/PROTOCOL.md, \"Resending a transaction\")." env:"RELAY_DEDUP"`
	DedupWindow     duration `help:"How long the shield remembers an answered or in-doubt TXID; 0 means 10m." default:"0" env:"RELAY_DEDUP_WINDOW"`
	DedupScope      string   `help:"Whose TXIDs the shield keeps apart (a settings file's dedup_scope sets it per target): identity gives each client certificate's identity its own, so that no client gets another's answers or learns its TXIDs; target shares them among all the target's clients. Clients without a certificate always share them." enum:"identity,target" default:"identity" env:"RELAY_DEDUP_SCOPE"`
	ResolveAfter    duration `help:"First try to settle a call in doubt this long after it, and the base of the backoff between tries." default:"5s" env:"RELAY_RESOLVE_AFTER"`
	ResolveMax      duration `name:"resolve-max-interval" help:"Longest wait between two tries to settle a call in doubt." default:"1m" env:"RELAY_RESOLVE_MAX_INTERVAL"`
	ResolveExpire   duration `help:"Give up settling a call in doubt this long after it (unresolved_expired)." default:"24h" env:"RELAY_RESOLVE_EXPIRE"`
	DedupMaxEntries int      `help:"Most TXIDs the shield remembers, over all targets (about 145 bytes each); past it answered ones are forgotten first, and counted in relay_dedup_evictions_total; one in flight or in doubt never is, and while nothing else is left a new TXID gets E906." default:"1000000" env:"RELAY_DEDUP_MAX_ENTRIES"`
	AdminToken      string   `help:"Bearer token every admin POST (POST /breakers/NAME, POST /reload) must carry, and every read but /healthz and /readyz from beyond loopback; this or --admin-token-file is required when --admin-listen is beyond loopback. Prefer --admin-token-file or the environment variable: a flag shows in the process list. Empty means no check." env:"RELAY_ADMIN_TOKEN"`
	AdminTokenFile  string   `help:"File holding the bearer token of --admin-token, instead of that flag: read at start and again on SIGHUP, so the token can be rotated without a restart. The whole file is the token, one line, a trailing newline dropped. A file that is empty, or that group or others have any access to (chmod 600 it), stops the relay at start; on SIGHUP it is refused and logged, and the token in force stays. Empty means none." placeholder:"FILE" env:"RELAY_ADMIN_TOKEN_FILE"`

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
		{"--min-inflight", c.MinInflight},
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
		{"--resolve-after", c.ResolveAfter},
		{"--resolve-max-interval", c.ResolveMax},
		{"--resolve-expire", c.ResolveExpire},
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
	if c.AdminToken != "" && c.AdminTokenFile != "" {
		return errors.New("--admin-token and --admin-token-file: give one or the other")
	}
	if c.AdminTokenFile != "" && strings.TrimSpace(c.AdminTokenFile) == "" {
		return errors.New("--admin-token-file: must name a file, or be empty for none")
	}
	if c.DedupWindow < 0 {
		return fmt.Errorf("--dedup-window: must not be negative, got %s", time.Duration(c.DedupWindow))
	}
	if c.DedupMaxEntries < 1 {
		return fmt.Errorf("--dedup-max-entries: must be at least 1, got %d", c.DedupMaxEntries)
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

// validateService checks the flags of running behind a load balancer; each
// error names its flag.
func (c *cli) validateService() error {
	if c.ShutdownDelay < 0 {
		return fmt.Errorf("--shutdown-delay: must not be negative, got %s", time.Duration(c.ShutdownDelay))
	}
	mode, err := relay.ParseProxyProtocol(c.ProxyProtocol)
	if err != nil {
		return fmt.Errorf("--proxy-protocol: %w", err)
	}
	trusted, err := c.proxyTrusted()
	if err != nil {
		return err
	}
	if mode != relay.ProxyOff && len(trusted) == 0 {
		return fmt.Errorf("--proxy-trusted: name the load balancers whose PROXY headers to believe (--proxy-protocol %s)", mode)
	}
	return nil
}

// validateFleet checks --state-store and --hub-id (docs/FLEET.md); each
// error names its flag.
func (c *cli) validateFleet() error {
	if c.StateStore != "" {
		if err := fleet.ValidateStoreURL(c.StateStore); err != nil {
			return fmt.Errorf("--state-store: %w", err)
		}
	}
	if c.HubID != "" && !fleet.ValidName(c.HubID) {
		return fmt.Errorf("--hub-id %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", c.HubID)
	}
	return nil
}

// targetDefaults returns the settings the flags give every target, as
// relay.Config and settingsfile.Load take them; codes are the parsed
// --failure-codes.
func (c *cli) targetDefaults(codes []string) relay.TargetSettings {
	return relay.TargetSettings{
		MaxInflight:        c.MaxInflight,
		AdaptiveLimit:      mustLimitMode(c.AdaptiveLimit),
		MinInflight:        c.MinInflight,
		TargetTimeout:      time.Duration(c.TargetTimeout),
		TargetIdleTimeout:  time.Duration(c.TargetIdleTimeout),
		FailureCodes:       codes,
		ProbePayload:       c.ProbePayload,
		ProbeExpect:        c.probeExpect(),
		Dedup:              c.Dedup,
		DedupWindow:        time.Duration(c.DedupWindow),
		DedupScope:         c.dedupScope(),
		ResolveAfter:       time.Duration(c.ResolveAfter),
		ResolveMaxInterval: time.Duration(c.ResolveMax),
		ResolveExpire:      time.Duration(c.ResolveExpire),
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

// dedupScope returns --dedup-scope; kong has checked its value.
func (c *cli) dedupScope() relay.DedupScope {
	scope, _ := relay.ParseDedupScope(c.DedupScope)
	return scope
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

// mustLimitMode is --adaptive-limit as a relay.LimitMode; kong's enum has
// already refused anything else.
func mustLimitMode(s string) relay.LimitMode {
	m, err := relay.ParseLimitMode(s)
	if err != nil {
		panic(err)
	}
	return m
}
