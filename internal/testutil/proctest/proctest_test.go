package proctest_test

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

const addrlogPkg = "./internal/testutil/proctest/testdata/addrlog"

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

func TestParseAnswer(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    proctest.Answer
		wantErr bool
	}{
		{name: "plain", line: "tx1|0000|balance=99500\n", want: proctest.Answer{TxID: "tx1", Code: "0000", Message: "balance=99500"}},
		{name: "no newline", line: "tx1|B201|insufficient funds", want: proctest.Answer{TxID: "tx1", Code: "B201", Message: "insufficient funds"}},
		{name: "pipe in message", line: "tx1|0000|a|b||c\n", want: proctest.Answer{TxID: "tx1", Code: "0000", Message: "a|b||c"}},
		{name: "empty message", line: "-|E900|\n", want: proctest.Answer{TxID: "-", Code: "E900"}},
		{name: "two fields", line: "tx1|0000\n", wantErr: true},
		{name: "empty txid", line: "|0000|x\n", wantErr: true},
		{name: "empty code", line: "tx1||x\n", wantErr: true},
		{name: "carriage return", line: "tx1|0000|x\r\n", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := proctest.ParseAnswer(tt.line)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestStartSignalWait(t *testing.T) {
	p := proctest.Start(t, addrlogPkg, "--listen", "127.0.0.1:0")
	require.NotEmpty(t, p.Addr())

	c := proctest.Dial(t, p.Addr())
	a := c.Exchange("tx1|hello|there")
	assert.Equal(t, proctest.Answer{TxID: "tx1", Code: "0000", Message: "hello|there"}, a)
	c.Send("a|1", "b|2")
	got := proctest.ByTxID(t, c.ReadAnswers(2))
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
