package relay

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// shortOfDescriptors returns a DialTarget that fails as Go's dialer does
// when the process is out of file descriptors (socket: EMFILE) while short
// is set, and dials TCP otherwise.
func shortOfDescriptors(short *atomic.Bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if short.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", syscall.EMFILE)}
		}
		return d.DialContext(ctx, network, addr)
	}
}

// msgHubOverloaded is the message of E906 for a call the hub could not make
// (docs/PROTOCOL.md, "Response codes").
const msgHubOverloaded = "hub overloaded; not sent"

func TestAHubOutOfDescriptorsIsNotATargetFailure(t *testing.T) {
	// Given CORE with threshold 3 and one failure counted, then healthy,
	// behind a hub out of file descriptors,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	var short atomic.Bool
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 3, 10*time.Second)})
	cfg.DialTarget = shortOfDescriptors(&short)
	var logs logtest.Buffer
	cfg.Logger = zerolog.New(&logs)
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Contains(t, c.Exchange("F1|CORE|x").String(), "|E500|")
	core.Set(hubtest.AnswerCode("0000", "balance=100000"))
	core.CloseClientConnections() // each call needs a connection of its own
	short.Store(true)

	// when more calls than the threshold cannot be made,
	const calls = 10
	for i := range calls {
		txid := fmt.Sprintf("S%d", i)
		assert.Equal(t, txid+"|E906|"+msgHubOverloaded, c.Exchange(txid+"|CORE|BAL 1001").String())
	}

	// then the breaker is CLOSED and counted them as neither failures nor
	// successes, no slot is held, no call is in doubt, and the refusals
	// are counted apart from the target's answers and logged once,
	st := status(t, srv, "CORE")
	assert.Equal(t, breaker.Closed, st.State)
	assert.Equal(t, 1, st.ConsecutiveFailures, "the failure before, neither more nor reset")
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.InDoubt)
	assert.Equal(t, 1, core.Calls())
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricDuration, "target", "CORE"), "no call, no duration")
	assert.Equal(t, float64(calls), hubtest.MetricValue(t, reg, metricHubRefusals, "target", "CORE", "reason", "descriptors"))
	assert.Zero(t, hubtest.MetricValue(t, reg, metricHubRefusals, "target", "CORE", "reason", "memory"), "every reason's series exists")
	assert.Equal(t, float64(calls), hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "E906"))
	assert.Zero(t, hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "E902"))
	assert.Zero(t, hubtest.MetricSum(t, reg, metricTransitions, "target", "CORE"), "no state change")
	lines := logs.Messages(t, "hub short of its own resources: call not made, answered E906")
	require.Len(t, lines, 1, "one line for the burst, not one per call")
	assert.Equal(t, "descriptors", lines[0]["reason"])
	assert.Equal(t, "CORE", lines[0]["target"])
	assert.Contains(t, lines[0]["err"], "too many open files")

	// and once descriptors are free again, CORE is called at once.
	short.Store(false)
	assert.Equal(t, "OK|0000|balance=100000", c.Exchange("OK|CORE|BAL 1001").String())
	assert.Equal(t, 2, core.Calls())
}

func TestAProbeTheHubCannotSendIsHandedBack(t *testing.T) {
	// Given CORE's breaker open (threshold 1) and its reset timeout passed,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	var short atomic.Bool
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Second)})
	cfg.DialTarget = shortOfDescriptors(&short)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Contains(t, c.Exchange("F1|CORE|x").String(), "|E500|")
	require.Equal(t, breaker.Open, status(t, srv, "CORE").State)
	core.CloseClientConnections() // the probe needs a connection of its own
	clk.Advance(time.Second)

	// when the request admitted as the probe cannot be sent,
	short.Store(true)
	assert.Equal(t, "P1|E906|"+msgHubOverloaded, c.Exchange("P1|CORE|x").String())

	// then the probe is handed back, not failed: the breaker waits
	// half-open for the next request, which is the probe,
	assert.Equal(t, breaker.HalfOpen, status(t, srv, "CORE").State)
	short.Store(false)
	core.Set(hubtest.AnswerCode("0000", "ok"))
	assert.Equal(t, "P2|0000|ok", c.Exchange("P2|CORE|x").String())
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE").State)
}

