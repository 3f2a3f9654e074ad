package fleet_test

import (
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/fleet"
)

// These tests run hubs' breakers against a real Redis Cluster of three
// masters with a replica each. CORE's keys and CLAIM's are on two
// different shards; the change channel, rh:changes, is on a third.

// multiHub is a hub of a test fleet sharing the breakers of several
// targets.
type multiHub struct {
	id   string
	fl   *fleet.Fleet
	bs   map[string]*breaker.Breaker
	logs *logtest.Buffer // the fleet's log, also passed to the test's
}

// Breaker implements fleet.Hub.
func (h *multiHub) Breaker(name string) *breaker.Breaker { return h.bs[name] }

// startMultiHub starts a hub named id sharing, through the store at url,
// a breaker (threshold 2, the given reset timeout, a one-second lease) for
// each of targets, in that order.
func startMultiHub(t *testing.T, url, id string, reset time.Duration, targets ...string) *multiHub {
	t.Helper()
	h := &multiHub{id: id, bs: map[string]*breaker.Breaker{}, logs: &logtest.Buffer{}}
	fl, err := fleet.New(fleet.Config{
		Store:          url,
		HubID:          id,
		Targets:        targets,
		Logger:         zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), h.logs)).Level(zerolog.InfoLevel),
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

// close closes the target's breaker by an operator's action shared with
// the fleet.
func (h *multiHub) close(t *testing.T, target string) {
	t.Helper()
	h.bs[target].ForceClose()
	require.NoError(t, h.fl.Control(target, relay.ActionClose))
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

func TestClusterShardWithNoNodeLeftLeavesOnlyItsTargetsAlone(t *testing.T) {
	// Given two hubs sharing CORE and CLAIM through a cluster, CORE
	// first, so that its shard is the first the hubs find gone,
	cl, a, b := startClusterFleet(t, 300*time.Millisecond)

	// when CORE's shard loses its replica and then its master,
	m := cl.MasterOfKey("rh:{CORE}:epoch")
	r := cl.ReplicaOf(m)
	cl.Kill(r)
	cl.Kill(m)
	for _, h := range []*multiHub{a, b} {
		eventually(t, h.id+" sees a shard gone", func() bool { return !h.fl.Status().StoreUp })
		eventually(t, h.id+" has CORE alone", func() bool { ts, _ := h.fl.Target("CORE"); return ts.Alone })
		ts, _ := h.fl.Target("CLAIM")
		assert.False(t, ts.Alone, "%s: CLAIM is still shared", h.id)
		lines := h.logs.Messages(t, "state store unreachable for some targets: their breakers decide alone until it is back")
		require.NotEmpty(t, lines, h.id)
		assert.Equal(t, []any{"CORE"}, lines[0]["targets"])
	}

	// then CLAIM's trip still reaches the other hub, and one hub alone
	// gets CLAIM's probe,
	a.trip(t, "CLAIM")
	eventually(t, "b opens CLAIM", func() bool { return b.state("CLAIM") == breaker.Open })
	eventually(t, "one hub admits CLAIM's probe", func() bool {
		for i, h := range []*multiHub{a, b} {
			tk, _, err := h.bs["CLAIM"].Allow()
			if err != nil {
				continue
			}
			other := []*multiHub{b, a}[i]
			_, _, err = other.bs["CLAIM"].Allow()
			assert.ErrorIs(t, err, breaker.ErrOpen, "%s refuses while %s probes", other.id, h.id)
			h.bs["CLAIM"].Done(tk, false, 0)
			return true
		}
		return false
	})
	eventually(t, "CLAIM closes on both", func() bool {
		return a.state("CLAIM") == breaker.Closed && b.state("CLAIM") == breaker.Closed
	})

	// while CORE's breakers decide alone: A's trip stays A's, and A
	// probes on its own once its period has passed.
	a.trip(t, "CORE")
	eventually(t, "a admits its own probe of CORE", func() bool {
		tk, _, err := a.bs["CORE"].Allow()
		if err != nil {
			return false
		}
		a.bs["CORE"].Done(tk, true, 0) // still failing: open again
		return true
	})
	assert.Equal(t, breaker.Closed, b.state("CORE"))

	// When the shard is back, empty, A's open breaker is written to it
	// again and B adopts it.
	cl.Restart(r)
	cl.Restart(m)
	back := time.Now()
	eventually(t, "b adopts a's open CORE", func() bool { return b.state("CORE") == breaker.Open })
	for _, h := range []*multiHub{a, b} {
		eventually(t, h.id+" shares every target again", func() bool { return h.fl.Status().StoreUp })
	}
	t.Logf("shared again %v after the shard came back", time.Since(back))
	a.close(t, "CORE")
	eventually(t, "b closes CORE", func() bool { return b.state("CORE") == breaker.Closed })
}

func TestClusterChannelShardGoneTheTargetsStayShared(t *testing.T) {
	// Given two hubs sharing CORE and CLAIM through a cluster,
	cl, a, b := startClusterFleet(t, 300*time.Millisecond)

	// when the shard of the change channel (neither CORE's nor CLAIM's)
	// loses its replica and then its master,
	m := cl.MasterOfKey(fleet.Channel)
	cl.Kill(cl.ReplicaOf(m))
	cl.Kill(m)
	for _, h := range []*multiHub{a, b} {
		eventually(t, h.id+" loses the channel", func() bool { return !h.fl.Status().StoreUp })
		for _, name := range []string{"CORE", "CLAIM"} {
			ts, _ := h.fl.Target(name)
			assert.False(t, ts.Alone, "%s: %s is still shared", h.id, name)
		}
		assert.NotEmpty(t, h.logs.Messages(t, "change channel not subscribed: the other hubs' changes arrive at each resync until it is back"), h.id)
	}

	// then CORE's trip on A still reaches B, at B's next resync,
	a.trip(t, "CORE")
	eventually(t, "b opens CORE", func() bool { return b.state("CORE") == breaker.Open })

	// and only one hub gets CORE's probe, whose success closes both.
	eventually(t, "one hub admits CORE's probe", func() bool {
		for i, h := range []*multiHub{a, b} {
			tk, _, err := h.bs["CORE"].Allow()
			if err != nil {
				continue
			}
			other := []*multiHub{b, a}[i]
			_, _, err = other.bs["CORE"].Allow()
			assert.ErrorIs(t, err, breaker.ErrOpen, "%s refuses while %s probes", other.id, h.id)
			h.bs["CORE"].Done(tk, false, 0)
			return true
		}
		return false
	})
	eventually(t, "CORE closes on both", func() bool {
		return a.state("CORE") == breaker.Closed && b.state("CORE") == breaker.Closed
	})
}

func TestOneServerDownEveryTargetIsAlone(t *testing.T) {
	// Given a hub sharing CORE and CLAIM through one redis-server,
	srv := redistest.Start(t)
	a := startMultiHub(t, srv.URL(), "a", time.Minute, "CORE", "CLAIM")
	eventually(t, "a reaches the store", func() bool { return a.fl.Status().StoreUp })

	// when the server is killed, then both targets decide alone: the
	// first failure says the server is gone, not only CORE's part of it.
	srv.Kill()
	eventually(t, "a sees the store gone", func() bool { return !a.fl.Status().StoreUp })
	for _, name := range []string{"CORE", "CLAIM"} {
		eventually(t, name+" decides alone", func() bool { ts, _ := a.fl.Target(name); return ts.Alone })
	}
	assert.Contains(t, a.logs.String(), "state store unreachable: each breaker decides alone")
}
