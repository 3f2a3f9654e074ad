package relay

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// TestIdleConnectionsHaveSmallStacksAndNoBuffers holds 1000 idle
// connections, cold (never used) and warm (one line each first), and
// checks what they cost in goroutine stacks and heap once they have waited
// past the hand-off: the runtime's smallest stack, 2 KiB, each (a
// goroutine that served a line, or waits deeper, has 4 KiB or more), and
// no read or write buffer (4 KiB each). The bounds are on bytes, with room
// to spare; the race detector doubles the stack guard, so the test runs
// without it (make test's second pass).
func TestIdleConnectionsHaveSmallStacksAndNoBuffers(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's stacks are larger; make test runs this without it")
	}
	const (
		conns       = 1000
		maxStack    = 3 << 10 // per connection: 2 KiB expected, 4 KiB before hand-offs
		maxHeap     = 3 << 10 // per connection, the client's side included: about 2 KiB expected
		idleTimeout = 4 * time.Second
	)
	for _, warm := range []bool{false, true} {
		t.Run(map[bool]string{false: "cold", true: "warm"}[warm], func(t *testing.T) {
			cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
			cfg.Clock = nil
			cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
			cfg.IdleTimeout = idleTimeout // hands off after 0.5 to 1 s
			srv, addr := startServer(t, cfg)
			before := memAfterGC()
			goroutines := runtime.NumGoroutine()

			// Given idle connections, each answered once when warm.
			clients := make([]net.Conn, 0, conns)
			t.Cleanup(func() {
				for _, nc := range clients {
					nc.Close()
				}
			})
			for range conns {
				nc, err := net.DialTimeout("tcp", addr, hubtest.IOTimeout)
				require.NoError(t, err)
				clients = append(clients, nc)
			}
			if warm {
				for _, nc := range clients {
					_, err := io.WriteString(nc, "W|NONE|x\n")
					require.NoError(t, err)
				}
				want := "W|E903|" + protocol.MsgUnknownTarget + "\n"
				for _, nc := range clients {
					require.NoError(t, nc.SetReadDeadline(time.Now().Add(hubtest.IOTimeout)))
					buf := make([]byte, len(want))
					_, err := io.ReadFull(nc, buf)
					require.NoError(t, err)
					require.Equal(t, want, string(buf))
				}
			}
			hubtest.Eventually(t, func() bool { return srv.ConnectionsOpen() == conns }, "every connection served")

			// When they have waited past the hand-off, then each costs one
			// goroutine with the smallest stack, and no buffer.
			var stack, heap float64
			for deadline := time.Now().Add(idleTimeout / 2); ; {
				ms := memAfterGC()
				stack = float64(ms.StackInuse-before.StackInuse) / conns
				heap = (float64(ms.HeapInuse) - float64(before.HeapInuse)) / conns
				if stack <= maxStack || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			assert.LessOrEqual(t, stack, float64(maxStack), "stack bytes per idle connection")
			assert.LessOrEqual(t, heap, float64(maxHeap), "heap bytes per idle connection")
			assert.Equal(t, conns, runtime.NumGoroutine()-goroutines, "one goroutine per idle connection")
			t.Logf("per idle connection: stack %.0f B, heap %.0f B (both ends)", stack, heap)
		})
	}
}

// memAfterGC returns the memory statistics after two collections, so that
// pools are emptied and freed stacks are handed back.
func memAfterGC() runtime.MemStats {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// TestIdleConnectionOutlivesItsHandOff checks that a connection that
// waits past the hand-off, with nothing sent yet, after a line, or in the
// middle of one, is served when its input comes, and is still closed by
// its idle timeout, never before.
func TestIdleConnectionOutlivesItsHandOff(t *testing.T) {
	const idle = 800 * time.Millisecond
	wait := 3 * handOffAfter(idle) // past the hand-off, which comes within twice handOffAfter
	require.Less(t, wait, idle/2)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.IdleTimeout = idle
	_, addr := startServer(t, cfg)
	unknown := func(txid string) string { return txid + "|E903|" + protocol.MsgUnknownTarget }

	t.Run("cold, then after a line", func(t *testing.T) {
		c := hubtest.Dial(t, addr)
		time.Sleep(wait) // a wait for the hand-off's deadline to pass: nothing to poll
		assert.Equal(t, unknown("A"), c.RoundTrip("A|NONE|x"))
		time.Sleep(wait)
		assert.Equal(t, unknown("B"), c.RoundTrip("B|NONE|x"))
		last := time.Now()
		c.ExpectEOF()
		assert.GreaterOrEqual(t, time.Since(last), idle)
	})

	t.Run("in the middle of a line", func(t *testing.T) {
		c := hubtest.Dial(t, addr)
		assert.Equal(t, unknown("A"), c.RoundTrip("A|NONE|x"))
		_, err := io.WriteString(c.Conn(), "P|NO")
		require.NoError(t, err)
		time.Sleep(wait)
		assert.Equal(t, unknown("P"), c.RoundTrip("NE|x"))
	})

	t.Run("cold, closed by the idle timeout", func(t *testing.T) {
		start := time.Now()
		c := hubtest.Dial(t, addr)
		c.ExpectEOF()
		assert.GreaterOrEqual(t, time.Since(start), idle)
	})
}

// TestBusyConnectionKeepsItsGoroutine checks that the hand-off is for
// quiet connections only: a connection whose lines come more often than
// handOffAfter stays on the goroutine that serves it, and one that goes
// quiet is handed to resume, which serves its next line.
func TestBusyConnectionKeepsItsGoroutine(t *testing.T) {
	const idle = 8 * time.Second
	h := handOffAfter(idle)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.IdleTimeout = idle
	_, addr := startServer(t, cfg)
	unknown := func(txid string) string { return txid + "|E903|" + protocol.MsgUnknownTarget }
	c := hubtest.Dial(t, addr)

	// Given a connection that sends a line every tenth of handOffAfter,
	// for twice handOffAfter,
	for i := range 20 {
		txid := fmt.Sprintf("B%d", i)
		require.Equal(t, unknown(txid), c.RoundTrip(txid+"|NONE|x"))
		// Then it is never handed off.
		require.False(t, resumed(), "handed off while busy, after %d lines", i+1)
		time.Sleep(h / 10) // the client's pace
	}

	// When it goes quiet, then resume takes it within twice handOffAfter,
	// and serves its next line.
	for deadline := time.Now().Add(2*h + hubtest.IOTimeout); !resumed(); time.Sleep(10 * time.Millisecond) {
		require.False(t, time.Now().After(deadline), "a quiet connection was not handed off")
	}
	assert.Equal(t, unknown("Q"), c.RoundTrip("Q|NONE|x"))
}

// resumed reports whether a goroutine serves a connection that a read loop
// handed off.
func resumed() bool {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return bytes.Contains(buf[:n], []byte("relay.(*conn).resume("))
}

// TestConnFitsItsSizeClass keeps conn within the allocator's 384-byte
// size class, which every connection pays while idle: what few connections
// use (a PROXY header's sender, a client certificate's identities, an
// over-long line's TXID, the E904 answer's tail, a place in the refusal
// lane) lives apart, and a raw write's progress is kept in the write
// buffer itself.
func TestConnFitsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(conn{}), uintptr(384))
}
