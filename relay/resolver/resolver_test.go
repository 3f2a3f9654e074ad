package resolver_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/relay/resolver"
)

var t0 = time.Date(2026, 12, 1, 17, 30, 0, 0, time.UTC)

// settlements records what the resolver settled. Safe for concurrent use.
type settlements struct {
	mu  sync.Mutex
	got []resolver.Settlement
}

func (s *settlements) Settled(x resolver.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, x)
}

func (s *settlements) all() []resolver.Settlement {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]resolver.Settlement(nil), s.got...)
}

// gate is a target's breaker and bulkhead as a test sets them.
type gate struct {
	closed   atomic.Bool // the breaker is open: nothing allowed
	slots    atomic.Int64
	acquires atomic.Int64
}

var _ resolver.Gate = (*gate)(nil)

func newGate(slots int64) *gate {
	g := &gate{}
	g.slots.Store(slots)
	return g
}

func (g *gate) Allow() bool { return !g.closed.Load() }

func (g *gate) TryAcquire() bool {
	if g.slots.Add(-1) < 0 {
		g.slots.Add(1)
		return false
	}
	g.acquires.Add(1)
	return true
}

func (g *gate) Release() { g.slots.Add(1) }

// half is a jitter source always at the middle.
func half() float64 { return 0.5 }

func newResolver(t *testing.T, policy resolver.Policy, g resolver.Gate) (*resolver.Resolver, *settlements) {
	t.Helper()
	s := &settlements{}
	r := resolver.New(resolver.Config{Settler: s, Rand: half})
	r.Configure("CORE", resolver.Target{
		Policy: policy, ResolveAfter: 5 * time.Second, MaxInterval: time.Minute, Expire: time.Hour, Gate: g,
	})
	return r, s
}

func add(t *testing.T, r *resolver.Resolver, txid string, since time.Time) {
	t.Helper()
	require.True(t, r.Add(resolver.Entry{Target: "CORE", TxID: txid, Since: since}))
}

func TestScheduleBacksOffWithJitterUpToTheCap(t *testing.T) {
	clk := fakeclock.New(t0)
	r, s := newResolver(t, resolver.PolicyLookup, nil)
	// Given W1 in doubt since t0
	add(t, r, "W1", t0)

	// Then its first attempt is resolve_after later, and not before
	next, ok := r.Next()
	require.True(t, ok)
	assert.Equal(t, t0.Add(5*time.Second), next)
	clk.Advance(4 * time.Second)
	assert.Empty(t, r.Due(clk.Now()))

	// And each retry waits the doubled interval, three quarters of it with
	// the jitter at its middle, capped at resolve_max_interval
	var waits []time.Duration
	for n := 1; n <= 6; n++ {
		next, _ := r.Next()
		clk.Set(next)
		due := r.Due(clk.Now())
		require.Len(t, due, 1)
		assert.Equal(t, n, due[0].N)
		_, ok := r.Next()
		assert.False(t, ok, "nothing to wake for while the attempt is in flight")
		r.Done(due[0], resolver.Retry, clk.Now())
		following, _ := r.Next()
		waits = append(waits, following.Sub(clk.Now()))
	}
	q := func(d time.Duration) time.Duration { return d * 3 / 4 }
	assert.Equal(t, []time.Duration{q(5 * time.Second), q(10 * time.Second), q(20 * time.Second), q(40 * time.Second), q(time.Minute), q(time.Minute)}, waits)
	assert.Empty(t, s.all())
}

func TestJitterComesFromTheInjectedSource(t *testing.T) {
	for _, tt := range []struct {
		name string
		rand float64
		want time.Duration
	}{
		{"lowest", 0, 5 * time.Second},
		{"highest", 0.999999, 10 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := resolver.New(resolver.Config{Settler: &settlements{}, Rand: func() float64 { return tt.rand }})
			r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup, ResolveAfter: 10 * time.Second})
			add(t, r, "W1", t0)
			due := r.Due(t0.Add(10 * time.Second))
			require.Len(t, due, 1)
			r.Done(due[0], resolver.Retry, t0.Add(10*time.Second))
			next, _ := r.Next()
			assert.InDelta(t, float64(tt.want), float64(next.Sub(t0.Add(10*time.Second))), float64(time.Millisecond))
		})
	}
}

