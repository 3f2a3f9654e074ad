package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/disktest"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// These tests put the relay's own files on a file system of their own and
// make it fail under the running relay, as the hub's disk does: full, then
// stalled (docs/OPERATING.md, "A full or stalled disk").

// wholeLines returns breaker log lines of an earlier run, each target's
// chain ending CLOSED, exactly size bytes long (size even, at least 80).
func wholeLines(size int) string {
	var b strings.Builder
	for i := 0; b.Len() < size; i++ {
		left := size - b.Len()
		n := 25 // a pair of 64-byte lines
		if left < 2*(39+n)+80 {
			n = left/2 - 39 // the last pair takes what is left
		}
		name := fmt.Sprintf("P%d%s", i, strings.Repeat("X", n))[:n]
		for _, change := range []string{"CLOSED->OPEN", "OPEN->CLOSED"} {
			fmt.Fprintf(&b, "2026-12-01T00:00:00.000Z|%s|%s\n", name, change)
		}
	}
	if b.Len() != size {
		panic(fmt.Sprintf("wholeLines(%d) made %d bytes", size, b.Len()))
	}
	return b.String()
}

func TestFullDiskLosesNoJournalledTransactionAndTearsNoLine(t *testing.T) {
	// Given the relay's in-doubt journal and breaker log on a 64 KiB tmpfs,
	// the breaker log's last page 20 bytes short of full, so that its next
	// line is torn by the full disk part way,
	dir := disktest.Tmpfs(t, 64<<10)
	journal, blog := filepath.Join(dir, "in-doubt.log"), filepath.Join(dir, "breaker.log")
	earlier := wholeLines(4096 - 20)
	require.NoError(t, os.WriteFile(blog, []byte(earlier), 0o644))
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":400}`)
	// No late reading: CORE's late answers would settle the calls, and
	// their resolution lines name the calls the full disk kept out.
	conf := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(conf, []byte("[CORE]\nlate_answer_grace = 0\n"), 0o600))
	r := startPolicyRelay(t, nil, "--config", conf, "--breaker-log", blog, "--in-doubt-log", journal,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+closedPortURL(t),
		"--target-timeout", "100ms", "--fail-threshold", "100000", "--max-inflight", "64")
	c := hubtest.Dial(t, r.Addr())
	seq := 0
	// inDoubt sends n withdrawals at once, each of which CORE books after
	// the relay gave up on it, and returns their TXIDs: every one is
	// answered, E901 outcome unknown, whatever the disk does.
	inDoubt := func(prefix string, n int) []string {
		t.Helper()
		var lines, txids []string
		for range n {
			seq++
			txid := fmt.Sprintf("%s-%d", prefix, seq)
			txids = append(txids, txid)
			lines = append(lines, fmt.Sprintf("%s|CORE|WD ACC%d 1", txid, seq))
		}
		c.Send(lines...)
		answers := c.ReadByTxID(n)
		for _, txid := range txids {
			a := answers[txid]
			require.Equal(t, "E901", a.Code, a.String())
			require.Contains(t, a.Message, "outcome unknown", a.String())
		}
		return txids
	}
	control := func(action string) {
		t.Helper()
		code, body := r.control(t, "CLAIM", action, "")
		require.Equal(t, 200, code, body)
	}
	before := inDoubt("BEFORE", 3)

	// when the file system fills up and calls go in doubt, until the
	// journal fails to take them, and CLAIM's breaker opens and closes,
	filler := disktest.Fill(t, dir)
	var full []string
	for i := 0; r.metric(t, "relay_in_doubt_log_errors_total") == 0; i++ {
		require.Less(t, i, 20, "the journal never failed on a full file system")
		full = append(full, inDoubt("FULL", 20)...)
	}
	full = append(full, inDoubt("FULL", 5)...)
	control("open")
	control("close")
	proctest.Eventually(t, 5*time.Second, "a breaker log write fails", func() bool {
		return r.status(t).BreakerLog.WriteErrors > 0
	})
	st := r.status(t).BreakerLog
	assert.Equal(t, int64(2), st.Pending, "the changes wait, in order, while the disk is full")
	assert.Contains(t, st.LastError, "no space left on device")

	// and space is freed again, and more calls go in doubt and CLAIM's
	// breaker moves again,
	require.NoError(t, os.Remove(filler))
	r.waitBreakerLog(t)
	after := inDoubt("AFTER", 10)
	control("open")
	control("close")
	r.waitBreakerLog(t)
	notJournalled := r.metric(t, "relay_in_doubt_log_errors_total")
	r.Signal(syscall.SIGTERM)
	require.Equal(t, 0, r.Wait(), r.Stderr())

	// then the breaker log has the earlier lines as they were and every
	// change after them, none torn, each chain whole,
	text, err := os.ReadFile(blog)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(text), earlier), "the earlier lines are kept")
	entries, fragments, err := breakerlog.ReadFile(blog)
	require.NoError(t, err, "every line parses")
	assert.Empty(t, fragments, "no torn line is left")
	require.NoError(t, breakerlog.CheckChains(entries))
	var claim []string
	for _, e := range entries {
		if e.Name == "CLAIM" {
			claim = append(claim, e.From.String()+"->"+e.To.String())
		}
	}
	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->CLOSED", "CLOSED->OPEN", "OPEN->CLOSED"}, claim)

	// every line of the journal parses, and reconcile finds every call in
	// doubt from before the disk filled and after it had room again, and
	// of those while it was full all but those counted as not journalled.
	core.Ctl(t, `{"mode":"normal"}`) // its look-ups answer at once
	res := proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal, "--json")
	require.Equal(t, 0, res.ExitCode, res.Stdout+res.Stderr)
	var report struct {
		Results  []reconcile.Result  `json:"results"`
		BadLines []reconcile.BadLine `json:"bad_lines"`
		Summary  reconcile.Summary   `json:"summary"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &report), res.Stdout)
	assert.Empty(t, report.BadLines, "no bad line, no fragment")
	found := map[string]bool{}
	for _, res := range report.Results {
		found[res.TxID] = true
		assert.Equal(t, reconcile.Applied, res.Outcome, res.TxID)
	}
	for _, txid := range append(before, after...) {
		assert.True(t, found[txid], "%s is not in the journal", txid)
	}
	missing := 0
	for _, txid := range full {
		if !found[txid] {
			missing++
		}
	}
	assert.Positive(t, missing, "every call was journalled: the disk was never full")
	assert.Equal(t, notJournalled, float64(missing), "each call missing from the journal is counted")
	t.Logf("%d calls in doubt while the disk was full, %d not journalled", len(full), missing)
}

func TestStalledDiskDelaysOnlyTheBreakerLog(t *testing.T) {
	// Given the relay's breaker log on an ext4 file system of its own,
	dir := disktest.Ext4(t, 8<<20)
	blog := filepath.Join(dir, "breaker.log")
	core := proctest.StartFixture(t, "CORE", "core")
	r := startPolicyRelay(t, nil, "--breaker-log", blog, "--target", "CORE="+core.URL,
		"--fail-threshold", "1", "--reset-timeout", "200ms", "--drain-timeout", "1s")
	c := hubtest.Dial(t, r.Addr())

	// when that file system is frozen, and CORE fails, trips its breaker
	// and recovers through a half-open probe that CORE books,
	disktest.Freeze(t, dir)
	core.Ctl(t, `{"mode":"fail"}`)
	a := c.Exchange("TRIP|CORE|WD ACC1 100")
	require.Equal(t, "E500", a.Code, a.String())
	require.Equal(t, "E904", c.Exchange("OPEN|CORE|BAL ACC1").Code)
	core.Ctl(t, `{"mode":"normal"}`)
	proctest.Eventually(t, 5*time.Second, "the probe is admitted and answered", func() bool {
		a = c.Exchange(fmt.Sprintf("PROBE-%d|CORE|WD ACC1 100", time.Now().UnixNano()))
		return a.Code != "E904"
	})

	// then every call was answered while the disk stalled, the booked
	// probe too, and /status answers, showing the changes waiting,
	require.Equal(t, "0000", a.Code, a.String())
	st := r.status(t)
	assert.Equal(t, "CLOSED", statusOf(t, st, "CORE").State)
	require.NotNil(t, st.BreakerLog)
	assert.Equal(t, int64(3), st.BreakerLog.Pending)
	assert.Positive(t, r.metric(t, "relay_breaker_log_oldest_pending_seconds"))

	// and once the disk thaws, the lines are written in order, each chain
	// whole.
	disktest.Thaw(t, dir)
	r.waitBreakerLog(t)
	assert.Equal(t, []string{"CORE|CLOSED->OPEN", "CORE|OPEN->HALF_OPEN", "CORE|HALF_OPEN->CLOSED"}, logLines(t, blog))

	// Stalled again with a change queued, SIGTERM still drains and the
	// relay stops within its bounds, saying what the log lacks;
	disktest.Freeze(t, dir)
	core.Ctl(t, `{"mode":"fail"}`)
	require.Equal(t, "E500", c.Exchange("TRIP-2|CORE|BAL ACC1").Code)
	r.Signal(syscall.SIGTERM)
	proctest.Eventually(t, 10*time.Second, "the relay reports the breaker log it could not close", func() bool {
		return strings.Contains(r.Stderr(), "state changes not written")
	})
	assert.Contains(t, r.Stderr(), "--breaker-log: close: breaker log: 1 state changes not written")

	// its process ends once the disk lets its last write go, with status
	// 1, and the file still parses and chains.
	disktest.Thaw(t, dir)
	assert.Equal(t, 1, r.Wait())
	entries, fragments, err := breakerlog.ReadFile(blog)
	require.NoError(t, err)
	assert.Empty(t, fragments)
	require.NoError(t, breakerlog.CheckChains(entries))
	assert.GreaterOrEqual(t, len(entries), 3)
}
