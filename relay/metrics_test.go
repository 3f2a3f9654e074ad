package relay

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// withMetrics adds Metrics on a fresh registry to cfg and returns the
// registry.
func withMetrics(t *testing.T, cfg *Config) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	cfg.Metrics = m
	return reg
}

// relayLabelValues returns, for each label name of the relay_ families in g,
// the set of values it takes.
func relayLabelValues(t *testing.T, g prometheus.Gatherer) map[string][]string {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	out := map[string][]string{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "relay_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(out[l.GetName()], l.GetValue()) {
					out[l.GetName()] = append(out[l.GetName()], l.GetValue())
				}
			}
		}
	}
	return out
}

// byPayload answers according to the payload, so one target can produce
// every kind of answer.
func byPayload(w http.ResponseWriter, r *http.Request, payload []byte) {
	switch string(payload) {
	case "b201":
		hubtest.AnswerCode("B201", "insufficient funds")(w, r, payload)
	case "b202":
		hubtest.AnswerCode("B202", "invalid account")(w, r, payload)
	case "e400":
		hubtest.AnswerStatus(404)(w, r, payload)
	case "e500":
		hubtest.AnswerStatus(500)(w, r, payload)
	case "e123":
		hubtest.AnswerCode("E123", "an error code of the target's own")(w, r, payload)
	case "e904":
		hubtest.AnswerCode("E904", "a target that sends a hub code")(w, r, payload)
	default:
		hubtest.Echo(w, r, payload)
	}
}

func TestMetricsCountAnswersByCode(t *testing.T) {
	core := hubtest.NewTarget(t, byPayload)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: core.URL})
	reg := withMetrics(t, &cfg)
	_, addr := startServer(t, cfg)

	// Every series of a configured target exists, at zero, before any
	// traffic: the children are resolved when the Server is built.
	for _, code := range codeLabelValues {
		assert.Zero(t, hubtest.MetricValue(t, reg, metricRequests, "target", "CLAIM", "code", code), code)
	}

	c := hubtest.Dial(t, addr)
	for _, rt := range []struct{ line, code string }{
		{"T1|CORE|ok", "0000"},
		{"T2|core|b201", "B201"},
		{"T3|CORE|b202", "B202"},
		{"T4|CORE|e400", "E400"},
		{"T5|CORE|e500", "E500"},
		{"T6|CORE|e123", "E123"},
		{"T7|CORE|e904", "E904"},
		{"T8|NOPE|x", "E903"},
		{"T9|relay_requests_total{code=\"x\"}|x", "E903"},
		{"garbage", "E900"},
		{"T10|CORE", "E900"},
	} {
		got := c.Exchange(rt.line).String()
		require.Contains(t, got, "|"+rt.code+"|", rt.line)
	}

	for code, want := range map[string]float64{
		"0000": 1, "Bnnn": 2, "E400": 1, "E500": 1, "Ennn": 2,
		"E901": 0, "E902": 0, "E904": 0, "E905": 0, "E906": 0, "E907": 0,
	} {
		assert.Equal(t, want, hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", code), "code %s", code)
	}
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricUnrouted, "code", "E903"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricUnrouted, "code", "E900"))
	assert.Equal(t, 7.0, hubtest.MetricValue(t, reg, metricDuration, "target", "CORE"), "one observation per call")
	assert.Zero(t, hubtest.MetricValue(t, reg, metricRejections, "target", "CORE", "reason", "open"))

	// No label value comes from client or target input.
	allowed := map[string][]string{
		"target": {"CORE", "CLAIM"},
		"code":   append(codeLabelValues[:], unroutedCodes[:]...),
		"from":   {"CLOSED", "OPEN", "HALF_OPEN"},
		"to":     {"CLOSED", "OPEN", "HALF_OPEN"},
		"reason": {"open", "full"},
		"task":   taskNames[:],
	}
	allowed["reason"] = append(allowed["reason"], tlsFailureNames[:]...)
	for f := targethttp.NoHubFault + 1; f < targethttp.NumHubFaults; f++ {
		allowed["reason"] = append(allowed["reason"], f.String())
	}
	allowed[labelResumed] = []string{"true", "false"}
	allowed[labelOutcome] = append([]string{outcomeHealthy, outcomeFailed}, shieldOutcomeNames[:]...)
	for _, k := range resolvedSeries {
		allowed[labelOutcome] = append(allowed[labelOutcome], string(k.outcome))
		allowed[labelVia] = append(allowed[labelVia], k.via)
	}
	for name, values := range relayLabelValues(t, reg) {
		require.Contains(t, allowed, name, "label %s", name)
		for _, v := range values {
			assert.Contains(t, allowed[name], v, "label %s", name)
		}
	}
}

