package fleet_test

import (
	"os"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
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
