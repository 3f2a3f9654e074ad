package main_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/fleet"
)

// These tests run fleets of real relays sharing a real Redis Cluster of
// three masters with a replica each (docs/FLEET.md, "Redis Cluster"). A
// target's keys are rh:{TARGET}:..., so each target lives on the shard of
// its name's hash slot: CORE (slot 13408), CLAIM (6836) and LOANS (3833)
// on the three shards, LOANS with the change channel rh:changes (4710).

// clusterRig is a Redis Cluster, one fixture per target, and the hubs
// sharing them.
type clusterRig struct {
	cluster  *redistest.Cluster
	rdb      *redis.ClusterClient
	fixtures map[string]*proctest.Fixture
	hubs     []*member
}

// startClusterRig starts a Redis Cluster, a core fixture for each of
// targets, and one hub per entry of args (each the flags of that hub
// beyond the fleet's and the targets'), named a, b, c..., serving every
// target; it waits until every hub reaches the store.
func startClusterRig(t *testing.T, targets []string, args ...[]string) *clusterRig {
	t.Helper()
	r := &clusterRig{cluster: redistest.StartCluster(t), fixtures: map[string]*proctest.Fixture{}}
	opt, err := redis.ParseClusterURL(r.cluster.URL())
	require.NoError(t, err)
	r.rdb = redis.NewClusterClient(opt)
	t.Cleanup(func() { _ = r.rdb.Close() })

	shards := map[string]string{}
	for _, name := range []string{"CORE", "CLAIM", "LOANS"} {
		shards[name] = r.cluster.MasterOfKey("rh:{" + name + "}:epoch").Addr()
	}
	require.Len(t, map[string]bool{shards["CORE"]: true, shards["CLAIM"]: true, shards["LOANS"]: true}, 3,
		"CORE, CLAIM and LOANS on three shards: %v", shards)
	require.Equal(t, shards["LOANS"], r.cluster.MasterOfKey(fleet.Channel).Addr(), "the channel on LOANS's shard")

	var flags []string
	for _, name := range targets {
		f := proctest.StartFixture(t, name, "core")
		r.fixtures[name] = f
		flags = append(flags, "--target", name+"="+f.URL)
	}
	for i, a := range args {
		id := string(rune('a' + i))
		r.hubs = append(r.hubs, startMember(t, r.cluster.URL(), id, append(append([]string{}, flags...), a...)...))
	}
	for _, h := range r.hubs {
		proctest.Eventually(t, 5*time.Second, h.id+" reaches the store", func() bool { return h.connected(t) })
	}
	return r
}

// of returns the hub's /status entry for the named target.
func (m *member) of(t *testing.T, name string) admin.Target {
	t.Helper()
	tg := statusOf(t, m.status(t), name)
	require.NotNil(t, tg.Fleet, "%s: %s has its shared state in /status", m.id, name)
	return tg
}

// connected returns the hub's store_connected.
func (m *member) connected(t *testing.T) bool {
	t.Helper()
	st := m.status(t)
	require.NotNil(t, st.Fleet, "%s: /status has a fleet section", m.id)
	return st.Fleet.StoreConnected
}

// txFor is a balance enquiry for the named target.
func txFor(target, txid string) string { return txid + "|" + target + "|BAL 1001" }

// trip makes the target's fixture fail and trips h's breaker of it with
// two failed calls.
func (r *clusterRig) trip(t *testing.T, h *member, target string) {
	t.Helper()
	r.fixtures[target].Ctl(t, `{"mode":"fail"}`)
	c := hubtest.Dial(t, h.Addr())
	defer c.Close()
	for i := range 2 {
		ans := c.Exchange(txFor(target, fmt.Sprintf("trip-%s-%s-%d", h.id, target, i)))
		require.Equal(t, "E500", ans.Code, "%s: %s", h.id, ans)
	}
	require.Equal(t, "OPEN", h.of(t, target).State)
}

// waitAdopted waits until each of hubs holds the target open as opened
// by the hub named by, and answers it E904; it returns how long the last
// one took.
func (r *clusterRig) waitAdopted(t *testing.T, target, by string, hubs ...*member) time.Duration {
	t.Helper()
	began := time.Now()
	for _, h := range hubs {
		proctest.Eventually(t, 2*time.Second, h.id+" adopts "+by+"'s open "+target, func() bool {
			tg := h.of(t, target)
			return tg.State == "OPEN" && tg.Fleet.OpenedBy == by && tg.Fleet.Source == "remote"
		})
		ans := hubtest.Dial(t, h.Addr()).Exchange(txFor(target, "refused-"+h.id))
		assert.Equal(t, "E904", ans.Code, "%s: %s", h.id, ans)
	}
	return time.Since(began)
}

