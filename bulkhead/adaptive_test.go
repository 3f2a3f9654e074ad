package bulkhead_test

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/bulkhead"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

// load drives an Adaptive on a fake clock: rate calls a second, each
// admitted with the given calls in flight, for d.
type load struct {
	t   *testing.T
	a   *bulkhead.Adaptive
	clk *fakeclock.Clock
	// changes are the moves Record reported, in order.
	changes []bulkhead.Change
}

func newLoad(t *testing.T, s bulkhead.AdaptiveSettings) *load {
	return &load{t: t, a: bulkhead.NewAdaptive(s), clk: fakeclock.New(time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC))}
}

// run records rate calls a second for d, each ending as o after latency,
// with inflight calls in flight (capped at the limit, as an enforcing
// bulkhead would), and checks the limit stays within [lo, hi].
func (l *load) run(d time.Duration, rate int, o bulkhead.Outcome, latency time.Duration, inflight int, lo, hi int) {
	l.t.Helper()
	l.runTarget(d, rate, o, func(int) time.Duration { return latency }, inflight, lo, hi)
}

// runTarget is run with a latency that depends on the calls in flight.
func (l *load) runTarget(d time.Duration, rate int, o bulkhead.Outcome, latency func(inflight int) time.Duration, inflight int, lo, hi int) {
	l.t.Helper()
	step := time.Second / time.Duration(rate)
	for end := l.clk.Now().Add(d); l.clk.Now().Before(end); {
		l.clk.Advance(step)
		n := min(inflight, l.a.Limit())
		if ch, ok := l.a.Record(l.clk.Now(), o, latency(n), n); ok {
			l.changes = append(l.changes, ch)
		}
		require.GreaterOrEqual(l.t, l.a.Limit(), lo)
		require.LessOrEqual(l.t, l.a.Limit(), hi)
	}
}

func TestAdaptiveLimitStartsAtTheCeiling(t *testing.T) {
	a := bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 64})
	assert.Equal(t, 64, a.Limit())
	assert.Equal(t, 3, bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 3, Min: 5}).Limit(), "a floor above the ceiling is the ceiling")
	assert.Panics(t, func() { bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{}) })
	assert.Panics(t, func() { bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 4, Min: -1}) })
}

// workers is a target of n workers that each take service for a call:
// past n calls in flight, calls queue inside it.
func workers(n int, service time.Duration) func(int) time.Duration {
	return func(inflight int) time.Duration {
		return service * time.Duration(max(inflight, n)) / time.Duration(n)
	}
}

func TestAdaptiveLimitFallsWhenLatencyRises(t *testing.T) {
	// Given a target of 64 workers answering in 20 ms, 64 calls in flight,
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64})
	l.runTarget(5*time.Second, 200, bulkhead.Answered, workers(64, 20*time.Millisecond), 64, 64, 64)

	// when its capacity falls to 16 workers, so that calls queue in it
	// (80 ms at 64 in flight),
	l.runTarget(10*time.Second, 200, bulkhead.Answered, workers(16, 20*time.Millisecond), 64, 2, 64)

	// then the limit falls to what it takes within the tolerance, saying
	// why.
	assert.Less(t, l.a.Limit(), 32)
	assert.GreaterOrEqual(t, l.a.Limit(), 16)
	require.NotEmpty(t, l.changes)
	assert.Equal(t, "latency rose", l.changes[0].Reason)
	assert.Equal(t, 20*time.Millisecond, l.changes[0].Baseline)
	assert.Equal(t, 80*time.Millisecond, l.changes[0].Recent)
}

func TestAdaptiveLimitFallsWhenEveryCallTimesOut(t *testing.T) {
	// Given a healthy target,
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64, Min: 4})
	l.run(2*time.Second, 100, bulkhead.Answered, 20*time.Millisecond, 64, 64, 64)

	// when every call ends in doubt, no latency sample at all,
	// (windows close at the first call after their end: 10 ms past a
	// second, the second one has),
	before := l.a.Limit()
	l.run(time.Second+10*time.Millisecond, 100, bulkhead.Overloaded, 0, 64, 4, 64)

	// then the limit is cut every window (×0.9), never frozen,
	require.Len(t, l.changes, 2)
	assert.Equal(t, bulkhead.Change{From: before, To: 58, Reason: "calls in doubt", Baseline: 20 * time.Millisecond}, l.changes[0])
	assert.Equal(t, bulkhead.Change{From: 58, To: 52, Reason: "calls in doubt", Baseline: 20 * time.Millisecond}, l.changes[1])

	// down to the floor, and no lower.
	l.run(30*time.Second, 100, bulkhead.Overloaded, 0, 64, 4, 64)
	assert.Equal(t, 4, l.a.Limit())
}

