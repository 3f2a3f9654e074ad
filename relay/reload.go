package relay

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/bulkhead"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// A running hub takes new targets and settings without a restart, and
// without forgetting: Reload keeps each remaining target's breaker (its
// state, counts and open period) and bulkhead (its calls in flight), and
// changes only the rules they apply from then on. The targets are found
// without a lock on every request: the table of targets is an immutable
// slice behind an atomic pointer, and what a reload changes of one target
// is an immutable targetConf behind another, which a call takes once at its
// admission and keeps to its end.

// targetConf is what a reload may change of a target besides its breaker's
// policy and its bulkhead's size: its URL, its HTTP client (which holds the
// timeouts and the TLS settings), its failure codes, its fallback and the
// clients allowed to use it. It is never changed once published in
// target.conf, so it is safe for concurrent use.
type targetConf struct {
	url          string
	own          bool           // the target came with Settings of its own
	settings     TargetSettings // the effective settings, defaults filled in
	tls          *tls.Config    // Target.TLS; nil when none
	clients      []string       // Target.AllowedClients; nil means every client may use the target
	client       *targethttp.Client
	failureCodes []string
	fallbackName string             // canonical name of the fallback target; empty when none
	fallback     *target            // the fallback; nil when none
	fallbacks    prometheus.Counter // relay_fallbacks_total of this target and its fallback; nil when none or without metrics
	probePayload []byte             // the synthetic probe's payload; nil when the target has none
	probeExpect  []string           // the answer codes of a healthy synthetic probe, canonical
	statusURL    string             // Target.StatusURL; empty when none
	// lookup asks the target about a resend in doubt, at statusURL, with
	// the target's TLS settings; nil without a status URL.
	lookup *targethttp.StatusClient
	// resolve is how the resolver settles the target's transactions in
	// doubt; reverse posts its reversals to reverseURL (nil without one).
	resolve    resolver.Policy
	reverseURL string
	reverse    *targethttp.ReverseClient
}

// isFailure reports whether a call that ended with code counts as a breaker
// failure for this target.
func (rc *targetConf) isFailure(code string) bool {
	return slices.Contains(rc.failureCodes, code)
}

// countFallback counts a request the target's breaker refused and its
// fallback's breaker admitted.
func (rc *targetConf) countFallback() {
	if rc.fallbacks != nil {
		rc.fallbacks.Inc()
	}
}

// targetPlan is one target of a checked configuration, ready to become a
// target: its canonical name, the URL transactions are posted to, and its
// settings with every default filled in.
type targetPlan struct {
	name         string
	url          string // as configured
	txURL        string // url + "/tx"
	fallbackName string
	own          bool
	settings     TargetSettings
	codes        []string
	probeExpect  []string
	tls          *tls.Config // Target.TLS
	clients      []string    // Target.AllowedClients, nil when empty
	statusURL    string      // Target.StatusURL
	reverseURL   string      // Target.ReverseURL
	resolve      resolver.Policy
}