// closeAll closes the target on every hub by an operator's close on h,
// and puts its fixture back to normal.
func (r *clusterRig) closeAll(t *testing.T, h *member, target string) {
	t.Helper()
	r.fixtures[target].Ctl(t, `{"mode":"normal"}`)
	h.mustControl(t, target, "close", "")
	for _, o := range r.hubs {
		proctest.Eventually(t, 2*time.Second, o.id+" closes "+target, func() bool { return o.of(t, target).State == "CLOSED" })
	}
}

// waitConnected waits until every hub reaches the store for every
// target, and returns how long that took.
func (r *clusterRig) waitConnected(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	for _, h := range r.hubs {
		proctest.Eventually(t, d, h.id+" reaches the store for every target", func() bool { return h.connected(t) })
	}
	return time.Since(began)
}

// oneProbe checks that, with the target's fleet breaker open and its
// fixture recovered, one hub wins the probe lease, and of 30 requests sent
// at once, 10 to each hub, exactly one reaches the target; its success
// closes every hub.
func (r *clusterRig) oneProbe(t *testing.T, target string) {
	t.Helper()
	// The target answers in 700 ms (within the hubs' 2 s target
	// timeout): the probe is still out when the last of the requests
	// arrives, however busy the machine.
	f := r.fixtures[target]
	f.Ctl(t, `{"mode":"slow","delay_ms":700,"reset":true}`)
	proctest.Eventually(t, 5*time.Second, "a hub wins "+target+"'s probe lease", func() bool {
		for _, h := range r.hubs {
			if h.of(t, target).Fleet.ProbeLease {
				return true
			}
		}
		return false
	})
	var conns []*hubtest.Client
	var lines []string
	for _, h := range r.hubs {
		conns = append(conns, hubtest.Dial(t, h.Addr()))
		for i := range 10 {
			lines = append(lines, txFor(target, fmt.Sprintf("probe-%s-%d", h.id, i)))
		}
	}
	codes := map[string]int{}
	for _, a := range sendConcurrently(t, conns, lines) {
		codes[a.Code]++
	}
	assert.Equal(t, map[string]int{"0000": 1, "E904": 29}, codes, target)
	assert.Equal(t, int64(1), f.SettledStats(t).Calls, "one probe of %s for the whole fleet", target)
	for _, h := range r.hubs {
		proctest.Eventually(t, 2*time.Second, h.id+" closes "+target, func() bool { return h.of(t, target).State == "CLOSED" })
	}
	f.Ctl(t, `{"mode":"normal"}`)
}

func TestFleetOnAClusterTripsProbesAndStartsOpen(t *testing.T) {
	// Given three hubs sharing CORE and CLAIM, on two shards of a cluster,
	r := startClusterRig(t, []string{"CORE", "CLAIM"},
		same(3, "--fail-threshold", "2", "--reset-timeout", "3s", "--target-timeout", "2s")...)
	a, b, c := r.hubs[0], r.hubs[1], r.hubs[2]

	// when A trips CLAIM, then B and C refuse it, opened by A;
	r.trip(t, a, "CLAIM")
	t.Logf("CLAIM's trip on a adopted by b and c within %v", r.waitAdopted(t, "CLAIM", "a", b, c))
	assert.Equal(t, "CLOSED", b.of(t, "CORE").State, "CORE's breaker is not CLAIM's")
	r.closeAll(t, a, "CLAIM")

	// when A trips CORE, B and C refuse it too,
	r.trip(t, a, "CORE")
	t.Logf("CORE's trip on a adopted by b and c within %v", r.waitAdopted(t, "CORE", "a", b, c))
	calls := r.fixtures["CORE"].SettledStats(t).Calls

	// and B, restarted, answers E904 from its first line on, with the
	// fleet's remaining time, without calling CORE;
	b.restart(t)
	ans := hubtest.Dial(t, b.Addr()).Exchange(txFor("CORE", "first"))
	require.Equal(t, "E904", ans.Code, ans.String())
	secs, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(ans.Message, "circuit open; retry after "), "s"))
	require.NoError(t, err, ans.Message)
	assert.True(t, secs >= 1 && secs <= 3, "retry after %ds: the fleet's remaining time", secs)
	assert.Equal(t, calls, r.fixtures["CORE"].Stats(t).Calls, "CORE was not called")
	assert.Equal(t, admin.TargetFleet{Epoch: 1, OpenedBy: "a", Source: "remote"}, *b.of(t, "CORE").Fleet)

	// and once CORE recovers, the fleet sends it one probe, whose success
	// closes every hub.
	r.oneProbe(t, "CORE")
	for _, h := range r.hubs {
		assert.Equal(t, "0000", hubtest.Dial(t, h.Addr()).Exchange(txFor("CORE", "after-"+h.id)).Code)
	}
	assert.Equal(t, "2", r.rdb.Get(t.Context(), "rh:{CORE}:epoch").Val(), "CORE's epoch, on its shard")
	assert.Equal(t, "2", r.rdb.Get(t.Context(), "rh:{CLAIM}:epoch").Val(), "CLAIM's epoch, on its shard")
}

