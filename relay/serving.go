package relay

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/sourcegraph/conc"
)

// serving is the Server's side that serves clients: its listeners and
// connections, the goroutines that serve them, and the state of its
// shutdown.
type serving struct {
	inShutdown  atomic.Bool  // set by Shutdown and Close: new lines get E906
	withdrawn   atomic.Bool  // set by Withdraw: Draining reports true, serving goes on
	activeCalls atomic.Int64 // transactions held (callHold) between admission and their answer
	turningAway atomic.Int64 // connections over MaxConns not yet closed

	mu        sync.Mutex
	closed    bool                       // guarded by mu: no more listeners or connections
	listeners map[*net.Listener]struct{} // guarded by mu
	conns     map[net.Conn]*conn         // guarded by mu; nil for a turned-away connection
	served    int                        // guarded by mu: connections being served (non-nil in conns)

	// clientWork owns every goroutine the Server starts to serve clients:
	// one per connection, one per turned-away connection, the call
	// workers, the resolvers and the probers.
	clientWork conc.WaitGroup
	// stopWorkers is closed when the Server stops, ending idle call
	// workers.
	stopWorkers     chan struct{}
	stopWorkersOnce sync.Once
	// stopping is closed when the Server begins to stop (Shutdown or
	// Close): the probers send no more probes and end, and no connection
	// waits any longer for a turn in the refusal lane.
	stopping     chan struct{}
	stoppingOnce sync.Once
}
