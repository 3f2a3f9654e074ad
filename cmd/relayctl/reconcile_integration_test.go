package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// journalLine is one in-doubt journal line as the hub writes it.
func journalLine(txid, target, url, code, stage string) string {
	b, err := json.Marshal(map[string]any{
		"time": "2026-12-01T17:30:00.123Z", "hub": "hub-a:9200", "txid": txid, "target": target,
		"url": url, "code": code, "stage": stage, "bytes_sent": 120,
		"payload_sha256": strings.Repeat("ab", 32),
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// resolvedLine is the journal line a hub appends when a resend of txid
// found that the target had applied it, with code.
func resolvedLine(txid, target, url, code string) string {
	b, err := json.Marshal(map[string]any{
		"time": "2026-12-01T17:31:05.250Z", "hub": "hub-b:9200", "txid": txid, "target": target,
		"url": url, "code": code, "stage": indoubt.StageResolvedApplied, "bytes_sent": 0,
		"payload_sha256": strings.Repeat("ab", 32),
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// writeJournal writes lines as a journal file and returns its path.
func writeJournal(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "in-doubt.log")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	return path
}

// deadURL is the URL of a loopback port nobody listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	return url
}

// TestReconcileAgainstRealFixtures: transactions posted straight to real
// fixture binaries, as a hub would have before losing their answers, are
// found applied; those never sent are found not applied; one whose target
// is down is unknown, and so is the run, exit status 1. Nothing is applied
// twice by being looked up.
func TestReconcileAgainstRealFixtures(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	for _, tx := range []struct{ url, txid, payload, code string }{
		{core.URL, "TX-wd-1", "WD 1001 2500", "0000"},
		{core.URL, "TX-xfer-1", "XFER 1001 1002 500", "0000"},
		{core.URL, "TX-over-1", "WD 1003 99999999", "B201"},
		{claim.URL, "TX-claim-1", "SUBMIT P1 700", "0000"},
	} {
		a, err := proctest.Tx(tx.url, tx.txid, tx.payload)
		require.NoError(t, err)
		require.Equal(t, tx.code, a.Code, tx.txid)
	}
	down := deadURL(t)
	journal := writeJournal(t,
		journalLine("TX-wd-1", "CORE", core.URL, "E901", reconcile.StageRequestSent),
		journalLine("TX-xfer-1", "CORE", core.URL, "E902", reconcile.StageAnswerPartlyRead),
		journalLine("TX-over-1", "CORE", core.URL, "E901", reconcile.StageRequestSent),
		journalLine("TX-claim-1", "CLAIM", claim.URL, "E500", reconcile.StageAnswerPartlyRead),
		journalLine("TX-never-1", "CORE", core.URL, "E902", reconcile.StageRequestPartlySent),
		journalLine("TX-never-2", "CLAIM", claim.URL, "E901", reconcile.StageRequestSent),
		journalLine("TX-down-1", "CORE", down, "E901", reconcile.StageRequestSent),
		`{"txid":"TX-torn","target":"CO`,
		journalLine("TX-wd-1", "CORE", core.URL+"/", "E901", reconcile.StageRequestSent),
	)

	res := proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal, "--json")
	assert.Equal(t, 1, res.ExitCode, res.Stderr)
	var report reconcileReport
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &report), res.Stdout)
	got := map[string]string{}
	for _, r := range report.Results {
		detail := ""
		if r.Answer != nil {
			detail = r.Answer.Code
		}
		got[r.TxID] = string(r.Outcome) + " " + detail
	}
	assert.Equal(t, map[string]string{
		"TX-wd-1":    "applied 0000",
		"TX-xfer-1":  "applied 0000",
		"TX-over-1":  "applied B201",
		"TX-claim-1": "applied 0000",
		"TX-never-1": "not_applied ",
		"TX-never-2": "not_applied ",
		"TX-down-1":  "unknown ",
	}, got)
	assert.Equal(t, []int{9}, report.Results[0].Duplicates)
	assert.Contains(t, report.Results[6].Reason, "connection refused")
	assert.Equal(t, []reconcile.BadLine{{Line: 8, Error: report.BadLines[0].Error, Fragment: true}}, report.BadLines,
		"the torn line is a fragment, skipped")
	assert.Equal(t, reconcile.Summary{InDoubt: 7, Applied: 4, NotApplied: 2, Unknown: 1, Fragments: 1}, report.Summary)

	// The text form says the same, a line each.
	res = proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal)
	assert.Equal(t, 1, res.ExitCode, res.Stderr)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.Len(t, lines, 10, res.Stdout)
	assert.Regexp(t, `^applied +TX-wd-1 +CORE +E901 +1,9 +0000 balance=97500$`, lines[1])
	assert.Regexp(t, `^not applied +TX-never-1 +CORE +E902 +5 +-$`, lines[5])
	assert.Regexp(t, `^unknown +TX-down-1 +CORE +E901 +7 +GET `+down+`/tx/TX-down-1: .*connection refused`, lines[7])
	assert.True(t, strings.HasPrefix(lines[8], "torn journal line 8 skipped: "), lines[8])
	assert.Equal(t, "7 in doubt: 4 applied, 2 not applied, 1 unknown; 1 torn fragment skipped", lines[9])

	// Looking up applied nothing twice: the money moved once.
	a, err := proctest.Tx(core.URL, "TX-bal-1", "BAL 1001")
	require.NoError(t, err)
	assert.Equal(t, "balance=97000", a.Message, "100000 - 2500 - 500")
	assert.Zero(t, core.SettledStats(t).Codes["E500"])

	// Without the down target and the torn line, everything is settled.
	settled := writeJournal(t,
		journalLine("TX-wd-1", "CORE", core.URL, "E901", reconcile.StageRequestSent),
		journalLine("TX-never-1", "CORE", core.URL, "E902", reconcile.StageRequestPartlySent),
	)
	res = proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", settled)
	assert.Equal(t, 0, res.ExitCode, res.Stdout+res.Stderr)
	assert.True(t, strings.HasSuffix(res.Stdout, "2 in doubt: 1 applied, 1 not applied, 0 unknown\n"), res.Stdout)
}

