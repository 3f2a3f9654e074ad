package admin

import (
	"runtime"
	"time"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/dedup"
)

// Fleet is the hub's place in its fleet, in Status. It is a plain value.
type Fleet struct {
	// HubID is the hub's name in the fleet (--hub-id).
	HubID string `json:"hub_id"`
	// StoreConnected reports that the hub reaches the state store, shares
	// every target's breaker and hears the change channel; false while any
	// breaker decides alone (TargetFleet.Alone says which) or the channel
	// is lost.
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
	// Alone reports that the store does not answer for this target (the
	// whole store is down, or the target's shard of a Redis Cluster): its
	// breaker decides alone until the store answers again.
	Alone bool `json:"alone"`
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
	// BreakerLog is the breaker log's writer; absent when the handler was
	// given none (Config.BreakerLog).
	BreakerLog *BreakerLog `json:"breaker_log,omitempty"`
}

// BreakerLog is the breaker log's writer in Status: how far behind the
// breakers' changes it is, and what it failed to do. It is a plain value.
type BreakerLog struct {
	// Pending is how many changes wait to be written, and
	// OldestPendingSeconds how long the oldest of them has.
	Pending              int64   `json:"pending"`
	OldestPendingSeconds float64 `json:"oldest_pending_seconds"`
	// Dropped counts the changes the log will not have; WriteErrors the
	// failed writes, each written again.
	Dropped     int64 `json:"dropped"`
	WriteErrors int64 `json:"write_errors"`
	// LastError is the last failed write's error; absent when none.
	LastError string `json:"last_error,omitempty"`
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
	// Limit is the bulkhead's limit now: max_inflight with a static
	// limit, else the adaptive one (enforced, or only computed while
	// LimitMode is "observe").
	Limit     int    `json:"limit"`
	LimitMode string `json:"limit_mode"` // static, adaptive or observe
	// RetryAfterSeconds is how long until the breaker admits a probe, in
	// seconds rounded up to the millisecond; 0 when closed, half-open or
	// held open.
	RetryAfterSeconds float64 `json:"retry_after_seconds"`
	Held              bool    `json:"held"`
	Disabled          bool    `json:"disabled"`
	// InDoubt is how many of the target's calls ended in doubt since the
	// hub started (GET /in-doubt lists the recent ones).
	InDoubt int64 `json:"in_doubt"`
	// InDoubtOpen is how many of them the hub has not settled yet, and
	// InDoubtOldestAgeSeconds how long ago the oldest of those went in
	// doubt (0 when none); NextResolve is when the next attempt to settle
	// one is due, absent when none is scheduled; Resolve is how they are
	// settled: lookup, reverse or manual (GET /in-doubt?open=1 lists them).
	InDoubtOpen             int        `json:"in_doubt_open"`
	InDoubtOldestAgeSeconds float64    `json:"in_doubt_oldest_age_seconds"`
	NextResolve             *time.Time `json:"next_resolve,omitempty"`
	Resolve                 string     `json:"resolve"`
	Settings                Settings   `json:"settings"`
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

// ageSeconds is how long ago t was, in seconds; 0 for a zero t.
func ageSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(time.Since(t).Seconds(), 0)
}

// timeOrNil returns t in UTC, or nil for a zero t.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
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
		Dedup:                   shield,
		Name:                    t.Name,
		URL:                     t.URL,
		Fallback:                t.Fallback,
		State:                   t.State.String(),
		ConsecutiveFailures:     t.ConsecutiveFailures,
		Inflight:                t.InFlight,
		MaxInflight:             t.MaxInFlight,
		Limit:                   t.Limit,
		LimitMode:               t.LimitMode.String(),
		RetryAfterSeconds:       relay.RetryAfterSeconds(t.RetryAfter),
		Held:                    t.Held,
		Disabled:                t.Disabled,
		InDoubt:                 t.InDoubt,
		InDoubtOpen:             t.InDoubtOpen,
		InDoubtOldestAgeSeconds: ageSeconds(t.InDoubtOldest),
		NextResolve:             timeOrNil(t.NextResolve),
		Resolve:                 t.Resolve,
		ProbeSuccesses:          t.Snapshot.ProbeSuccesses,
		LastProbe:               ProbeOf(t.LastProbe),
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
