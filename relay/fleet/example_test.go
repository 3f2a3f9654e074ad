package fleet_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/fleet"
)

// A hub in a fleet: its breakers need probe permits, their changes go to
// the fleet, and the fleet reads the shared state before the hub serves.
func ExampleNew() {
	logger := zerolog.New(os.Stderr)
	fl, err := fleet.New(fleet.Config{
		Store:   "redis://127.0.0.1:6379/0",
		HubID:   "hub-a:9200",
		Targets: []string{"CORE"},
		Logger:  logger,
	})
	if err != nil {
		logger.Fatal().Err(err).Msg("fleet")
	}
	srv, err := relay.New(relay.Config{
		Targets:      []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:9201"}},
		ProbePermits: true,
		OnTransition: fl.Observe,
		Logger:       logger,
	})
	if err != nil {
		logger.Fatal().Err(err).Msg("relay")
	}
	if err := fl.Start(srv); err != nil {
		logger.Fatal().Err(err).Msg("fleet")
	}
	defer fl.Close()
	// ... srv.Serve(ln), and on SIGTERM srv.Shutdown(ctx) before fl.Close.
}

// A hub of a fleet shares its duplicate-TXID shield: a claim in the store
// before the call tells it whether another hub has the transaction.
func ExampleFleet_Dedup() {
	fl, err := fleet.New(fleet.Config{
		Store:   "redis://127.0.0.1:6379/0",
		HubID:   "hub-a:9200",
		Targets: []string{"CORE"},
	})
	if err != nil {
		return
	}
	defer fl.Close()
	store := fl.Dedup()
	ctx := context.Background()
	rec := dedup.Record{State: dedup.InFlight, Hash: dedup.HashPayload([]byte("pay 10")), Hub: "hub-a:9200"}
	existing, claimed, err := store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", rec, time.Minute)
	switch {
	case err != nil:
		// The store cannot be used: the hub's own memory decides.
	case claimed:
		// This hub calls CORE, then settles the transaction for the others.
		rec.State, rec.Code, rec.Message = dedup.Answered, "0000", "balance=100"
		_ = store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", rec, 10*time.Minute)
	default:
		// Another hub has it: existing is its claim or its answer.
		fmt.Println(existing.State, existing.Code)
	}
}
