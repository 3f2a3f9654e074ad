package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/replay"
)

// writeSmallLog copies testdata/small-access.log, an access log of CORE
// failing three times in a row and a request refused, then a CLAIM call,
// and a torn last line, to a file of its own and returns its path.
func writeSmallLog(t *testing.T) string {
	data, err := os.ReadFile(filepath.Join("testdata", "small-access.log"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "access.log")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	return path
}

// runReplay parses args as main does and runs the replay command, and
// returns its output, its diagnostics and its error.
func runReplay(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	_, kctx, err := parse(t, append([]string{"replay"}, args...)...)
	if err != nil {
		return "", "", err
	}
	var out, diag bytes.Buffer
	kctx.BindTo(t.Context(), (*context.Context)(nil))
	err = kctx.Run(&streams{Out: &out, Err: &diag})
	return out.String(), diag.String(), err
}

func TestParseReplayDefaultsAreTheRelays(t *testing.T) {
	c, kctx, err := parse(t, "replay", "access.log")
	require.NoError(t, err)
	assert.Equal(t, "replay <file>", kctx.Command())
	sets, err := c.Replay.sets()
	require.NoError(t, err)
	require.Len(t, sets, 1)
	assert.Equal(t, "fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902", sets[0].Describe("CORE"))
	assert.Equal(t, time.Minute, c.Replay.ReorderWindow)
}

func TestParseReplaySettings(t *testing.T) {
	c, _, err := parse(t, "replay", "--access-log", "a.log", "--fail-threshold", "3", "--reset-timeout", "2",
		"--slow-call", "250ms", "--failure-codes", "e500,E902", "--failure-rate", "0.5", "--min-samples", "10",
		"--max-reset-timeout", "1m", "--config", filepath.Join("..", "..", "docs", "relay.example.toml"),
		"--compare", "fail_threshold=4", "--compare", "CLAIM.slow_call=0")
	require.NoError(t, err)
	sets, err := c.Replay.sets()
	require.NoError(t, err)
	require.Len(t, sets, 2)
	assert.Equal(t, "fail_threshold=3 reset_timeout=2s target_timeout=3s failure_codes=E500,E902 failure_rate=0.5 window=1m0s min_samples=10 slow_call=250ms max_reset_timeout=1m0s",
		sets[0].Describe("PAYROLL"), "the flags")
	assert.Equal(t, "fail_threshold=3 reset_timeout=5s target_timeout=3s failure_codes=E500,E902 failure_rate=0.5 window=1m0s min_samples=10 slow_call=250ms max_reset_timeout=1m0s",
		sets[0].Describe("CLAIM"), "the file over the flags")
	assert.Equal(t, "fail_threshold=4 reset_timeout=5s target_timeout=3s failure_codes=E500,E902 failure_rate=0.5 window=1m0s min_samples=10 max_reset_timeout=1m0s",
		sets[1].Describe("CLAIM"), "--compare over both")
	assert.Equal(t, "compare", sets[1].Name)
}

func TestParseReplayProbeSettings(t *testing.T) {
	c, _, err := parse(t, "replay", "a.log", "--probe-payload", "BAL HEALTH", "--probe-expect", "0000,b404",
		"--probe-successes", "3", "--probe-interval", "2", "--compare", "probe_payload=")
	require.NoError(t, err)
	sets, err := c.Replay.sets()
	require.NoError(t, err)
	require.Len(t, sets, 2)
	assert.Equal(t, `fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902 probe_payload="BAL HEALTH" probe_expect=0000,B404 probe_successes=3 probe_interval=2s`,
		sets[0].Describe("CORE"))
	assert.Equal(t, `fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902 probe_successes=3 probe_interval=2s`,
		sets[1].Describe("CORE"), "compared without synthetic probes")
}

func TestParseReplayRejects(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"zero threshold", []string{"--fail-threshold", "0"}, "--fail-threshold: must be at least 1, got 0"},
		{"zero reset timeout", []string{"--reset-timeout", "0"}, "--reset-timeout: must be more than zero, got 0s"},
		{"bad duration", []string{"--slow-call", "soon"}, `duration "soon"`},
		{"rate above 1", []string{"--failure-rate", "1.5"}, "--failure-rate: must be from 0 (off) to 1, got 1.5"},
		{"backoff below reset", []string{"--max-reset-timeout", "5s"}, "--max-reset-timeout: must be 0 (off) or more than --reset-timeout, got 5s"},
		{"hub's own code", []string{"--failure-codes", "E904"}, "--failure-codes: "},
		{"zero reorder window", []string{"--reorder-window", "0"}, "--reorder-window: must be more than zero"},
		{"zero probe successes", []string{"--probe-successes", "0"}, "--probe-successes: must be at least 1, got 0"},
		{"bad probe code", []string{"--probe-expect", "0000,X"}, `--probe-expect: probe code "X"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parse(t, append([]string{"replay", "a.log"}, tc.args...)...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestReplayCommand(t *testing.T) {
	path := writeSmallLog(t)

	// The hub's settings: the three failures open CORE, the torn line is
	// reported with its number.
	out, diag, err := runReplay(t, "--fail-threshold", "3", path)
	require.NoError(t, err)
	assert.Empty(t, diag, "no progress line off a terminal")
	assert.Contains(t, out, "transitions replay (1):\n2026-11-30T08:00:00.031Z|CORE|CLOSED->OPEN\n")
	assert.Contains(t, out, "malformed lines (1, first 1):\n  "+path+":6: not JSON\n")

	// Compared with a threshold of 4, for CORE only, as JSON.
	out, _, err = runReplay(t, "--access-log", path, "--fail-threshold", "3", "--compare", "fail_threshold=4", "--target", "core", "--json")
	require.NoError(t, err)
	var rep struct {
		Sets []struct {
			Name        string   `json:"name"`
			Transitions []string `json:"transitions"`
			Targets     []struct {
				Target  string `json:"target"`
				Refused int64  `json:"refused"`
			} `json:"targets"`
		} `json:"sets"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Len(t, rep.Sets, 2)
	assert.Equal(t, []string{"2026-11-30T08:00:00.031Z|CORE|CLOSED->OPEN"}, rep.Sets[0].Transitions)
	// With a threshold of 4 the request at 40 ms is sent, gets the outcome
	// of the call before it, a failure, and that fourth failure opens.
	assert.Equal(t, []string{"2026-11-30T08:00:00.041Z|CORE|CLOSED->OPEN"}, rep.Sets[1].Transitions)
	require.Len(t, rep.Sets[1].Targets, 1)
	assert.Equal(t, "CORE", rep.Sets[1].Targets[0].Target)
	assert.Zero(t, rep.Sets[1].Targets[0].Refused)
}

func TestReplayCommandFailures(t *testing.T) {
	path := writeSmallLog(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no access log", nil, "name an access log"},
		{"missing file", []string{filepath.Join(t.TempDir(), "nope.log")}, "access log: open "},
		{"unknown target", []string{path, "--target", "PAYROLL"}, "--target PAYROLL: no request in the access log names it (it names CORE, CLAIM)"},
		{"bad --compare", []string{path, "--compare", "fail_threshold=0"}, "config --compare: fail_threshold: must be at least 1, got 0"},
		{"bad --config", []string{path, "--config", filepath.Join(t.TempDir(), "nope.toml")}, "config "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := runReplay(t, tc.args...)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestReplayProgressLine(t *testing.T) {
	var w bytes.Buffer
	p := &replayProgress{w: &w}
	p.print(replay.Progress{Source: "access.log", Bytes: 250, Size: 1000, Lines: 3000, Elapsed: time.Second})
	p.print(replay.Progress{Source: "-", Lines: 6000, Elapsed: 2 * time.Second})
	p.print(replay.Progress{Done: true})
	assert.Equal(t, "\r 25.0%  access.log  3000 lines  3000 lines/s\x1b[K"+
		"\r-  6000 lines  3000 lines/s\x1b[K"+
		"\r\x1b[K", w.String())

	// Nothing printed, nothing to clear.
	w.Reset()
	(&replayProgress{w: &w}).print(replay.Progress{Done: true})
	assert.Empty(t, w.String())
	assert.False(t, strings.Contains(w.String(), "\n"))
}
