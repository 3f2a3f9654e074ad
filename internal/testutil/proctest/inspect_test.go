package proctest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

func TestOpenFDsFollowsConnections(t *testing.T) {
	p := proctest.Start(t, addrlogPkg, "--listen", "127.0.0.1:0")
	require.Positive(t, p.Pid())
	idle, err := p.OpenFDs()
	require.NoError(t, err)
	require.Positive(t, idle)

	// Each connection the binary serves holds one descriptor while open.
	conns := make([]*hubtest.Client, 3)
	for i := range conns {
		conns[i] = hubtest.Dial(t, p.Addr())
		conns[i].Exchange("fd|x")
	}
	n, err := p.OpenFDs()
	require.NoError(t, err)
	assert.Equal(t, idle+len(conns), n)

	for _, c := range conns {
		c.Close()
	}
	proctest.Eventually(t, 5*time.Second, "descriptors back to the idle count", func() bool {
		n, err := p.OpenFDs()
		return err == nil && n == idle
	})

	p.Kill()
	_, err = p.OpenFDs()
	assert.Error(t, err, "an exited process has no descriptors to count")
}

func TestCtlErrReportsARefusedControl(t *testing.T) {
	f := proctest.StartFixture(t, "CORE", "core")
	require.NoError(t, f.CtlErr(`{"mode":"fail"}`))
	assert.Equal(t, "fail", f.Stats(t).Mode)

	err := f.CtlErr(`{"mode":"sideways"}`)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "HTTP 400")
	}
	assert.Equal(t, "fail", f.Stats(t).Mode, "a refused control changes nothing")
}
