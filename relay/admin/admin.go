// Package admin is the hub's admin HTTP handler: Prometheus metrics,
// liveness and readiness, the JSON status of every target, and manual
// breaker control (docs/PROTOCOL.md, "Admin HTTP"). It reads and steers the
// hub only through the small Hub interface, which *relay.Server implements.
//
// Typical use:
//
//	h, err := admin.New(admin.Config{Hub: srv, Gatherer: reg, Logger: logger})
//	if err != nil {
//		return err
//	}
//	go http.Serve(adminListener, h)
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
)

// Hub is what the admin endpoints need of the hub. *relay.Server implements
// it; an implementation must be safe for concurrent use.
type Hub interface {
	// Draining reports that the hub is leaving service: withdrawn ahead of
	// its shutdown (still serving), or shutting down.
	Draining() bool
	// ConnectionsOpen returns the number of client connections served.
	ConnectionsOpen() int
	// Targets returns a snapshot of every target, in configuration order.
	Targets() []relay.TargetSnapshot
	// Target returns a snapshot of one target, matched case-insensitively;
	// false when there is none.
	Target(name string) (relay.TargetSnapshot, bool)
	// ControlBreaker applies an operator's action to one target's breaker
	// and returns the target's snapshot afterwards.
	ControlBreaker(name string, action relay.BreakerAction) (relay.TargetSnapshot, error)
}

var _ Hub = (*relay.Server)(nil)

// FleetHub is a Hub whose breakers are shared with a fleet of hubs through
// a state store (docs/FLEET.md). StatusOf and POST /breakers/{target} add
// the fleet's view to what they show of such a hub; its ControlBreaker acts
// on every hub of the fleet. An implementation must be safe for concurrent
// use.
type FleetHub interface {
	Hub
	// FleetStatus returns the hub's place in the fleet.
	FleetStatus() Fleet
	// TargetFleet returns one target's shared state; false when the fleet
	// does not share it.
	TargetFleet(name string) (TargetFleet, bool)
}

// DedupHub is a Hub with a duplicate-TXID shield (*relay.Server has one);
// Status shows its state. An implementation must be safe for concurrent
// use.
type DedupHub interface {
	Hub
	// Dedup returns the shield's state.
	Dedup() relay.DedupStatus
}

var _ DedupHub = (*relay.Server)(nil)

// InDoubtHub is a Hub that keeps its recent calls in doubt (*relay.Server
// does); GET /in-doubt lists them. An implementation must be safe for
// concurrent use.
type InDoubtHub interface {
	Hub
	// InDoubt returns the recent calls in doubt that ended at or after
	// since, oldest first.
	InDoubt(since time.Time) []indoubt.Entry
}

var _ InDoubtHub = (*relay.Server)(nil)

// Fleet is the hub's place in its fleet, in Status. It is a plain value.
type Fleet struct {
	// HubID is the hub's name in the fleet (--hub-id).
	HubID string `json:"hub_id"`
	// StoreConnected reports that the hub reaches the state store and
	// shares its breakers' state; false while each breaker decides alone.
	StoreConnected bool `json:"store_connected"`
}

// TargetFleet is one target's shared breaker state in Target. It is a
// plain value.
type TargetFleet struct {
	// Epoch is the target's epoch in the store as this hub last saw it: it
	// moves on every open and every close anywhere in the fleet.
	Epoch int64 `json:"epoch"`
	// OpenedBy is the hub that opened the fleet's breaker (or whose
	// operator held it open); empty while it is closed.
	OpenedBy string `json:"opened_by"`
	// Source says how the last change reached this hub: "local" (this
	// hub's own, written to the store), "remote" (another hub's, applied
	// here), or empty before any.
	Source string `json:"source"`
	// ProbeLease reports that this hub won the probe lease of the current
	// open period: it sends the fleet's one probe.
	ProbeLease bool `json:"probe_lease"`
}

