package breakerlog_test

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
)

// TestRealBreakersChain feeds the log from two real breakers hammered by
// many goroutines while the fake clock moves, and checks that the file holds
// exactly one line per transition, as unbroken chains in time order.
func TestRealBreakersChain(t *testing.T) {
	const (
		workers    = 16
		iterations = 3000 // per worker, at least
		clockSteps = 1000
		opsPerStep = 50
	)
	path := filepath.Join(t.TempDir(), "breaker.log")
	bl, err := breakerlog.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = bl.Close() })

	clk := fakeclock.New(time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	var (
		calls    atomic.Int64
		errMu    sync.Mutex
		writeErr error // guarded by errMu
		edgesMu  sync.Mutex
		edges    = map[[2]breaker.State]int{} // guarded by edgesMu
	)
	observe := func(tr breaker.Transition) {
		calls.Add(1)
		edgesMu.Lock()
		edges[[2]breaker.State{tr.From, tr.To}]++
		edgesMu.Unlock()
		if err := bl.Write(tr); err != nil {
			errMu.Lock()
			writeErr = errors.Join(writeErr, err)
			errMu.Unlock()
		}
	}
	breakers := []*breaker.Breaker{
		breaker.New(breaker.Settings{Name: "CORE", Policy: breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second}, Clock: clk, OnTransition: observe}),
		breaker.New(breaker.Settings{Name: "CLAIM", Policy: breaker.Policy{FailThreshold: 3, ResetTimeout: time.Second}, Clock: clk, OnTransition: observe}),
	}

	// Given 16 goroutines making random calls with random results, and one
	// goroutine moving the clock a step after every few dozen calls, so that
	// the breakers go through many open periods however the goroutines are
	// scheduled
	var (
		workersWG, clockWG sync.WaitGroup
		clockDone          = make(chan struct{})
		ops                atomic.Int64
		refused, admitted  atomic.Int64
		unexpected         atomic.Int64
		timedOut           atomic.Bool
		deadline           = time.Now().Add(20 * time.Second) // only a guard against a hang
	)
	clockWG.Go(func() {
		defer close(clockDone)
		for range clockSteps {
			next := ops.Load() + opsPerStep
			for ops.Load() < next {
				if time.Now().After(deadline) {
					timedOut.Store(true)
					return
				}
				runtime.Gosched()
			}
			clk.Advance(250 * time.Millisecond)
		}
	})
	for w := range workers {
		workersWG.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 0x5eed))
			for i := 0; ; i++ {
				if i >= iterations {
					select {
					case <-clockDone:
						return
					default:
					}
				}
				ops.Add(1)
				b := breakers[rng.IntN(len(breakers))]
				ticket, _, err := b.Allow()
				if err != nil {
					if !errors.Is(err, breaker.ErrOpen) {
						unexpected.Add(1)
					}
					refused.Add(1)
					// Let the clock goroutine run rather than spin on
					// refusals while it waits for its turn.
					runtime.Gosched()
					continue
				}
				admitted.Add(1)
				if rng.IntN(10) == 0 {
					b.Cancel(ticket) // say, the bulkhead was full
					continue
				}
				b.Done(ticket, rng.IntN(2) == 0, 0)
			}
		})
	}
	workersWG.Wait()
	clockWG.Wait()
	require.False(t, timedOut.Load(), "the workers stopped making calls")
	require.NoError(t, bl.Close())

	require.Zero(t, unexpected.Load(), "Allow errors other than ErrOpen")
	errMu.Lock()
	require.NoError(t, writeErr)
	errMu.Unlock()

	// Then the hammer really exercised every kind of change
	edgesMu.Lock()
	for _, edge := range [][2]breaker.State{
		{breaker.Closed, breaker.Open},
		{breaker.Open, breaker.HalfOpen},
		{breaker.HalfOpen, breaker.Closed},
		{breaker.HalfOpen, breaker.Open},
	} {
		assert.Positive(t, edges[edge], "no %s->%s transition happened", edge[0], edge[1])
	}
	edgesMu.Unlock()
	assert.Positive(t, refused.Load())
	assert.Positive(t, admitted.Load())

	// And the file holds exactly one line per transition, as chains
	entries, _, err := breakerlog.ReadFile(path)
	require.NoError(t, err)
	assert.Len(t, entries, int(calls.Load()), "lines in the file vs OnTransition calls")
	require.NoError(t, breakerlog.CheckChains(entries))

	// And per target the times never go backwards, since each breaker
	// stamps and reports its changes in the order they happen
	last := map[string]breakerlog.Entry{}
	for i, e := range entries {
		if prev, ok := last[e.Name]; ok {
			assert.False(t, e.At.Before(prev.At), "line %d (%s) is earlier than %s", i+1, e, prev)
		}
		last[e.Name] = e
	}
	for _, b := range breakers {
		if e, ok := last[b.Name()]; ok {
			assert.Equal(t, b.Snapshot().State, e.To, "%s: the last line is the breaker's current state", b.Name())
		}
	}
	t.Logf("%d transitions, %d admitted, %d refused", calls.Load(), admitted.Load(), refused.Load())
}
