package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/redistest"
)

func TestClusterFailsOverAndADeadShardStopsOnlyItsSlots(t *testing.T) {
	// Given a cluster of three masters with a replica each,
	cl := redistest.StartCluster(t)
	masters := cl.Masters()
	require.Len(t, masters, 3)
	for _, n := range cl.Nodes() {
		assert.Less(t, n.Port(), 65535-10000, "%s: its bus port is a port", n)
	}
	for _, m := range masters {
		role, err := m.Role()
		require.NoError(t, err)
		assert.Equal(t, "master", role)
		r := cl.ReplicaOf(m)
		role, err = r.Role()
		require.NoError(t, err)
		assert.Equal(t, "slave", role, "%s replicates %s", r, m)
	}

	// its URL reaches every shard through go-redis, and a key lands on
	// the master of its hash tag's slot;
	opt, err := redis.ParseClusterURL(cl.URL())
	require.NoError(t, err)
	assert.Len(t, opt.Addrs, 6)
	rdb := redis.NewClusterClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	assert.Equal(t, 13408, cl.KeySlot("rh:{CORE}:epoch"))
	assert.Equal(t, cl.KeySlot("CORE"), cl.KeySlot("rh:{CORE}:tx:T1"))
	for _, key := range []string{"rh:{CORE}:epoch", "rh:{CLAIM}:epoch", "rh:{LOANS}:epoch"} {
		require.NoError(t, rdb.Set(ctx, key, "7", 0).Err())
		master := cl.MasterOfKey(key).Client()
		got, err := master.Get(ctx, key).Result()
		require.NoError(t, err, key)
		assert.Equal(t, "7", got, key)
		// Replication is asynchronous: wait until the replica has it,
		// since the failover below expects it there.
		n, err := master.Do(ctx, "WAIT", 1, 5000).Int()
		require.NoError(t, err, key)
		require.Equal(t, 1, n, "%s reached the replica", key)
	}
	assert.Len(t, map[*redistest.ClusterNode]bool{
		cl.MasterOfKey("rh:{CORE}:epoch"):  true,
		cl.MasterOfKey("rh:{CLAIM}:epoch"): true,
		cl.MasterOfKey("rh:{LOANS}:epoch"): true,
	}, 3, "one target per shard")

	// when CORE's master is killed,
	old := cl.MasterOfKey("rh:{CORE}:epoch")
	replica := cl.ReplicaOf(old)
	pid := old.Pid()
	cl.Kill(old)
	assert.Zero(t, old.Pid())
	assert.NotEqual(t, 0, pid)

	// then its replica takes over, with the data it replicated,
	killed := time.Now()
	promoted := cl.WaitFailover(old)
	t.Logf("failover in %v", time.Since(killed))
	assert.Equal(t, replica, promoted)
	assert.Equal(t, promoted, cl.MasterOfKey("rh:{CORE}:epoch"))
	got, err := promoted.Client().Get(ctx, "rh:{CORE}:epoch").Result()
	require.NoError(t, err)
	assert.Equal(t, "7", got)

	// and the old master, restarted, is its replica.
	cl.Restart(old)
	cl.WaitOK()
	role, err := old.Role()
	require.NoError(t, err)
	assert.Equal(t, "slave", role)
	assert.Equal(t, old, cl.ReplicaOf(promoted))

	// When the shard has no node left, only its slots stop.
	cl.Kill(old)
	cl.Kill(promoted)
	assert.Error(t, rdb.Set(ctx, "rh:{CORE}:epoch", "8", 0).Err())
	assert.NoError(t, rdb.Set(ctx, "rh:{CLAIM}:epoch", "8", 0).Err())
	assert.NoError(t, rdb.Set(ctx, "rh:{LOANS}:epoch", "8", 0).Err())
}
