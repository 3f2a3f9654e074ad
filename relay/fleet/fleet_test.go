package fleet_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/fleet"
)

// These tests run hubs' breakers (without the rest of a hub) against a real
// redis-server, on the system clock with short periods: the fleet's loops
// run on real time.

// hub is one hub of a test fleet: its breaker for CORE and its Fleet.
type hub struct {
	id    string
	b     *breaker.Breaker
	fl    *fleet.Fleet
	reg   *prometheus.Registry
	trans *hubtest.Transitions
}

// Breaker implements fleet.Hub.
func (h *hub) Breaker(name string) *breaker.Breaker {
	if name == "CORE" {
		return h.b
	}
	return nil
}

// startHub starts a hub named id sharing its CORE breaker (threshold 2,
// the given reset timeout) through the store at url.
func startHub(t *testing.T, url, id string, reset time.Duration) *hub {
	t.Helper()
	return startHubLease(t, url, id, reset, time.Second)
}

// startHubLease is startHub with the breaker's probe timeout, which is
// the fleet's probe lease.
func startHubLease(t *testing.T, url, id string, reset, lease time.Duration) *hub {
	t.Helper()
	h := &hub{id: id, reg: prometheus.NewRegistry(), trans: &hubtest.Transitions{}}
	fl, err := fleet.New(fleet.Config{
		Store:          url,
		HubID:          id,
		Targets:        []string{"CORE"},
		Logger:         zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		Registerer:     h.reg,
		ResyncInterval: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	h.fl = fl
	h.b = breaker.New(breaker.Settings{
		Name:         "CORE",
		Policy:       breaker.Policy{FailThreshold: 2, ResetTimeout: reset},
		ProbePermits: true,
		ProbeTimeout: lease,
		OnTransition: func(tr breaker.Transition) {
			h.trans.Observe(tr)
			fl.Observe(tr)
		},
	})
	require.NoError(t, fl.Start(h))
	t.Cleanup(func() { assert.NoError(t, fl.Close()) })
	return h
}

// startFleet starts one hub per id on the store at url, as startHubLease
// does, and waits until every one reaches the store.
func startFleet(t *testing.T, url string, reset, lease time.Duration, ids ...string) []*hub {
	t.Helper()
	hubs := make([]*hub, len(ids))
	for i, id := range ids {
		hubs[i] = startHubLease(t, url, id, reset, lease)
	}
	for _, h := range hubs {
		eventually(t, h.id+" reaches the store", func() bool { return h.fl.Status().StoreUp })
	}
	return hubs
}

// trip fails two calls on h's breaker, which opens it.
func (h *hub) trip(t *testing.T) {
	t.Helper()
	for range 2 {
		tk, _, err := h.b.Allow()
		require.NoError(t, err)
		h.b.Done(tk, true, 0)
	}
	require.Equal(t, breaker.Open, h.b.Snapshot().State)
}

// eventually waits up to 3 s for cond.
func eventually(t *testing.T, msg string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 3*time.Second, 5*time.Millisecond, msg)
}

func state(h *hub) breaker.State { return h.b.Snapshot().State }

func TestTripSpreadsAndProbeClosesTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	fl := startFleet(t, srv.URL(), 300*time.Millisecond, time.Second, "a", "b", "c")
	a, b, c := fl[0], fl[1], fl[2]

	// Given a fleet of three, when A's breaker trips,
	a.trip(t)

	// then B and C open too, with the same epoch, opened by A.
	for _, h := range []*hub{b, c} {
		eventually(t, h.id+" opens", func() bool { return state(h) == breaker.Open })
	}
	ts, _ := a.fl.Target("CORE")
	assert.Equal(t, fleet.TargetStatus{Name: "CORE", Epoch: 1, OpenedBy: "a", Source: fleet.SourceLocal}, ts)
	ts, _ = b.fl.Target("CORE")
	assert.Equal(t, fleet.TargetStatus{Name: "CORE", Epoch: 1, OpenedBy: "a", Source: fleet.SourceRemote}, ts)

	// When the period ends, exactly one hub gets to probe;
	var probes []*hub
	eventually(t, "one hub admits a probe", func() bool {
		for _, h := range []*hub{a, b, c} {
			if tk, _, err := h.b.Allow(); err == nil {
				require.True(t, tk.Probe())
				probes = append(probes, h)
				h.b.Done(tk, false, 0)
				return true
			}
		}
		return false
	})
	require.Len(t, probes, 1)

	// and its success closes all three.
	for _, h := range []*hub{a, b, c} {
		eventually(t, h.id+" closes", func() bool { return state(h) == breaker.Closed })
	}
	ts, _ = c.fl.Target("CORE")
	assert.Equal(t, int64(2), ts.Epoch)
}