func TestFleetOnAClusterFollowsAFailover(t *testing.T) {
	// Given three hubs sharing CORE, CLAIM and LOANS, one per shard, with
	// the shield on,
	r := startClusterRig(t, []string{"CORE", "CLAIM", "LOANS"},
		same(3, "--fail-threshold", "2", "--reset-timeout", "60s", "--dedup")...)
	a, b, c := r.hubs[0], r.hubs[1], r.hubs[2]
	cl := r.cluster

	// and a CORE withdrawal answered by A, whose resend to B is answered
	// from the store, in CORE's slot,
	first := hubtest.Dial(t, a.Addr()).Exchange("W1|CORE|WD 1001 300").String()
	require.Equal(t, "W1|0000|balance=99700", first)
	// A settles the record in the store after it answers the client.
	proctest.Eventually(t, 2*time.Second, "W1 settled in the store", func() bool {
		return strings.HasPrefix(r.rdb.Get(t.Context(), "rh:{CORE}:tx:W1").Val(), "1|A|")
	})
	assert.Equal(t, cl.KeySlot("CORE"), cl.KeySlot("rh:{CORE}:tx:W1"))
	assert.Equal(t, first, hubtest.Dial(t, b.Addr()).Exchange("W1|CORE|WD 1001 300").String())
	assert.Equal(t, 1.0, b.metric(t, `relay_dedup_total{outcome="replayed",target="CORE"}`))

	// when CORE's master is killed,
	old := cl.MasterOfKey("rh:{CORE}:epoch")
	cl.Kill(old)
	killed := time.Now()

	// then every hub finds CORE's shard gone (store_connected is one flag
	// for the whole hub: false while any target decides alone), while
	// CLAIM's trip on A still reaches B and C;
	for _, h := range r.hubs {
		proctest.Eventually(t, 3*time.Second, h.id+" finds CORE's shard gone", func() bool { return !h.connected(t) })
	}
	r.trip(t, a, "CLAIM")
	t.Logf("CLAIM's trip on a, during CORE's failover, adopted by b and c within %v", r.waitAdopted(t, "CLAIM", "a", b, c))
	r.closeAll(t, a, "CLAIM")

	// and once CORE's replica has taken over, every hub shares CORE again:
	// the resend of W1 to C is answered from the promoted replica, and A's
	// trip reaches B and C.
	promoted := cl.WaitFailover(old)
	t.Logf("CORE's replica %s took over %v after the kill", promoted, time.Since(killed))
	t.Logf("every hub shares every target again %v after the promotion", r.waitConnected(t, 5*time.Second))
	assert.Equal(t, first, hubtest.Dial(t, c.Addr()).Exchange("W1|CORE|WD 1001 300").String())
	assert.Equal(t, 1.0, c.metric(t, `relay_dedup_total{outcome="replayed",target="CORE"}`))
	assert.Equal(t, []string{"W1"}, r.fixtures["CORE"].Received(t))
	r.trip(t, a, "CORE")
	t.Logf("CORE's trip on a, after the failover, adopted by b and c within %v", r.waitAdopted(t, "CORE", "a", b, c))

	// When the master of LOANS's shard, which carries the change channel,
	// is killed too, the hubs subscribe again through its replica once it
	// has taken over, and LOANS's trip reaches every hub.
	old = cl.MasterOfKey(fleet.Channel)
	cl.Kill(old)
	for _, h := range r.hubs {
		proctest.Eventually(t, 3*time.Second, h.id+" loses the channel", func() bool { return !h.connected(t) })
	}
	cl.WaitFailover(old)
	t.Logf("every hub subscribed again %v after the promotion", r.waitConnected(t, 5*time.Second))
	r.trip(t, a, "LOANS")
	t.Logf("LOANS's trip on a adopted by b and c within %v", r.waitAdopted(t, "LOANS", "a", b, c))
}