// TestMetricsCountTargetConnectionsOpened checks that
// relay_target_connections_opened_total counts each connection the hub
// opens to a target, and only those: a kept-alive connection idle for
// longer than the target timeout is reused, not counted again.
func TestMetricsCountTargetConnectionsOpened(t *testing.T) {
	const timeout = 100 * time.Millisecond
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: core.URL})
	cfg.TargetTimeout = timeout
	reg := withMetrics(t, &cfg)
	_, addr := startServer(t, cfg)
	assert.Zero(t, hubtest.MetricValue(t, reg, metricConnsOpened, "target", "CORE"), "the series exists before traffic")

	c := hubtest.Dial(t, addr)
	for i := range 3 {
		if i > 0 {
			// Only real time expires the last call's deadline.
			time.Sleep(2 * timeout)
		}
		require.Equal(t, "T|0000|got x", c.Exchange("T|CORE|x").String())
	}
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricConnsOpened, "target", "CORE"), "one connection, reused")

	core.CloseClientConnections()
	require.Equal(t, "T|0000|got x", c.Exchange("T|CORE|x").String())
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricConnsOpened, "target", "CORE"), "a fresh one once the target closed it")
	assert.Zero(t, hubtest.MetricValue(t, reg, metricConnsOpened, "target", "CLAIM"), "counted per target")
}

func TestMetricsFollowTheBreaker(t *testing.T) {
	// Given a closed breaker with threshold 2 and reset timeout 5 s.
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold, cfg.ResetTimeout = 2, 5*time.Second
	reg := withMetrics(t, &cfg)
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	state := func() float64 { return hubtest.MetricValue(t, reg, metricBreakerState, "target", "CORE") }
	moves := func(from, to string) float64 {
		return hubtest.MetricValue(t, reg, metricTransitions, "target", "CORE", "from", from, "to", to)
	}
	assert.Equal(t, 0.0, state())

	// When two calls fail, the state is 1 (open) and the trip is counted;
	// a refusal counts as E904 and as a rejection for reason open.
	c.Exchange("F1|CORE|x")
	c.Exchange("F2|CORE|x")
	assert.Equal(t, 1.0, state())
	assert.Equal(t, 1.0, moves("CLOSED", "OPEN"))
	assert.Contains(t, c.Exchange("R1|CORE|x").String(), "|E904|")
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "E904"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRejections, "target", "CORE", "reason", "open"))

	// When the reset timeout has passed and the probe is out, the state is
	// 2 (half-open) and others are refused.
	clk.Advance(5 * time.Second)
	core.Set(core.BlockThen(hubtest.Echo))
	c.Send("P1|CORE|x")
	core.WaitEntered(t, 1)
	assert.Equal(t, 2.0, state())
	assert.Equal(t, 1.0, moves("OPEN", "HALF_OPEN"))
	assert.Contains(t, c.Exchange("R2|CORE|x").String(), "|E904|")
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricRejections, "target", "CORE", "reason", "open"))

	// Then the probe's success closes the breaker: state 0, and each of the
	// three changes counted once.
	core.UnblockAll()
	assert.Equal(t, "P1|0000|got x", c.ReadResponse().String())
	assert.Equal(t, 0.0, state())
	assert.Equal(t, 1.0, moves("HALF_OPEN", "CLOSED"))
	assert.Zero(t, moves("HALF_OPEN", "OPEN"))
	assert.Zero(t, moves("OPEN", "CLOSED"))
	assert.Equal(t, 3.0, hubtest.MetricSum(t, reg, metricTransitions, "target", "CORE"))
}

