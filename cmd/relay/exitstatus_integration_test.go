package main_test

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// busyAddr returns a loopback address something listens on until the
// test ends.
func busyAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return ln.Addr().String()
}

func TestRelayExitStatus(t *testing.T) {
	// The convention of every binary (docs/TOOLS.md, "Exit status"): 2 and
	// one line for a mistake in the command line or the environment, 1 for
	// a failure at run time.
	tests := []struct {
		name   string
		env    []string
		args   []string
		exit   int
		stderr string // the whole of it, or with contains a part
		partly bool
	}{
		{name: "an unknown flag", args: []string{"--fail-treshold", "3"}, exit: 2,
			stderr: "relay: error: unknown flag --fail-treshold, did you mean \"--fail-threshold\"?\n"},
		{name: "a misspelt variable", env: []string{"RELAY_TARGET_TIMOUT=1s"}, args: []string{"--listen", "127.0.0.1:0", "--admin-listen", ""}, exit: 2,
			stderr: "relay: error: environment: RELAY_TARGET_TIMOUT: no such setting; did you mean RELAY_TARGET_TIMEOUT?\n"},
		{name: "a port in use", args: []string{"--listen", busyAddr(t), "--admin-listen", ""}, exit: 1,
			stderr: "relay: error: --listen: listen tcp", partly: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := proctest.RunEnv(t, relayPkg, tt.env, tt.args...)
			assert.Equal(t, tt.exit, res.ExitCode)
			if tt.partly {
				assert.Contains(t, res.Stderr, tt.stderr)
			} else {
				assert.Equal(t, tt.stderr, res.Stderr)
			}
		})
	}
}
