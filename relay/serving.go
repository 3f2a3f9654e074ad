package relay

import (
	"errors"
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

// trackListener adds or removes ln from the listeners Shutdown closes. It
// reports false when adding to a Server that is already closed.
func (sv *serving) trackListener(ln *net.Listener, add bool) bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if !add {
		delete(sv.listeners, ln)
		return true
	}
	if sv.closed {
		return false
	}
	sv.listeners[ln] = struct{}{}
	return true
}

// closeListeners closes every listener and marks the Server closed, so no
// listener or connection is added afterwards.
func (sv *serving) closeListeners() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.closed = true
	var errs []error
	for ln := range sv.listeners {
		if err := (*ln).Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isClosed reports whether Shutdown or Close has closed the listeners.
func (sv *serving) isClosed() bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.closed
}

// connsSnapshot returns the connections being served.
func (sv *serving) connsSnapshot() []*conn {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	out := make([]*conn, 0, len(sv.conns))
	for _, c := range sv.conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// connCount returns the number of open connections, served or turned away.
func (sv *serving) connCount() int {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return len(sv.conns)
}
