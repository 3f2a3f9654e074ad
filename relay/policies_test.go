package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/fakeclock"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// settings returns per-target settings with the given bulkhead size,
// threshold and reset timeout, the rest defaults.
func settings(maxInflight, threshold int, reset time.Duration) *TargetSettings {
	return &TargetSettings{MaxInflight: maxInflight, Policy: breaker.Policy{FailThreshold: threshold, ResetTimeout: reset}}
}

// fallbackPair returns a Config, on a fake clock, where CORE falls back to
// CORE_DR, each with the given settings (nil for the Config's).
func fallbackPair(t *testing.T, core, dr *hubtest.Target, coreSettings, drSettings *TargetSettings) (Config, *fakeclock.Clock) {
	t.Helper()
	cfg, clk := testConfig(t,
		Target{Name: "CORE", URL: core.URL, Settings: coreSettings, Fallback: "core_dr"},
		Target{Name: "CORE_DR", URL: dr.URL, Settings: drSettings},
	)
	return cfg, clk
}

func TestFallbackTakesRequestsWhileTheBreakerRefuses(t *testing.T) {
	// Given CORE (threshold 1, reset 10 s) failing, with CORE_DR (threshold
	// 1, reset 1 min) as its fallback, an access log and metrics,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	dr := hubtest.NewTarget(t, hubtest.Echo)
	cfg, clk := fallbackPair(t, core, dr, settings(0, 1, 10*time.Second), settings(0, 1, time.Minute))
	reg := withMetrics(t, &cfg)
	var access logtest.Buffer
	cfg.AccessLog = &access
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// when CORE trips,
	assert.Equal(t, "F1|E500|target failed: HTTP 500: injected", c.Exchange("F1|CORE|x").String())
	require.Equal(t, breaker.Open, status(t, srv, "CORE").State)

	// then CORE_DR answers for it, saying so, and CORE is not called;
	assert.Equal(t, "F2|0000|via CORE_DR: got x", c.Exchange("F2|core|x").String())
	assert.Equal(t, "F3|0000|via CORE_DR: got y", c.Exchange("F3|CORE|y").String())
	assert.Equal(t, 1, core.Calls())
	assert.Equal(t, 2, dr.Calls())

	// a request for CORE_DR itself is answered without the prefix;
	assert.Equal(t, "D1|0000|got z", c.Exchange("D1|CORE_DR|z").String())

	// the answers count under CORE_DR, the refusals under CORE's fallbacks;
	assert.Equal(t, 3.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE_DR", labelCode, "0000"))
	assert.Equal(t, 0.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "0000"))
	assert.Equal(t, 0.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "E904"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, reg, metricFallbacks, labelTarget, "CORE", labelFallback, "CORE_DR"))

	// when CORE_DR fails too, its failure reaches the client through it,
	dr.Set(hubtest.AnswerStatus(503))
	assert.Equal(t, "F4|E500|via CORE_DR: target failed: HTTP 503: injected", c.Exchange("F4|CORE|x").String())
	require.Equal(t, breaker.Open, status(t, srv, "CORE_DR").State)

	// and once both breakers refuse, the answer is E904 with CORE's own
	// retry hint (CORE_DR's would be about a minute).
	clk.Advance(3 * time.Second)
	assert.Equal(t, "F5|E904|circuit open; retry after 7s", c.Exchange("F5|CORE|x").String())
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CORE", labelCode, "E904"))
	assert.Equal(t, 3.0, hubtest.MetricValue(t, reg, metricFallbacks, labelTarget, "CORE", labelFallback, "CORE_DR"))
	assert.Equal(t, 1, core.Calls())

	// The access log names the target that answered, and whom for.
	c.Conn().Close()
	ctx, cancel := context.WithTimeout(context.Background(), hubtest.IOTimeout)
	defer cancel()
	require.NoError(t, srv.Shutdown(ctx))
	lines := access.Lines(t)
	require.Len(t, lines, 6)
	assert.Subset(t, lines[0], map[string]any{"txid": "F1", "target": "CORE", "code": "E500"})
	assert.NotContains(t, lines[0], "fallback_for")
	assert.Subset(t, lines[1], map[string]any{"txid": "F2", "target": "CORE_DR", "fallback_for": "CORE", "code": "0000"})
	assert.NotContains(t, lines[3], "fallback_for", "D1 was for CORE_DR itself")
	assert.Subset(t, lines[4], map[string]any{"txid": "F4", "target": "CORE_DR", "fallback_for": "CORE", "code": "E500"})
	assert.Subset(t, lines[5], map[string]any{"txid": "F5", "target": "CORE", "code": "E904"})
	assert.NotContains(t, lines[5], "fallback_for")
}

