package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Status is the hub's state at one instant, as GET /status serves it
// (SPEC §9). Field names and JSON keys are a contract that tools such as
// relayctl decode: fields may be added, never renamed. It is a plain value.
type Status struct {
	// Draining reports that Shutdown has begun.
	Draining bool `json:"draining"`
	// Goroutines is runtime.NumGoroutine() of the whole process, so that a
	// test or an operator can see the hub come back to its idle baseline.
	Goroutines int `json:"goroutines"`
	// ConnectionsOpen is the number of client connections being served.
	ConnectionsOpen int `json:"connections_open"`
	// Targets are the configured targets, in configuration order.
	Targets []StatusTarget `json:"targets"`
}

// StatusTarget is one target in Status. It is a plain value.
type StatusTarget struct {
	Name                string `json:"name"`
	URL                 string `json:"url"`
	State               string `json:"state"` // CLOSED, OPEN or HALF_OPEN
	ConsecutiveFailures int    `json:"consecutive_failures"`
	Inflight            int    `json:"inflight"`
	MaxInflight         int    `json:"max_inflight"`
	// RetryAfterSeconds is how long until the breaker admits a probe, in
	// seconds rounded up to the millisecond; 0 when closed, half-open or
	// held open.
	RetryAfterSeconds float64        `json:"retry_after_seconds"`
	Held              bool           `json:"held"`
	Disabled          bool           `json:"disabled"`
	Settings          StatusSettings `json:"settings"`
}

// StatusSettings are a target's effective settings in StatusTarget,
// durations in seconds. The policies of SPEC §12 appear only when on. It is
// a plain value.
type StatusSettings struct {
	FailThreshold          int      `json:"fail_threshold"`
	ResetTimeoutSeconds    float64  `json:"reset_timeout_seconds"`
	TargetTimeoutSeconds   float64  `json:"target_timeout_seconds"`
	ProbeTimeoutSeconds    float64  `json:"probe_timeout_seconds"`
	FailureCodes           []string `json:"failure_codes"`
	FailureRate            float64  `json:"failure_rate,omitempty"`
	WindowSeconds          float64  `json:"window_seconds,omitempty"`
	MinSamples             int      `json:"min_samples,omitempty"`
	SlowCallSeconds        float64  `json:"slow_call_seconds,omitempty"`
	MaxResetTimeoutSeconds float64  `json:"max_reset_timeout_seconds,omitempty"`
	ResetJitter            float64  `json:"reset_jitter,omitempty"`
}

// Status returns the hub's state now, as GET /status serves it.
func (s *Server) Status() Status {
	targets := s.Targets()
	st := Status{
		Draining:        s.Draining(),
		Goroutines:      runtime.NumGoroutine(),
		ConnectionsOpen: s.ConnectionsOpen(),
		Targets:         make([]StatusTarget, len(targets)),
	}
	for i, t := range targets {
		ts := t.Settings
		st.Targets[i] = StatusTarget{
			Name:                t.Name,
			URL:                 t.URL,
			State:               t.State.String(),
			ConsecutiveFailures: t.ConsecutiveFailures,
			Inflight:            t.InFlight,
			MaxInflight:         t.MaxInFlight,
			RetryAfterSeconds:   retryAfterSeconds(t.RetryAfter),
			Held:                t.Held,
			Disabled:            t.Disabled,
			Settings: StatusSettings{
				FailThreshold:          ts.FailThreshold,
				ResetTimeoutSeconds:    ts.ResetTimeout.Seconds(),
				TargetTimeoutSeconds:   ts.TargetTimeout.Seconds(),
				ProbeTimeoutSeconds:    ts.ProbeTimeout.Seconds(),
				FailureCodes:           ts.FailureCodes,
				FailureRate:            ts.FailureRate,
				WindowSeconds:          ts.Window.Seconds(),
				MinSamples:             ts.MinSamples,
				SlowCallSeconds:        ts.SlowCall.Seconds(),
				MaxResetTimeoutSeconds: ts.MaxResetTimeout.Seconds(),
				ResetJitter:            ts.ResetJitter,
			},
		}
	}
	return st
}

// AdminConfig configures NewAdmin. It is a plain value.
type AdminConfig struct {
	// Server is the hub the endpoints report on. Required.
	Server *Server
	// Gatherer is what GET /metrics serves, usually the registry given to
	// NewMetrics. Nil means /metrics is not served (404).
	Gatherer prometheus.Gatherer
	// Logger receives the errors of gathering metrics and of encoding the
	// status. The zero Logger logs nothing.
	Logger zerolog.Logger
}

// Admin is the hub's admin HTTP handler (SPEC §9):
//
//   - GET /metrics: the Gatherer's metrics in the Prometheus formats;
//   - GET /healthz: 200 "ok" while the process runs;
//   - GET /readyz: 200 "ready" while the Server accepts, 503 "draining" once
//     Shutdown has begun, so a load balancer stops sending new connections;
//   - GET /status: Status as JSON.
//
// Other paths answer 404, other methods 405. It is safe for concurrent use.
type Admin struct {
	srv *Server
	mux *http.ServeMux
	log zerolog.Logger
}

var _ http.Handler = (*Admin)(nil)

// NewAdmin returns the admin handler for cfg.Server. The caller serves it
// with an http.Server of its own, on an address apart from the client
// protocol's, and shuts that down after the hub's Shutdown so that
// /readyz reports the drain while it lasts.
func NewAdmin(cfg AdminConfig) (*Admin, error) {
	if cfg.Server == nil {
		return nil, errors.New("relay: admin: no Server")
	}
	a := &Admin{srv: cfg.Server, mux: http.NewServeMux(), log: cfg.Logger.With().Str("component", "admin").Logger()}
	a.mux.HandleFunc("GET /{$}", a.serveIndex)
	a.mux.HandleFunc("GET /healthz", a.serveHealthz)
	a.mux.HandleFunc("GET /readyz", a.serveReadyz)
	a.mux.HandleFunc("GET /status", a.serveStatus)
	if cfg.Gatherer != nil {
		a.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog: promLogger{a.log},
			// A collector that fails must not hide every other metric.
			ErrorHandling: promhttp.ContinueOnError,
		}))
	}
	return a, nil
}

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mux.ServeHTTP(w, r)
}

// adminIndex is the body of GET /, for an operator who opens the port in a
// browser.
const adminIndex = "relayhub admin\n/metrics  Prometheus metrics\n/healthz  liveness\n/readyz   readiness (503 while draining)\n/status   JSON status of every target\n"

func (a *Admin) serveIndex(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, adminIndex)
}

func (a *Admin) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

func (a *Admin) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	if a.srv.Draining() {
		writeText(w, http.StatusServiceUnavailable, "draining\n")
		return
	}
	writeText(w, http.StatusOK, "ready\n")
}

func (a *Admin) serveStatus(w http.ResponseWriter, _ *http.Request) {
	body, err := json.Marshal(a.srv.Status())
	if err != nil {
		// Only a non-finite number could do this; the hub never makes one.
		a.log.Error().Err(err).Msg("status does not encode")
		writeText(w, http.StatusInternalServerError, "status does not encode\n")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
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
