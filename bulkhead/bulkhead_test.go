package bulkhead_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/bulkhead"
)

func TestNewLimit(t *testing.T) {
	tests := []struct {
		name        string
		maxInflight int
		want        int
	}{
		{name: "zero means default", maxInflight: 0, want: bulkhead.DefaultMaxInflight},
		{name: "one", maxInflight: 1, want: 1},
		{name: "explicit", maxInflight: 25, want: 25},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := bulkhead.New(bulkhead.Settings{MaxInflight: tt.maxInflight})
			assert.Equal(t, tt.want, b.Limit())
			assert.Equal(t, 0, b.InFlight())
		})
	}
}

func TestNewNegativePanics(t *testing.T) {
	assert.PanicsWithValue(t, "bulkhead: negative MaxInflight -3", func() {
		bulkhead.New(bulkhead.Settings{MaxInflight: -3})
	})
}

func TestLimitRespected(t *testing.T) {
	tests := []struct {
		name  string
		limit int
	}{
		{name: "limit 1", limit: 1},
		{name: "limit 3", limit: 3},
		{name: "default", limit: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given a bulkhead
			b := bulkhead.New(bulkhead.Settings{MaxInflight: tt.limit})

			// When every slot is taken
			for i := range b.Limit() {
				require.True(t, b.TryAcquire(), "acquire %d of %d", i+1, b.Limit())
			}

			// Then the next caller is refused at once and nothing is counted for it
			assert.False(t, b.TryAcquire())
			assert.False(t, b.TryAcquire())
			assert.Equal(t, b.Limit(), b.InFlight())
		})
	}
}

func TestReleaseFreesSlot(t *testing.T) {
	// Given a full bulkhead
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 2})
	require.True(t, b.TryAcquire())
	require.True(t, b.TryAcquire())
	require.False(t, b.TryAcquire())

	// When one slot is released
	b.Release()

	// Then exactly one more caller is admitted
	assert.Equal(t, 1, b.InFlight())
	assert.True(t, b.TryAcquire())
	assert.False(t, b.TryAcquire())

	// And releasing everything empties it
	b.Release()
	b.Release()
	assert.Equal(t, 0, b.InFlight())
}

func TestLimitOneEdge(t *testing.T) {
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	for round := range 3 {
		require.True(t, b.TryAcquire(), "round %d: first acquire", round)
		assert.False(t, b.TryAcquire(), "round %d: second acquire while held", round)
		assert.Equal(t, 1, b.InFlight())
		b.Release()
		assert.Equal(t, 0, b.InFlight())
	}
}

func TestReleaseIsDeferrable(t *testing.T) {
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	call := func() (admitted bool) {
		if !b.TryAcquire() {
			return false
		}
		defer b.Release()
		return true
	}
	assert.True(t, call())
	assert.True(t, call(), "the deferred Release must have freed the slot")
	assert.Equal(t, 0, b.InFlight())
}

func TestReleaseOnPanicPath(t *testing.T) {
	// Given a call that panics while holding the only slot
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	call := func() {
		if !b.TryAcquire() {
			return
		}
		defer b.Release()
		panic("target client bug")
	}

	// When it panics
	assert.Panics(t, call)

	// Then the slot was given back
	assert.Equal(t, 0, b.InFlight())
	assert.True(t, b.TryAcquire())
}

func TestOverReleasePanics(t *testing.T) {
	tests := []struct {
		name     string
		acquires int
		releases int
	}{
		{name: "release without acquire", acquires: 0, releases: 1},
		{name: "one release too many", acquires: 2, releases: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := bulkhead.New(bulkhead.Settings{MaxInflight: 5})
			for range tt.acquires {
				require.True(t, b.TryAcquire())
			}
			for range tt.releases - 1 {
				b.Release()
			}

			assert.PanicsWithValue(t,
				"bulkhead: Release called more times than TryAcquire succeeded",
				b.Release)

			// The failed release must not have pushed the count below zero,
			// or the bulkhead would admit one caller too many afterwards.
			assert.Equal(t, 0, b.InFlight())
			for range 5 {
				assert.True(t, b.TryAcquire())
			}
			assert.False(t, b.TryAcquire())
		})
	}
}

// TestHammer checks under -race that the number of callers inside the
// guarded section never exceeds the limit, however many goroutines race.
func TestHammer(t *testing.T) {
	const (
		limit      = 4
		goroutines = 32
		iterations = 2000
	)
	b := bulkhead.New(bulkhead.Settings{MaxInflight: limit})

	var (
		inside, maxInside  atomic.Int64
		admitted, refused  atomic.Int64
		overLimit          atomic.Int64
		start              = make(chan struct{})
		wg                 sync.WaitGroup
		observeMaxInflight = func(n int64) {
			for {
				m := maxInside.Load()
				if n <= m || maxInside.CompareAndSwap(m, n) {
					return
				}
			}
		}
	)
	for range goroutines {
		wg.Go(func() {
			<-start
			for range iterations {
				if !b.TryAcquire() {
					refused.Add(1)
					continue
				}
				n := inside.Add(1)
				observeMaxInflight(n)
				if b.InFlight() > limit {
					overLimit.Add(1)
				}
				// Yield while holding the slot so that other goroutines
				// really contend for the remaining ones.
				runtime.Gosched()
				inside.Add(-1)
				admitted.Add(1)
				b.Release()
			}
		})
	}
	close(start)
	wg.Wait()

	assert.LessOrEqual(t, maxInside.Load(), int64(limit), "callers inside at once")
	assert.Zero(t, overLimit.Load(), "InFlight above the limit")
	assert.Equal(t, int64(goroutines*iterations), admitted.Load()+refused.Load())
	assert.Positive(t, admitted.Load())
	assert.Positive(t, refused.Load(), "the hammer never filled the bulkhead, so it tested nothing")
	assert.Equal(t, 0, b.InFlight(), "every slot given back")
}

