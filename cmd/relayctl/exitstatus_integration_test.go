package main_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

func TestRelayctlExitStatus(t *testing.T) {
	// The convention of every binary (docs/TOOLS.md, "Exit status"): 2 and
	// one line for a mistake in the command line or the environment, 1 for
	// a failure at run time.
	missing := filepath.Join(t.TempDir(), "access.log")
	tests := []struct {
		name   string
		env    []string
		args   []string
		exit   int
		stderr string
	}{
		{name: "an unknown flag", args: []string{"status", "--bogus"}, exit: 2, stderr: "relayctl: error: unknown flag --bogus\n"},
		{name: "an unknown flag of reconcile", args: []string{"reconcile", "--bogus"}, exit: 2, stderr: "relayctl: error: unknown flag --bogus\n"},
		{name: "a missing argument", args: []string{"send"}, exit: 2, stderr: "relayctl: error: expected \"<target>\"\n"},
		{name: "a misspelt variable", env: []string{"RELAYCTL_ADRR=127.0.0.1:9200"}, args: []string{"send", "CORE", "BAL 1"}, exit: 2,
			stderr: "relayctl: error: environment: RELAYCTL_ADRR: no such setting; did you mean RELAYCTL_ADDR?\n"},
		{name: "another command's variable is not a mistake", env: []string{"RELAYCTL_TXID=T1", "RELAYCTL_ADMIN=127.0.0.1:1"}, args: []string{"replay", missing}, exit: 1,
			stderr: "relayctl: error: access log: open " + missing + ": no such file or directory\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := proctest.RunEnv(t, "./cmd/relayctl", tt.env, tt.args...)
			assert.Equal(t, tt.exit, res.ExitCode)
			assert.Equal(t, tt.stderr, res.Stderr)
		})
	}
}
