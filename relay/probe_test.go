package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

func TestParseProbeCode(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "0000", want: "0000"},
		{in: "B404", want: "B404"},
		{in: "b201", want: "B201"},
		{in: "E123", want: "E123"},
		{in: "E400", want: "E400"},
		{in: "E500", err: "a failure is never healthy"},
		{in: "E901", err: "E900 and above are the hub's own"},
		{in: "0001", err: "want 0000, Bnnn"},
		{in: "B4O4", err: "want 0000, Bnnn"},
		{in: "", err: "want 0000, Bnnn"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseProbeCode(tc.in)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestProbeTxIDsAreTheHubsOwn(t *testing.T) {
	// Given a hub whose id is as long as an id may be,
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:9"})
	cfg.HubID = strings.Repeat("h", 60) + ":920"
	srv, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })

	// its probes' TXIDs are valid, distinct, marked and cut to 64.
	a, b := string(srv.probeTxID()), string(srv.probeTxID())
	for _, id := range []string{a, b} {
		assert.True(t, protocol.ValidTxID([]byte(id)), id)
		assert.True(t, strings.HasPrefix(id, ProbeTxIDPrefix), id)
		assert.LessOrEqual(t, len(id), protocol.MaxTxIDLen)
		assert.Contains(t, id, "hhh:920-", "the hub id, cut from the left")
	}
	assert.NotEqual(t, a, b)
}

func TestSyntheticProbesFollowAReload(t *testing.T) {
	// Given CORE failing, open with threshold 1, its probes held at the
	// target,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	cfg, clk := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Second)})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Contains(t, c.Exchange("F1|CORE|x").String(), "|E500|")

	// when a reload gives it a probe payload and its open period passes,
	probing := *settings(0, 1, time.Second)
	probing.ProbePayload = "PING"
	_, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL, Settings: &probing}})
	require.NoError(t, err)
	core.Set(core.BlockThen(hubtest.AnswerCode("0000", "pong")))
	clk.Advance(time.Second)

	// then the hub sends its own probe, and customers get E904 while it
	// is out;
	got := core.WaitEntered(t, 1)
	assert.True(t, strings.HasPrefix(got[0], ProbeTxIDPrefix), got[0])
	assert.Equal(t, breaker.HalfOpen, status(t, srv, "CORE").State)
	assert.Contains(t, c.Exchange("H1|CORE|x").String(), "|E904|")
	core.UnblockAll()
	hubtest.Eventually(t, func() bool { return status(t, srv, "CORE").State == breaker.Closed }, "the healthy probe closes CORE")
	last := status(t, srv, "CORE").LastProbe
	assert.Equal(t, ProbeResult{TxID: got[0], At: last.At, Healthy: true, Code: "0000", Duration: last.Duration}, last)
	assert.Equal(t, "PING", status(t, srv, "CORE").Settings.ProbePayload)
	assert.Equal(t, []string{"0000"}, status(t, srv, "CORE").Settings.ProbeExpect)

	// and once a reload takes the payload away, a customer is the probe
	// again.
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Second)}})
	require.NoError(t, err)
	core.Set(hubtest.AnswerStatus(500))
	require.Contains(t, c.Exchange("F2|CORE|x").String(), "|E500|")
	clk.Advance(time.Second)
	calls := core.Calls()
	assert.Contains(t, c.Exchange("P1|CORE|x").String(), "|E500|", "the customer is the probe")
	assert.Equal(t, calls+1, core.Calls())
}

func TestShutdownStopsTheProbers(t *testing.T) {
	// Given a hub probing CORE, which never answers well,
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	s := settings(0, 1, time.Millisecond)
	s.ProbePayload = "PING"
	s.ProbeInterval = time.Millisecond
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: s})
	cfg.Clock = nil
	srv, addr := startServer(t, cfg)
	require.Contains(t, hubtest.Dial(t, addr).Exchange("F1|CORE|x").String(), "|E500|")
	hubtest.Eventually(t, func() bool { return core.Calls() >= 3 }, "the hub probes")

	// when it shuts down, its prober has ended by the time Close returns.
	require.NoError(t, srv.Close())
	rt := srv.table.all()[0]
	rt.prober.mu.Lock()
	defer rt.prober.mu.Unlock()
	assert.False(t, rt.prober.on, "the prober ended")
}