// Status is the hub's state at one instant, as GET /status serves it. Field names and JSON keys are a contract that tools such as
// relayctl decode: fields may be added, never renamed. It is a plain value.
type Status struct {
	// Draining reports that the hub is leaving service, withdrawn or
	// shutting down: /readyz answers 503.
	Draining bool `json:"draining"`
	// Goroutines is runtime.NumGoroutine() of the whole process, so that a
	// test or an operator can see the hub come back to its idle baseline.
	Goroutines int `json:"goroutines"`
	// ConnectionsOpen is the number of client connections being served.
	ConnectionsOpen int `json:"connections_open"`
	// Targets are the configured targets, in configuration order.
	Targets []Target `json:"targets"`
	// Fleet is the hub's place in its fleet; absent when the hub runs
	// alone (no --state-store).
	Fleet *Fleet `json:"fleet,omitempty"`
	// Dedup is the duplicate-TXID shield's state; absent when no target
	// has the shield on.
	Dedup *Dedup `json:"dedup,omitempty"`
}

// Dedup is the duplicate-TXID shield's state in Status: a
// relay.DedupStatus as JSON. It is a plain value.
type Dedup struct {
	Entries   int64 `json:"entries"`
	Evictions int64 `json:"evictions"`
	// Store is "shared" while the fleet's store serves the shield,
	// "local_fallback" while it fails and the hub shields on its own
	// memory, and "local" without a store.
	Store          string `json:"store"`
	StoreFallbacks int64  `json:"store_fallbacks"`
}

// TargetDedup is one target's shield in Target. It is a plain value.
type TargetDedup struct {
	WindowSeconds float64 `json:"window_seconds"`
	// StatusURL is where a resend in doubt is looked up; absent when
	// none, and such a resend is answered E901 without a call.
	StatusURL          string `json:"status_url,omitempty"`
	Joined             int64  `json:"joined"`
	Replayed           int64  `json:"replayed"`
	RefusedPayload     int64  `json:"refused_payload"`
	ResolvedApplied    int64  `json:"resolved_applied"`
	ResolvedNotApplied int64  `json:"resolved_not_applied"`
	Unresolved         int64  `json:"unresolved"`
}

// Target is one target in Status: a relay.TargetSnapshot as JSON. It is a
// plain value.
type Target struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// Fallback names the target that takes this one's requests while its
	// breaker refuses them; absent when none.
	Fallback            string `json:"fallback,omitempty"`
	State               string `json:"state"` // CLOSED, OPEN or HALF_OPEN
	ConsecutiveFailures int    `json:"consecutive_failures"`
	Inflight            int    `json:"inflight"`
	MaxInflight         int    `json:"max_inflight"`
	// RetryAfterSeconds is how long until the breaker admits a probe, in
	// seconds rounded up to the millisecond; 0 when closed, half-open or
	// held open.
	RetryAfterSeconds float64 `json:"retry_after_seconds"`
	Held              bool    `json:"held"`
	Disabled          bool    `json:"disabled"`
	// InDoubt is how many of the target's calls ended in doubt since the
	// hub started (GET /in-doubt lists the recent ones).
	InDoubt  int64    `json:"in_doubt"`
	Settings Settings `json:"settings"`
	// ProbeSuccesses is how many healthy probes in a row the half-open
	// breaker has had, when it needs several (probe_successes); absent
	// otherwise.
	ProbeSuccesses int `json:"probe_successes,omitempty"`
	// LastProbe is the target's latest synthetic probe; absent when the
	// hub has sent none.
	LastProbe *Probe `json:"last_probe,omitempty"`
	// Fleet is the target's breaker state shared with the fleet; absent
	// when the hub runs alone.
	Fleet *TargetFleet `json:"fleet,omitempty"`
	// Dedup is the target's duplicate-TXID shield; absent when it is off.
	Dedup *TargetDedup `json:"dedup,omitempty"`
}

