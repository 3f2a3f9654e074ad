package statuspage

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

// fleetHub is a hub in fleet mode as the admin port sees it: a
// relay.Server whose fleet status and shared states the test sets. It is
// safe for concurrent use.
type fleetHub struct {
	*relay.Server

	mu     sync.Mutex
	fleet  admin.Fleet                  // guarded by mu
	shared map[string]admin.TargetFleet // guarded by mu; by target name
}

var _ admin.FleetHub = (*fleetHub)(nil)

// FleetStatus implements admin.FleetHub.
func (h *fleetHub) FleetStatus() admin.Fleet {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fleet
}

// TargetFleet implements admin.FleetHub.
func (h *fleetHub) TargetFleet(name string) (admin.TargetFleet, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	tf, ok := h.shared[name]
	return tf, ok
}

// set changes the fleet status and CORE's shared state.
func (h *fleetHub) set(fleet admin.Fleet, core admin.TargetFleet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fleet, h.shared["CORE"] = fleet, core
}

func TestPageShowsTheFleet(t *testing.T) {
	// Given a hub in a fleet, reaching the store, whose CORE another hub
	// opened and whose CLAIM the fleet does not share, the hub ids holding
	// markup,
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	_, err := h.srv.ControlBreaker("CORE", relay.ActionOpen)
	require.NoError(t, err)
	fh := &fleetHub{Server: h.srv, shared: make(map[string]admin.TargetFleet)}
	fh.set(admin.Fleet{HubID: "a<b>1</b>", StoreConnected: true}, admin.TargetFleet{Epoch: 7, OpenedBy: "<i>b</i>", Source: "remote"})
	cfg := h.config(t)
	cfg.Hub = fh
	p := newPage(cfg)

	// when the page is drawn,
	resp := get(p, http.MethodGet, "/")
	require.Equal(t, http.StatusOK, resp.Code)
	body := resp.Body.String()

	// then the header names the hub and says the store is connected in
	// words, each row tells its shared state, and the ids are text.
	hub, _ := wellFormed(t, body, "hub")
	assert.Contains(t, hub, "STORE CONNECTED")
	assert.Contains(t, hub, "fleet hub a<b>1</b>")
	assert.Contains(t, body, `class="badge store up"`)
	core, _ := wellFormed(t, body, "t-CORE-state")
	assert.Contains(t, core, "fleet epoch 7 · opened by <i>b</i> · last change: the fleet · no probe while held")
	claim, _ := wellFormed(t, body, "t-CLAIM-state")
	assert.Contains(t, claim, "not shared with the fleet")
	assert.NotContains(t, body, "<b>1</b>")
	assert.NotContains(t, body, "<i>b</i>")

	// When the store goes away and this hub wins CORE's probe lease, the
	// next frame sends the header and CORE's state, and not CLAIM's.
	p.publish(p.now())
	fh.set(admin.Fleet{HubID: "a", StoreConnected: false}, admin.TargetFleet{Epoch: 7, OpenedBy: "b", Source: "remote", ProbeLease: true})
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `class="badge store down"`)
	assert.Contains(t, delta, "STORE UNREACHABLE")
	assert.Contains(t, delta, "fleet hub a: each breaker decides alone")
	assert.Contains(t, delta, `id="t-CORE-state"`)
	assert.Contains(t, delta, "probe lease: this hub")
	assert.NotContains(t, delta, `id="t-CLAIM-state"`)
}

func TestPageShowsNoFleetForAHubAlone(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	body := get(newPage(h.config(t)), http.MethodGet, "/").Body.String()
	assert.NotContains(t, body, "STORE")
	assert.NotContains(t, body, `class="sub fleet"`)
	assert.NotContains(t, body, "fleet hub")
}
