package main_test

import (
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/internal/testutil/toxitest"
)

// TestFleetPartialPartitionOfOneHubsStoreLink puts toxiproxy on the link
// between one hub and the store only (docs/FLEET.md, "A partial
// partition"): that hub degrades to its own state within the store's
// timeout and says so, the others go on sharing, and when the link heals
// it reads the store again and adopts what changed meanwhile. Paced load
// runs through the two other hubs all along: every line is answered, once.
func TestFleetPartialPartitionOfOneHubsStoreLink(t *testing.T) {
	for _, fault := range []struct {
		name, typ string
		attrs     toxitest.Attributes
	}{
		{"latency above the store timeout", "latency", toxitest.Attributes{"latency": 2000}},
		{"a store that keeps the connection and says nothing", "timeout", toxitest.Attributes{"timeout": 0}},
	} {
		t.Run(fault.name, func(t *testing.T) {
			// Given three hubs on one Redis, hub a's link to it through
			// toxiproxy,
			store := redistest.Start(t)
			tox := toxitest.Start(t)
			link := tox.Proxy(t, "store-a", store.Addr())
			core := proctest.StartFixture(t, "CORE", "core")
			args := []string{"--target", "CORE=" + core.URL, "--fail-threshold", "2", "--reset-timeout", "1h"}
			a := startMember(t, "redis://"+link.Listen, "a", args...)
			b := startMember(t, store.URL(), "b", args...)
			c := startMember(t, store.URL(), "c", args...)
			hubs := []*member{a, b, c}
			for _, h := range hubs {
				proctest.Eventually(t, 5*time.Second, h.id+" reaches the store", func() bool {
					_, up := h.core(t)
					return up
				})
			}
			// Paced load through b and c all along; a is sent lines by the
			// test alone, so that only the fleet can open its breaker.
			load := &pacedLoad{}
			stop := make(chan struct{})
			wg := load.run(t, []*member{b, c}, 20*time.Millisecond, stop)

			// when a's link to the store goes bad both ways,
			cut := time.Now()
			link.AddToxic("up", fault.typ, toxitest.Upstream, fault.attrs)
			link.AddToxic("down", fault.typ, toxitest.Downstream, fault.attrs)

			// then a says within a few store timeouts that it is on its
			// own, on /status and its status page, while b and c share;
			proctest.Eventually(t, 5*time.Second, "a degrades to its own state", func() bool {
				_, up := a.core(t)
				return !up
			})
			t.Logf("a on its own %s after the cut", time.Since(cut).Round(10*time.Millisecond))
			for _, h := range []*member{b, c} {
				_, up := h.core(t)
				assert.True(t, up, "%s still reaches the store", h.id)
			}
			code, page, _ := getHTML(t, a.admin, "/")
			require.Equal(t, http.StatusOK, code)
			assert.Contains(t, page, "STORE UNREACHABLE")

			// a trip on b reaches c, not a, whose CORE answers on;
			core.Ctl(t, `{"mode":"fail"}`)
			// (the paced load may be the one that trips it)
			cb := hubtest.Dial(t, b.Addr())
			proctest.Eventually(t, 5*time.Second, "b trips", func() bool {
				return cb.Exchange("T-B|CORE|BAL 1001").Code == "E904"
			})
			proctest.Eventually(t, 2*time.Second, "c adopts b's trip", func() bool { return c.state(t) == "OPEN" })
			assert.Equal(t, "CLOSED", a.state(t), "a, cut off, keeps its own state")
			core.Ctl(t, `{"mode":"normal"}`)
			assert.Equal(t, "0000", hubtest.Dial(t, a.Addr()).Exchange("T-A0|CORE|BAL 1001").Code, "a, cut off, goes on calling CORE")

			// and once the link heals, a reads the store again and adopts
			// the trip it missed.
			link.RemoveToxic("up")
			link.RemoveToxic("down")
			proctest.Eventually(t, 10*time.Second, "a rejoins and adopts the trip", func() bool {
				st, up := a.core(t)
				return up && st.State == "OPEN"
			})
			assert.Equal(t, "E904", hubtest.Dial(t, a.Addr()).Exchange("T-A|CORE|BAL 1001").Code)

			close(stop)
			wg.Wait()
			codes, _ := load.take()
			for code := range codes {
				assert.Contains(t, []string{"0000", "E500", "E904"}, code, "every paced line answered, none lost or garbled: %v", codes)
			}
			assert.NotEmpty(t, slices.Collect(maps.Keys(codes)))
			assert.False(t, strings.Contains(strings.Join(slices.Collect(maps.Keys(codes)), ","), "error"), "%v", codes)
		})
	}
}