func TestLookupOutcomes(t *testing.T) {
	tests := []struct {
		name    string
		result  resolver.Result
		outcome resolver.Outcome
		code    string
	}{
		{"applied, with the target's code", resolver.LookupResult(true, "B201", ""), resolver.Applied, "B201"},
		{"explicitly not applied", resolver.LookupResult(false, "", ""), resolver.NotApplied, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, s := newResolver(t, resolver.PolicyLookup, nil)
			add(t, r, "W1", t0)
			due := r.Due(t0.Add(5 * time.Second))
			require.Len(t, due, 1)
			assert.Equal(t, resolver.PolicyLookup, due[0].Policy)
			r.Done(due[0], tt.result, t0.Add(6*time.Second))
			require.Len(t, s.all(), 1)
			got := s.all()[0]
			assert.Equal(t, "W1", got.TxID)
			assert.Equal(t, tt.outcome, got.Outcome)
			assert.Equal(t, tt.code, got.Code)
			assert.Equal(t, resolver.ViaLookup, got.Via)
			assert.Equal(t, 1, got.Attempts)
			assert.Equal(t, t0.Add(6*time.Second), got.At)
			assert.Zero(t, r.Stats("CORE").Open)
			_, ok := r.Next()
			assert.False(t, ok)
		})
	}
}

func TestReversalResult(t *testing.T) {
	for code, reversed := range map[string]bool{
		"0000": true, "B404": true, "B201": true,
		"E500": false, "E901": false, "E902": false, "E400": false, "": false, "Bxyz": false, "00000": false,
	} {
		t.Run(code, func(t *testing.T) {
			r, s := newResolver(t, resolver.PolicyReverse, nil)
			add(t, r, "W2", t0)
			due := r.Due(t0.Add(5 * time.Second))
			require.Len(t, due, 1)
			r.Done(due[0], resolver.ReversalResult(code), t0.Add(5*time.Second))
			if !reversed {
				assert.Empty(t, s.all())
				assert.Equal(t, 1, r.Stats("CORE").Open)
				return
			}
			require.Len(t, s.all(), 1)
			assert.Equal(t, resolver.Reversed, s.all()[0].Outcome)
			assert.Equal(t, code, s.all()[0].Code)
			assert.Equal(t, resolver.ViaReversal, s.all()[0].Via)
		})
	}
}

func TestReversalsGoOneAtATimeOldestFirst(t *testing.T) {
	r, s := newResolver(t, resolver.PolicyReverse, nil)
	// Given three entries, added out of order
	add(t, r, "W2", t0.Add(time.Second))
	add(t, r, "W1", t0)
	add(t, r, "W3", t0.Add(2*time.Second))
	now := t0.Add(time.Minute)

	// When all are due, only the oldest goes out, and nothing more while it
	// is in flight
	due := r.Due(now)
	require.Len(t, due, 1)
	assert.Equal(t, "W1", due[0].TxID)
	assert.Empty(t, r.Due(now))

	// And its retry is attempt 2, a retransmission, still before the others
	r.Done(due[0], resolver.Retry, now)
	now = now.Add(time.Minute)
	due = r.Due(now)
	require.Len(t, due, 1)
	assert.Equal(t, "W1", due[0].TxID)
	assert.Equal(t, 2, due[0].N)

	// Then once it is reversed, the next oldest goes, as attempt 1
	r.Done(due[0], resolver.ReversalResult("0000"), now)
	due = r.Due(now)
	require.Len(t, due, 1)
	assert.Equal(t, "W2", due[0].TxID)
	assert.Equal(t, 1, due[0].N)
	require.Len(t, s.all(), 1)
	assert.Equal(t, 2, s.all()[0].Attempts)
}

