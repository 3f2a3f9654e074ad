package fleet_test

import (
	"context"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/fleet"
	"github.com/relayhub/relayhub/relay/protocol"
)

// These tests run the shield's store against a real redis-server. The
// fleet is not started: its store works from New on.

// dedupFixture is a fleet's shield store on its own redis-server, and a
// plain client to look at the store with.
type dedupFixture struct {
	srv   *redistest.Server
	store *fleet.DedupStore
	rdb   *redis.Client
	reg   *prometheus.Registry
	op    time.Duration
}

func newDedup(t *testing.T, opTimeout time.Duration) *dedupFixture {
	t.Helper()
	d := &dedupFixture{srv: redistest.Start(t), reg: prometheus.NewRegistry(), op: opTimeout}
	fl, err := fleet.New(fleet.Config{
		Store:      d.srv.URL(),
		HubID:      "a",
		Targets:    []string{"CORE"},
		Logger:     zerolog.New(zerolog.NewTestWriter(t)),
		Registerer: d.reg,
		OpTimeout:  opTimeout,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, fl.Close()) })
	d.store = fl.Dedup()
	d.rdb = redis.NewClient(&redis.Options{Addr: d.srv.Addr()})
	t.Cleanup(func() { _ = d.rdb.Close() })
	return d
}

func (d *dedupFixture) errors(t *testing.T, kind string) float64 {
	t.Helper()
	return hubtest.MetricSum(t, d.reg, "relay_state_store_errors_total", "kind", kind)
}

func inFlight(hub, payload string) dedup.Record {
	return dedup.Record{State: dedup.InFlight, Hash: dedup.HashPayload([]byte(payload)), Hub: hub}
}

func TestDedupClaimThenClaimAgain(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()

	// Given hub a's claim of CORE's tx-1,
	first := inFlight("a", "pay 10")
	_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", first, time.Minute)
	require.NoError(t, err)
	require.True(t, claimed)

	// when hub b claims it too, with any payload,
	existing, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("b", "pay 20"), time.Minute)

	// then b gets a's record and the store keeps it.
	require.NoError(t, err)
	assert.False(t, claimed)
	assert.Equal(t, first, existing)
	h := first.Hash
	assert.Equal(t, "1|F|"+hex.EncodeToString(h[:])+"|a||", d.rdb.Get(ctx, "rh:{CORE}:tx:tx-1").Val())
	ttl := d.rdb.PTTL(ctx, "rh:{CORE}:tx:tx-1").Val()
	assert.True(t, ttl > 0 && ttl <= time.Minute, "ttl %v", ttl)

	// Another target's tx-1 is another transaction.
	_, claimed, err = d.store.Claim(ctx, "CLAIM", dedup.Scope{}, "tx-1", inFlight("b", "pay 20"), time.Minute)
	require.NoError(t, err)
	assert.True(t, claimed)
}

func TestDedupSettleThenClaim(t *testing.T) {
	for _, st := range []dedup.State{dedup.Answered, dedup.InDoubt} {
		t.Run(st.String(), func(t *testing.T) {
			d := newDedup(t, time.Second)
			ctx := context.Background()

			// Given a claim settled with an answer holding '|' and
			// non-ASCII text,
			rec := inFlight("a", "pay 10")
			_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", rec, time.Minute)
			require.NoError(t, err)
			require.True(t, claimed)
			rec.State, rec.Code, rec.Message = st, "E123", "solde|insuffisant: 10 € — 残高不足 |"
			require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", rec, 10*time.Minute))

			// when a resend is claimed on another hub, it gets the answer.
			existing, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("b", "pay 10"), time.Minute)
			require.NoError(t, err)
			assert.False(t, claimed)
			assert.Equal(t, rec, existing)
			ttl := d.rdb.PTTL(ctx, "rh:{CORE}:tx:tx-1").Val()
			assert.True(t, ttl > time.Minute && ttl <= 10*time.Minute, "the settle's ttl, %v", ttl)
		})
	}
}

func TestDedupSettleTakesOverATransactionInDoubt(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()

	// Given a call in doubt on hub a,
	doubt := dedup.Record{State: dedup.InDoubt, Hash: dedup.HashPayload([]byte("p")), Hub: "a", Code: "E901", Message: "no answer in time"}
	require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", doubt, time.Minute))

	// when hub b learns the target never applied it and takes it over,
	require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("b", "p"), time.Minute))

	// then the fleet sees b's call in flight, and b may release it.
	existing, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("c", "p"), time.Minute)
	require.NoError(t, err)
	assert.False(t, claimed)
	assert.Equal(t, inFlight("b", "p"), existing)
	require.NoError(t, d.store.Release(ctx, "CORE", dedup.Scope{}, "tx-1", "b"))
	assert.Equal(t, int64(0), d.rdb.Exists(ctx, "rh:{CORE}:tx:tx-1").Val())
}

