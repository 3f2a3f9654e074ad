package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// runResolve runs `relayctl in-doubt resolve` with args in-process and
// returns its output and exit status.
func runResolve(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	_, kctx, err := parse(t, append([]string{"in-doubt", "resolve"}, args...)...)
	if err != nil {
		return "", 2, err
	}
	var out bytes.Buffer
	kctx.BindTo(context.Background(), (*context.Context)(nil))
	err = kctx.Run(&cmdline.Streams{In: bytes.NewReader(nil), Out: &out, Err: &out})
	return out.String(), cmdline.Code(err), err
}

// readBack reads the journal at path.
func readBack(t *testing.T, path string) []reconcile.Entry {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	entries, bad, err := reconcile.ReadJournal(f)
	require.NoError(t, err)
	require.Empty(t, bad)
	return entries
}

func TestInDoubtResolve(t *testing.T) {
	journal := func(t *testing.T) string {
		return writeJournal(t,
			journalLine("W1", "CORE", "http://127.0.0.1:9201", "E901", reconcile.StageRequestSent),
			journalLine("W2", "CORE", "http://127.0.0.1:9201", "E901", reconcile.StageRequestSent),
			resolvedLine("W2", "CORE", "http://127.0.0.1:9201", "0000"),
		)
	}

	t.Run("applied, with the target's code", func(t *testing.T) {
		// Given a stopped hub's journal with W1 open
		path := journal(t)

		// When an operator settles it as applied with B201
		out, code, err := runResolve(t, "W1", "--applied", "B201", "--in-doubt-log", path)

		// Then a resolved_applied line via operator is appended, and W1 is
		// no longer open
		require.NoError(t, err)
		assert.Zero(t, code)
		assert.Contains(t, out, "W1 at CORE: resolved_applied via operator (journal line 1 settled)")
		entries := readBack(t, path)
		require.Len(t, entries, 4)
		last := entries[3]
		assert.Equal(t, reconcile.StageResolvedApplied, last.Stage)
		assert.Equal(t, indoubt.ViaOperator, last.Via)
		assert.Equal(t, "B201", last.Code)
		assert.Equal(t, "hub-a:9200", last.Hub)
		assert.Equal(t, entries[0].PayloadSHA256, last.PayloadSHA256, "the resolution names the same payload")
		_, ok := reconcile.Unsettled(entries, "", "W1")
		assert.False(t, ok)
	})
	t.Run("not applied", func(t *testing.T) {
		path := journal(t)
		_, code, err := runResolve(t, "W1", "--not-applied", "--in-doubt-log", path)
		require.NoError(t, err)
		assert.Zero(t, code)
		entries := readBack(t, path)
		assert.Equal(t, reconcile.StageResolvedNotApplied, entries[3].Stage)
		assert.Equal(t, indoubt.ViaOperator, entries[3].Via)
		assert.Empty(t, entries[3].Code)
	})
	t.Run("already settled", func(t *testing.T) {
		path := journal(t)
		_, code, err := runResolve(t, "W2", "--not-applied", "--in-doubt-log", path)
		assert.Equal(t, 1, code)
		assert.ErrorContains(t, err, "W2: no unsettled in-doubt entry")
		assert.Len(t, readBack(t, path), 3, "nothing appended")
	})
	t.Run("a running hub holds the journal: the hub settles it", func(t *testing.T) {
		// Given a journal a hub holds, with W1 open at it
		path := journal(t)
		j, err := indoubt.Open(indoubt.Config{Path: path})
		require.NoError(t, err)
		t.Cleanup(func() { _ = j.Close() })
		hub := &openHub{open: twoOpen, status: http.StatusOK}
		flags := startOpenHub(t, hub)

		// When an operator settles it, naming the journal and the hub
		out, code, err := runResolve(t, "W1", "--applied", "0000", "--in-doubt-log", path, "--admin", flags.Admin)

		// Then the hub is asked to, at the target it has W1 open at, and
		// the journal is left to it
		require.NoError(t, err)
		assert.Zero(t, code)
		assert.Equal(t, []string{`/in-doubt/W1/resolve {"target":"CORE","applied":true,"code":"0000"}`}, hub.resolved)
		assert.Contains(t, out, "W1 at CORE: resolved_applied via operator (settled by the hub at "+flags.Admin+")")
		assert.Len(t, readBack(t, path), 3, "nothing appended by relayctl")
	})
	t.Run("through the hub, without a journal", func(t *testing.T) {
		hub := &openHub{open: twoOpen, status: http.StatusOK}
		flags := startOpenHub(t, hub)
		out, code, err := runResolve(t, "CL-22", "--not-applied", "--target", "claim", "--admin", flags.Admin)
		require.NoError(t, err)
		assert.Zero(t, code)
		assert.Equal(t, []string{`/in-doubt/CL-22/resolve {"target":"claim","not_applied":true}`}, hub.resolved)
		assert.Contains(t, out, "CL-22 at CLAIM: resolved_not_applied via operator", "the hub's name for the target")
	})
	t.Run("the hub has it nowhere open, or refuses", func(t *testing.T) {
		hub := &openHub{open: twoOpen, status: http.StatusNotFound}
		flags := startOpenHub(t, hub)
		_, code, err := runResolve(t, "W9", "--not-applied", "--admin", flags.Admin)
		assert.Equal(t, 1, code)
		assert.ErrorContains(t, err, "W9: not open in doubt at the hub at "+flags.Admin)
		assert.Empty(t, hub.resolved)
		_, code, err = runResolve(t, "W9", "--not-applied", "--target", "CORE", "--admin", flags.Admin)
		assert.Equal(t, 1, code)
		assert.ErrorContains(t, err, "404 Not Found: W9 is not open in doubt at CORE")
	})
	t.Run("a running hub that cannot be asked", func(t *testing.T) {
		path := journal(t)
		j, err := indoubt.Open(indoubt.Config{Path: path})
		require.NoError(t, err)
		t.Cleanup(func() { _ = j.Close() })
		_, code, err := runResolve(t, "W1", "--not-applied", "--in-doubt-log", path, "--admin", "127.0.0.1:1")
		assert.Equal(t, 2, code)
		assert.ErrorContains(t, err, "connection refused")
		assert.Len(t, readBack(t, path), 3, "nothing appended")
	})
	t.Run("no journal there", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "in-doubt.log")
		_, code, err := runResolve(t, "W1", "--not-applied", "--in-doubt-log", path)
		assert.Equal(t, 2, code)
		assert.ErrorContains(t, err, "no such file")
		assert.NoFileExists(t, path, "none created")
	})
	t.Run("the TXID at two targets", func(t *testing.T) {
		path := writeJournal(t,
			journalLine("W1", "CORE", "http://127.0.0.1:9201", "E901", reconcile.StageRequestSent),
			journalLine("W1", "CLAIM", "http://127.0.0.1:9202", "E901", reconcile.StageRequestSent),
		)
		_, code, err := runResolve(t, "W1", "--not-applied", "--in-doubt-log", path)
		assert.Equal(t, 1, code)
		assert.ErrorContains(t, err, "--target")
		_, code, err = runResolve(t, "W1", "--not-applied", "--target", "CORE", "--in-doubt-log", path)
		require.NoError(t, err)
		assert.Zero(t, code)
		entries := readBack(t, path)
		assert.Equal(t, "CORE", entries[2].Target)
	})
	t.Run("command line mistakes", func(t *testing.T) {
		path := journal(t)
		for name, args := range map[string][]string{
			"no outcome":       {"W1", "--in-doubt-log", path},
			"both outcomes":    {"W1", "--applied", "0000", "--not-applied", "--in-doubt-log", path},
			"a hub's own code": {"W1", "--applied", "E901", "--in-doubt-log", path},
			"not a code":       {"W1", "--applied", "ok", "--in-doubt-log", path},
		} {
			t.Run(name, func(t *testing.T) {
				_, _, err := runResolve(t, args...)
				assert.Error(t, err)
			})
		}
		assert.Len(t, readBack(t, path), 3, "nothing appended")
	})
}

