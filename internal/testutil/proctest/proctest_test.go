package proctest_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

const addrlogPkg = "./internal/testutil/proctest/testdata/addrlog"

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

func TestStartSignalWait(t *testing.T) {
	p := proctest.Start(t, addrlogPkg, "--listen", "127.0.0.1:0")
	require.NotEmpty(t, p.Addr())

	c := hubtest.Dial(t, p.Addr())
	a := c.Exchange("tx1|hello|there")
	assert.Equal(t, hubtest.Response{TxID: "tx1", Code: "0000", Message: "hello|there"}, a)
	c.Send("a|1", "b|2")
	got := c.ReadByTxID(2)
	assert.Equal(t, "1", got["a"].Message)
	assert.Equal(t, "2", got["b"].Message)

	p.Signal(syscall.SIGTERM)
	assert.Equal(t, 0, p.Wait())
	assert.Contains(t, p.Stderr(), `"message":"stopped"`)
	assert.Len(t, p.LogLines(), 2, "the non-JSON line is not a log line")
	assert.Equal(t, "", c.ExpectClosed())
}

func TestKill(t *testing.T) {
	p := proctest.Start(t, addrlogPkg)
	p.Kill()
	code, exited := p.WaitFor(0)
	assert.True(t, exited)
	assert.Equal(t, -1, code, "a process ended by a signal has no exit status")
}

func TestRun(t *testing.T) {
	res := proctest.Run(t, addrlogPkg, "--exit", "3")
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, "addrlog: exiting with status 3\n", res.Stderr)
}

func TestRunEnvDropsInheritedRelayVariables(t *testing.T) {
	t.Setenv("RELAY_FAIL_THRESHOLD", "1")
	res := proctest.RunEnv(t, addrlogPkg, []string{"RELAY_MAX_INFLIGHT=2"}, "--print-env", "--exit", "0")
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "RELAY_MAX_INFLIGHT=2\n", res.Stdout)
}