// Probe is a synthetic probe in Target. It is a plain value.
type Probe struct {
	TxID string `json:"txid"`
	// At is when it ended, RFC 3339 UTC with milliseconds.
	At string `json:"at"`
	// Outcome is "healthy" or "failed".
	Outcome string `json:"outcome"`
	// Code is the probe's answer code (the hub's E901, E902 or E500 when
	// the call failed).
	Code            string  `json:"code"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// ProbeOf returns p as /status shows it; nil when there was none.
func ProbeOf(p relay.ProbeResult) *Probe {
	if p.At.IsZero() {
		return nil
	}
	outcome := "failed"
	if p.Healthy {
		outcome = "healthy"
	}
	return &Probe{TxID: p.TxID, At: p.At.UTC().Format(relay.TimeFormat), Outcome: outcome, Code: p.Code, DurationSeconds: p.Duration.Seconds()}
}

// Settings are a target's effective settings in Target, durations in
// seconds. The optional policies appear only when in use: each policy when
// it is on (a zero value is off and left out), and max_inflight when the
// target has settings of its own (--config; the bulkhead size of every
// target is Target's max_inflight). It is a plain value.
type Settings struct {
	MaxInflight              int      `json:"max_inflight,omitempty"`
	FailThreshold            int      `json:"fail_threshold"`
	ResetTimeoutSeconds      float64  `json:"reset_timeout_seconds"`
	TargetTimeoutSeconds     float64  `json:"target_timeout_seconds"`
	TargetIdleTimeoutSeconds float64  `json:"target_idle_timeout_seconds"`
	ProbeTimeoutSeconds      float64  `json:"probe_timeout_seconds"`
	FailureCodes             []string `json:"failure_codes"`
	FailureRate              float64  `json:"failure_rate,omitempty"`
	WindowSeconds            float64  `json:"window_seconds,omitempty"`
	MinSamples               int      `json:"min_samples,omitempty"`
	SlowCallSeconds          float64  `json:"slow_call_seconds,omitempty"`
	MaxResetTimeoutSeconds   float64  `json:"max_reset_timeout_seconds,omitempty"`
	ResetJitter              float64  `json:"reset_jitter,omitempty"`
	// The synthetic probes' settings, present only with a probe payload.
	ProbePayload         string   `json:"probe_payload,omitempty"`
	ProbeExpect          []string `json:"probe_expect,omitempty"`
	ProbeSuccesses       int      `json:"probe_successes,omitempty"`
	ProbeIntervalSeconds float64  `json:"probe_interval_seconds,omitempty"`
}

// StatusOf returns hub's state now, as GET /status serves it.
func StatusOf(hub Hub) Status {
	targets := hub.Targets()
	st := Status{
		Draining:        hub.Draining(),
		Goroutines:      runtime.NumGoroutine(),
		ConnectionsOpen: hub.ConnectionsOpen(),
		Targets:         make([]Target, len(targets)),
	}
	shielded := false
	for i, t := range targets {
		st.Targets[i] = targetOf(hub, t)
		shielded = shielded || t.Settings.Dedup
	}
	if dh, ok := hub.(DedupHub); ok && shielded {
		d := dh.Dedup()
		st.Dedup = &Dedup{Entries: d.Entries, Evictions: d.Evictions, Store: "local", StoreFallbacks: d.StoreFallbacks}
		switch {
		case d.Shared && d.StoreDown:
			st.Dedup.Store = "local_fallback"
		case d.Shared:
			st.Dedup.Store = "shared"
		}
	}
	if fh, ok := hub.(FleetHub); ok {
		fs := fh.FleetStatus()
		st.Fleet = &fs
	}
	return st
}

// targetOf returns t as /status shows it, with its shared state when hub
// is a FleetHub.
func targetOf(hub Hub, t relay.TargetSnapshot) Target {
	out := TargetOf(t)
	if fh, ok := hub.(FleetHub); ok {
		if tf, ok := fh.TargetFleet(t.Name); ok {
			out.Fleet = &tf
		}
	}
	return out
}

// TargetOf returns t as /status shows it.
func TargetOf(t relay.TargetSnapshot) Target {
	ts := t.Settings
	var shield *TargetDedup
	if ts.Dedup {
		d := t.Dedup
		window := ts.DedupWindow
		if window == 0 {
			window = dedup.DefaultWindow
		}
		shield = &TargetDedup{WindowSeconds: window.Seconds(), StatusURL: t.StatusURL,
			Joined: d.Joined, Replayed: d.Replayed, RefusedPayload: d.RefusedPayload,
			ResolvedApplied: d.ResolvedApplied, ResolvedNotApplied: d.ResolvedNotApplied, Unresolved: d.Unresolved}
	}
	return Target{
		Dedup:               shield,
		Name:                t.Name,
		URL:                 t.URL,
		Fallback:            t.Fallback,
		State:               t.State.String(),
		ConsecutiveFailures: t.ConsecutiveFailures,
		Inflight:            t.InFlight,
		MaxInflight:         t.MaxInFlight,
		RetryAfterSeconds:   relay.RetryAfterSeconds(t.RetryAfter),
		Held:                t.Held,
		Disabled:            t.Disabled,
		InDoubt:             t.InDoubt,
		ProbeSuccesses:      t.Snapshot.ProbeSuccesses,
		LastProbe:           ProbeOf(t.LastProbe),
		Settings: Settings{
			MaxInflight:              ts.MaxInflight,
			FailThreshold:            ts.FailThreshold,
			ResetTimeoutSeconds:      ts.ResetTimeout.Seconds(),
			TargetTimeoutSeconds:     ts.TargetTimeout.Seconds(),
			TargetIdleTimeoutSeconds: ts.TargetIdleTimeout.Seconds(),
			ProbeTimeoutSeconds:      t.ProbeTimeout.Seconds(),
			FailureCodes:             ts.FailureCodes,
			FailureRate:              ts.FailureRate,
			WindowSeconds:            ts.Window.Seconds(),
			MinSamples:               ts.MinSamples,
			SlowCallSeconds:          ts.SlowCall.Seconds(),
			MaxResetTimeoutSeconds:   ts.MaxResetTimeout.Seconds(),
			ResetJitter:              ts.ResetJitter,
			ProbePayload:             ts.ProbePayload,
			ProbeExpect:              ts.ProbeExpect,
			ProbeSuccesses:           probeSuccesses(ts),
			ProbeIntervalSeconds:     ts.ProbeInterval.Seconds(),
		},
	}
}

// probeSuccesses is the healthy probes in a row that close the target's
// breaker, shown with synthetic probes (at least 1) or when above 1.
func probeSuccesses(ts relay.TargetSettings) int {
	if ts.ProbePayload == "" && ts.ProbeSuccesses <= 1 {
		return 0
	}
	return max(ts.ProbeSuccesses, 1)
}

// Config configures New. It is a plain value.
type Config struct {
	// Hub is the hub the endpoints report on and steer. Required.
	Hub Hub
	// Gatherer is what GET /metrics serves, usually the registry given to
	// NewMetrics. Nil means /metrics is not served (404).
	Gatherer prometheus.Gatherer
	// Page, when set, is the status page (see package statuspage): it
	// answers GET / for clients that accept text/html, such as browsers,
	// and GET /events. Nil means GET / is the text index for everyone and
	// /events is 404.
	Page http.Handler
	// Logger receives the operators' breaker actions, refused
	// authorizations, and the errors of gathering metrics and of encoding
	// the status. The zero Logger logs nothing.
	Logger zerolog.Logger
	// Token, when not empty, is the bearer token every request other than
	// GET and HEAD must carry ("Authorization: Bearer <Token>"), and every
	// GET and HEAD from a client not on loopback but those of /healthz and
	// /readyz (see needsToken); one without it is answered 401. Empty means
	// no check: keep the admin port on loopback or a management network
	// then. Handler.SetToken replaces it while the handler serves.
	Token string
	// Reload, when set, serves POST /reload: it re-reads the hub's settings
	// and applies them, returning what changed, or why nothing did (the
	// running settings are then kept; ErrNothingToReload when there are
	// none to re-read). Nil means POST /reload answers 404.
	Reload func() (relay.ReloadResult, error)
}

// Handler is the hub's admin HTTP handler:
//
//   - GET /metrics: the Gatherer's metrics in the Prometheus formats;
//   - GET /healthz: 200 "ok" while the process runs;
//   - GET /readyz: 200 "ready" while the Server accepts, 503 "draining" once
//     it is withdrawn or Shutdown has begun, so a load balancer stops
//     sending new connections;
//   - GET /status: Status as JSON, indented with ?pretty;
//   - GET /: with Config.Page, the status page for a client whose Accept
//     header takes text/html; otherwise a short text index of the
//     endpoints;
//   - GET /events: with Config.Page, the page's live updates;
//   - POST /breakers/{target} with {"action":"open"|"close"|"disable"|"enable"}:
//     Hub.ControlBreaker, answered 200 with the target's entry of
//     /status; 404 for an unknown target, 400 for a bad body or action,
//     405 for another method, each with a JSON {"error":...} body.
//   - POST /reload, when Config.Reload is set: the hub re-reads its
//     settings, answered 200 with the targets added, removed and changed,
//     409 when there is nothing to reload, 422 with the reason when the
//     new settings were refused and the running ones kept.
//
// With Config.Token set, every request other than GET and HEAD needs
// the bearer token, and so do the reads of clients beyond loopback other
// than /healthz and /readyz, or are answered 401 with a JSON error and
// "WWW-Authenticate: Bearer". Other paths answer 404, other methods 405.
// It is safe for concurrent use.
type Handler struct {
	hub     Hub
	mux     *http.ServeMux
	page    http.Handler                // nil without the status page
	origins *http.CrossOriginProtection // refuses other sites' POSTs (ServeHTTP)
	log     zerolog.Logger
	denyLog zerolog.Logger // log sampled to denyLogBurst lines a second
	// tokenHash is the SHA-256 of the bearer token, replaced whole by
	// SetToken; nil without one.
	tokenHash atomic.Pointer[[sha256.Size]byte]
	hasToken  bool                               // set by New, never changed: SetToken cannot turn the check on or off
	reloadFn  func() (relay.ReloadResult, error) // nil: no POST /reload
	index     string                             // the text index: adminIndex and the lines of what else is served
}

var _ http.Handler = (*Handler)(nil)

// denyLogBurst is how many refused authorizations a second are logged, so
// that someone guessing tokens cannot flood the log.
const denyLogBurst = 5

// maxActionBody caps the body of POST /breakers/{target}: the JSON object
// it takes is a few dozen bytes.
const maxActionBody = 4 << 10

// New returns the admin handler for cfg.Hub. The caller serves it
// with an http.Server of its own, on an address apart from the client
// protocol's, and shuts that down after the hub's Shutdown so that
// /readyz reports the drain while it lasts.
func New(cfg Config) (*Handler, error) {
	if cfg.Hub == nil {
		return nil, errors.New("admin: no Hub")
	}
	a := &Handler{hub: cfg.Hub, mux: http.NewServeMux(), log: cfg.Logger.With().Str("component", "admin").Logger()}
	a.page, a.origins = cfg.Page, http.NewCrossOriginProtection()
	a.denyLog = a.log.Sample(&zerolog.BurstSampler{Burst: denyLogBurst, Period: time.Second})
	if cfg.Token != "" {
		a.setTokenHash(cfg.Token)
		a.hasToken = true
	}
	a.mux.HandleFunc("GET /{$}", a.serveIndex)
	a.mux.HandleFunc("GET /healthz", a.serveHealthz)
	a.mux.HandleFunc("GET /readyz", a.serveReadyz)
	a.mux.HandleFunc("GET /status", a.serveStatus)
	a.mux.HandleFunc("/breakers/{target}", a.serveBreaker)
	if cfg.Reload != nil {
		a.reloadFn = cfg.Reload
		a.mux.HandleFunc("/reload", a.serveReload)
	}
	if ih, ok := cfg.Hub.(InDoubtHub); ok {
		a.mux.HandleFunc("GET /in-doubt", func(w http.ResponseWriter, r *http.Request) { serveInDoubt(ih, w, r) })
	}
	if cfg.Gatherer != nil {
		a.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog: promLogger{a.log},
			// A collector that fails must not hide every other metric.
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	if cfg.Page != nil {
		a.mux.Handle("GET /events", cfg.Page)
	}
	a.index = adminIndex
	if _, ok := cfg.Hub.(InDoubtHub); ok {
		a.index += inDoubtIndex
	}
	if cfg.Reload != nil {
		a.index += reloadIndex
	}
	if cfg.Page != nil {
		a.index += pageIndex
	}
	return a, nil
}

// ServeHTTP implements http.Handler. The token is checked before routing,
// so a request without it learns nothing about the paths behind it.
//
// Before the token, every request other than GET, HEAD and OPTIONS that a
// browser marks as sent from another origin (Sec-Fetch-Site, or else an
// Origin header that is not the Host) is answered 403 with a JSON error,
// whatever token it carries, so that no other web page an operator has
// open can act on the breakers; tools such as curl send neither header and
// are not affected.
func (a *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := a.origins.Check(r); err != nil {
		a.denyLog.Warn().Str("method", r.Method).Str("path", r.URL.Path).Str("remote", r.RemoteAddr).
			Str("origin", r.Header.Get("Origin")).Str("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")).
			Msg("admin request refused: sent from another origin")
		writeJSONError(w, http.StatusForbidden, "cross-origin request refused: act from the admin port's own page, or from a tool that sends no Origin")
		return
	}
	if a.needsToken(r) && !a.authorized(r) {
		a.denyLog.Warn().Str("method", r.Method).Str("path", r.URL.Path).Str("remote", r.RemoteAddr).
			Msg("admin request refused: missing or wrong bearer token")
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeJSONError(w, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	a.mux.ServeHTTP(w, r)
}

// authorized reports whether r carries the bearer token. The scheme is
// matched case-insensitively (RFC 7235); the token is compared in constant
// time, through its hash.
func (a *Handler) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	want := a.tokenHash.Load() // not nil: needsToken asks only with a token
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// SetToken replaces the bearer token: every request checked from then on
// needs the new one, and the old one is refused. It is for rotating the
// token without a restart (the relay's --admin-token-file, re-read on
// SIGHUP), and cannot turn the check on or off: it returns an error,
// changing nothing, for an empty token or a handler built without
// Config.Token. It is safe to call while the handler serves.
func (a *Handler) SetToken(token string) error {
	switch {
	case !a.hasToken:
		return errors.New("admin: the admin port was started without a token")
	case token == "":
		return errors.New("admin: empty token")
	}
	a.setTokenHash(token)
	return nil
}

// setTokenHash stores the hash of token, the only form in which it is
// kept: hashes of equal length compared in constant time tell a guesser
// neither the token's bytes nor its length.
func (a *Handler) setTokenHash(token string) {
	sum := sha256.Sum256([]byte(token))
	a.tokenHash.Store(&sum)
}

// actionRequest is the body of POST /breakers/{target}.
type actionRequest struct {
	Action *string `json:"action"`
}

// serveBreaker is POST /breakers/{target}. The action is logged before it
// is applied, so the breaker changes it causes follow it in the log.
func (a *Handler) serveBreaker(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSONError(w, http.StatusMethodNotAllowed, "method "+r.Method+` not allowed: POST {"action":"open|close|disable|enable"}`)
		return
	}
	name := r.PathValue("target")
	target, ok := a.hub.Target(name)
	if !ok {
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("unknown target %q", name))
		return
	}
	action, err := decodeAction(http.MaxBytesReader(w, r.Body, maxActionBody))
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.operator(a.log.Info().Str("target", target.Name).Str("action", string(action)), r).Msg("breaker action")
	st, err := a.hub.ControlBreaker(target.Name, action)
	if err != nil {
		// Both the target and the action were checked above.
		panic("admin: breaker action: " + err.Error())
	}
	writeJSON(w, http.StatusOK, targetOf(a.hub, st))
}

// decodeAction reads the body of POST /breakers/{target}: one JSON object
// with a string "action" and nothing else.
func decodeAction(body io.Reader) (relay.BreakerAction, error) {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var req actionRequest
	if err := dec.Decode(&req); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			return "", fmt.Errorf("body over %d bytes", maxActionBody)
		}
		return "", fmt.Errorf(`body: want a JSON object {"action":"open|close|disable|enable"}: %v`, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("body: want one JSON object and nothing after it")
	}
	if req.Action == nil {
		return "", errors.New(`body: no "action": want open, close, disable or enable`)
	}
	action, err := relay.ParseBreakerAction(*req.Action)
	if err != nil {
		return "", fmt.Errorf("unknown action %q: want open, close, disable or enable", *req.Action)
	}
	return action, nil
}

// adminIndex is the body of GET / for a client that does not take HTML,
// such as curl.
const adminIndex = "relayhub admin\n/metrics  Prometheus metrics\n/healthz  liveness\n/readyz   readiness (503 while draining)\n/status   JSON status of every target (?pretty for indented JSON)\nPOST /breakers/{target}  manual breaker control: {\"action\":\"open|close|disable|enable\"}\n"

// inDoubtIndex is the line the index adds when GET /in-doubt is served.
const inDoubtIndex = "/in-doubt?since=RFC3339  JSON list of the recent calls in doubt (the last 1000)\n"

// reloadIndex is the line the index adds when POST /reload is served.
const reloadIndex = "POST /reload  re-read the settings file and apply it without a restart\n"

// pageIndex is the lines the index adds when the status page is on.
const pageIndex = "/         this index; a browser (Accept: text/html) gets the live status page\n/events   the status page's live updates (Server-Sent Events)\n"

// serveIndex is GET /: the status page for a client that takes HTML, when
// the page is on, else the text index.
func (a *Handler) serveIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Vary", "Accept")
	if a.page != nil && acceptsHTML(r.Header.Values("Accept")) {
		a.page.ServeHTTP(w, r)
		return
	}
	writeText(w, http.StatusOK, a.index)
}

// acceptsHTML reports whether Accept header values name text/html with a
// quality above zero. A wildcard alone does not count: curl sends "*/*"
// and gets the text index.
func acceptsHTML(accept []string) bool {
	for _, v := range accept {
		for part := range strings.SplitSeq(v, ",") {
			mediaType, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(mediaType), "text/html") {
				continue
			}
			if q, ok := qualityOf(params); !ok || q > 0 {
				return true
			}
		}
	}
	return false
}

// qualityOf returns the q parameter among a media range's parameters
// (";"-separated), and whether there is one that parses.
func qualityOf(params string) (float64, bool) {
	for p := range strings.SplitSeq(params, ";") {
		name, value, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(name), "q") {
			q, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
			return q, err == nil
		}
	}
	return 0, false
}

func (a *Handler) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

func (a *Handler) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	if a.hub.Draining() {
		writeText(w, http.StatusServiceUnavailable, "draining\n")
		return
	}
	writeText(w, http.StatusOK, "ready\n")
}

// serveStatus is GET /status; with ?pretty (any value) the JSON is indented
// for a person reading it in a terminal.
func (a *Handler) serveStatus(w http.ResponseWriter, r *http.Request) {
	var (
		body []byte
		err  error
	)
	if r.URL.Query().Has("pretty") {
		body, err = json.MarshalIndent(StatusOf(a.hub), "", "  ")
	} else {
		body, err = json.Marshal(StatusOf(a.hub))
	}
	if err != nil {
		// Only a non-finite number could do this; the hub never makes one.
		a.log.Error().Err(err).Msg("status does not encode")
		writeText(w, http.StatusInternalServerError, "status does not encode\n")
		return
	}
	writeJSONBody(w, http.StatusOK, body)
}

// serveInDoubt is GET /in-doubt: {"in_doubt":[...]}, the recent calls in
// doubt of hub, oldest first, each in the in-doubt journal's form; with
// ?since=RFC3339 only those that ended at or after it. A since that does
// not parse is answered 400.
func serveInDoubt(hub InDoubtHub, w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, "since: want an RFC 3339 time such as 2026-12-01T17:30:00Z")
			return
		}
		since = t
	}
	entries := hub.InDoubt(since)
	body := append(make([]byte, 0, 64+len(entries)*256), `{"in_doubt":[`...)
	for i := range entries {
		if i > 0 {
			body = append(body, ',')
		}
		body = entries[i].AppendJSON(body)
	}
	writeJSONBody(w, http.StatusOK, append(body, "]}"...))
}

// writeJSON answers v as JSON that no cache may keep. v is one of the
// admin's own types, which always encode.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		panic("admin: answer does not encode: " + err.Error())
	}
	writeJSONBody(w, status, body)
}

// writeJSONError answers {"error": msg}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Error string `json:"error"`
	}{msg})
}

// writeJSONBody answers an encoded JSON body, with a final newline, that no
// cache may keep.
func writeJSONBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// writeText answers a short plain text body that no cache may keep.
func writeText(w http.ResponseWriter, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// promLogger passes promhttp's errors to zerolog. Like the Logger it holds,
// it is safe for concurrent use.
type promLogger struct{ log zerolog.Logger }

var _ promhttp.Logger = promLogger{}

// Println implements promhttp.Logger.
func (l promLogger) Println(v ...any) {
	l.log.Error().Msg(fmt.Sprint(v...))
}