func TestFallbackBulkheadFullIsE905(t *testing.T) {
	// Given CORE held open by an operator and CORE_DR with one slot, whose
	// one call is in flight,
	core := hubtest.NewTarget(t, hubtest.Echo)
	dr := hubtest.NewTarget(t, nil)
	dr.Set(dr.BlockThen(hubtest.Echo))
	cfg, _ := fallbackPair(t, core, dr, nil, settings(1, 0, 0))
	srv, addr := startServer(t, cfg)
	_, err := srv.ControlBreaker("CORE", ActionOpen)
	require.NoError(t, err)
	c := hubtest.Dial(t, addr)
	c.Send("B1|CORE|x")
	dr.WaitEntered(t, 1)

	// when another request for CORE comes, it gets CORE_DR's E905 at once,
	// naming CORE_DR,
	assert.Equal(t, "B2|E905|via CORE_DR: target busy: too many calls in flight", c.Exchange("B2|CORE|x").String())

	// and the call in flight is answered through CORE_DR as usual; CORE
	// was never called.
	dr.UnblockAll()
	assert.Equal(t, "B1|0000|via CORE_DR: got x", c.ReadResponse().String())
	assert.Zero(t, core.Calls())
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE_DR").State, "E905 is no failure")
}

func TestFullPrimaryBulkheadDoesNotFallBack(t *testing.T) {
	// Given CORE with one slot, closed, its one call in flight, and a
	// fallback,
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	dr := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := fallbackPair(t, core, dr, settings(1, 0, 0), nil)
	_, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("P1|CORE|x")
	core.WaitEntered(t, 1)

	// when another request comes, it is CORE's E905, not a fallback.
	assert.Equal(t, "P2|E905|target busy: too many calls in flight", c.Exchange("P2|CORE|x").String())
	assert.Zero(t, dr.Calls())
	core.UnblockAll()
	assert.Equal(t, "P1|0000|got x", c.ReadResponse().String())
}

func TestHeldOpenMessage(t *testing.T) {
	// Given CORE with no fallback and CLAIM falling back to DR,
	core := hubtest.NewTarget(t, hubtest.Echo)
	claim := hubtest.NewTarget(t, hubtest.Echo)
	dr := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t,
		Target{Name: "CORE", URL: core.URL},
		Target{Name: "CLAIM", URL: claim.URL, Fallback: "DR"},
		Target{Name: "DR", URL: dr.URL},
	)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)

	// when an operator holds CORE open, its requests are refused with no
	// time to retry;
	_, err := srv.ControlBreaker("core", ActionOpen)
	require.NoError(t, err)
	assert.Equal(t, "H1|E904|circuit open; held open by operator", c.Exchange("H1|CORE|x").String())

	// holding CLAIM open sends its requests to DR (an operator's failover),
	_, err = srv.ControlBreaker("CLAIM", ActionOpen)
	require.NoError(t, err)
	assert.Equal(t, "H2|0000|via DR: got x", c.Exchange("H2|CLAIM|x").String())

	// and with DR held open too, the message is CLAIM's.
	_, err = srv.ControlBreaker("DR", ActionOpen)
	require.NoError(t, err)
	assert.Equal(t, "H3|E904|circuit open; held open by operator", c.Exchange("H3|CLAIM|x").String())
	assert.Zero(t, core.Calls()+claim.Calls())

	// Enable starts a normal open period: the hint is back.
	_, err = srv.ControlBreaker("CORE", ActionEnable)
	require.NoError(t, err)
	assert.Equal(t, "H4|E904|circuit open; retry after 10s", c.Exchange("H4|CORE|x").String())
}

