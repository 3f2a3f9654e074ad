package dedup_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/relay/dedup"
)

func newShield(maxEntries int) (*dedup.Shield, *fakeclock.Clock) {
	c := fakeclock.New(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC))
	return dedup.New(dedup.Config{MaxEntries: maxEntries, Now: c.Now}), c
}

// copyOf is a waiting copy that records the answer it is given.
type copyOf struct {
	code, msg string
	answered  int
}

func (w *copyOf) Answer(code string, msg []byte) {
	w.code, w.msg = code, string(msg)
	w.answered++
}

// joinAs returns a join func that hands out w.
func joinAs(w *copyOf) func() dedup.Waiter { return func() dedup.Waiter { return w } }

// noJoin fails the test if a copy is made to join.
func noJoin(t *testing.T) func() dedup.Waiter {
	return func() dedup.Waiter {
		t.Error("unexpected join")
		return &copyOf{}
	}
}

var (
	payload = []byte("WD 1001 500")
	h       = dedup.HashPayload(payload)
)

const window = 10 * time.Minute

func TestAnAnsweredTransactionIsReplayedWithinItsWindow(t *testing.T) {
	s, clk := newShield(0)
	v, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W1"), h, noJoin(t))
	require.Equal(t, dedup.Claimed, v)
	require.NotNil(t, f)
	assert.Empty(t, s.Settle(f, dedup.Answered, "0000", []byte("balance=99500"), window))

	clk.Advance(window - time.Second)
	v, f, code, msg := s.Begin("CORE", dedup.Scope{}, []byte("W1"), h, noJoin(t))
	assert.Equal(t, dedup.Replayed, v)
	assert.Nil(t, f)
	assert.Equal(t, "0000", code)
	assert.Equal(t, "balance=99500", msg)

	// The same TXID at another target is another transaction.
	v, _, _, _ = s.Begin("CLAIM", dedup.Scope{}, []byte("W1"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v)

	// Once the window has passed, the TXID is claimed afresh.
	clk.Advance(time.Second)
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W1"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v)
}

func TestCopiesOfACallInFlightJoinItAndGetItsAnswer(t *testing.T) {
	s, _ := newShield(0)
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W2"), h, noJoin(t))
	a, b := &copyOf{}, &copyOf{}
	v, g, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W2"), h, joinAs(a))
	assert.Equal(t, dedup.Joined, v)
	assert.Nil(t, g)
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W2"), h, joinAs(b))
	assert.Equal(t, dedup.Joined, v)

	// An in-flight call never expires, however long it takes.
	waiters := s.Settle(f, dedup.Answered, "B201", []byte("insufficient funds"), window)
	assert.Equal(t, []dedup.Waiter{a, b}, waiters)
}

func TestEachClientScopeHasTXIDsOfItsOwn(t *testing.T) {
	// Given branch A's W1, answered,
	s, _ := newShield(0)
	a, b := dedup.ClientScope("spiffe://bank/branch-a"), dedup.ClientScope("spiffe://bank/branch-b")
	_, f, _, _ := s.Begin("CORE", a, []byte("W1"), h, noJoin(t))
	s.Settle(f, dedup.Answered, "0000", []byte("balance=99500"), window)

	// when branch B, and a client without an identity, send W1 with the
	// same payload and with another,
	other := dedup.HashPayload([]byte("WD 1001 900"))
	vB, fB, _, _ := s.Begin("CORE", b, []byte("W1"), h, noJoin(t))
	vOther, _, _, _ := s.Begin("CORE", dedup.ClientScope("spiffe://bank/branch-c"), []byte("W1"), other, noJoin(t))
	vNone, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W1"), h, noJoin(t))

	// then each is a first line of its own, never A's answer nor E909,
	assert.Equal(t, dedup.Claimed, vB)
	assert.Equal(t, dedup.Claimed, vOther)
	assert.Equal(t, dedup.Claimed, vNone)
	assert.Equal(t, b, fB.Scope())
	// while A's resend is still answered from memory.
	v, _, code, _ := s.Begin("CORE", a, []byte("W1"), h, noJoin(t))
	assert.Equal(t, dedup.Replayed, v)
	assert.Equal(t, "0000", code)
	id, ok := a.Client()
	assert.True(t, ok)
	assert.NotEqual(t, dedup.Hash{}, id)
	_, ok = dedup.Scope{}.Client()
	assert.False(t, ok)
}

func TestAnotherPayloadIsAConflictInFlightAndAfter(t *testing.T) {
	s, _ := newShield(0)
	other := dedup.HashPayload([]byte("WD 1001 900"))
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W3"), h, noJoin(t))
	v, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W3"), other, noJoin(t))
	assert.Equal(t, dedup.Conflict, v)
	s.Settle(f, dedup.Answered, "0000", []byte("ok"), window)
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W3"), other, noJoin(t))
	assert.Equal(t, dedup.Conflict, v)
}

func TestAForgottenTransactionIsAFreshTryAndItsCopiesAreHandedBack(t *testing.T) {
	s, _ := newShield(0)
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W4"), h, noJoin(t))
	a := &copyOf{}
	s.Begin("CORE", dedup.Scope{}, []byte("W4"), h, joinAs(a))
	assert.Equal(t, []dedup.Waiter{a}, s.Forget(f))
	assert.Zero(t, s.Len())
	v, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W4"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v)
}

func TestATransactionInDoubtHasOneLookUpAtATime(t *testing.T) {
	s, clk := newShield(0)
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W5"), h, noJoin(t))
	s.Settle(f, dedup.InDoubt, "E901", []byte("no answer within target timeout; outcome unknown"), window)

	// The first resend leads the look-up; a second copy joins it.
	v, lead, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W5"), h, noJoin(t))
	require.Equal(t, dedup.Resolve, v)
	require.NotNil(t, lead)
	a := &copyOf{}
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W5"), h, joinAs(a))
	assert.Equal(t, dedup.Joined, v)

	// Still unknown: back in doubt, and the next resend looks up again.
	assert.Equal(t, []dedup.Waiter{a}, s.Settle(lead, dedup.InDoubt, "E901", []byte("outcome still unknown; do not resend yet"), window))
	clk.Advance(time.Minute)
	v, lead, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("W5"), h, noJoin(t))
	require.Equal(t, dedup.Resolve, v)

	// Applied: from then on the answer is replayed.
	s.Settle(lead, dedup.Answered, "0000", []byte("balance=99500"), window)
	v, _, code, msg := s.Begin("CORE", dedup.Scope{}, []byte("W5"), h, noJoin(t))
	assert.Equal(t, dedup.Replayed, v)
	assert.Equal(t, "0000 balance=99500", code+" "+msg)
}

