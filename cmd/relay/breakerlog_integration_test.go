package main_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests hold the real relay to the breaker log's life outside the
// process: one relay per file, and rotation by rename and SIGHUP as
// logrotate does it (docs/OPERATING.md).

// stderrLines returns the non-blank lines of s.
func stderrLines(s string) []string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// logLines returns the lines of the breaker log at path as
// TARGET|FROM->TO, failing the test if it does not parse.
func logLines(t *testing.T, path string) []string {
	t.Helper()
	entries, fragments, err := breakerlog.ReadFile(path)
	require.NoError(t, err)
	require.Empty(t, fragments, "torn lines")
	var out []string
	for _, e := range entries {
		out = append(out, e.Name+"|"+e.From.String()+"->"+e.To.String())
	}
	return out
}

func TestSecondRelayOnTheSameBreakerLogRefusesToStart(t *testing.T) {
	// Given a relay running with its breaker log,
	first := startPolicyRelay(t, nil, "--target", "CORE="+closedPortURL(t))
	first.mustControl(t, "CORE", "open", "")

	// when a second relay is started on the same file,
	res := proctest.Run(t, relayPkg, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--breaker-log", first.logPath, "--target", "CORE="+closedPortURL(t))

	// then it exits 1, a runtime error, with one line on stderr that names
	// the file and says why,
	assert.Equal(t, 1, res.ExitCode, "stderr: %s", res.Stderr)
	lines := stderrLines(res.Stderr)
	if assert.Len(t, lines, 1, "want exactly one line on stderr, got:\n%s", res.Stderr) {
		assert.Contains(t, lines[0], first.logPath)
		assert.Contains(t, lines[0], "another relay holds it")
	}

	// and the first one goes on alone in its file.
	first.mustControl(t, "CORE", "close", "")
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CORE|OPEN->CLOSED"}, logLines(t, first.logPath))

	// Once the first relay has stopped, the file is free again.
	first.Signal(syscall.SIGTERM)
	require.Equal(t, 0, first.Wait())
	proctest.Start(t, relayPkg, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--breaker-log", first.logPath, "--target", "CORE="+closedPortURL(t))
}

func TestSIGHUPReopensTheBreakerLog(t *testing.T) {
	r := startPolicyRelay(t, nil, "--target", "CORE="+closedPortURL(t), "--target", "CLAIM="+closedPortURL(t))
	rotated := r.logPath + ".1"
	reopened := func() int {
		n := 0
		for _, l := range r.LogLines() {
			if l["message"] == "breaker log reopened" {
				n++
			}
		}
		return n
	}

	// Given a breaker log with a line in it, renamed as logrotate does,
	// and a change made after the rename but before the signal,
	r.mustControl(t, "CORE", "open", "")
	require.NoError(t, os.Rename(r.logPath, rotated))
	r.mustControl(t, "CORE", "close", "")

	// when the relay gets SIGHUP,
	r.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "the relay logs that it reopened its breaker log", func() bool {
		return reopened() == 1
	})

	// then it keeps running, and the changes after the signal go to a new
	// file at the path,
	_, exited := r.WaitFor(0)
	require.False(t, exited, "SIGHUP ended the relay; stderr:\n%s", r.Stderr())
	r.mustControl(t, "CORE", "open", "")
	r.mustControl(t, "CLAIM", "open", "")
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CORE|OPEN->CLOSED"}, logLines(t, rotated))
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CLAIM|CLOSED->OPEN"}, logLines(t, r.logPath))

	// with the chains unbroken from the old file into the new,
	old, _, err := breakerlog.ReadFile(rotated)
	require.NoError(t, err)
	cur, _, err := breakerlog.ReadFile(r.logPath)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(append(old, cur...)))

	// and the relay's lock moved with it: the new file is held, the old
	// one free.
	_, err = breakerlog.Open(r.logPath)
	assert.ErrorIs(t, err, breakerlog.ErrLocked)
	bl, err := breakerlog.Open(rotated)
	require.NoError(t, err, "the relay still holds the renamed file")
	require.NoError(t, bl.Close())

	// A SIGHUP with nothing renamed keeps the file.
	r.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "the relay logs a second reopen", func() bool {
		return reopened() == 2
	})
	r.mustControl(t, "CLAIM", "close", "")

	// SIGTERM still stops it cleanly, its lines all in the new file.
	r.Signal(syscall.SIGTERM)
	require.Equal(t, 0, r.Wait())
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CLAIM|CLOSED->OPEN", "CLAIM|OPEN->CLOSED"}, logLines(t, r.logPath))
	entries, err := os.ReadDir(filepath.Dir(r.logPath))
	require.NoError(t, err)
	assert.Len(t, entries, 2, "the relay made no file beside the log and its rotated copy")
}