func TestMetricsLiveGauges(t *testing.T) {
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.MaxInflight = 2
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)

	c1 := hubtest.Dial(t, addr)
	c1.Send("A|CORE|a", "B|CORE|b")
	core.WaitEntered(t, 2)
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricInflight, "target", "CORE"))
	assert.Equal(t, "C|E905|"+protocol.MsgBulkheadFull, c1.Exchange("C|CORE|c").String())
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRejections, "target", "CORE", "reason", "full"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "E905"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricConnectionsOpen))

	c2 := hubtest.Dial(t, addr)
	c2.Exchange("Z|NOPE|z")
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricConnectionsOpen))
	assert.Equal(t, 2, srv.ConnectionsOpen())

	core.UnblockAll()
	c1.ReadByTxID(2)
	assert.Zero(t, hubtest.MetricValue(t, reg, metricInflight, "target", "CORE"), "slots are released before the answer")
	c2.Conn().Close()
	hubtest.Eventually(t, func() bool { return srv.ConnectionsOpen() == 1 }, "closed connection still counted")
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricConnectionsOpen))
}

func TestNewMetricsAndSharing(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	_, err = NewMetrics(reg)
	assert.ErrorContains(t, err, "register metrics", "the same names twice on one registry")

	_, err = NewMetrics(nil)
	assert.NoError(t, err, "nil registerer: a private registry")

	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.Metrics = m
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	_, err = New(cfg)
	assert.ErrorContains(t, err, "already used by another Server")

	// A refused Config neither binds a Metrics nor leaves series behind.
	reg2 := prometheus.NewRegistry()
	m2, err := NewMetrics(reg2)
	require.NoError(t, err)
	bad := Config{Targets: []Target{{Name: "GOOD", URL: "http://127.0.0.1:1"}, {Name: "good", URL: "http://127.0.0.1:2"}}, Metrics: m2}
	_, err = New(bad)
	require.ErrorContains(t, err, "configured twice")
	assert.NotContains(t, relayLabelValues(t, reg2), "target")
	cfg.Metrics = m2
	srv2, err := New(cfg)
	require.NoError(t, err, "m2 is still free")
	t.Cleanup(func() { _ = srv2.Close() })
}

// TestMetricsCountEveryAnswerUnderLoad runs many connections of pipelined
// traffic against a flaky target whose breaker trips and recovers on the
// real clock, under -race, and checks that every answer is counted exactly
// once, in the metrics and in the access log, and that the transition
// counters form a consistent chain.
func TestMetricsCountEveryAnswerUnderLoad(t *testing.T) {
	cfg := flakyCoreConfig(t)
	cfg.Logger = zerolog.Nop()
	cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxInflight = 2, time.Millisecond, 4
	var access logtest.Buffer
	cfg.AccessLog = &access
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)

	const clients, perClient = 8, 120
	var sent [3]atomic.Int64 // CORE, CLAIM, unknown
	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := hubtest.Dial(t, addr)
			var b strings.Builder
			for i := range perClient {
				k := i % 3
				sent[k].Add(1)
				fmt.Fprintf(&b, "H%d-%d|%s|x\n", ci, i, [...]string{"CORE", "claim", "ELSEWHERE"}[k])
			}
			go func() { _, _ = c.Conn().Write([]byte(b.String())) }()
			for range perClient {
				if _, err := c.ReadLine(hubtest.ClientTimeout); !assert.NoError(t, err) {
					return
				}
			}
		}()
	}
	wg.Wait()

	assert.Equal(t, float64(sent[0].Load()), hubtest.MetricSum(t, reg, metricRequests, "target", "CORE"))
	assert.Equal(t, float64(sent[1].Load()), hubtest.MetricSum(t, reg, metricRequests, "target", "CLAIM"))
	assert.Equal(t, float64(sent[2].Load()), hubtest.MetricValue(t, reg, metricUnrouted, "code", "E903"))
	calls := hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "0000") +
		hubtest.MetricValue(t, reg, metricRequests, "target", "CORE", "code", "E500")
	assert.Equal(t, calls, hubtest.MetricValue(t, reg, metricDuration, "target", "CORE"))

	// Into a state minus out of it is 1 for the current state, 0 for the
	// others (CLOSED counts its start as an entry).
	state := breaker.State(hubtest.MetricValue(t, reg, metricBreakerState, "target", "CORE"))
	for _, s := range []breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen} {
		in := hubtest.MetricSum(t, reg, metricTransitions, "target", "CORE", "to", s.String())
		out := hubtest.MetricSum(t, reg, metricTransitions, "target", "CORE", "from", s.String())
		if s == breaker.Closed {
			in++
		}
		want := 0.0
		if s == state {
			want = 1
		}
		assert.Equal(t, want, in-out, "state %s (now %s)", s, state)
	}

	require.NoError(t, srv.Close())
	assert.Len(t, access.Lines(t), clients*perClient, "one access log line per answer")
	assert.Zero(t, hubtest.MetricValue(t, reg, metricAccessLogDropped))
}

