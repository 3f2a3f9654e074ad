// Package hubtest holds the helpers that the tests of the hub's packages
// share when they run a hub in process: a fake HTTP target whose answers a
// test switches and holds, a client of the line protocol (the one the
// integration tests of the binaries use too), a recorder of breaker
// transitions, a reader of Prometheus metrics, and polling with a
// deadline. Every wait is bounded by IOTimeout, or ClientTimeout for the
// client, so a hub that does not answer fails its test instead of hanging
// the run.
//
// Of relay and its sub-packages it imports only relay/protocol, whose tests
// do not use it, so relay's own internal tests can use it; what needs
// relay's types stays in the tests that build a relay.Server.
//
// Typical use, in a test of a package that runs a hub:
//
//	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
//	var tr hubtest.Transitions
//	srv, err := relay.New(relay.Config{
//		Targets:      []relay.Target{{Name: "CORE", URL: core.URL}},
//		OnTransition: tr.Observe,
//	})
//	require.NoError(t, err)
//	c := hubtest.Dial(t, hubtest.Serve(t, srv, relay.ErrServerClosed))
//	assert.Equal(t, "E500", c.Exchange("T1|CORE|x").Code)
//	core.Set(core.BlockThen(hubtest.Echo))
//	c.Send("T2|CORE|x")
//	core.WaitEntered(t, 1) // T2 is in flight
//	core.UnblockAll()
//	assert.Equal(t, "T2|0000|got x", c.ReadResponse().String())
package hubtest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// IOTimeout bounds every wait of these helpers; it is only reached when a
// test is about to fail.
const IOTimeout = 5 * time.Second

// Eventually polls cond every millisecond until it holds, and fails the test
// with msg if it does not within IOTimeout.
func Eventually(t testing.TB, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(IOTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
		time.Sleep(time.Millisecond)
	}
}

// Server is what Serve needs of a server, such as a *relay.Server.
type Server interface {
	Serve(ln net.Listener) error
	Close() error
}

// Serve serves srv on a new 127.0.0.1:0 listener and returns the listener's
// address. When the test ends it closes srv and checks that Serve returned,
// within IOTimeout, an error that is closed (the server's ErrServerClosed).
func Serve(t testing.TB, srv Server, closed error) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		assert.NoError(t, srv.Close())
		select {
		case err := <-served:
			assert.ErrorIs(t, err, closed)
		case <-time.After(IOTimeout):
			t.Error("Serve did not return after Close")
		}
	})
	return ln.Addr().String()
}

// ShutdownAsync starts srv.Shutdown with a context of the given timeout and
// returns the channel its result arrives on.
func ShutdownAsync(srv interface{ Shutdown(context.Context) error }, timeout time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		done <- srv.Shutdown(ctx)
	}()
	return done
}