// plan checks targets as New takes them, against the Server's defaults,
// and returns them in order. It refuses what New refuses: no targets, a bad
// or duplicate target, bad settings or failure codes, a fallback that
// names no target in targets, the target itself, or a target with a
// fallback of its own, and TLS settings or allowed clients that cannot
// work (checkTargetTLS).
func (s *Server) plan(targets []Target) ([]targetPlan, error) {
	if len(targets) == 0 {
		return nil, errors.New("relay: no targets configured")
	}
	plans := make([]targetPlan, 0, len(targets))
	byName := make(map[string]*targetPlan, len(targets))
	for _, t := range targets {
		name, txURL, err := t.canonical()
		if err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		if byName[name] != nil {
			return nil, fmt.Errorf("relay: target %s configured twice", name)
		}
		if err := s.checkTargetTLS(name, t); err != nil {
			return nil, err
		}
		p := targetPlan{name: name, url: t.URL, txURL: txURL, fallbackName: strings.ToUpper(t.Fallback),
			own: t.Settings != nil, settings: s.table.defaults, codes: s.table.defaultCodes, probeExpect: s.table.defaultExpect, tls: t.TLS, statusURL: t.StatusURL}
		p.reverseURL = t.ReverseURL
		if len(t.AllowedClients) > 0 {
			p.clients = slices.Clone(t.AllowedClients)
		}
		if p.own {
			p.settings = t.Settings.WithDefaults()
			if err := p.settings.check(); err != nil {
				return nil, fmt.Errorf("relay: target %s: %w", name, err)
			}
			if p.codes, err = parseFailureCodes(p.settings.FailureCodes); err != nil {
				return nil, fmt.Errorf("relay: target %s: %w", name, err)
			}
			if p.probeExpect, err = parseProbeExpect(p.settings.ProbeExpect); err != nil {
				return nil, fmt.Errorf("relay: target %s: %w", name, err)
			}
			p.settings.SyntheticProbes = p.settings.ProbePayload != ""
		}
		if p.resolve, err = t.ResolvePolicy(p.settings); err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
		plans = append(plans, p)
		byName[name] = &plans[len(plans)-1]
	}
	for _, p := range plans {
		if p.fallbackName == "" {
			continue
		}
		switch fb := byName[p.fallbackName]; {
		case fb == nil:
			return nil, fmt.Errorf("relay: target %s: fallback %q is not a configured target", p.name, p.fallbackName)
		case fb.name == p.name:
			return nil, fmt.Errorf("relay: target %s: fallback to itself", p.name)
		case fb.fallbackName != "":
			return nil, fmt.Errorf("relay: target %s: fallback %s has a fallback of its own (%s); fallbacks go one step only", p.name, fb.name, fb.fallbackName)
		}
	}
	return plans, nil
}

// newTarget returns a target for p with a closed breaker and an empty
// bulkhead at its limit; its metrics and its targetConf are the caller's to set before
// the target is published.
func (s *Server) newTarget(p targetPlan) *target {
	via := "via " + p.name + ": "
	rt := &target{
		name:      p.name,
		nameBytes: []byte(p.name),
		bulkhead:  bulkhead.New(bulkhead.Settings{MaxInflight: p.settings.MaxInflight}),
		viaPrefix: via,
		viaBusy:   via + protocol.MsgBulkheadFull,
		work:      make(chan *call),
		prober:    prober{wake: make(chan struct{}, 1)},
		log:       s.obs.log.With().Str("target", p.name).Logger(),
	}
	rt.failLog = rt.log.Sample(&zerolog.BurstSampler{Burst: failLogBurst, Period: time.Second})
	rt.breaker = breaker.New(breaker.Settings{
		Name:         p.name,
		Policy:       p.settings.Policy,
		Clock:        s.clock,
		OnTransition: rt.observer(s.onTransition),
		Rand:         s.rand,
		ProbePermits: s.probePermits,
		ProbeTimeout: p.settings.TargetTimeout + ProbeGrace,
	})
	rt.setLimitMode(p.settings, s.clock)
	return rt
}

// newConf returns the targetConf of p for rt, without its fallback, which
// only the whole table can tell. It keeps old's HTTP client, and with it
// the client's pooled connections, when nothing the client depends on
// changed; old is nil for a new target.
func (s *Server) newConf(p targetPlan, rt *target, old *targetConf) (*targetConf, error) {
	rc := &targetConf{url: p.url, own: p.own, settings: p.settings, tls: p.tls, clients: p.clients,
		failureCodes: p.codes, fallbackName: p.fallbackName, probeExpect: p.probeExpect, statusURL: p.statusURL,
		resolve: p.resolve, reverseURL: p.reverseURL}
	if p.settings.ProbePayload != "" {
		rc.probePayload = []byte(p.settings.ProbePayload)
	}
	if p.statusURL != "" || p.reverseURL != "" {
		// Look-ups and reversals share one pool of connections.
		side := sideClient(p.tls)
		if p.statusURL != "" {
			rc.lookup = targethttp.NewStatusClient(targethttp.StatusConfig{Client: side})
		}
		if p.reverseURL != "" {
			rc.reverse = targethttp.NewReverseClient(targethttp.ReverseConfig{Client: side, Timeout: p.settings.TargetTimeout})
		}
	}
	if old != nil && old.url == p.url && old.settings.TargetTimeout == p.settings.TargetTimeout &&
		old.settings.TargetIdleTimeout == p.settings.TargetIdleTimeout && old.settings.MaxInflight == p.settings.MaxInflight &&
		old.settings.LateGrace() == p.settings.LateGrace() && sameTargetTLS(old.tls, p.tls) {
		rc.client, rc.tls = old.client, old.tls
		return rc, nil
	}
	client, err := targethttp.New(targethttp.Config{
		URL: p.txURL, Timeout: p.settings.TargetTimeout, MaxInflight: p.settings.MaxInflight, Conns: s.table.conns,
		IdleTimeout: p.settings.TargetIdleTimeout, OnDial: rt.connOpened, TLS: p.tls,
		LateAnswerGrace: p.settings.LateGrace(), OnLateAnswer: func(la targethttp.LateAnswer) { s.lateAnswer(rt, la) },
	})
	if err != nil {
		return nil, fmt.Errorf("relay: target %s: %w", p.name, err)
	}
	rc.client = client
	return rc, nil
}