// TestLimitOneExcludes uses a limit-1 bulkhead as a mutual exclusion and lets
// the race detector check that no two goroutines were ever inside together.
func TestLimitOneExcludes(t *testing.T) {
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	counter := 0 // deliberately not atomic: only the bulkhead guards it
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if b.TryAcquire() {
					counter++
					admitted.Add(1)
					b.Release()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, admitted.Load(), int64(counter))
	assert.Equal(t, 0, b.InFlight())
}

func BenchmarkTryAcquireRelease(b *testing.B) {
	bh := bulkhead.New(bulkhead.Settings{})
	b.ReportAllocs()
	for b.Loop() {
		if bh.TryAcquire() {
			bh.Release()
		}
	}
}

func BenchmarkTryAcquireReleaseParallel(b *testing.B) {
	bh := bulkhead.New(bulkhead.Settings{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if bh.TryAcquire() {
				bh.Release()
			}
		}
	})
}

// BenchmarkTryAcquireFull measures the refusal path, which is what every
// request to an overloaded target pays before it is answered E905.
func BenchmarkTryAcquireFull(b *testing.B) {
	bh := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	if !bh.TryAcquire() {
		b.Fatal("could not fill the bulkhead")
	}
	b.ReportAllocs()
	for b.Loop() {
		if bh.TryAcquire() {
			b.Fatal("a full bulkhead admitted a caller")
		}
	}
}

func TestSetLimit(t *testing.T) {
	t.Run("a larger limit admits more at once", func(t *testing.T) {
		// Given a full bulkhead of 2
		b := bulkhead.New(bulkhead.Settings{MaxInflight: 2})
		require.True(t, b.TryAcquire())
		require.True(t, b.TryAcquire())
		require.False(t, b.TryAcquire())

		// When its limit becomes 3, one more is admitted and no more
		b.SetLimit(3)
		assert.Equal(t, 3, b.Limit())
		assert.True(t, b.TryAcquire())
		assert.False(t, b.TryAcquire())
		assert.Equal(t, 3, b.InFlight())
	})

	t.Run("a smaller limit keeps the calls and refuses until they fall below it", func(t *testing.T) {
		// Given three slots held of four
		b := bulkhead.New(bulkhead.Settings{MaxInflight: 4})
		for range 3 {
			require.True(t, b.TryAcquire())
		}

		// When the limit drops to 2, the three keep their slots and every
		// new caller is refused
		b.SetLimit(2)
		assert.Equal(t, 3, b.InFlight())
		assert.False(t, b.TryAcquire())
		b.Release()
		assert.False(t, b.TryAcquire(), "two held of two")

		// until fewer than two are held.
		b.Release()
		assert.True(t, b.TryAcquire())
		assert.False(t, b.TryAcquire())
		b.Release()
		b.Release()
		assert.Equal(t, 0, b.InFlight())
	})

	t.Run("zero means the default", func(t *testing.T) {
		b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
		b.SetLimit(0)
		assert.Equal(t, bulkhead.DefaultMaxInflight, b.Limit())
	})

	t.Run("negative panics and changes nothing", func(t *testing.T) {
		b := bulkhead.New(bulkhead.Settings{MaxInflight: 3})
		assert.PanicsWithValue(t, "bulkhead: negative limit -1", func() { b.SetLimit(-1) })
		assert.Equal(t, 3, b.Limit())
	})
}

// TestSetLimitUnderRace changes the limit while many goroutines take and
// give back slots. Every slot is taken against the limit in force at that
// instant, so with the limit only ever raised while callers run, at most
// the limit in force can be inside; lowered, the callers already inside
// stay and no new one enters above it.
func TestSetLimitUnderRace(t *testing.T) {
	const goroutines = 16
	b := bulkhead.New(bulkhead.Settings{MaxInflight: 1})
	var (
		overLimit atomic.Int64
		admitted  atomic.Int64
		stop      = make(chan struct{})
		changer   sync.WaitGroup
		callers   sync.WaitGroup
	)
	changer.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b.SetLimit(1 + i%6)
			runtime.Gosched()
		}
	})
	for range goroutines {
		callers.Go(func() {
			for range 3000 {
				if !b.TryAcquire() {
					continue
				}
				admitted.Add(1)
				// The word holds the limit and the slots together, so no
				// more than six (the largest limit) are ever held.
				if b.InFlight() > 6 {
					overLimit.Add(1)
				}
				runtime.Gosched()
				b.Release()
			}
		})
	}
	callers.Wait()
	close(stop)
	changer.Wait()

	assert.Zero(t, overLimit.Load())
	assert.Positive(t, admitted.Load())
	assert.Equal(t, 0, b.InFlight())
	b.SetLimit(2)
	assert.True(t, b.TryAcquire())
	assert.True(t, b.TryAcquire())
	assert.False(t, b.TryAcquire())
}