func TestCallCodeLabel(t *testing.T) {
	for code, want := range map[string]string{
		"0000": "0000", "E400": "E400", "E500": "E500", "E901": "E901", "E902": "E902",
		"B201": "Bnnn", "B999": "Bnnn", "E123": "Ennn", "E904": "Ennn", "E907": "Ennn",
	} {
		assert.Equal(t, want, codeLabelValues[callCodeLabel(code)], code)
	}
}

// withMessage returns the lines whose message is msg.
func withMessage(lines []map[string]any, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["message"] == msg {
			out = append(out, l)
		}
	}
	return out
}

func TestBreakerTransitionsAreLogged(t *testing.T) {
	// Given a logger that keeps its lines and a breaker with threshold 2.
	var logs logtest.Buffer
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(503))
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.Logger = zerolog.New(&logs).Level(zerolog.InfoLevel)
	cfg.FailThreshold, cfg.ResetTimeout = 2, 5*time.Second
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// When it trips, then recovers through a probe,
	c.Exchange("F1|CORE|x")
	c.Exchange("F2|CORE|x")
	clk.Advance(5 * time.Second)
	core.Set(hubtest.Echo)
	assert.Equal(t, "P1|0000|got x", c.Exchange("P1|CORE|x").String())

	// then each change is one line, at warn when it opened, with the
	// failure count and the retry hint of the moment.
	lines := withMessage(logs.Lines(t), "breaker state changed")
	require.Len(t, lines, 3)
	assert.Subset(t, lines[0], map[string]any{
		"level": "warn", "target": "CORE", "from": "CLOSED", "to": "OPEN",
		"consecutive_failures": 2.0, "retry_after_seconds": 5.0, "held": false,
	})
	assert.Subset(t, lines[1], map[string]any{"level": "info", "from": "OPEN", "to": "HALF_OPEN"})
	assert.Subset(t, lines[2], map[string]any{"level": "info", "from": "HALF_OPEN", "to": "CLOSED", "consecutive_failures": 0.0})
	for _, l := range withMessage(logs.Lines(t), "call done") {
		assert.Equal(t, "warn", l["level"], "only failed calls are logged above debug: %v", l)
		assert.Contains(t, l, "detail", "the target's message, apart from the log message")
	}
}

func TestFailedCallsAreLoggedSparingly(t *testing.T) {
	var logs logtest.Buffer
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.Logger = zerolog.New(&logs).Level(zerolog.DebugLevel)
	cfg.FailThreshold = 1000
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	const calls = 4 * failLogBurst
	for i := range calls {
		c.Exchange(fmt.Sprintf("F%d|CORE|x", i))
	}

	// A call is logged after its answer is written.
	var levels map[string]int
	hubtest.Eventually(t, func() bool {
		levels = map[string]int{}
		for _, l := range withMessage(logs.Lines(t), "call done") {
			levels[l["level"].(string)]++
		}
		return levels["warn"]+levels["debug"] == calls
	}, "not every call was logged once")
	assert.GreaterOrEqual(t, levels["warn"], 1)
	assert.LessOrEqual(t, levels["warn"], 2*failLogBurst, "warn lines are sampled per second")
}