func TestReconcileExitStatuses(t *testing.T) {
	empty := writeJournal(t)
	tests := []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"empty journal", []string{"--in-doubt-log", empty}, 0, "0 in doubt: 0 applied, 0 not applied, 0 unknown\n"},
		{"missing journal", []string{"--in-doubt-log", filepath.Join(t.TempDir(), "nope")}, 2, ""},
		{"no journal flag", nil, 2, ""},
		{"unknown flag", []string{"--in-doubt-log", empty, "--bogus"}, 2, ""},
		{"zero timeout", []string{"--in-doubt-log", empty, "--timeout", "0s"}, 2, ""},
		{"key without certificate", []string{"--in-doubt-log", empty, "--key", "k.pem"}, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := proctest.Run(t, "./cmd/relayctl", append([]string{"reconcile"}, tt.args...)...)
			assert.Equal(t, tt.code, res.ExitCode, res.Stderr)
			if tt.code == 0 {
				assert.True(t, strings.HasSuffix(res.Stdout, tt.out), res.Stdout)
			} else {
				assert.Empty(t, res.Stdout)
				assert.NotEmpty(t, res.Stderr)
			}
		})
	}
}

func TestReconcileReadsStandardInput(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	_, err := proctest.Tx(core.URL, "T1", "DEP 1 1")
	require.NoError(t, err)
	var out strings.Builder
	c := reconcileCmd{InDoubtLog: []string{"-"}, Timeout: reconcile.DefaultTimeout, Concurrency: 1}
	err = c.Run(t.Context(), &streams{In: strings.NewReader(journalLine("T1", "CORE", core.URL, "E901", "request_sent")), Out: &out})
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(out.String(), "1 in doubt: 1 applied, 0 not applied, 0 unknown\n"), out.String())
}