func TestASyntheticProbeTheHubCannotSendIsHandedBack(t *testing.T) {
	// Given CORE, probed with the hub's own payload, open (threshold 1),
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	var short atomic.Bool
	s := settings(0, 1, time.Second)
	s.ProbePayload = "PING"
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: s})
	cfg.DialTarget = shortOfDescriptors(&short)
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	require.Contains(t, hubtest.Dial(t, addr).Exchange("F1|CORE|x").String(), "|E500|")
	core.CloseClientConnections() // the probe needs a connection of its own
	calls := core.Calls()

	// when its probe falls due while the hub is out of descriptors,
	short.Store(true)
	clk.Advance(time.Second)
	hubtest.Eventually(t, func() bool {
		return hubtest.MetricValue(t, reg, metricHubRefusals, "target", "CORE", "reason", "descriptors") >= 2
	}, "the prober tries, and tries again")

	// then no probe failed: the breaker is not opened again,
	assert.Equal(t, breaker.HalfOpen, status(t, srv, "CORE").State)
	assert.Zero(t, hubtest.MetricValue(t, reg, metricProbes, "target", "CORE", "outcome", "failed"))
	assert.Zero(t, hubtest.MetricValue(t, reg, metricTransitions, "target", "CORE", "from", "HALF_OPEN", "to", "OPEN"))
	assert.Equal(t, calls, core.Calls())

	// and once descriptors are free, the next probe closes it.
	core.Set(hubtest.AnswerCode("0000", "pong"))
	short.Store(false)
	hubtest.Eventually(t, func() bool { return status(t, srv, "CORE").State == breaker.Closed }, "the healthy probe closes CORE")
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricProbes, "target", "CORE", "outcome", "healthy"))
}

// failingListener fails its first fails accepts with err, as accept4 does
// when the process is out of descriptors, then accepts.
type failingListener struct {
	net.Listener
	err   error
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", l.err)}
	}
	return l.Listener.Accept()
}

// failingAccepts serves a Server on a failingListener.
type failingAccepts struct {
	*Server
	err   error
	fails int32
}

func (f failingAccepts) Serve(ln net.Listener) error {
	fl := &failingListener{Listener: ln, err: f.err}
	fl.fails.Store(f.fails)
	return f.Server.Serve(fl)
}

func TestAcceptOutOfDescriptorsBacksOffAndLogsOnce(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		t.Run(errno.Error(), func(t *testing.T) {
			// Given a hub whose first four accepts fail for want of its own
			// resources,
			core := hubtest.NewTarget(t, hubtest.AnswerCode("0000", "ok"))
			cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
			var logs logtest.Buffer
			cfg.Logger = zerolog.New(&logs)
			srv, err := New(cfg)
			require.NoError(t, err)
			addr := hubtest.Serve(t, failingAccepts{Server: srv, err: errno, fails: 4}, ErrServerClosed)

			// a client waiting in the listen queue is served once they
			// pass,
			assert.Equal(t, "T1|0000|ok", hubtest.Dial(t, addr).Exchange("T1|CORE|x").String())

			// and the burst of failures is logged once, with its end.
			failed := logs.Messages(t, "accept failed; retrying with backoff until it works again")
			require.Len(t, failed, 1)
			assert.Contains(t, failed[0]["error"], errno.Error())
			again := logs.Messages(t, "accepting again")
			require.Len(t, again, 1)
			assert.Equal(t, 4.0, again[0]["failed"])
		})
	}
}

func TestTurningAwayHoldsAtMostMaxTurningAway(t *testing.T) {
	// Given a TLS hub serving its one connection, whose log we read,
	h := newTLSHub(t, false)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.MaxConns = 1
	var logs logtest.Buffer
	cfg.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel)
	h.start(t, cfg)
	hubtest.Dial(t, h.addr)
	hubtest.Eventually(t, func() bool { return h.srv.ConnectionsOpen() == 1 }, "the first connection is served")

	// when connections arrive and never start their handshakes, each of
	// which the hub holds for a second, one is closed without a handshake,
	const unanswered = "connection turned away unanswered: too many being turned away"
	n := 0
	hubtest.Eventually(t, func() bool {
		for range 64 {
			hubtest.Dial(t, h.addr)
			n++
		}
		return len(logs.Messages(t, unanswered)) > 0
	}, "a connection past MaxTurningAway is closed at once")

	// only once MaxTurningAway of them are held.
	assert.Greater(t, n, MaxTurningAway)
}