// sideClient returns a client of its own for a target's look-ups or
// reversals, with the target's TLS settings (nil: the system's).
func sideClient(tlsConf *tls.Config) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	if tlsConf != nil {
		tr.TLSClientConfig = tlsConf.Clone()
	}
	return &http.Client{Transport: tr}
}

// linkConfs points each targetConf with a fallback at the fallback's target
// in targets (plan has checked that it is there) and resolves its fallback
// counter.
func (s *Server) linkConfs(routes []*target, confs []*targetConf) {
	for _, rc := range confs {
		if rc.fallbackName == "" {
			continue
		}
		for i, rt := range routes {
			if rt.name == rc.fallbackName {
				rc.fallback = routes[i]
			}
		}
	}
	for i, rc := range confs {
		rc.fallbacks = s.obs.metrics.fallbackCounter(routes[i].name, rc.fallbackName)
	}
}

// ReloadResult says what a Reload changed, each list of canonical target
// names in configuration order. It is a plain value.
type ReloadResult struct {
	// Added are the targets that were not served before; each starts with
	// a closed breaker and an empty bulkhead.
	Added []string
	// Removed are the targets no longer served: new lines for them get
	// E903, their calls in flight finish and are answered.
	Removed []string
	// Changed are the targets still served whose URL, fallback, settings,
	// TLS settings (the files' contents included) or allowed clients
	// changed.
	Changed []string
}

// ErrReloadClosed is returned by Reload once Shutdown or Close has begun.
var ErrReloadClosed = errors.New("relay: reload: server is shutting down")