func TestAdaptiveLimitRecoversWithinAFewWindows(t *testing.T) {
	// Given a limit cut to the floor by a target that timed out,
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64})
	l.run(time.Second, 100, bulkhead.Answered, 20*time.Millisecond, 40, 2, 64)
	l.run(20*time.Second, 100, bulkhead.Overloaded, 0, 40, 2, 64)
	require.Equal(t, 2, l.a.Limit())

	// when the target answers at its old pace again, with a demand of 40
	// calls in flight,
	l.changes = nil
	l.run(5*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 40, 2, 64)

	// then within a few windows the limit covers the demand,
	windows := 0
	for _, ch := range l.changes {
		windows++
		if ch.To >= 40 {
			break
		}
	}
	assert.GreaterOrEqual(t, l.a.Limit(), 40)
	assert.LessOrEqual(t, windows, 8, "windows until the demand fits: %+v", l.changes)

	// and grows no further than the demand needs.
	settled := l.a.Limit()
	l.run(10*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 40, 2, 64)
	assert.Equal(t, settled, l.a.Limit())
	assert.Less(t, settled, 64)

	// A demand beyond the ceiling takes it to the ceiling, no further.
	l.run(5*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 500, 2, 64)
	assert.Equal(t, 64, l.a.Limit())
}

func TestAdaptiveLimitBaselineDoesNotDriftInALongIncident(t *testing.T) {
	// Given a target at 20 ms,
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64})
	l.run(2*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 64, 64, 64)

	// when it answers in 100 ms for ten minutes, with calls in doubt among
	// its answers,
	for range 600 {
		l.run(450*time.Millisecond, 200, bulkhead.Answered, 100*time.Millisecond, 64, 2, 64)
		l.run(50*time.Millisecond, 200, bulkhead.Overloaded, 0, 64, 2, 64)
	}
	low := l.a.Limit()
	require.Less(t, low, 16)

	// then it is still measured against 20 ms: back at 20 ms, the limit
	// grows again to the demand.
	l.changes = nil
	l.run(5*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 64, 2, 64)
	assert.Equal(t, 64, l.a.Limit())
	require.NotEmpty(t, l.changes)
	assert.Equal(t, 20*time.Millisecond, l.changes[len(l.changes)-1].Baseline)
}

func TestAdaptiveLimitRelearnsATargetSlowerForGood(t *testing.T) {
	// Given a target at 20 ms that becomes 100 ms for good, whatever the
	// load (no call in doubt),
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64})
	l.run(2*time.Second, 200, bulkhead.Answered, 20*time.Millisecond, 64, 64, 64)
	l.run(30*time.Second, 200, bulkhead.Answered, 100*time.Millisecond, 64, 2, 64)

	// then the limit does not stay at the floor refusing it: the floor
	// takes 100 ms as its pace, and the limit grows back to the demand.
	assert.Equal(t, 64, l.a.Limit())
}

func TestAdaptiveWindowsCloseByTimeAtLowTraffic(t *testing.T) {
	// Given 20 calls a second (one every 50 ms) and 500 ms windows,
	l := newLoad(t, bulkhead.AdaptiveSettings{Max: 64, Window: 500 * time.Millisecond})
	l.run(time.Second, 20, bulkhead.Answered, 20*time.Millisecond, 64, 64, 64)

	// when every call ends in doubt for two seconds (and one call more,
	// which closes the last window),
	l.run(2*time.Second+50*time.Millisecond, 20, bulkhead.Overloaded, 0, 64, 2, 64)

	// then each 500 ms window moved the limit once: four cuts.
	assert.Len(t, l.changes, 4)
}

func TestAdaptiveLimitStaysWithinBounds(t *testing.T) {
	// Given any mix of outcomes, latencies and demand,
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		s := bulkhead.AdaptiveSettings{Max: 1 + rng.IntN(200), Min: rng.IntN(10)}
		floor := s.Min
		if floor == 0 {
			floor = bulkhead.DefaultMinInflight
		}
		floor = min(floor, s.Max)
		l := newLoad(t, s)
		for range 2000 {
			l.clk.Advance(time.Duration(rng.IntN(100)) * time.Millisecond)
			o := bulkhead.Outcome(rng.IntN(2))
			l.a.Record(l.clk.Now(), o, time.Duration(rng.IntN(1000))*time.Millisecond, rng.IntN(300))
			// then the limit never leaves [floor, ceiling].
			require.LessOrEqual(t, l.a.Limit(), s.Max)
			require.GreaterOrEqual(t, l.a.Limit(), floor)
		}
	}
}

func TestAdaptiveHammer(t *testing.T) {
	a := bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 32, Min: 2, Window: time.Millisecond})
	start := time.Now()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				now := start.Add(time.Duration(i) * 100 * time.Microsecond)
				o := bulkhead.Answered
				if (i+g)%7 == 0 {
					o = bulkhead.Overloaded
				}
				a.Record(now, o, time.Duration(i%50)*time.Millisecond, i%40)
				l := a.Limit()
				if l < 2 || l > 32 {
					t.Errorf("limit %d out of [2, 32]", l)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestAdaptiveRecordDoesNotAllocate(t *testing.T) {
	a := bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 32})
	now := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		a.Record(now, bulkhead.Answered, 5*time.Millisecond, 10)
	})
	assert.Zero(t, allocs)
}

func BenchmarkAdaptiveRecord(b *testing.B) {
	a := bulkhead.NewAdaptive(bulkhead.AdaptiveSettings{Max: 32})
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(10 * time.Microsecond)
		a.Record(now, bulkhead.Answered, 5*time.Millisecond, 10)
	}
}
