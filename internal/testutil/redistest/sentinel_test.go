package redistest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/redistest"
)

func TestSentinelFailsOverAndBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.StartSentinel(t)
	first, second := s.Nodes()[0], s.Nodes()[1]
	require.Same(t, first, s.Master())
	require.Same(t, second, s.Replica())

	// The URL is one go-redis takes for Sentinel: sentinels as seeds, the
	// master by name.
	sn := s.Sentinels()
	assert.Equal(t, "redis://"+sn[0].Addr()+"?master_name="+redistest.SentinelMasterName+
		"&addr="+sn[1].Addr()+"&addr="+sn[2].Addr(), s.URL())
	opts, err := redis.ParseFailoverURL(s.URL())
	require.NoError(t, err)
	opts.MaxRetries = -1
	rdb := redis.NewFailoverClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, rdb.Set(ctx, "k", "replicated", 0).Err())
	require.Equal(t, int64(1), first.Client().Do(ctx, "WAIT", 1, 1000).Val(), "the replica has the write")

	// Given a write the master acknowledged while the replica was
	// stalled,
	s.StallReplica()
	require.NoError(t, first.Client().Set(ctx, "k", "lost", 0).Err())

	// when the master is killed, the sentinels promote the replica, which
	// lacks that write.
	began := time.Now()
	require.Same(t, first, s.KillMaster())
	assert.Zero(t, first.Pid())
	require.Same(t, second, s.WaitFailover(first))
	t.Logf("failover took %v", time.Since(began))
	assert.Equal(t, "replicated", second.Client().Get(ctx, "k").Val())
	require.Eventually(t, func() bool { return rdb.Get(ctx, "k").Val() == "replicated" }, 5*time.Second, 10*time.Millisecond,
		"the failover client follows the promotion")
	info := second.Client().Info(ctx, "replication").Val()
	assert.Contains(t, info, "role:master")

	// The old master comes back empty, as the new one's replica,
	s.Restart(first)
	require.Same(t, second, s.Master())
	require.NoError(t, rdb.Set(ctx, "k", "after", 0).Err())
	require.Equal(t, int64(1), second.Client().Do(ctx, "WAIT", 1, 1000).Val())

	// and takes over again, with every write, when the new master dies.
	began = time.Now()
	require.Same(t, second, s.KillMaster())
	require.Same(t, first, s.WaitFailover(second))
	t.Logf("second failover took %v", time.Since(began))
	assert.Equal(t, "after", first.Client().Get(ctx, "k").Val())
	assert.True(t, strings.Contains(first.Client().Info(ctx, "replication").Val(), "role:master"))
}