func TestTheOldestAreEvictedAtTheBound(t *testing.T) {
	const bound = 64 * 4 // four entries a shard
	s, _ := newShield(bound)
	for i := range 10 * bound {
		_, f, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "T%d", i), h, noJoin(t))
		s.Settle(f, dedup.Answered, "0000", []byte("ok"), window)
	}
	assert.LessOrEqual(t, s.Len(), int64(bound))
	assert.Equal(t, int64(10*bound)-s.Len(), s.Evictions())

	// The newest are still remembered, the first are not.
	v, _, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "T%d", 10*bound-1), h, noJoin(t))
	assert.Equal(t, dedup.Replayed, v)
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("T0"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v)
}

func TestACallInFlightOrInDoubtIsNotEvicted(t *testing.T) {
	s, _ := newShield(64 * 8) // about eight entries a shard
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("LONG"), h, noJoin(t))
	a := &copyOf{}
	s.Begin("CORE", dedup.Scope{}, []byte("LONG"), h, joinAs(a))
	_, g, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("DOUBT"), h, noJoin(t))
	s.Settle(g, dedup.InDoubt, "E901", []byte("outcome unknown"), window)
	// Fill the shield until every shard has had to evict many times.
	for i := range 64 * 40 {
		_, g, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "T%d", i), h, noJoin(t))
		s.Settle(g, dedup.Answered, "0000", []byte("ok"), window)
	}
	assert.Positive(t, s.Evictions())
	assert.LessOrEqual(t, s.Len(), int64(64*8+64))

	// LONG is still in flight: a copy joins it, and its leader hands both
	// copies their answer.
	b := &copyOf{}
	v, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("LONG"), h, joinAs(b))
	assert.Equal(t, dedup.Joined, v)
	assert.Equal(t, []dedup.Waiter{a, b}, s.Settle(f, dedup.Answered, "0000", []byte("late"), window))
	v, _, code, msg := s.Begin("CORE", dedup.Scope{}, []byte("LONG"), h, noJoin(t))
	assert.Equal(t, dedup.Replayed, v)
	assert.Equal(t, "0000 late", code+" "+msg)
	// DOUBT is still in doubt: its resend is looked up, never sent afresh.
	v, _, code, msg = s.Begin("CORE", dedup.Scope{}, []byte("DOUBT"), h, noJoin(t))
	assert.Equal(t, dedup.Resolve, v)
	assert.Equal(t, "E901 outcome unknown", code+" "+msg)
}