func TestDedupSettleStoresTheAnswerAClientGets(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()

	// A message is kept as it goes out on an answer line: control
	// characters as spaces, cut to the protocol's limit.
	long := strings.Repeat("é", protocol.MaxMessageBytes) // two bytes each
	for msg, want := range map[string]string{
		"line\none\ttab": "line one tab",
		long:             string(protocol.AppendMessage(nil, long)),
	} {
		rec := dedup.Record{State: dedup.Answered, Hub: "a", Code: "0000", Message: msg}
		require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", rec, time.Minute))
		existing, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("b", ""), time.Minute)
		require.NoError(t, err)
		require.False(t, claimed)
		assert.Equal(t, want, existing.Message)
		assert.LessOrEqual(t, len(existing.Message), protocol.MaxMessageBytes)
	}
}

func TestDedupRelease(t *testing.T) {
	settled := inFlight("a", "pay 10")
	settled.State, settled.Code, settled.Message = dedup.Answered, "0000", "ok"
	tests := []struct {
		name   string
		settle bool
		hub    string
		kept   bool
	}{
		{"by the hub that claimed it", false, "a", false},
		{"by another hub", false, "b", true},
		{"by a hub whose name ends the same", false, "xa", true},
		{"once settled", true, "a", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDedup(t, time.Second)
			ctx := context.Background()
			_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "pay 10"), time.Minute)
			require.NoError(t, err)
			require.True(t, claimed)
			if tt.settle {
				require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", settled, time.Minute))
			}

			require.NoError(t, d.store.Release(ctx, "CORE", dedup.Scope{}, "tx-1", tt.hub))

			kept := d.rdb.Exists(ctx, "rh:{CORE}:tx:tx-1").Val() == 1
			assert.Equal(t, tt.kept, kept)
		})
	}

	t.Run("nothing there", func(t *testing.T) {
		d := newDedup(t, time.Second)
		assert.NoError(t, d.store.Release(context.Background(), "CORE", dedup.Scope{}, "tx-1", "a"))
	})
}

func TestDedupRecordsExpire(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()

	// Given a claim kept for 50 ms and an answer kept for 50 ms,
	_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "p"), 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, claimed)
	ans := dedup.Record{State: dedup.Answered, Hub: "a", Code: "0000"}
	require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-2", ans, 50*time.Millisecond))
	for _, key := range []string{"rh:{CORE}:tx:tx-1", "rh:{CORE}:tx:tx-2"} {
		ttl := d.rdb.PTTL(ctx, key).Val()
		assert.True(t, ttl > 0 && ttl <= 50*time.Millisecond, "%s ttl %v", key, ttl)
	}

	// then both can be claimed afresh once they have expired.
	for _, txid := range []string{"tx-1", "tx-2"} {
		require.Eventually(t, func() bool {
			_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, txid, inFlight("b", "p"), time.Minute)
			require.NoError(t, err)
			return claimed
		}, 3*time.Second, 5*time.Millisecond, txid)
	}
}

func TestDedupRefusesWhatIsNotARecord(t *testing.T) {
	hash := strings.Repeat("0f", 16)
	tests := []struct {
		name string
		set  func(ctx context.Context, rdb *redis.Client, key string) error
	}{
		{"garbage", setTo("hello")},
		{"empty", setTo("")},
		{"another version", setTo("2|F|" + hash + "|a||")},
		{"unknown state", setTo("1|X|" + hash + "|a||")},
		{"short hash", setTo("1|F|" + hash[:30] + "|a||")},
		{"upper-case hash", setTo("1|F|" + strings.Repeat("AB", 16) + "|a||")},
		{"not hex", setTo("1|F|" + strings.Repeat("zz", 16) + "|a||")},
		{"bad hub", setTo("1|F|" + hash + "|a b||")},
		{"empty hub", setTo("1|F|" + hash + "|||")},
		{"in flight with an answer", setTo("1|F|" + hash + "|a|0000|ok")},
		{"answered without a code", setTo("1|A|" + hash + "|a||ok")},
		{"answered with a bad code", setTo("1|A|" + hash + "|a|OK|ok")},
		{"too few fields", setTo("1|A|" + hash + "|a")},
		{"message too long", setTo("1|A|" + hash + "|a|0000|" + strings.Repeat("x", protocol.MaxMessageBytes+1))},
		{"far too long", setTo("1|A|" + hash + "|a|0000|" + strings.Repeat("x", 1<<20))},
		{"a list", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.RPush(ctx, key, "1|F|"+hash+"|a||").Err()
		}},
		{"a hash", func(ctx context.Context, rdb *redis.Client, key string) error {
			return rdb.HSet(ctx, key, "state", "F").Err()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDedup(t, time.Second)
			ctx := context.Background()
			const key = "rh:{CORE}:tx:tx-1"
			require.NoError(t, tt.set(ctx, d.rdb, key))

			// A claim is refused with an error, and claims nothing;
			_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "p"), time.Minute)
			require.ErrorIs(t, err, fleet.ErrBadDedupRecord)
			assert.False(t, claimed)
			assert.Equal(t, 1.0, d.errors(t, "content"))
			assert.Equal(t, 0.0, d.errors(t, "command"))
			// a release leaves it;
			require.NoError(t, d.store.Release(ctx, "CORE", dedup.Scope{}, "tx-1", "a"))
			assert.Equal(t, int64(1), d.rdb.Exists(ctx, key).Val())
			// a settle overwrites it.
			ans := dedup.Record{State: dedup.Answered, Hub: "a", Code: "0000", Message: "ok"}
			require.NoError(t, d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", ans, time.Minute))
			existing, _, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("b", "p"), time.Minute)
			require.NoError(t, err)
			assert.Equal(t, ans, existing)
		})
	}
}