func TestRetryHintFollowsBackoffAndJitter(t *testing.T) {
	t.Run("backoff", func(t *testing.T) {
		// Given threshold 1, reset 1 s and backoff up to 5 s, on a fake clock,
		core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
		cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
		cfg.FailThreshold, cfg.ResetTimeout, cfg.MaxResetTimeout = 1, time.Second, 5*time.Second
		srv, addr := startServer(t, cfg)
		c := hubtest.Dial(t, addr)
		require.Equal(t, "F0|E500|target failed: HTTP 500: injected", c.Exchange("F0|CORE|x").String())
		assert.Equal(t, "R0|E904|circuit open; retry after 1s", c.Exchange("R0|CORE|x").String())

		// when each probe fails, the hint doubles, up to the cap.
		period := time.Second
		for i, want := range []string{"2s", "4s", "5s", "5s"} {
			clk.Advance(period)
			require.Contains(t, c.Exchange("P|CORE|x").String(), "|E500|", "probe %d", i)
			assert.Equal(t, "R|E904|circuit open; retry after "+want, c.Exchange("R|CORE|x").String(), "after failed probe %d", i+1)
			period = min(2*period, 5*time.Second)
			assert.Equal(t, period, status(t, srv, "CORE").RetryAfter)
		}

		// A successful probe brings the open period back to the reset
		// timeout.
		clk.Advance(period)
		core.Set(hubtest.Echo)
		require.Equal(t, "P|0000|got x", c.Exchange("P|CORE|x").String())
		core.Set(hubtest.AnswerStatus(500))
		require.Contains(t, c.Exchange("F|CORE|x").String(), "|E500|")
		assert.Equal(t, "R|E904|circuit open; retry after 1s", c.Exchange("R|CORE|x").String())
	})
	t.Run("jitter", func(t *testing.T) {
		// Given a reset of 4 s with jitter 0.5 and a random source that
		// always draws 0.5,
		core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
		cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL})
		cfg.FailThreshold, cfg.ResetTimeout, cfg.ResetJitter = 1, 4*time.Second, 0.5
		cfg.Rand = func() float64 { return 0.5 }
		srv, addr := startServer(t, cfg)
		c := hubtest.Dial(t, addr)

		// when CORE opens, the open period is 4 s + 4 s × 0.5 × 0.5 = 5 s,
		// and the hint and the status say so.
		require.Contains(t, c.Exchange("F|CORE|x").String(), "|E500|")
		assert.Equal(t, "R|E904|circuit open; retry after 5s", c.Exchange("R|CORE|x").String())
		assert.Equal(t, 5*time.Second, status(t, srv, "CORE").RetryAfter)
		clk.Advance(4500 * time.Millisecond)
		assert.Equal(t, "R|E904|circuit open; retry after 1s", c.Exchange("R|CORE|x").String())
		assert.Equal(t, 500*time.Millisecond, status(t, srv, "CORE").RetryAfter)
	})
}

func TestPerTargetSettingsApplied(t *testing.T) {
	// Given CORE with one slot, threshold 1, a 150 ms target timeout and a
	// 2 s target idle timeout, and CLAIM with two slots, threshold 3,
	// counting E400 (only) as a failure,
	core := hubtest.NewTarget(t, nil)
	core.Set(core.BlockThen(hubtest.Echo))
	claim := hubtest.NewTarget(t, hubtest.AnswerStatus(404))
	cfg, _ := testConfig(t,
		Target{Name: "CORE", URL: core.URL, Settings: &TargetSettings{
			MaxInflight: 1, Policy: breaker.Policy{FailThreshold: 1}, TargetTimeout: 150 * time.Millisecond, TargetIdleTimeout: 2 * time.Second,
		}},
		Target{Name: "CLAIM", URL: claim.URL, Settings: &TargetSettings{MaxInflight: 2, Policy: breaker.Policy{FailThreshold: 3}, FailureCodes: []string{"e400"}}},
	)
	cfg.MaxInflight, cfg.FailThreshold = 50, 50 // not used: both targets have settings of their own
	srv, addr := startServer(t, cfg)

	st := status(t, srv, "CORE")
	assert.Equal(t, 1, st.MaxInFlight)
	assert.Equal(t, TargetSettings{
		MaxInflight: 1, TargetTimeout: 150 * time.Millisecond, TargetIdleTimeout: 2 * time.Second,
		FailureCodes: []string{"E500", "E901", "E902"},
		Policy:       breaker.Policy{FailThreshold: 1, ResetTimeout: DefaultResetTimeout},
	}, st.Settings)
	assert.Equal(t, 150*time.Millisecond+time.Second, st.ProbeTimeout)
	st = status(t, srv, "CLAIM")
	assert.Equal(t, 2, st.MaxInFlight)
	assert.Equal(t, []string{"E400"}, st.Settings.FailureCodes)
	assert.Equal(t, DefaultTargetIdleTimeout, st.Settings.TargetIdleTimeout)
	assert.Equal(t, DefaultTargetTimeout+time.Second, st.ProbeTimeout)

	// When CORE's one call hangs, a second is E905 and the first times out
	// after CORE's own timeout, opening CORE's breaker at threshold 1;
	c := hubtest.Dial(t, addr)
	c.Send("C1|CORE|x")
	core.WaitEntered(t, 1)
	assert.Equal(t, "C2|E905|target busy: too many calls in flight", c.Exchange("C2|CORE|x").String())
	assert.Equal(t, "C1|E901|no answer within target timeout; outcome unknown", c.ReadResponse().String())
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State)

	// and CLAIM's 4xx count as failures there, opening it at its threshold 3.
	for range 3 {
		assert.Contains(t, c.Exchange("L|CLAIM|x").String(), "|E400|")
	}
	assert.Contains(t, c.Exchange("L|CLAIM|x").String(), "|E904|")
}

