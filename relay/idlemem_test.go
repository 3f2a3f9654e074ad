package relay

import (
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
				if stack <= maxStack && heap <= maxHeap || time.Now().After(deadline) {
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

// TestConnFitsItsSizeClass keeps conn within the allocator's 384-byte
// size class, which every connection pays while idle: what few connections
// use (a PROXY header's sender, a client certificate's identities, an
// over-long line's TXID, the E904 answer's tail, a place in the refusal
// lane) lives apart, and a raw write's progress is kept in the write
// buffer itself.
func TestConnFitsItsSizeClass(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(conn{}), uintptr(384))
}