func setTo(v string) func(context.Context, *redis.Client, string) error {
	return func(ctx context.Context, rdb *redis.Client, key string) error {
		return rdb.Set(ctx, key, v, 0).Err()
	}
}

func TestDedupStoreDown(t *testing.T) {
	const op = 200 * time.Millisecond
	d := newDedup(t, op)
	ctx := context.Background()
	_, _, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-0", inFlight("a", "p"), time.Minute)
	require.NoError(t, err, "a pooled connection, for the kill to reset")

	// Given a store killed under the hub, every command fails, well within
	// a few command timeouts.
	d.srv.Kill()
	ans := dedup.Record{State: dedup.Answered, Hub: "a", Code: "0000"}
	calls := map[string]func() error{
		"claim": func() error {
			_, _, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "p"), time.Minute)
			return err
		},
		"settle":  func() error { return d.store.Settle(ctx, "CORE", dedup.Scope{}, "tx-1", ans, time.Minute) },
		"release": func() error { return d.store.Release(ctx, "CORE", dedup.Scope{}, "tx-1", "a") },
	}
	for name, call := range calls {
		start := time.Now()
		assert.Error(t, call(), name)
		assert.Less(t, time.Since(start), 5*op, name)
	}
	assert.Equal(t, 3.0, d.errors(t, "command"))
}

func TestDedupSlowStore(t *testing.T) {
	const op = 200 * time.Millisecond
	d := newDedup(t, op)
	ctx := context.Background()

	// Given a store that stops answering for 2 s (CLIENT PAUSE holds every
	// client's commands),
	require.NoError(t, d.rdb.Do(ctx, "CLIENT", "PAUSE", "2000", "ALL").Err())

	// a claim gives up after its command timeout, long before the store
	// answers again.
	start := time.Now()
	_, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "p"), time.Minute)
	assert.Error(t, err)
	assert.False(t, claimed)
	assert.Less(t, time.Since(start), 5*op)
	assert.Equal(t, 1.0, d.errors(t, "command"))
}

func TestDedupCallersContext(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	// A call given up by its caller fails, and is not the store's failure.
	_, _, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-1", inFlight("a", "p"), time.Minute)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 0.0, d.errors(t, "command"))
}