func TestAShieldFullOfCallsInDoubtRefusesNewTXIDsAndForgetsNone(t *testing.T) {
	// Given a shield of four entries: two answered and two in doubt,
	s, clk := newShield(4)
	settle := func(txid string, st dedup.State) {
		t.Helper()
		v, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte(txid), h, noJoin(t))
		require.Equal(t, dedup.Claimed, v, txid)
		s.Settle(f, st, "E901", []byte("outcome unknown"), window)
	}
	settle("A1", dedup.Answered)
	settle("D1", dedup.InDoubt)
	settle("A2", dedup.Answered)
	settle("D2", dedup.InDoubt)

	// when two new TXIDs arrive, they take the answered ones' room;
	settle("N1", dedup.InDoubt)
	settle("N2", dedup.InDoubt)
	assert.Equal(t, int64(2), s.Evictions())

	// then, with only calls in doubt left, every new TXID is refused,
	for i := range 100 {
		v, f, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "X%d", i), h, noJoin(t))
		require.Equal(t, dedup.Full, v)
		require.Nil(t, f)
	}
	assert.Equal(t, int64(100), s.Refusals())
	assert.Equal(t, int64(2), s.Evictions())
	assert.Equal(t, int64(4), s.Len())

	// and each call in doubt is still remembered: its resend is looked up,
	// and once its outcome is learnt, it is answered and may go.
	for _, txid := range []string{"D1", "D2", "N1", "N2"} {
		v, f, code, _ := s.Begin("CORE", dedup.Scope{}, []byte(txid), h, noJoin(t))
		require.Equal(t, dedup.Resolve, v, txid)
		assert.Equal(t, "E901", code)
		if txid == "D1" {
			s.Settle(f, dedup.Answered, "0000", []byte("balance=99500"), window)
		} else {
			s.Settle(f, dedup.InDoubt, "E901", []byte("outcome still unknown; do not resend yet"), window)
		}
	}
	v, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("X0"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v, "D1, answered, made room")
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("X1"), h, noJoin(t))
	assert.Equal(t, dedup.Full, v, "X0 is in flight, the rest in doubt")

	// A call in doubt goes once its window has passed since its last
	// outcome, which is not an eviction.
	clk.Advance(window)
	v, _, _, _ = s.Begin("CORE", dedup.Scope{}, []byte("X2"), h, noJoin(t))
	assert.Equal(t, dedup.Claimed, v)
	assert.Equal(t, int64(3), s.Evictions())
}

func TestCallsInDoubtSurviveConcurrentPressure(t *testing.T) {
	// Given a shield of 64 entries and eight clients each sending new
	// TXIDs at once, every third of which ends in doubt,
	const bound, clients, each = 64, 8, 200
	s, _ := newShield(bound)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		doubt []string
	)
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				txid := fmt.Sprintf("C%d-%d", c, i)
				v, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte(txid), h, noJoin(t))
				if v != dedup.Claimed {
					assert.Equal(t, dedup.Full, v)
					continue
				}
				st := dedup.Answered
				if i%3 == 0 {
					st = dedup.InDoubt
					mu.Lock()
					doubt = append(doubt, txid)
					mu.Unlock()
				}
				s.Settle(f, st, "E901", []byte("outcome unknown"), window)
			}
		})
	}
	wg.Wait()

	// then the shield kept near its bound (a busy shard holding answered
	// entries counts as room, roomElsewhere, so contention may pass it by
	// a few entries a client; unbounded, it would hold 1 600), refused
	// some, and forgot no call in doubt.
	assert.LessOrEqual(t, s.Len(), int64(2*bound))
	assert.Positive(t, s.Refusals())
	assert.NotEmpty(t, doubt)
	for _, txid := range doubt {
		v, _, _, _ := s.Begin("CORE", dedup.Scope{}, []byte(txid), h, noJoin(t))
		assert.Equal(t, dedup.Resolve, v, txid)
	}
}

