package relay

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
)

func TestWithdrawReportsDrainingAndGoesOnServing(t *testing.T) {
	// Given a serving hub with a client
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Equal(t, "T1|0000|got a", c.Exchange("T1|CORE|a").String())
	require.False(t, srv.Draining())

	// When it is withdrawn
	srv.Withdraw()

	// Then it reports draining, while it still answers the connections it
	// has and accepts new ones;
	assert.True(t, srv.Draining())
	assert.Equal(t, "T2|0000|got b", c.Exchange("T2|CORE|b").String())
	assert.Equal(t, "T3|0000|got c", hubtest.Dial(t, addr).Exchange("T3|CORE|c").String())

	// and Shutdown drains as ever: with a call in flight, new lines get
	// E906 and the call is answered.
	core.Set(core.BlockThen(hubtest.Echo))
	c.Send("S1|CORE|slow")
	core.WaitEntered(t, 1)
	done := hubtest.ShutdownAsync(srv, hubtest.IOTimeout)
	hubtest.Eventually(t, srv.serving.isClosed, "Shutdown never began")
	assert.Equal(t, "T4|E906|shutting down", c.Exchange("T4|CORE|d").String())
	core.UnblockAll()
	assert.Equal(t, "S1|0000|got slow", c.ReadResponse().String())
	require.NoError(t, <-done)
	assert.True(t, srv.Draining())
}