func TestFleetOnAClusterShardWithNoNodeLeftLeavesOnlyItsTargetsAlone(t *testing.T) {
	// Given three hubs sharing CORE and CLAIM, on two shards of a cluster,
	r := startClusterRig(t, []string{"CORE", "CLAIM"},
		same(3, "--fail-threshold", "2", "--reset-timeout", "1s", "--target-timeout", "2s")...)
	a, b, c := r.hubs[0], r.hubs[1], r.hubs[2]
	cl := r.cluster

	// when CORE's shard loses its replica, then its master,
	m := cl.MasterOfKey("rh:{CORE}:epoch")
	replica := cl.ReplicaOf(m)
	cl.Kill(replica)
	cl.Kill(m)

	// then every hub shows the store as not connected, its one flag, CORE
	// alone and CLAIM not on /status, and logs CORE as the target whose
	// breaker decides alone;
	for _, h := range r.hubs {
		proctest.Eventually(t, 3*time.Second, h.id+" finds CORE's shard gone", func() bool { return !h.connected(t) })
		proctest.Eventually(t, time.Second, h.id+" shows CORE alone", func() bool { return h.of(t, "CORE").Fleet.Alone })
		assert.False(t, h.of(t, "CLAIM").Fleet.Alone, "%s: CLAIM's shard answers", h.id)
		proctest.Eventually(t, time.Second, h.id+" logs CORE alone", func() bool {
			for _, l := range h.LogLines() {
				if strings.HasPrefix(fmt.Sprint(l["message"]), "state store unreachable for some targets") {
					return assert.Equal(t, []any{"CORE"}, l["targets"], "%s: %v", h.id, l)
				}
			}
			return false
		})
		assert.Equal(t, 0.0, h.metric(t, "relay_state_store_up"))
	}

	// CLAIM is still shared: A's trip reaches B and C, and the fleet sends
	// CLAIM one probe;
	r.trip(t, a, "CLAIM")
	t.Logf("CLAIM's trip on a adopted by b and c within %v", r.waitAdopted(t, "CLAIM", "a", b, c))
	r.oneProbe(t, "CLAIM")

	// while each hub's CORE breaker decides alone: each trips on its own,
	// the others staying closed, and each sends its own probe.
	r.fixtures["CORE"].Ctl(t, `{"mode":"fail"}`)
	for i, h := range r.hubs {
		r.trip(t, h, "CORE")
		for _, other := range r.hubs[i+1:] {
			assert.Equal(t, "CLOSED", other.of(t, "CORE").State, "%s does not follow %s's CORE", other.id, h.id)
		}
	}
	r.fixtures["CORE"].Ctl(t, `{"mode":"normal","reset":true}`)
	for _, h := range r.hubs {
		conn := hubtest.Dial(t, h.Addr())
		proctest.Eventually(t, 3*time.Second, h.id+" probes CORE and closes", func() bool {
			return conn.Exchange(txFor("CORE", "p")).Code == "0000" && h.of(t, "CORE").State == "CLOSED"
		})
	}
	assert.Equal(t, int64(len(r.hubs)), r.fixtures["CORE"].SettledStats(t).Calls, "one probe of CORE per hub")

	// When the shard is back, empty, every hub shares CORE again: A's trip
	// reaches B and C.
	cl.Restart(replica)
	cl.Restart(m)
	t.Logf("every hub shares every target again %v after CORE's shard came back", r.waitConnected(t, 10*time.Second))
	for _, h := range r.hubs {
		assert.False(t, h.of(t, "CORE").Fleet.Alone, "%s: CORE's shard is back", h.id)
	}
	r.trip(t, a, "CORE")
	t.Logf("CORE's trip on a adopted by b and c within %v", r.waitAdopted(t, "CORE", "a", b, c))
}