func TestExpiry(t *testing.T) {
	for _, tt := range []struct {
		policy resolver.Policy
		via    string
	}{{resolver.PolicyLookup, resolver.ViaLookup}, {resolver.PolicyReverse, resolver.ViaReversal}} {
		t.Run(string(tt.policy), func(t *testing.T) {
			r, s := newResolver(t, tt.policy, nil)
			add(t, r, "W1", t0)
			due := r.Due(t0.Add(5 * time.Second))
			require.Len(t, due, 1)

			// Given an attempt in flight at the expiry, the entry waits for it
			assert.Empty(t, r.Due(t0.Add(time.Hour)))
			assert.Empty(t, s.all())
			r.Done(due[0], resolver.Retry, t0.Add(time.Hour))

			// Then it is given up at the next Due, which Next points at
			next, ok := r.Next()
			require.True(t, ok)
			assert.Equal(t, t0.Add(time.Hour), next)
			assert.Empty(t, r.Due(next))
			require.Len(t, s.all(), 1)
			got := s.all()[0]
			assert.Equal(t, resolver.Expired, got.Outcome)
			assert.Equal(t, tt.via, got.Via)
			assert.Equal(t, 1, got.Attempts)
			assert.Zero(t, r.Stats("CORE").Open)
		})
	}
}

func TestPausedWhileTheBreakerIsOpen(t *testing.T) {
	g := newGate(1)
	r, _ := newResolver(t, resolver.PolicyLookup, g)
	add(t, r, "W1", t0)

	// Given the target's breaker open
	g.closed.Store(true)
	now := t0.Add(5 * time.Second)

	// Then no attempt goes, and no slot is taken; the entry waits
	assert.Empty(t, r.Due(now))
	assert.Zero(t, g.acquires.Load())
	now = now.Add(time.Minute)
	assert.Empty(t, r.Due(now))

	// When the breaker closes, attempts resume at the next check
	g.closed.Store(false)
	next, _ := r.Next()
	assert.False(t, next.After(now.Add(5*time.Second)))
	due := r.Due(now.Add(5 * time.Second))
	require.Len(t, due, 1)
	assert.Equal(t, 1, due[0].N, "paused turns are not attempts")
}

func TestAnAttemptTakesABulkheadSlot(t *testing.T) {
	g := newGate(1)
	r, _ := newResolver(t, resolver.PolicyLookup, g)
	add(t, r, "W1", t0)
	add(t, r, "W2", t0)
	now := t0.Add(5 * time.Second)

	// Given one free slot, one attempt goes and the other skips its turn
	due := r.Due(now)
	require.Len(t, due, 1)
	assert.Zero(t, g.slots.Load())
	assert.Empty(t, r.Due(now), "the skipped one waits for its next turn")
	var skipped resolver.EntryState
	for _, e := range r.Open() {
		if e.TxID != due[0].TxID {
			skipped = e
		}
	}
	assert.Zero(t, skipped.Attempts, "a skipped turn is no attempt")
	assert.True(t, skipped.Next.After(now))

	// When the attempt is done, its slot is back for the skipped one
	r.Done(due[0], resolver.LookupResult(true, "0000", ""), now)
	assert.Equal(t, int64(1), g.slots.Load())
	due = r.Due(skipped.Next)
	require.Len(t, due, 1)
	assert.Equal(t, skipped.TxID, due[0].TxID)
	assert.Equal(t, 1, due[0].N)
	r.Done(due[0], resolver.Retry, skipped.Next)
	assert.Equal(t, int64(1), g.slots.Load())
}

func TestManualEntriesWaitForAnOperator(t *testing.T) {
	r, s := newResolver(t, resolver.PolicyManual, nil)
	add(t, r, "W1", t0)
	assert.Empty(t, r.Due(t0.Add(48*time.Hour)), "no attempt, and no expiry")
	assert.Empty(t, s.all())
	_, ok := r.Next()
	assert.False(t, ok)
	assert.Equal(t, resolver.TargetStats{Open: 1, Oldest: t0}, r.Stats("CORE"))
	open := r.Open()
	require.Len(t, open, 1)
	assert.Zero(t, open[0].Next)
	assert.True(t, r.Forget("CORE", "W1"), "an operator or a resend settled it")
	assert.Zero(t, r.Stats("CORE").Open)

	t.Run("an unconfigured target is manual", func(t *testing.T) {
		r := resolver.New(resolver.Config{Settler: s})
		require.True(t, r.Add(resolver.Entry{Target: "CLAIM", TxID: "T1", Since: t0}))
		assert.Empty(t, r.Due(t0.Add(48*time.Hour)))
		assert.Equal(t, resolver.PolicyManual, r.Open()[0].Policy)
	})
}