// TestReconcileReadsRotatedJournals: a journal and the files logrotate
// made of it, the older ones gzipped, are reconciled together, given as
// flags and arguments; each line is placed by file, and a transaction in
// two files is asked about once.
func TestReconcileReadsRotatedJournals(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	for _, txid := range []string{"TX-old", "TX-mid"} {
		_, err := proctest.Tx(core.URL, txid, "DEP 1001 10")
		require.NoError(t, err)
	}
	dir := t.TempDir()
	current := writeJournal(t,
		journalLine("TX-new", "CORE", core.URL, "E901", reconcile.StageRequestSent),
		journalLine("TX-mid", "CORE", core.URL, "E901", reconcile.StageRequestSent))
	mid := filepath.Join(dir, "in-doubt.log-20261201")
	require.NoError(t, os.WriteFile(mid, []byte(journalLine("TX-mid", "CORE", core.URL, "E902", reconcile.StageAnswerPartlyRead)+"\n"), 0o600))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write([]byte(`{"txid":"TX-bad"}` + "\n" + journalLine("TX-old", "CORE", core.URL, "E901", reconcile.StageRequestSent) + "\n"))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	old := filepath.Join(dir, "in-doubt.log-20261130.gz")
	require.NoError(t, os.WriteFile(old, gz.Bytes(), 0o600))

	res := proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", old, mid, current, "--json")
	assert.Equal(t, 1, res.ExitCode, "a bad line leaves the run unsettled: %s", res.Stderr)
	var report reconcileReport
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &report), res.Stdout)
	got := map[string]string{}
	for _, r := range report.Results {
		got[r.TxID] = fmt.Sprintf("%s %s:%d", r.Outcome, filepath.Base(r.File), r.Line)
	}
	assert.Equal(t, map[string]string{
		"TX-old": "applied in-doubt.log-20261130.gz:2",
		"TX-mid": "applied in-doubt.log-20261201:1",
		"TX-new": "not_applied in-doubt.log:1",
	}, got)
	for _, r := range report.Results {
		if r.TxID == "TX-mid" {
			assert.Equal(t, []int{2}, r.Duplicates)
			assert.Equal(t, []string{current}, r.DuplicateFiles)
		}
	}
	require.Len(t, report.BadLines, 1)
	assert.Equal(t, old, report.BadLines[0].File)
	assert.Equal(t, 1, report.BadLines[0].Line)
	assert.Equal(t, reconcile.Summary{InDoubt: 3, Applied: 2, NotApplied: 1, BadLines: 1}, report.Summary)

	// The text form places each line by its file.
	res = proctest.Run(t, "./cmd/relayctl", "reconcile", old, mid, current)
	assert.Equal(t, 1, res.ExitCode, res.Stderr)
	assert.Regexp(t, `(?m)^applied +TX-mid +CORE +E902 +`+regexp.QuoteMeta(mid+":1,"+current+":2")+` +0000 `, res.Stdout)
	assert.Contains(t, res.Stdout, "bad journal line "+old+":1: ")

	// A file that is not there stops it before any look-up.
	res = proctest.Run(t, "./cmd/relayctl", "reconcile", current, filepath.Join(dir, "nope.gz"))
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Stderr, "nope.gz")
}

// TestReconcileResolvedOnResend: transactions a hub resolved on a resend
// are applied from the journal, whichever comes first of the in-doubt line
// and the resolution, and with no in-doubt line at all. Their target is
// down, so a look-up would leave them unknown: the run is settled only if
// none was made.
func TestReconcileResolvedOnResend(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	_, err := proctest.Tx(core.URL, "TX-plain", "DEP 1001 10")
	require.NoError(t, err)
	down := deadURL(t)
	journal := writeJournal(t,
		journalLine("TX-after", "CORE", down, "E901", reconcile.StageRequestSent),
		resolvedLine("TX-before", "CORE", down, "B201"),
		journalLine("TX-plain", "CORE", core.URL, "E902", reconcile.StageAnswerPartlyRead),
		resolvedLine("TX-after", "CORE", down+"/", "0000"),
		journalLine("TX-before", "CORE", down, "E500", reconcile.StageAnswerPartlyRead),
		resolvedLine("TX-alone", "CORE", down, "0000"),
	)

	res := proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal)
	assert.Equal(t, 0, res.ExitCode, res.Stdout+res.Stderr)
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	require.Len(t, lines, 6, res.Stdout)
	assert.Regexp(t, `^applied +TX-after +CORE +E901 +1,4 +0000, resolved on resend by hub-b:9200 at 2026-12-01T17:31:05.250Z$`, lines[1])
	assert.Regexp(t, `^applied +TX-before +CORE +E500 +5,2 +B201, resolved on resend by hub-b:9200 at 2026-12-01T17:31:05.250Z$`, lines[2])
	assert.Regexp(t, `^applied +TX-plain +CORE +E902 +3 +0000 balance=100010$`, lines[3])
	assert.Regexp(t, `^applied +TX-alone +CORE +- +6 +0000, resolved on resend by hub-b:9200 at 2026-12-01T17:31:05.250Z$`, lines[4])
	assert.Equal(t, "4 in doubt: 4 applied (3 resolved in the journal), 0 not applied, 0 unknown", lines[5])

	res = proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal, "--json")
	assert.Equal(t, 0, res.ExitCode, res.Stderr)
	var report reconcileReport
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &report), res.Stdout)
	require.Len(t, report.Results, 4)
	after := report.Results[0]
	assert.Equal(t, "TX-after", after.TxID)
	assert.Equal(t, reconcile.StageRequestSent, after.Stage, "the result is about the call in doubt")
	assert.Equal(t, &reconcile.Answer{Code: "0000"}, after.Answer)
	require.NotNil(t, after.Resolved)
	assert.Equal(t, 4, after.Resolved.Line)
	assert.Equal(t, "hub-b:9200", after.Resolved.Hub)
	assert.Empty(t, after.Duplicates, "a resolution is not a repeated call")
	assert.Nil(t, report.Results[2].Resolved, "TX-plain was looked up")
	assert.Equal(t, reconcile.Summary{InDoubt: 4, Applied: 4, Resolved: 3}, report.Summary)
	assert.Contains(t, res.Stdout, `"resolved": {`, "the JSON names the resolution")
}