func TestInDoubtStillListsByDefault(t *testing.T) {
	c, kctx, err := parse(t, "in-doubt", "--since", "2026-12-01T17:00:00Z")
	require.NoError(t, err)
	assert.Equal(t, "in-doubt list", kctx.Command())
	assert.Equal(t, "2026-12-01T17:00:00Z", c.InDoubt.List.Since)
	c, _, err = parse(t, "in-doubt", "--recent")
	require.NoError(t, err)
	assert.True(t, c.InDoubt.List.Recent)
}

// stageLine is a resolution line of stage, learnt via via.
func stageLine(txid, url, code, stage, via string) string {
	b, err := json.Marshal(map[string]any{
		"time": "2026-12-01T17:31:05.250Z", "hub": "hub-b:9200", "txid": txid, "target": "CORE",
		"url": url, "code": code, "stage": stage, "via": via, "payload_sha256": strings.Repeat("ab", 32),
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestReconcileReadsEveryStage: the journal settles applied, not applied
// and reversed transactions, each with how it was learnt, and an expired
// one is looked up (its target is down here) and says the hub gave up.
func TestReconcileReadsEveryStage(t *testing.T) {
	down := deadURL(t)
	path := writeJournal(t,
		journalLine("A", "CORE", down, "E901", reconcile.StageRequestSent),
		stageLine("A", down, "B201", reconcile.StageResolvedApplied, indoubt.ViaLateAnswer),
		journalLine("N", "CORE", down, "E901", reconcile.StageRequestSent),
		stageLine("N", down, "", reconcile.StageResolvedNotApplied, indoubt.ViaLookup),
		journalLine("R", "CORE", down, "E901", reconcile.StageRequestSent),
		stageLine("R", down, "0000", reconcile.StageResolvedReversed, indoubt.ViaReversal),
		journalLine("X", "CORE", down, "E901", reconcile.StageRequestSent),
		stageLine("X", down, "", reconcile.StageUnresolvedExpired, indoubt.ViaLookup),
	)
	_, kctx, err := parse(t, "reconcile", "--in-doubt-log", path, "--timeout", "2s")
	require.NoError(t, err)
	var out bytes.Buffer
	kctx.BindTo(context.Background(), (*context.Context)(nil))
	err = kctx.Run(&cmdline.Streams{In: bytes.NewReader(nil), Out: &out, Err: &out})
	assert.Equal(t, 1, cmdline.Code(err), "X is still unknown")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 6, out.String())
	assert.Regexp(t, `^applied +A +CORE +E901 +1,2 +B201, resolved by a late answer by hub-b:9200 at 2026-12-01T17:31:05.250Z$`, lines[1])
	assert.Regexp(t, `^not applied +N +CORE +E901 +3,4 +-, resolved by look-up by hub-b:9200`, lines[2])
	assert.Regexp(t, `^reversed +R +CORE +E901 +5,6 +0000, resolved by reversal by hub-b:9200`, lines[3])
	assert.Regexp(t, `^unknown +X +CORE +E901 +7,8 +GET .*; the hub gave up at 2026-12-01T17:31:05.250Z$`, lines[4])
	assert.Equal(t, "4 in doubt: 1 applied (3 resolved in the journal), 1 not applied, 1 reversed, 1 unknown; 1 given up by the hub", lines[5])
}