func TestSettledElsewhereWhileInFlight(t *testing.T) {
	for _, tt := range []struct {
		name   string
		settle func(r *resolver.Resolver) bool
		want   int
	}{
		{"a resend settled it", func(r *resolver.Resolver) bool { return r.Forget("CORE", "W1") }, 0},
		{"its late answer came", func(r *resolver.Resolver) bool { return r.LateAnswer("CORE", "W1", "0000", "", t0.Add(6*time.Second)) }, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := newGate(1)
			r, s := newResolver(t, resolver.PolicyLookup, g)
			add(t, r, "W1", t0)
			due := r.Due(t0.Add(5 * time.Second))
			require.Len(t, due, 1)

			require.True(t, tt.settle(r))

			// Then the attempt's result settles nothing more, and its slot is
			// back
			r.Done(due[0], resolver.LookupResult(false, "", ""), t0.Add(7*time.Second))
			assert.Len(t, s.all(), tt.want)
			if tt.want == 1 {
				assert.Equal(t, resolver.Settlement{Entry: due[0].Entry, Outcome: resolver.Applied, Code: "0000",
					Via: resolver.ViaLateAnswer, Attempts: 1, At: t0.Add(6 * time.Second)}, s.all()[0])
			}
			assert.Equal(t, int64(1), g.slots.Load())
			assert.False(t, tt.settle(r), "settled once")
		})
	}
}

func TestAddIsOncePerTransaction(t *testing.T) {
	r, _ := newResolver(t, resolver.PolicyLookup, nil)
	add(t, r, "W1", t0)
	assert.False(t, r.Add(resolver.Entry{Target: "CORE", TxID: "W1", Since: t0.Add(time.Second)}))
	assert.True(t, r.Add(resolver.Entry{Target: "CLAIM", TxID: "W1", Since: t0}), "another target's W1")
	assert.Equal(t, resolver.TargetStats{Open: 1, Oldest: t0, Next: t0.Add(5 * time.Second)}, r.Stats("CORE"))
}

// TestResolverInParallel hammers one resolver from many goroutines: entries
// added, attempts made and settled, late answers and resends racing them.
// Every entry is settled or forgotten exactly once, and every slot taken
// is given back.
func TestResolverInParallel(t *testing.T) {
	g := newGate(4)
	s := &settlements{}
	r := resolver.New(resolver.Config{Settler: s})
	r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup, ResolveAfter: time.Millisecond, MaxInterval: time.Millisecond, Gate: g})
	r.Configure("CLAIM", resolver.Target{Policy: resolver.PolicyReverse, ResolveAfter: time.Millisecond, MaxInterval: time.Millisecond})
	const perWorker, workers = 200, 4
	var forgotten atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				target := [...]string{"CORE", "CLAIM"}[i%2]
				txid := fmt.Sprintf("W%d-%d", w, i)
				r.Add(resolver.Entry{Target: target, TxID: txid, Since: t0})
				switch i % 7 {
				case 3:
					if r.Forget(target, txid) {
						forgotten.Add(1)
					}
				case 5:
					r.LateAnswer(target, txid, "0000", "", t0)
				}
			}
		})
	}
	for d := range workers {
		wg.Go(func() {
			now := t0
			for n := 0; len(s.all())+int(forgotten.Load()) < workers*perWorker && n < 100000; n++ {
				now = now.Add(resolver.Tick) // attempts fall due on ticks
				for i, a := range r.Due(now) {
					res := resolver.Retry
					if (i+n+d)%3 == 0 {
						res = resolver.LookupResult(true, "0000", "")
						if a.Policy == resolver.PolicyReverse {
							res = resolver.ReversalResult("0000")
						}
					}
					r.Done(a, res, now)
				}
				_, _ = r.Next()
				_ = r.Stats("CLAIM")
			}
		})
	}
	wg.Wait()
	seen := map[string]int{}
	for _, x := range s.all() {
		seen[x.Target+"/"+x.TxID]++
	}
	for k, n := range seen {
		assert.Equal(t, 1, n, k)
	}
	assert.Equal(t, workers*perWorker, len(seen)+int(forgotten.Load()))
	assert.Empty(t, r.Open())
	assert.Equal(t, int64(4), g.slots.Load())
}