// Reload makes targets the hub's targets, as New would take them in
// Config.Targets (a target without Settings takes the Config's
// TargetSettings), without stopping: every line read from then on is routed
// by the new configuration. It checks the whole configuration first and
// returns the first error New would, changing nothing, so a bad one leaves
// the running settings whole.
//
// What the hub knows survives: a target still configured keeps its breaker,
// with its state, failure count, open period and manual control (its new
// policy judges the results from now on, as breaker.SetPolicy says; its
// probe timeout follows its new target timeout), and its bulkhead with its
// calls in flight (a smaller size refuses until they fall below it). A
// call already admitted runs to its end with the URL, timeouts and failure
// codes of its admission. A target added starts CLOSED with an empty
// bulkhead, unless a reload removed it earlier: then it gets back the
// breaker and bulkhead it had, so its state and its line of the breaker
// log go on where they stopped. With Config.ProbePermits a reload cannot
// add a target never served before: whoever gives its breaker probe
// permits knows only the targets it started with. A target's allowed
// clients apply from the next line read, on the connections already open
// too: a client keeps the identities its handshake verified, and each line
// is checked against the patterns in force. A target removed drains: new
// lines for it are answered E903,
// its calls in flight finish and are answered and recorded, and its
// relay_breaker_state series goes away (its counters stay). A target's
// pooled connections are kept unless its URL, timeouts or bulkhead size
// changed.
//
// Reloads are applied one at a time; Reload is safe for concurrent use with
// every other method. It never blocks the requests in flight: they read the
// configuration without a lock.
func (s *Server) Reload(targets []Target) (ReloadResult, error) {
	s.table.reloadMu.Lock()
	defer s.table.reloadMu.Unlock()
	if s.serving.inShutdown.Load() {
		return ReloadResult{}, ErrReloadClosed
	}
	plans, err := s.plan(targets)
	if err != nil {
		return ReloadResult{}, err
	}
	current := s.table.all()
	byName := make(map[string]*target, len(current))
	for _, rt := range current {
		byName[rt.name] = rt
	}

	// Everything that can fail is done before anything is applied.
	var res ReloadResult
	routes := make([]*target, len(plans))
	confs := make([]*targetConf, len(plans))
	for i, p := range plans {
		rt, kept := byName[p.name]
		var old *targetConf
		switch retired, back := s.table.retired[p.name]; {
		case kept:
			old = rt.conf.Load()
			delete(byName, p.name)
		case back:
			// Added back: the breaker it had, whose last logged state
			// the breaker log's chain goes on from.
			rt, old = retired, retired.conf.Load()
			res.Added = append(res.Added, p.name)
		case s.probePermits:
			// Its breaker would wait for probe permits that nobody gives:
			// whoever shares the breakers' state knows the targets it was
			// started with.
			return ReloadResult{}, fmt.Errorf("relay: target %s: a reload cannot add a target while the breakers share their state with other hubs; restart the hub to add it", p.name)
		default:
			rt = s.newTarget(p)
			res.Added = append(res.Added, p.name)
		}
		if confs[i], err = s.newConf(p, rt, old); err != nil {
			return ReloadResult{}, err
		}
		if kept && !sameConf(old, confs[i]) {
			res.Changed = append(res.Changed, p.name)
		}
		routes[i] = rt
	}
	s.linkConfs(routes, confs)
	s.applyConfs(routes, confs)
	s.table.list.Store(&routes)
	for _, rt := range routes {
		delete(s.table.retired, rt.name)
	}
	s.startProbers(routes)
	for _, rt := range current {
		if _, removed := byName[rt.name]; removed {
			res.Removed = append(res.Removed, rt.name)
			if s.table.retired == nil {
				s.table.retired = make(map[string]*target)
			}
			s.table.retired[rt.name] = rt
			rt.conf.Load().client.CloseIdle()
			// Its prober, if any, sees that it is no longer served and ends.
			rt.prober.poke()
		}
	}
	return res, nil
}

// applyConfs puts each of targets under its new conf: a new target gets its
// metrics, a kept one's breaker its new policy and probe timeout, each its
// limit mode, and a replaced client closes its idle connections.
func (s *Server) applyConfs(routes []*target, confs []*targetConf) {
	for i, rt := range routes {
		old := rt.conf.Load()
		if old == nil {
			rt.metrics = s.obs.metrics.forTarget(rt.name)
		} else {
			rt.breaker.SetPolicy(confs[i].settings.Policy)
			rt.breaker.SetProbeTimeout(confs[i].settings.TargetTimeout + ProbeGrace)
		}
		rt.setLimitMode(confs[i].settings, s.clock)
		rt.conf.Store(confs[i])
		s.configureResolver(rt, confs[i])
		if old != nil && old.client != confs[i].client {
			// Calls in flight still hold the old client; its connections
			// close once idle.
			old.client.CloseIdle()
		}
	}
}

// sameConf reports whether a and b configure a target alike: URL, fallback,
// effective settings (the synthetic probe's included), TLS settings and
// allowed clients.
func sameConf(a, b *targetConf) bool {
	as, bs := a.settings, b.settings
	return a.url == b.url && a.statusURL == b.statusURL && a.reverseURL == b.reverseURL && a.resolve == b.resolve &&
		as.ResolveAfter == bs.ResolveAfter && as.ResolveMaxInterval == bs.ResolveMaxInterval && as.ResolveExpire == bs.ResolveExpire && as.LateGrace() == bs.LateGrace() && as.Dedup == bs.Dedup && as.DedupWindow == bs.DedupWindow && a.fallbackName == b.fallbackName && a.own == b.own &&
		slices.Equal(a.failureCodes, b.failureCodes) && slices.Equal(a.clients, b.clients) && sameTargetTLS(a.tls, b.tls) &&
		as.ProbePayload == bs.ProbePayload && slices.Equal(a.probeExpect, b.probeExpect) &&
		as.MaxInflight == bs.MaxInflight && as.TargetTimeout == bs.TargetTimeout &&
		as.TargetIdleTimeout == bs.TargetIdleTimeout && as.Policy.Effective() == bs.Policy.Effective()
}
