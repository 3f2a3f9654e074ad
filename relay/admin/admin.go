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
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/resolver"
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
	// OpenInDoubt lists the open transactions in doubt.
	OpenInDoubt() []resolver.EntryState
	// SettleInDoubt settles one as applied with code, or not applied.
	SettleInDoubt(target, txid string, applied bool, code string) error
}

var _ InDoubtHub = (*relay.Server)(nil)

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
	// BreakerLog, when set, returns the breaker log writer's state, which
	// GET /status adds as breaker_log. It must not wait on the disk. Nil
	// means /status has no breaker_log.
	BreakerLog func() BreakerLog
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
//   - GET /in-doubt: the recent calls in doubt (?since=RFC3339); with
//     ?open=1 the transactions in doubt still open;
//   - POST /in-doubt/{txid}/resolve with {"target":...,"applied":true,"code":...}
//     or {"target":...,"not_applied":true}: Hub.SettleInDoubt, answered
//     200, 400 for a bad body or code, 404 when it is not open;
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
	blogFn    func() BreakerLog                  // nil: no breaker_log in /status
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
	a.blogFn = cfg.BreakerLog
	if cfg.Reload != nil {
		a.reloadFn = cfg.Reload
		a.mux.HandleFunc("/reload", a.serveReload)
	}
	if ih, ok := cfg.Hub.(InDoubtHub); ok {
		a.mux.HandleFunc("GET /in-doubt", func(w http.ResponseWriter, r *http.Request) { serveInDoubt(ih, w, r) })
		a.mux.HandleFunc("POST /in-doubt/{txid}/resolve", func(w http.ResponseWriter, r *http.Request) { a.serveSettle(ih, w, r) })
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
	var req actionRequest
	if err := decodeBody(body, &req, `want a JSON object {"action":"open|close|disable|enable"}`); err != nil {
		return "", err
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

// decodeBody reads body, of at most maxActionBody bytes, into v: one JSON
// object with none but v's fields and nothing after it. want says what the
// object must be, in the error.
func decodeBody(body io.Reader, v any, want string) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			return fmt.Errorf("body over %d bytes", maxActionBody)
		}
		return fmt.Errorf("body: %s: %v", want, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("body: want one JSON object and nothing after it")
	}
	return nil
}

// adminIndex is the body of GET / for a client that does not take HTML,
// such as curl.
const adminIndex = "relayhub admin\n/metrics  Prometheus metrics\n/healthz  liveness\n/readyz   readiness (503 while draining)\n/status   JSON status of every target (?pretty for indented JSON)\nPOST /breakers/{target}  manual breaker control: {\"action\":\"open|close|disable|enable\"}\n"

// inDoubtIndex is the line the index adds when GET /in-doubt is served.
const inDoubtIndex = "/in-doubt?since=RFC3339  JSON list of the recent calls in doubt (the last 1000)\n/in-doubt?open=1  JSON list of the transactions in doubt still open, with attempts and next attempt\nPOST /in-doubt/{txid}/resolve  settle one: {\"target\":\"NAME\",\"applied\":true,\"code\":\"0000\"} or {\"target\":\"NAME\",\"not_applied\":true}\n"

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
	st := StatusOf(a.hub)
	if a.blogFn != nil {
		bl := a.blogFn()
		st.BreakerLog = &bl
	}
	if r.URL.Query().Has("pretty") {
		body, err = json.MarshalIndent(st, "", "  ")
	} else {
		body, err = json.Marshal(st)
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
// not parse is answered 400. With ?open, the transactions
// in doubt still open instead (serveOpenInDoubt).
func serveInDoubt(hub InDoubtHub, w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("open") {
		serveOpenInDoubt(hub, w)
		return
	}
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
