package fleet_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay/fleet"
)

// These tests run hubs' breakers against a real Redis Cluster of three
// masters with a replica each. CORE's keys and CLAIM's are on two
// different shards; the change channel, rh:changes, is on a third.

// multiHub is a hub of a test fleet sharing the breakers of several
// targets.
type multiHub struct {
	id string
	fl *fleet.Fleet
	bs map[string]*breaker.Breaker
}

// Breaker implements fleet.Hub.
func (h *multiHub) Breaker(name string) *breaker.Breaker { return h.bs[name] }

// startMultiHub starts a hub named id sharing, through the store at url,
// a breaker (threshold 2, the given reset timeout, a one-second lease) for
// each of targets, in that order.
func startMultiHub(t *testing.T, url, id string, reset time.Duration, targets ...string) *multiHub {
	t.Helper()
	h := &multiHub{id: id, bs: map[string]*breaker.Breaker{}}
	fl, err := fleet.New(fleet.Config{
		Store:          url,
		HubID:          id,
		Targets:        targets,
		Logger:         zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		ResyncInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	h.fl = fl
	for _, name := range targets {
		h.bs[name] = breaker.New(breaker.Settings{
			Name:         name,
			Policy:       breaker.Policy{FailThreshold: 2, ResetTimeout: reset},
			ProbePermits: true,
			ProbeTimeout: time.Second,
			OnTransition: fl.Observe,
		})
	}
	require.NoError(t, fl.Start(h))
	t.Cleanup(func() { assert.NoError(t, fl.Close()) })
	return h
}

// trip fails two calls on the target's breaker, which opens it.
func (h *multiHub) trip(t *testing.T, target string) {
	t.Helper()
	b := h.bs[target]
	for range 2 {
		tk, _, err := b.Allow()
		require.NoError(t, err)
		b.Done(tk, true, 0)
	}
	require.Equal(t, breaker.Open, b.Snapshot().State)
}

func (h *multiHub) state(target string) breaker.State { return h.bs[target].Snapshot().State }

// startClusterFleet starts a cluster and two hubs sharing CORE and CLAIM
// through it, and waits until both reach it.
func startClusterFleet(t *testing.T, reset time.Duration) (*redistest.Cluster, *multiHub, *multiHub) {
	t.Helper()
	cl := redistest.StartCluster(t)
	require.NotEqual(t, cl.MasterOfKey("rh:{CORE}:epoch"), cl.MasterOfKey("rh:{CLAIM}:epoch"), "CORE and CLAIM on two shards")
	require.NotEqual(t, cl.MasterOfKey("rh:{CORE}:epoch"), cl.MasterOfKey(fleet.Channel), "the channel on another shard than CORE's")
	a := startMultiHub(t, cl.URL(), "a", reset, "CORE", "CLAIM")
	b := startMultiHub(t, cl.URL(), "b", reset, "CORE", "CLAIM")
	for _, h := range []*multiHub{a, b} {
		eventually(t, h.id+" reaches the store", func() bool { return h.fl.Status().StoreUp })
	}
	return cl, a, b
}

func TestClusterFailoverIsFollowedAtOnce(t *testing.T) {
	// Given two hubs sharing CORE and CLAIM through a cluster,
	cl, a, b := startClusterFleet(t, time.Minute)

	// when CORE's master is killed and its replica takes over,
	old := cl.MasterOfKey("rh:{CORE}:epoch")
	cl.Kill(old)
	cl.WaitFailover(old)
	promoted := time.Now()

	// then both hubs find the new master within a few resyncs, not at
	// the client's next periodic look at the cluster's layout (a minute),
	for _, h := range []*multiHub{a, b} {
		eventually(t, h.id+" shares CORE again", func() bool { return h.fl.Status().StoreUp })
	}
	t.Logf("shared again %v after the promotion", time.Since(promoted))

	// and a trip of CORE reaches the other hub.
	a.trip(t, "CORE")
	eventually(t, "b opens CORE", func() bool { return b.state("CORE") == breaker.Open })
	ts, _ := b.fl.Target("CORE")
	assert.Equal(t, "a", ts.OpenedBy)
}
