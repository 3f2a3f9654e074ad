package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/fleet"
)

// startFleet builds and starts the fleet when --state-store is set, and
// points shared at it; nil without one. It reads the fleet's state before
// returning, so the hub starts open while the fleet is; a store it cannot
// reach does not stop it. addr is the bound --listen address, whose port
// names the hub when --hub-id is empty.
func startFleet(c *cli, addr net.Addr, srv *relay.Server, reg prometheus.Registerer, shared *fleetObserver, logger zerolog.Logger) (*fleet.Fleet, error) {
	if c.StateStore == "" {
		return nil, nil
	}
	redis.SetLogger(redisLogger{logger.With().Str("component", "redis").Logger()})
	id := c.HubID
	if id == "" {
		id = defaultHubID(addr)
	}
	names := make([]string, 0)
	for _, t := range srv.Targets() {
		names = append(names, t.Name)
	}
	fl, err := fleet.New(fleet.Config{
		Store:      c.StateStore,
		HubID:      id,
		Targets:    names,
		Logger:     logger,
		Registerer: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("--state-store: %w", err)
	}
	shared.fleet.Store(fl)
	if err := fl.Start(srv); err != nil {
		_ = fl.Close()
		return nil, err
	}
	return fl, nil
}

// defaultHubID is HOSTNAME:PORT of the bound listen address, made of the
// characters a hub id may hold: the name the hub also gives its in-doubt
// records.
func defaultHubID(addr net.Addr) string {
	return relay.DefaultHubID(addr)
}

// redactURL returns raw without its password, for the start-up line.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Redacted()
}

// fleetObserver passes breaker transitions, and the shield's store
// commands, to the fleet once it is built. Until then (the hub is not
// serving yet) there are none to pass. It is safe for concurrent use.
type fleetObserver struct {
	fleet atomic.Pointer[fleet.Fleet]
}

// Observe is a breaker transition observer: fleet.Fleet.Observe, fast and
// non-blocking, under the breaker's lock.
func (o *fleetObserver) Observe(t breaker.Transition) {
	if f := o.fleet.Load(); f != nil {
		f.Observe(t)
	}
}

// errFleetNotStarted is what the shield's store commands return before
// the fleet is built: the hub then shields on its own memory.
var errFleetNotStarted = errors.New("fleet not started")

// The fleet's duplicate-TXID store, once the fleet is built
// (dedup.Store).

// Claim implements dedup.Store.
func (o *fleetObserver) Claim(ctx context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, ttl time.Duration) (dedup.Record, bool, error) {
	if f := o.fleet.Load(); f != nil {
		return f.Dedup().Claim(ctx, target, scope, txid, rec, ttl)
	}
	return dedup.Record{}, false, errFleetNotStarted
}

// Settle implements dedup.Store.
func (o *fleetObserver) Settle(ctx context.Context, target string, scope dedup.Scope, txid string, rec dedup.Record, ttl time.Duration) error {
	if f := o.fleet.Load(); f != nil {
		return f.Dedup().Settle(ctx, target, scope, txid, rec, ttl)
	}
	return errFleetNotStarted
}

// Release implements dedup.Store.
func (o *fleetObserver) Release(ctx context.Context, target string, scope dedup.Scope, txid, hub string) error {
	if f := o.fleet.Load(); f != nil {
		return f.Dedup().Release(ctx, target, scope, txid, hub)
	}
	return errFleetNotStarted
}

// chainObservers returns an observer that calls each of obs in turn.
func chainObservers(obs ...func(breaker.Transition)) func(breaker.Transition) {
	return func(t breaker.Transition) {
		for _, o := range obs {
			o(t)
		}
	}
}

// fleetHub is the hub as the admin port sees it in fleet mode: an
// operator's action acts on this hub's breaker and is then spread to every
// hub of the fleet, and /status shows the fleet's view. It is safe for
// concurrent use.
type fleetHub struct {
	*relay.Server
	fleet *fleet.Fleet
}

var _ admin.FleetHub = fleetHub{}

// ControlBreaker applies the action here, then spreads it.
func (h fleetHub) ControlBreaker(name string, action relay.BreakerAction) (relay.TargetSnapshot, error) {
	st, err := h.Server.ControlBreaker(name, action)
	if err != nil {
		return st, err
	}
	if err := h.fleet.Control(st.Name, action); err != nil {
		return st, err
	}
	return st, nil
}

// FleetStatus implements admin.FleetHub.
func (h fleetHub) FleetStatus() admin.Fleet {
	st := h.fleet.Status()
	return admin.Fleet{HubID: st.HubID, StoreConnected: st.StoreUp}
}

// TargetFleet implements admin.FleetHub.
func (h fleetHub) TargetFleet(name string) (admin.TargetFleet, bool) {
	ts, ok := h.fleet.Target(name)
	if !ok {
		return admin.TargetFleet{}, false
	}
	return admin.TargetFleet{Epoch: ts.Epoch, OpenedBy: ts.OpenedBy, Source: ts.Source, ProbeLease: ts.ProbeLease, Alone: ts.Alone}, true
}

// redisLogger passes go-redis's own messages (reconnects and the like) to
// the relay's log at debug: the fleet logs what an operator needs. Like the
// Logger it holds, it is safe for concurrent use.
type redisLogger struct{ log zerolog.Logger }

// Printf implements go-redis's logger.
func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug().Msg(fmt.Sprintf(format, v...))
}