func TestDedupRefusesBadArguments(t *testing.T) {
	fl, err := fleet.New(fleet.Config{Store: "redis://127.0.0.1:1", HubID: "a", Targets: []string{"CORE"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = fl.Close() })
	s := fl.Dedup()
	ctx := context.Background()
	ans := dedup.Record{State: dedup.Answered, Hub: "a", Code: "0000"}
	claim := func(target, txid string, rec dedup.Record, ttl time.Duration) func() error {
		return func() error { _, _, err := s.Claim(ctx, target, dedup.Scope{}, txid, rec, ttl); return err }
	}
	settle := func(target, txid string, rec dedup.Record, ttl time.Duration) func() error {
		return func() error { return s.Settle(ctx, target, dedup.Scope{}, txid, rec, ttl) }
	}
	tests := []struct {
		name string
		call func() error
	}{
		{"lower-case target", claim("core", "tx-1", inFlight("a", "p"), time.Minute)},
		{"target breaking the hash tag", claim("CO}RE", "tx-1", inFlight("a", "p"), time.Minute)},
		{"empty target", claim("", "tx-1", inFlight("a", "p"), time.Minute)},
		{"empty txid", claim("CORE", "", inFlight("a", "p"), time.Minute)},
		{"txid with '|'", claim("CORE", "a|b", inFlight("a", "p"), time.Minute)},
		{"txid too long", claim("CORE", strings.Repeat("x", 65), inFlight("a", "p"), time.Minute)},
		{"claim of an answer", claim("CORE", "tx-1", ans, time.Minute)},
		{"claim with an answer", claim("CORE", "tx-1", dedup.Record{State: dedup.InFlight, Hub: "a", Code: "0000"}, time.Minute)},
		{"claim by a bad hub", claim("CORE", "tx-1", inFlight("a|b", "p"), time.Minute)},
		{"claim for no time", claim("CORE", "tx-1", inFlight("a", "p"), 0)},
		{"settle in flight with an answer", settle("CORE", "tx-1", dedup.Record{State: dedup.InFlight, Hub: "a", Code: "0000"}, time.Minute)},
		{"settle absent", settle("CORE", "tx-1", dedup.Record{Hub: "a", Code: "0000"}, time.Minute)},
		{"settle without a code", settle("CORE", "tx-1", dedup.Record{State: dedup.Answered, Hub: "a"}, time.Minute)},
		{"settle with a code holding '|'", settle("CORE", "tx-1", dedup.Record{State: dedup.Answered, Hub: "a", Code: "0|00"}, time.Minute)},
		{"settle for a negative time", settle("CORE", "tx-1", ans, -time.Second)},
		{"release by a bad hub", func() error { return s.Release(ctx, "CORE", dedup.Scope{}, "tx-1", "") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Error(t, tt.call())
		})
	}
}

func TestDedupClaimHammer(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()

	// Given 8 hubs racing to claim each of 20 transactions, exactly one
	// wins each, and every other gets the winner's record.
	const hubs, txs = 8, 20
	type result struct {
		hub      string
		claimed  bool
		existing dedup.Record
		err      error
	}
	results := make([][hubs]result, txs)
	var wg sync.WaitGroup
	for h := range hubs {
		wg.Go(func() {
			hub := string(rune('a' + h))
			for tx := range txs {
				existing, claimed, err := d.store.Claim(ctx, "CORE", dedup.Scope{}, "tx-"+string(rune('a'+tx)), inFlight(hub, "p"), time.Minute)
				results[tx][h] = result{hub, claimed, existing, err}
			}
		})
	}
	wg.Wait()
	for tx, rs := range results {
		var winner string
		for _, r := range rs {
			require.NoError(t, r.err)
			if r.claimed {
				require.Empty(t, winner, "tx %d claimed twice", tx)
				winner = r.hub
			}
		}
		require.NotEmpty(t, winner, "tx %d claimed by none", tx)
		for _, r := range rs {
			if !r.claimed {
				assert.Equal(t, inFlight(winner, "p"), r.existing)
			}
		}
	}
}

func TestDedupClientScopesHaveKeysOfTheirOwn(t *testing.T) {
	d := newDedup(t, time.Second)
	ctx := context.Background()
	a, b := dedup.ClientScope("spiffe://bank/branch-a"), dedup.ClientScope("spiffe://bank/branch-b")

	// Given tx-1 claimed by branch a, by branch b and without a scope,
	for _, scope := range []dedup.Scope{a, b, {}} {
		_, claimed, err := d.store.Claim(ctx, "CORE", scope, "tx-1", inFlight("a", "pay 10"), time.Minute)
		require.NoError(t, err)
		require.True(t, claimed, "each scope claims tx-1 for itself")
	}

	// then each is a key of its own, named by the identity's hash and
	// never by the identity,
	idA, _ := a.Client()
	idB, _ := b.Client()
	keys, err := d.rdb.Keys(ctx, "rh:{CORE}:*").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{
		"rh:{CORE}:idtx:" + hex.EncodeToString(idA[:]) + ":tx-1",
		"rh:{CORE}:idtx:" + hex.EncodeToString(idB[:]) + ":tx-1",
		"rh:{CORE}:tx:tx-1",
	}, keys)

	// and releasing a's leaves the others.
	require.NoError(t, d.store.Release(ctx, "CORE", a, "tx-1", "a"))
	keys, err = d.rdb.Keys(ctx, "rh:{CORE}:*").Result()
	require.NoError(t, err)
	assert.Len(t, keys, 2)
	_, claimed, err := d.store.Claim(ctx, "CORE", a, "tx-1", inFlight("b", "pay 20"), time.Minute)
	require.NoError(t, err)
	assert.True(t, claimed)
}