func TestStoreContent(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	a := startHub(t, srv.URL(), "a", time.Minute)
	a.trip(t)
	eventually(t, "the open record is written", func() bool {
		return rdb.Exists(ctx, "rh:{CORE}:open").Val() == 1
	})
	v := rdb.Get(ctx, "rh:{CORE}:open").Val()
	parts := strings.Split(v, "|")
	require.Len(t, parts, 6, v)
	assert.Equal(t, []string{"1", "a", "results", "60000"}, parts[:4])
	assert.Equal(t, "0", parts[5])
	assert.Equal(t, "1", rdb.Get(ctx, "rh:{CORE}:epoch").Val())
	ttl := rdb.PTTL(ctx, "rh:{CORE}:open").Val()
	assert.Greater(t, ttl, 24*time.Hour, "the record outlives its open period")

	require.NoError(t, a.fl.Control("core", relay.ActionOpen))
	eventually(t, "the hold is written", func() bool {
		return strings.HasSuffix(rdb.Get(ctx, "rh:{CORE}:open").Val(), "|1")
	})
	assert.Equal(t, time.Duration(-1), rdb.PTTL(ctx, "rh:{CORE}:open").Val(), "held until told otherwise")
}

func TestStoreDownEachBreakerDecidesAlone(t *testing.T) {
	srv := redistest.Start(t)
	fl := startFleet(t, srv.URL(), 200*time.Millisecond, time.Second, "a", "b")
	a, b := fl[0], fl[1]

	// Given a store killed under the fleet,
	srv.Kill()
	for _, h := range []*hub{a, b} {
		eventually(t, h.id+" sees the store gone", func() bool { return !h.fl.Status().StoreUp })
	}

	// when A trips, B does not hear of it, and A probes on its own once
	// its period has passed.
	a.trip(t)
	eventually(t, "a admits its own probe", func() bool {
		tk, _, err := a.b.Allow()
		if err != nil {
			return false
		}
		require.True(t, tk.Probe())
		a.b.Done(tk, true, 0) // the target is still down: open again
		return true
	})
	assert.Equal(t, breaker.Closed, state(b))

	// When the store comes back, A's open breaker is written again and B
	// adopts it.
	srv.Restart()
	eventually(t, "b adopts a's open breaker", func() bool { return state(b) == breaker.Open })
	ts, _ := b.fl.Target("CORE")
	assert.Equal(t, "a", ts.OpenedBy)
	assert.Equal(t, fleet.SourceRemote, ts.Source)
}

func TestAStoreBehindTheFleetGetsTheOpenBreakerBack(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	// Given a fleet with a history (its epoch is 5, CORE closed) whose
	// breaker A's trip opened at epoch 6,
	require.NoError(t, rdb.Set(ctx, "rh:{CORE}:epoch", "5", 0).Err())
	fl := startFleet(t, srv.URL(), time.Minute, time.Second, "a", "b", "c")
	fl[0].trip(t)
	for _, h := range fl {
		eventually(t, h.id+" opens at epoch 6", func() bool {
			ts, _ := h.fl.Target("CORE")
			return state(h) == breaker.Open && ts.Epoch == 6
		})
	}

	// when the store goes back to what it held before the trip, as a
	// replica promoted before the trip reached it does,
	require.NoError(t, rdb.Set(ctx, "rh:{CORE}:epoch", "5", 0).Err())
	require.NoError(t, rdb.Del(ctx, "rh:{CORE}:open", "rh:{CORE}:probe").Err())

	// then the hubs holding the open breaker write it again, past the
	// epoch they knew, and every hub stays open for the rest of its
	// period: none takes the store's older state for news.
	eventually(t, "the open breaker is written again", func() bool {
		return rdb.Get(ctx, "rh:{CORE}:epoch").Val() == "7" && rdb.Exists(ctx, "rh:{CORE}:open").Val() == 1
	})
	assert.True(t, strings.HasPrefix(rdb.Get(ctx, "rh:{CORE}:open").Val(), "7|"), "the record is of epoch 7")
	for _, h := range fl {
		eventually(t, h.id+" holds epoch 7", func() bool {
			ts, _ := h.fl.Target("CORE")
			return ts.Epoch == 7
		})
		snap := h.b.Snapshot()
		assert.Equal(t, breaker.Open, snap.State, h.id)
		assert.Greater(t, snap.RetryAfter, 50*time.Second, "%s: the period goes on", h.id)
		assert.NotContains(t, h.trans.List(), "CORE:OPEN->CLOSED", "%s never closed", h.id)
	}
}

