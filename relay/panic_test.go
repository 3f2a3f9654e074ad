package relay

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/logtest"
)

// panicOn is a zerolog hook that panics when a line with the message msg
// is logged: a bug injected where the hub logs.
type panicOn struct{ msg string }

func (h panicOn) Run(_ *zerolog.Event, _ zerolog.Level, msg string) {
	if msg == h.msg {
		panic("injected: " + msg)
	}
}

func TestPanicAfterTheAnswerSendsNoSecondAnswer(t *testing.T) {
	// Given a hub that panics when it logs a finished call, after the
	// call's answer is written,
	core := newFakeTarget(t, echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	var logs logtest.Buffer
	cfg.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel).Hook(panicOn{"call done"})
	reg := withMetrics(t, &cfg)
	_, addr := startServer(t, cfg)
	c := dial(t, addr)

	// when a transaction is answered,
	assert.Equal(t, "A1|0000|got x", c.roundTrip("A1|CORE|x"))

	// then the next answer on the connection is the next line's, not an
	// E907 for the first,
	assert.Equal(t, "A2|0000|got y", c.roundTrip("A2|CORE|y"))

	// the answer is counted once, and the panic is logged.
	assert.Equal(t, 2.0, metricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "0000"))
	assert.Equal(t, 0.0, metricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "E907"))
	eventually(t, func() bool {
		return strings.Contains(logs.String(), "target call panicked after its answer")
	}, "the panic after the answer was not logged")
}

// panickyWriter panics on its first Write and then keeps what it is given.
type panickyWriter struct {
	mu       sync.Mutex
	panicked bool
	buf      bytes.Buffer
}

func (w *panickyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.panicked {
		w.panicked = true
		panic("injected: access log write")
	}
	return w.buf.Write(p)
}

func (w *panickyWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestAccessLogWriterRestartsAfterAPanic(t *testing.T) {
	// Given an access log whose first write panics,
	core := newFakeTarget(t, echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	out := &panickyWriter{}
	cfg.AccessLog = out
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := dial(t, addr)

	// when transactions go on after the panic,
	assert.Equal(t, "P1|0000|got x", c.roundTrip("P1|CORE|x"))
	eventually(t, func() bool {
		return metricValue(t, reg, metricPanics, labelTask, "access_log") == 1
	}, "the access log writer's panic was not counted")
	assert.Equal(t, "P2|0000|got y", c.roundTrip("P2|CORE|y"))

	// then the restarted writer logs them, the line lost in the panic is
	// counted as dropped,
	eventually(t, func() bool { return strings.Contains(out.String(), `"txid":"P2"`) },
		"the access log stopped after its writer panicked")
	assert.NotContains(t, out.String(), `"txid":"P1"`)
	assert.Equal(t, 1.0, metricValue(t, reg, metricAccessLogDropped))

	// and the hub shuts down cleanly: the panic is not held for Wait.
	c.nc.Close()
	assert.NoError(t, <-shutdownAsync(srv, ioTimeout))
}

func TestPanicInAConnectionIsCaughtWhereItHappens(t *testing.T) {
	// Given a hub that panics when it logs a closed connection,
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel).Hook(panicOn{"connection closed"})
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)

	// when a client comes and goes,
	c := dial(t, addr)
	assert.Equal(t, "U1|E903|unknown target", c.roundTrip("U1|NOPE|x"))
	c.nc.Close()

	// then the panic is counted at once, the connection is forgotten, and
	// the hub still serves and shuts down cleanly.
	eventually(t, func() bool {
		return metricValue(t, reg, metricPanics, labelTask, "conn") == 1
	}, "the connection's panic was not counted when it happened")
	eventually(t, func() bool { return srv.ConnectionsOpen() == 0 }, "the panicked connection is still tracked")
	c2 := dial(t, addr)
	assert.Equal(t, "U2|E903|unknown target", c2.roundTrip("U2|NOPE|x"))
	c2.nc.Close()
	done := shutdownAsync(srv, ioTimeout)
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(ioTimeout):
		t.Fatal("Shutdown did not return")
	}
	require.Equal(t, 2.0, metricValue(t, reg, metricPanics, labelTask, "conn"))
}