func TestExpiredEntriesAreSweptAsNewOnesArrive(t *testing.T) {
	s, clk := newShield(0)
	for i := range 1000 {
		_, f, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "T%d", i), h, noJoin(t))
		s.Settle(f, dedup.Answered, "0000", []byte("ok"), time.Minute)
	}
	clk.Advance(2 * time.Minute)
	for i := range 1000 {
		_, f, _, _ := s.Begin("CORE", dedup.Scope{}, fmt.Appendf(nil, "U%d", i), h, noJoin(t))
		s.Settle(f, dedup.Answered, "0000", []byte("ok"), time.Minute)
	}
	assert.Equal(t, int64(1000), s.Len())
	assert.Zero(t, s.Evictions(), "expiry is not eviction")
}

func TestConcurrentCopiesMakeOneCall(t *testing.T) {
	s, _ := newShield(0)
	const copies = 16
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		leaders int
		joined  []*copyOf
	)
	start := make(chan struct{})
	for range copies {
		wg.Go(func() {
			<-start
			w := &copyOf{}
			v, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("RACE"), h, joinAs(w))
			mu.Lock()
			defer mu.Unlock()
			switch v {
			case dedup.Claimed:
				leaders++
				for _, x := range s.Settle(f, dedup.Answered, "0000", []byte("once"), window) {
					x.Answer("0000", []byte("once"))
				}
			case dedup.Joined:
				joined = append(joined, w)
			}
		})
	}
	close(start)
	wg.Wait()
	assert.Equal(t, 1, leaders)
	for _, w := range joined {
		assert.Equal(t, 1, w.answered)
	}
}

// BenchmarkReplay is the shield's cost on the answered path: a resend of a
// remembered TXID, its payload hashed, answered from memory.
func BenchmarkReplay(b *testing.B) {
	s := dedup.New(dedup.Config{})
	_, f, _, _ := s.Begin("CORE", dedup.Scope{}, []byte("W1"), h, nil)
	s.Settle(f, dedup.Answered, "0000", []byte("balance=99500"), window)
	txid := []byte("W1")
	b.ReportAllocs()
	for b.Loop() {
		if v, _, _, _ := s.Begin("CORE", dedup.Scope{}, txid, dedup.HashPayload(payload), nil); v != dedup.Replayed {
			b.Fatal(v)
		}
	}
}

// BenchmarkClaimAndSettle is the shield's cost on a first call: claimed,
// then settled with its answer.
func BenchmarkClaimAndSettle(b *testing.B) {
	s := dedup.New(dedup.Config{})
	msg := []byte("balance=99500")
	var txid []byte
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		txid = fmt.Appendf(txid[:0], "TX%010d", i)
		i++
		_, f, _, _ := s.Begin("CORE", dedup.Scope{}, txid, dedup.HashPayload(payload), nil)
		s.Settle(f, dedup.Answered, "0000", msg, window)
	}
}

// BenchmarkMemory remembers 1 000 000 answered TXIDs, of the shape a core
// banking channel sends, and reports the heap they hold.
func BenchmarkMemory(b *testing.B) {
	const n = 1_000_000
	msg := []byte("balance=99500")
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := dedup.New(dedup.Config{MaxEntries: n})
		var txid []byte
		for i := range n {
			txid = fmt.Appendf(txid[:0], "BR042-%012d", i)
			_, f, _, _ := s.Begin("CORE", dedup.Scope{}, txid, dedup.HashPayload(txid), nil)
			s.Settle(f, dedup.Answered, "0000", msg, window)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if s.Len() != n {
			b.Fatalf("%d remembered", s.Len())
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MB/1M")
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/entry")
		runtime.KeepAlive(s)
	}
}