func TestHammerConverges(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	hubs := startFleet(t, srv.URL(), 20*time.Millisecond, time.Second, "a", "b", "c")

	// Given calls that fail at random on every hub, probes, trips and
	// operators closing breakers, all at once,
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, h := range hubs {
		for g := range 3 {
			wg.Go(func() {
				for n := 0; ; n++ {
					select {
					case <-stop:
						return
					default:
					}
					if tk, _, err := h.b.Allow(); err == nil {
						h.b.Done(tk, (n+g+i)%3 == 0, 0)
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		wg.Go(func() {
			tick := time.NewTicker(70 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				h.b.ForceClose()
				assert.NoError(t, h.fl.Control("CORE", relay.ActionClose))
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	// when the calls succeed from then on, the fleet closes, and every hub
	// knows the store's epoch.
	eventually(t, "the fleet converges, closed", func() bool {
		epoch, err := rdb.Get(context.Background(), "rh:{CORE}:epoch").Int64()
		if err != nil {
			return false
		}
		for _, h := range hubs {
			if tk, _, err := h.b.Allow(); err == nil {
				h.b.Done(tk, false, 0)
			}
		}
		for _, h := range hubs {
			ts, _ := h.fl.Target("CORE")
			if state(h) != breaker.Closed || ts.Epoch != epoch {
				return false
			}
		}
		return true
	})
}

func TestNewRefusesWhatItCannotRun(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, err := fleet.New(fleet.Config{Store: "redis://127.0.0.1:1", HubID: "a", Targets: []string{"CORE"}, Registerer: reg})
	require.NoError(t, err)

	tests := []struct {
		name string
		cfg  fleet.Config
		want string
	}{
		{"no hub id", fleet.Config{Store: "redis://h:1", Targets: []string{"CORE"}}, "hub id"},
		{"bad hub id", fleet.Config{Store: "redis://h:1", HubID: "a|b", Targets: []string{"CORE"}}, "hub id"},
		{"no targets", fleet.Config{Store: "redis://h:1", HubID: "a"}, "no targets"},
		{"lower-case target", fleet.Config{Store: "redis://h:1", HubID: "a", Targets: []string{"core"}}, "canonical"},
		{"target twice", fleet.Config{Store: "redis://h:1", HubID: "a", Targets: []string{"CORE", "CORE"}}, "twice"},
		{"bad store", fleet.Config{Store: "mysql://h:1", HubID: "a", Targets: []string{"CORE"}}, "redis://"},
		{"negative timeout", fleet.Config{Store: "redis://h:1", HubID: "a", Targets: []string{"CORE"}, OpTimeout: -1}, "negative"},
		{"metrics twice", fleet.Config{Store: "redis://h:1", HubID: "a", Targets: []string{"CORE"}, Registerer: reg}, "registered twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := fleet.New(tt.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestStartNeedsEveryBreaker(t *testing.T) {
	fl, err := fleet.New(fleet.Config{Store: "redis://127.0.0.1:1", HubID: "a", Targets: []string{"CORE", "CLAIM"}})
	require.NoError(t, err)
	h := &hub{b: breaker.New(breaker.Settings{Name: "CORE"})}
	assert.ErrorContains(t, fl.Start(h), "no target CLAIM")
	assert.NoError(t, fl.Close())
	assert.ErrorIs(t, fl.Control("NOPE", relay.ActionOpen), relay.ErrUnknownTarget)
	assert.ErrorIs(t, fl.Control("CORE", "explode"), relay.ErrUnknownAction)
}

func TestAnUnusedProbeLeaseMovesOn(t *testing.T) {
	srv := redistest.Start(t)
	fl := startFleet(t, srv.URL(), 100*time.Millisecond, 400*time.Millisecond, "a", "b")
	a, b := fl[0], fl[1]
	lease := func(h *hub) bool { ts, _ := h.fl.Target("CORE"); return ts.ProbeLease }

	// Given a fleet whose open period has passed and one hub holding the
	// probe lease,
	a.trip(t)
	eventually(t, "b adopts the open breaker", func() bool { return state(b) == breaker.Open })
	var winner, other *hub
	eventually(t, "a hub wins the lease", func() bool {
		switch {
		case lease(a):
			winner, other = a, b
		case lease(b):
			winner, other = b, a
		}
		return winner != nil
	})

	// when no request comes to that hub, the lease goes to the other,
	eventually(t, "the lease moves on", func() bool { return lease(other) })

	// and only the other may probe: the first's permit was taken back.
	_, _, err := winner.b.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
	tk, _, err := other.b.Allow()
	require.NoError(t, err)
	require.True(t, tk.Probe())
	other.b.Done(tk, false, 0)
	eventually(t, "the fleet closes", func() bool { return state(a) == breaker.Closed && state(b) == breaker.Closed })
}

func TestSlowStoreEachBreakerDecidesAlone(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	a := startHub(t, srv.URL(), "a", 200*time.Millisecond)
	eventually(t, "a reaches the store", func() bool { return a.fl.Status().StoreUp })

	// Given an open breaker and a store that stops answering for 3 s
	// (CLIENT PAUSE holds every client's commands),
	a.trip(t)
	eventually(t, "the trip is written", func() bool { ts, _ := a.fl.Target("CORE"); return ts.Epoch == 1 })
	require.NoError(t, rdb.Do(context.Background(), "CLIENT", "PAUSE", "3000", "ALL").Err())
	paused := time.Now()

	// when the open period ends, the hub gives up on the store after its
	// command timeout and lets its own breaker probe, long before the store
	// answers again.
	eventually(t, "a probes on its own", func() bool {
		tk, _, err := a.b.Allow()
		if err != nil {
			return false
		}
		a.b.Done(tk, false, 0)
		return true
	})
	assert.Less(t, time.Since(paused), 2*time.Second)
	assert.False(t, a.fl.Status().StoreUp)
	assert.Equal(t, breaker.Closed, state(a))
}

func TestOperatorActionWhileStoreDownReachesTheFleetLater(t *testing.T) {
	srv := redistest.Start(t)
	fl := startFleet(t, srv.URL(), time.Minute, time.Second, "a", "b")
	a, b := fl[0], fl[1]

	// Given a store that is down, when an operator holds CORE open on A,
	srv.Kill()
	eventually(t, "a sees the store gone", func() bool { return !a.fl.Status().StoreUp })
	a.b.HoldOpen()
	require.NoError(t, a.fl.Control("CORE", relay.ActionOpen))
	assert.Equal(t, breaker.Closed, state(b))

	// then B is held too once the store is back.
	srv.Restart()
	eventually(t, "b is held open", func() bool { return b.b.Snapshot().Held })
	ts, _ := b.fl.Target("CORE")
	assert.Equal(t, "a", ts.OpenedBy)
}

func TestAQuietChannelStaysSubscribed(t *testing.T) {
	// Given two hubs (resync 200 ms, so the channel gets a PING after
	// 400 ms of silence) and nothing happening for a second and a half,
	srv := redistest.Start(t)
	fl := startFleet(t, srv.URL(), time.Minute, time.Second, "a", "b")
	a, b := fl[0], fl[1]
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		require.True(t, a.fl.Status().StoreUp && b.fl.Status().StoreUp, "a quiet channel is not a lost one")
	}

	// then a trip still reaches the other hub.
	a.trip(t)
	eventually(t, "b opens", func() bool { return state(b) == breaker.Open })
}

func TestAStepBackOfTheStoreClockHoldsNoPeriodPastTwiceItsLength(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()

	// Given an open record of a 400 ms period written just before the
	// store host's clock stepped an hour back: by the store's clock, its
	// end is an hour and 400 ms away,
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	end := now.Add(time.Hour + 400*time.Millisecond).UnixMilli()
	require.NoError(t, rdb.Set(ctx, "rh:{CORE}:epoch", "1", 0).Err())
	require.NoError(t, rdb.Set(ctx, "rh:{CORE}:open", fmt.Sprintf("1|x|results|400|%d|0", end), 0).Err())

	// when a hub starts on it, it adopts the open period,
	a := startHub(t, srv.URL(), "a", 400*time.Millisecond)
	require.Equal(t, breaker.Open, state(a))
	assert.LessOrEqual(t, a.b.Snapshot().RetryAfter, 800*time.Millisecond, "at most twice the period, not an hour")

	// and once twice the period has passed, it takes the probe lease and
	// admits the probe.
	eventually(t, "a probe is admitted", func() bool {
		tk, _, err := a.b.Allow()
		if err != nil {
			return false
		}
		a.b.Done(tk, true, 0)
		return true
	})
}
