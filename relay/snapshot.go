package relay

import (
	"slices"
	"time"

	"github.com/relayhub/relayhub/breaker"
)

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
	// MaxInFlight is the bulkhead's size, the ceiling of an adaptive limit.
	MaxInFlight int
	// Limit is the limit in force, or computed while LimitMode is
	// LimitObserve; MaxInFlight with a static limit.
	Limit int
	// LimitMode is how the limit is set.
	LimitMode LimitMode
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
	// InDoubtOpen is how many of its transactions in doubt the hub has
	// not settled yet; InDoubtOldest when the oldest of them went in
	// doubt (zero: none), and NextResolve when the next attempt to settle
	// one is due (zero: none scheduled), on the Server's clock.
	InDoubtOpen   int
	InDoubtOldest time.Time
	NextResolve   time.Time
	// Resolve is how they are settled: lookup, reverse or manual.
	Resolve string
	// LastProbe is the target's latest synthetic probe; its At is zero
	// when the hub has sent none.
	LastProbe ProbeResult
	// StatusURL is the target's look-up URL for resends in doubt; empty
	// when none.
	StatusURL string
	// Dedup counts what the duplicate-TXID shield did with the target's
	// requests since the hub started.
	Dedup DedupCounts
}

// DedupCounts are what the duplicate-TXID shield did with one target's
// requests, one count per outcome of relay_dedup_total. A plain value.
type DedupCounts struct {
	Joined, Replayed, RefusedPayload, ResolvedApplied, ResolvedNotApplied, Unresolved int64
}

// DedupStatus is the state of the hub's duplicate-TXID shield. A plain
// value.
type DedupStatus struct {
	// Entries is how many TXIDs the shield remembers; Evictions how many
	// it forgot early to stay within Config.DedupMaxEntries.
	Entries, Evictions int64
	// Shared reports that the shield is shared through the fleet's store
	// (Config.DedupStore); StoreDown that the store failed its latest
	// command, so that the hub shields on its own memory; StoreFallbacks
	// counts the shielded requests the store could not serve.
	Shared, StoreDown bool
	StoreFallbacks    int64
}

// Dedup returns the state of the duplicate-TXID shield.
func (s *Server) Dedup() DedupStatus {
	return DedupStatus{
		Entries:        s.shield.mem.Len(),
		Evictions:      s.shield.mem.Evictions(),
		Shared:         s.shield.store != nil,
		StoreDown:      s.shield.storeDown.Load(),
		StoreFallbacks: s.shield.storeFallbacks.Load(),
	}
}

// Targets returns a snapshot of every target, in configuration order.
func (s *Server) Targets() []TargetSnapshot {
	routes := s.table.all()
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
	r := s.table.lookup([]byte(name))
	if r == nil {
		return nil
	}
	return r.breaker
}

// Target returns a snapshot of the target named name, matched
// case-insensitively; false when there is none.
func (s *Server) Target(name string) (TargetSnapshot, bool) {
	r := s.table.lookup([]byte(name))
	if r == nil {
		return TargetSnapshot{}, false
	}
	return s.snapshot(r), true
}

// snapshot returns r's state now.
func (s *Server) snapshot(r *target) TargetSnapshot {
	rc := r.conf.Load()
	bs := r.breaker.Settings()
	settings := TargetSettings{
		TargetTimeout:     rc.client.Timeout(),
		TargetIdleTimeout: rc.client.IdleTimeout(),
		FailureCodes:      append([]string(nil), rc.failureCodes...),
		Policy:            bs.Policy,
		Dedup:             rc.settings.Dedup,
		DedupWindow:       rc.settings.DedupWindow,
	}
	if rc.own {
		settings.MaxInflight = rc.settings.MaxInflight
	}
	if rc.probePayload != nil {
		settings.ProbePayload = string(rc.probePayload)
		settings.ProbeExpect = slices.Clone(rc.probeExpect)
	}
	rs := s.resolve.r.Stats(r.name)
	return TargetSnapshot{
		InDoubtOpen:   rs.Open,
		InDoubtOldest: rs.Oldest,
		NextResolve:   rs.Next,
		Resolve:       string(rc.resolve),
		Name:          r.name,
		URL:           rc.url,
		Fallback:      rc.fallbackName,
		Snapshot:      r.breaker.Snapshot(),
		InFlight:      r.bulkhead.InFlight(),
		MaxInFlight:   rc.settings.MaxInflight,
		Limit:         r.limit(),
		LimitMode:     rc.settings.AdaptiveLimit,
		ProbeTimeout:  bs.ProbeTimeout,
		Settings:      settings,
		LastFailure:   r.lastFailure.load(),
		InDoubt:       r.inDoubt.Load(),
		LastProbe:     r.lastProbe(),
		StatusURL:     rc.statusURL,
		Dedup: DedupCounts{
			Joined:             r.shielded[shieldJoined].Load(),
			Replayed:           r.shielded[shieldReplayed].Load(),
			RefusedPayload:     r.shielded[shieldRefusedPayload].Load(),
			ResolvedApplied:    r.shielded[shieldResolvedApplied].Load(),
			ResolvedNotApplied: r.shielded[shieldResolvedNotApplied].Load(),
			Unresolved:         r.shielded[shieldUnresolved].Load(),
		},
	}
}

// lastProbe returns r's latest synthetic probe; zero At when none.
func (r *target) lastProbe() ProbeResult {
	if p := r.prober.last.Load(); p != nil {
		return *p
	}
	return ProbeResult{}
}

// Draining reports whether the Server is leaving service: Withdraw has
// been called (it still serves), or Shutdown or Close has begun (it no
// longer accepts connections and answers new lines E906).
func (s *Server) Draining() bool {
	return s.serving.withdrawn.Load() || s.serving.inShutdown.Load()
}

// ConnectionsOpen returns the number of client connections being served,
// not counting those turned away over MaxConns.
func (s *Server) ConnectionsOpen() int {
	s.serving.mu.Lock()
	defer s.serving.mu.Unlock()
	return s.serving.served
}
