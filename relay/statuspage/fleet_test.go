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
// relay.Server whose fleet status, shared states and shield's store the
// test sets. It is safe for concurrent use.
type fleetHub struct {
	*relay.Server

	mu     sync.Mutex
	fleet  admin.Fleet                  // guarded by mu
	shared map[string]admin.TargetFleet // guarded by mu; by target name
	dedup  relay.DedupStatus            // guarded by mu
}

var (
	_ admin.FleetHub = (*fleetHub)(nil)
	_ admin.DedupHub = (*fleetHub)(nil)
)

// Dedup implements admin.DedupHub.
func (h *fleetHub) Dedup() relay.DedupStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dedup
}

// setDedup changes the shield's state.
func (h *fleetHub) setDedup(d relay.DedupStatus) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dedup = d
}

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
	fh.set(admin.Fleet{HubID: "a", StoreConnected: false}, admin.TargetFleet{Epoch: 7, OpenedBy: "b", Source: "remote", ProbeLease: true, Alone: true})
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `class="badge store down"`)
	assert.Contains(t, delta, "STORE UNREACHABLE")
	assert.Contains(t, delta, "fleet hub a: each breaker decides alone")
	assert.Contains(t, delta, `id="t-CORE-state"`)
	assert.Contains(t, delta, "probe lease: this hub")
	assert.Contains(t, delta, "deciding alone: the store does not answer for it")
	assert.NotContains(t, delta, `id="t-CLAIM-state"`)
}

func TestPageShowsNoFleetForAHubAlone(t *testing.T) {
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	body := get(newPage(h.config(t)), http.MethodGet, "/").Body.String()
	assert.NotContains(t, body, "STORE")
	assert.NotContains(t, body, `class="sub fleet"`)
	assert.NotContains(t, body, "fleet hub")
}

func TestPageShowsTheShieldStore(t *testing.T) {
	// Given a hub in a fleet, reaching its store, with CORE shielded and
	// CLAIM not, and a shield without a store of its own,
	shielded := &relay.TargetSettings{Dedup: true}
	h := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1", Settings: shielded}, relay.Target{Name: "CLAIM", URL: "http://127.0.0.1:1"})
	fh := &fleetHub{Server: h.srv, shared: make(map[string]admin.TargetFleet)}
	fh.set(admin.Fleet{HubID: "a", StoreConnected: true}, admin.TargetFleet{})
	cfg := h.config(t)
	cfg.Hub = fh
	p := newPage(cfg)
	hubText := func() string {
		t.Helper()
		hub, _ := wellFormed(t, get(p, http.MethodGet, "/").Body.String(), "hub")
		return hub
	}

	// then the header says nothing of the shield's store;
	assert.NotContains(t, hubText(), "shield")

	// when the shield is shared through the store, it says so, quietly;
	fh.setDedup(relay.DedupStatus{Shared: true})
	assert.Contains(t, hubText(), "shield shared")
	body := get(p, http.MethodGet, "/").Body.String()
	assert.Contains(t, body, `<span class="badge shield up" title="the duplicate-TXID shield is shared with the fleet through its store; 0 fallbacks to this hub's memory since start">shield shared</span>`)
	p.publish(p.now())

	// when the store fails, the next frame sends the header with a
	// warning, and no row.
	fh.setDedup(relay.DedupStatus{Shared: true, StoreDown: true, StoreFallbacks: 3})
	p.publish(p.now())
	delta := p.frame.delta
	assert.Contains(t, delta, `class="badge shield down"`)
	assert.Contains(t, delta, "shield: local only (3 fallbacks)")
	assert.Contains(t, delta, "a resend sent to another hub is not recognised")
	assert.NotContains(t, delta, `id="t-CORE-dedup"`)
	assert.Contains(t, hubText(), "STORE CONNECTED", "the breakers' store is told apart")

	// With no target shielded, the store has nothing to tell.
	h2 := startHub(t, relay.Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	fh2 := &fleetHub{Server: h2.srv, shared: make(map[string]admin.TargetFleet)}
	fh2.setDedup(relay.DedupStatus{Shared: true, StoreDown: true, StoreFallbacks: 3})
	cfg2 := h2.config(t)
	cfg2.Hub = fh2
	hub, _ := wellFormed(t, get(newPage(cfg2), http.MethodGet, "/").Body.String(), "hub")
	assert.NotContains(t, hub, "shield")
}
