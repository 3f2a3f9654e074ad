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

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
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
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	var logs logtest.Buffer
	cfg.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel).Hook(panicOn{"call done"})
	reg := withMetrics(t, &cfg)
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// when a transaction is answered,
	assert.Equal(t, "A1|0000|got x", c.Exchange("A1|CORE|x").String())

	// then the next answer on the connection is the next line's, not an
	// E907 for the first,
	assert.Equal(t, "A2|0000|got y", c.Exchange("A2|CORE|y").String())

	// the answer is counted once, and the panic is logged.
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "0000"))
	assert.Equal(t, 0.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "E907"))
	hubtest.Eventually(t, func() bool {
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
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	out := &panickyWriter{}
	cfg.AccessLog = out
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// when transactions go on after the panic,
	assert.Equal(t, "P1|0000|got x", c.Exchange("P1|CORE|x").String())
	hubtest.Eventually(t, func() bool {
		return hubtest.MetricValue(t, reg, metricPanics, labelTask, "access_log") == 1
	}, "the access log writer's panic was not counted")
	assert.Equal(t, "P2|0000|got y", c.Exchange("P2|CORE|y").String())

	// then the restarted writer logs them, the line lost in the panic is
	// counted as dropped,
	hubtest.Eventually(t, func() bool { return strings.Contains(out.String(), `"txid":"P2"`) },
		"the access log stopped after its writer panicked")
	assert.NotContains(t, out.String(), `"txid":"P1"`)
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricAccessLogDropped))

	// and the hub shuts down cleanly: the panic is not held for Wait.
	c.Conn().Close()
	assert.NoError(t, <-hubtest.ShutdownAsync(srv, hubtest.IOTimeout))
}

func TestPanicInAConnectionIsCaughtWhereItHappens(t *testing.T) {
	// Given a hub that panics when it logs a closed connection,
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel).Hook(panicOn{"connection closed"})
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)

	// when a client comes and goes,
	c := hubtest.Dial(t, addr)
	assert.Equal(t, "U1|E903|unknown target", c.Exchange("U1|NOPE|x").String())
	c.Conn().Close()

	// then the panic is counted at once, the connection is forgotten, and
	// the hub still serves and shuts down cleanly.
	hubtest.Eventually(t, func() bool {
		return hubtest.MetricValue(t, reg, metricPanics, labelTask, "conn") == 1
	}, "the connection's panic was not counted when it happened")
	hubtest.Eventually(t, func() bool { return srv.ConnectionsOpen() == 0 }, "the panicked connection is still tracked")
	c2 := hubtest.Dial(t, addr)
	assert.Equal(t, "U2|E903|unknown target", c2.Exchange("U2|NOPE|x").String())
	c2.Conn().Close()
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(hubtest.IOTimeout):
		t.Fatal("Shutdown did not return")
	}
	require.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricPanics, labelTask, "conn"))
}
