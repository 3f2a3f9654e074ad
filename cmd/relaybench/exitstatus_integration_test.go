package main_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

func TestRelaybenchExitStatus(t *testing.T) {
	// The convention of every binary (docs/TOOLS.md, "Exit status"): 2 and
	// one line for a mistake in the command line or the environment, 1 for
	// a failure at run time.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = busy.Close() })
	tests := []struct {
		name   string
		env    []string
		args   []string
		exit   int
		stderr string
	}{
		{name: "an unknown flag", args: []string{"load", "--bogus"}, exit: 2, stderr: "relaybench: error: unknown flag --bogus\n"},
		{name: "a misspelt variable", env: []string{"RELAYBENCH_CONN=3"}, args: []string{"target", "--listen", "127.0.0.1:0"}, exit: 2,
			stderr: "relaybench: error: environment: RELAYBENCH_CONN: no such setting; did you mean RELAYBENCH_CONNS?\n"},
		{name: "a port in use", args: []string{"target", "--listen", busy.Addr().String()}, exit: 1,
			stderr: "relaybench: error: listen " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := proctest.RunEnv(t, "./cmd/relaybench", tt.env, tt.args...)
			assert.Equal(t, tt.exit, res.ExitCode)
			assert.Equal(t, tt.stderr, res.Stderr)
		})
	}
}
