package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/statuspage"
)

// statusPageRecorder returns the recorder of breaker state changes the
// status page draws, or nil when the page is off: --no-status-page, or no
// admin port to serve it on.
func statusPageRecorder(c *cli) *statuspage.Recorder {
	if !c.StatusPage || c.AdminListen == "" {
		return nil
	}
	return statuspage.NewRecorder()
}

// alsoObserve returns a transition observer that calls first, then then.
// Both run under the breaker's lock, in that order, so the breaker log's
// line is written before the page hears of the change.
func alsoObserve(first, then func(breaker.Transition)) func(breaker.Transition) {
	if first == nil {
		return then
	}
	return func(t breaker.Transition) {
		first(t)
		then(t)
	}
}

// The page shows the duplicate-TXID shield's store through
// admin.DedupHub, in fleet mode too: fleetHub has it from the relay.Server
// it embeds.
var _ admin.DedupHub = fleetHub{}

// newStatusPage starts the status page of hub (the hub as the admin port
// sees it, so in fleet mode the page shows the fleet too), drawn from reg's
// metrics and rec's breaker changes; tokenRequired makes it ask for the
// admin token. It returns nil when rec is nil: the page is off.
func newStatusPage(hub admin.Hub, reg prometheus.Gatherer, rec *statuspage.Recorder, tokenRequired bool, logger zerolog.Logger) *statuspage.Page {
	if rec == nil {
		return nil
	}
	page, err := statuspage.New(statuspage.Config{
		Hub: hub, Recorder: rec, Gatherer: reg, TokenRequired: tokenRequired, Version: version, Logger: logger,
	})
	if err != nil {
		// Hub and Recorder are both given: nothing else can fail.
		panic("relay: status page: " + err.Error())
	}
	return page
}

// pageHandler returns page as admin.Config takes it: nil when the page is
// off, never a nil *statuspage.Page in a non-nil interface.
func pageHandler(page *statuspage.Page) http.Handler {
	if page == nil {
		return nil
	}
	return page
}

// withStatusPage makes s end the page's live streams when it shuts down,
// so that Shutdown does not wait for browsers to hang up; s is unchanged
// when page is nil.
func withStatusPage(s *http.Server, page *statuspage.Page) *http.Server {
	if page != nil {
		s.RegisterOnShutdown(page.EndStreams)
	}
	return s
}