func TestFailureRatePolicyIsWired(t *testing.T) {
	// Given a high threshold and a failure rate of 0.5 over 4 calls,
	core := hubtest.NewTarget(t, byPayload)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	cfg.FailThreshold, cfg.FailureRate, cfg.MinSamples, cfg.Window = 100, 0.5, 4, time.Minute
	srv, addr := startServer(t, cfg)
	st := status(t, srv, "CORE").Settings
	assert.Equal(t, 0.5, st.FailureRate)
	assert.Equal(t, 4, st.MinSamples)
	assert.Equal(t, time.Minute, st.Window)
	c := hubtest.Dial(t, addr)

	// when two of four calls fail, not in a row,
	for _, p := range []string{"e500", "ok", "e500", "ok"} {
		c.Exchange("R|CORE|" + p)
	}

	// then the breaker opens on the rate.
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State)
	assert.Contains(t, c.Exchange("R|CORE|ok").String(), "|E904|")
}

func TestNewRejectsBadPolicies(t *testing.T) {
	good := Target{Name: "CORE", URL: "http://127.0.0.1:9201"}
	dr := Target{Name: "DR", URL: "http://127.0.0.1:9203"}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "rate above 1", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{FailureRate: 1.5}}}, want: "FailureRate must be between 0 and 1"},
		{name: "negative jitter", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{ResetJitter: -0.1}}}, want: "ResetJitter"},
		{name: "negative window", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{Window: -time.Second}}}, want: "Window must not be negative"},
		{name: "negative min samples", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{MinSamples: -1}}}, want: "MinSamples"},
		{name: "negative slow call", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{SlowCall: -1}}}, want: "SlowCall"},
		{name: "negative backoff", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Policy: breaker.Policy{MaxResetTimeout: -1}}}, want: "MaxResetTimeout"},
		{name: "target settings negative", cfg: Config{Targets: []Target{{Name: "core", URL: good.URL, Settings: &TargetSettings{MaxInflight: -1}}}}, want: "target CORE: MaxInflight must not be negative"},
		{name: "target idle timeout negative", cfg: Config{Targets: []Target{{Name: "core", URL: good.URL, Settings: &TargetSettings{TargetIdleTimeout: -1}}}}, want: "target CORE: TargetIdleTimeout must not be negative"},
		{name: "target failure code", cfg: Config{Targets: []Target{{Name: "CORE", URL: good.URL, Settings: &TargetSettings{FailureCodes: []string{"B201"}}}}}, want: "target CORE: failure code"},
		{name: "unknown fallback", cfg: Config{Targets: []Target{{Name: "CORE", URL: good.URL, Fallback: "NOPE"}}}, want: `fallback "NOPE" is not a configured target`},
		{name: "fallback to itself", cfg: Config{Targets: []Target{{Name: "CORE", URL: good.URL, Fallback: "core"}}}, want: "fallback to itself"},
		{
			name: "fallback cycle",
			cfg:  Config{Targets: []Target{{Name: "CORE", URL: good.URL, Fallback: "DR"}, {Name: "DR", URL: dr.URL, Fallback: "CORE"}}},
			want: "has a fallback of its own",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := New(tt.cfg)
			require.Error(t, err)
			assert.Nil(t, srv)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestProbePermitsHoldTheProbeUntilPermitted(t *testing.T) {
	// Given a hub whose breakers need probe permits, with CORE (threshold
	// 1, reset 10 s) open,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 1, 10*time.Second)})
	cfg.ProbePermits = true
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	assert.Equal(t, "F1|E500|target failed: HTTP 500: injected", c.Exchange("F1|CORE|x").String())
	core.Set(hubtest.Echo)

	// when its open period has passed, it still refuses, with a hint of a
	// second, and calls nobody,
	clk.Advance(time.Minute)
	assert.Equal(t, "W1|E904|circuit open; retry after 1s", c.Exchange("W1|CORE|x").String())
	assert.Equal(t, "W2|E904|circuit open; retry after 1s", c.Exchange("W2|CORE|x").String())
	assert.Equal(t, 1, core.Calls())

	// until its breaker is permitted a probe, whose success closes it.
	b := srv.Breaker("core")
	require.NotNil(t, b)
	b.PermitProbe()
	assert.Equal(t, "P1|0000|got x", c.Exchange("P1|CORE|x").String())
	assert.Equal(t, breaker.Closed, status(t, srv, "CORE").State)
	assert.Nil(t, srv.Breaker("NOPE"))
}