// BenchmarkDueWith10000Open measures one Due over 10 000 open entries of
// which none is due: the cost of a wake-up with a large backlog.
func BenchmarkDueWith10000Open(b *testing.B) {
	r := resolver.New(resolver.Config{Settler: &settlements{}})
	r.Configure("CORE", resolver.Target{Policy: resolver.PolicyLookup})
	for i := range 10000 {
		r.Add(resolver.Entry{Target: "CORE", TxID: fmt.Sprintf("W%d", i), Since: t0})
	}
	b.ReportAllocs()
	for b.Loop() {
		if due := r.Due(t0); len(due) != 0 {
			b.Fatal(len(due))
		}
		_, _ = r.Next()
	}
}

// TestALateAnswerBeforeAddIsHeldForIt: the target's late answer may come
// before the hub has journalled the call and added it; Add then settles
// it at once, within LateAnswerHold.
func TestALateAnswerBeforeAddIsHeldForIt(t *testing.T) {
	r, s := newResolver(t, resolver.PolicyLookup, nil)

	// Given W1's late answer before W1 is added
	assert.False(t, r.LateAnswer("CORE", "W1", "0000", "", t0.Add(time.Millisecond)))
	assert.Empty(t, s.all())

	// When W1 is added, it is settled with that answer, not scheduled
	require.True(t, r.Add(resolver.Entry{Target: "CORE", TxID: "W1", Since: t0}))
	require.Len(t, s.all(), 1)
	assert.Equal(t, resolver.Settlement{Entry: resolver.Entry{Target: "CORE", TxID: "W1", Since: t0}, Outcome: resolver.Applied,
		Code: "0000", Via: resolver.ViaLateAnswer, At: t0.Add(time.Millisecond)}, s.all()[0])
	assert.Zero(t, r.Stats("CORE").Open)

	// And a held answer older than LateAnswerHold is dropped
	assert.False(t, r.LateAnswer("CORE", "W2", "0000", "", t0))
	r.Due(t0.Add(resolver.LateAnswerHold))
	add(t, r, "W2", t0)
	assert.Len(t, s.all(), 1, "W2 is open, not settled by a stale answer")
	assert.Equal(t, 1, r.Stats("CORE").Open)
}

// TestEntriesBehindAnOpenBreakerWaitTogether: entries that went in doubt
// at different times, all due while the breaker is open, make one wake-up
// per resolve_after between them, not one each, and are all tried once
// it closes.
func TestEntriesBehindAnOpenBreakerWaitTogether(t *testing.T) {
	g := newGate(10)
	r, _ := newResolver(t, resolver.PolicyLookup, g)
	for i := range 5 {
		add(t, r, fmt.Sprintf("W%d", i), t0.Add(time.Duration(i)*time.Second))
	}

	// Given the breaker open when the first entry is due
	g.closed.Store(true)
	now := t0.Add(5 * time.Second)
	require.Empty(t, r.Due(now))

	// Then the next wake-up is resolve_after later, for all of them
	next, ok := r.Next()
	require.True(t, ok)
	assert.Equal(t, now.Add(5*time.Second), next)
	for _, e := range r.Open() {
		assert.Equal(t, now.Add(5*time.Second), e.Next, e.TxID)
	}
	assert.Equal(t, now.Add(5*time.Second), r.Stats("CORE").Next)
	assert.Empty(t, r.Due(now.Add(4*time.Second)), "paused: nothing is tried")

	// When the breaker has closed by then, every entry due is tried
	g.closed.Store(false)
	due := r.Due(next)
	assert.Len(t, due, 5)
	assert.Equal(t, int64(5), g.acquires.Load())
}

// TestAttemptsFallDueOnTicks: entries that went in doubt within one Tick
// are due together, so a hub wakes once for them, not once each.
func TestAttemptsFallDueOnTicks(t *testing.T) {
	r, _ := newResolver(t, resolver.PolicyLookup, nil)
	for i := range 50 {
		add(t, r, fmt.Sprintf("W%d", i), t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	next, ok := r.Next()
	require.True(t, ok)
	assert.Equal(t, t0.Add(5*time.Second+resolver.Tick), next, "rounded up, never early")
	due := r.Due(next)
	assert.Len(t, due, 50)
	for _, a := range due {
		r.Done(a, resolver.Retry, next.Add(3*time.Millisecond))
	}
	for _, e := range r.Open() {
		assert.Zero(t, e.Next.Sub(t0)%resolver.Tick, "%s next %v", e.TxID, e.Next)
	}
}
