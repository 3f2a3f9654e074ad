package main_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// These tests start the real relay and fixture binaries and hold them to
// docs/PROTOCOL.md, "In-doubt journal": a call that may have reached its
// target without an answer is journalled, fsynced, before its client reads
// the answer; one that never left the hub is not, and is tried once more.

func TestInDoubtCallIsJournalledBeforeItsAnswerAndSurvivesKill9(t *testing.T) {
	// Given CORE slower than the relay's target timeout, and a journal,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":3000}`)
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target-timeout", "200ms",
		"--in-doubt-log", journal, "--hub-id", "hub-it")
	c := hubtest.Dial(t, h.Addr())

	// when a transfer times out after CORE took it,
	a := c.Exchange("XF-1|CORE|XFER 1001 1002 2500")
	require.Equal(t, "XF-1|E901|no answer within target timeout; outcome unknown", a.String())

	// then the admin port lists it and counts it,
	var listed struct {
		InDoubt []map[string]any `json:"in_doubt"`
	}
	require.NoError(t, json.Unmarshal([]byte(h.mustGet(t, "/in-doubt")), &listed))
	require.Len(t, listed.InDoubt, 1)
	assert.Equal(t, "XF-1", listed.InDoubt[0]["txid"])
	assert.Equal(t, int64(1), statusOf(t, h.status(t), "CORE").InDoubt)
	m, _ := h.scrape(t)
	assert.Equal(t, 1.0, m[`relay_in_doubt_total{target="CORE"}`])

	// and when a second one times out and the relay is killed with SIGKILL
	// the moment its client has read the answer,
	a = c.Exchange("XF-2|CORE|XFER 1001 1003 700")
	h.Kill()
	require.Equal(t, "XF-2|E901|no answer within target timeout; outcome unknown", a.String())

	// then both lines are in the journal, whole, in the documented format.
	lines := logtest.FileLines(t, journal)
	require.Len(t, lines, 2)
	for i, want := range []struct{ txid, payload string }{{"XF-1", "XFER 1001 1002 2500"}, {"XF-2", "XFER 1001 1003 700"}} {
		l := lines[i]
		assert.ElementsMatch(t, []string{"time", "hub", "txid", "target", "url", "code", "stage", "bytes_sent", "payload_sha256"}, keys(l))
		assert.Equal(t, want.txid, l["txid"])
		assert.Equal(t, "hub-it", l["hub"])
		assert.Equal(t, "CORE", l["target"])
		assert.Equal(t, core.URL, l["url"])
		assert.Equal(t, "E901", l["code"])
		assert.Equal(t, "request_sent", l["stage"])
		assert.Greater(t, l["bytes_sent"], float64(len(want.payload)))
		sum := sha256.Sum256([]byte(want.payload))
		assert.Equal(t, hex.EncodeToString(sum[:]), l["payload_sha256"])
		assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, l["time"])
	}
	assert.Equal(t, int64(2), core.SettledStats(t).Calls, "each transfer reached CORE once")
}

func TestFailureBeforeSendIsNotInDoubtAndIsTriedOnceMore(t *testing.T) {
	// Given CORE's port closed, and a journal,
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startAdminRelay(t, "--target", "CORE="+closedPortURL(t), "--in-doubt-log", journal)
	c := hubtest.Dial(t, h.Addr())

	// when a transfer cannot connect,
	a := c.Exchange("XF-1|CORE|XFER 1001 1002 2500")

	// then the client learns it was not sent, the connect was tried once
	// more, and nothing is in doubt.
	assert.Equal(t, "XF-1|E902|target unreachable: connection refused; not sent", a.String())
	m, _ := h.scrape(t)
	assert.Equal(t, 1.0, m[`relay_target_retries_total{target="CORE"}`], "one retry, never more")
	assert.Equal(t, 0.0, m[`relay_in_doubt_total{target="CORE"}`])
	assert.Zero(t, statusOf(t, h.status(t), "CORE").InDoubt)
	assert.Equal(t, `{"in_doubt":[]}`+"\n", h.mustGet(t, "/in-doubt"))
	assert.Empty(t, logtest.FileLines(t, journal))
}

// TestLateBookingsAreReconciledAppliedOnce: a CORE that books at once but
// answers after the relay's target timeout leaves its clients with E901
// for withdrawals it did book; the relay reads each late answer and
// journals it applied (via late_answer), relayctl reconcile, reading the
// journal, finds every one of them settled applied without asking CORE,
// none missing, and CORE's ledger shows each applied exactly once.
func TestLateBookingsAreReconciledAppliedOnce(t *testing.T) {
	const n = 10
	// Given CORE booking at once and answering after 1 s, and a relay that
	// waits 300 ms, journals calls in doubt, and neither trips nor fills
	// over n of them,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target-timeout", "300ms",
		"--in-doubt-log", journal, "--fail-threshold", "1000", "--max-inflight", fmt.Sprint(2*n))
	c := hubtest.Dial(t, h.Addr())

	// when n distinct withdrawals are sent at once,
	lines := make([]string, n)
	for i := range n {
		lines[i] = fmt.Sprintf("LATE-%d|CORE|WD ACC%d 100", i, i)
	}
	c.Send(lines...)

	// then each client answer is a timeout of unknown outcome,
	answers := c.ReadByTxID(n)
	require.Len(t, answers, n)
	for i := range n {
		txid := fmt.Sprintf("LATE-%d", i)
		a := answers[txid]
		assert.Equal(t, "E901", a.Code, txid)
		assert.Contains(t, a.Message, "; outcome unknown", txid)
	}

	// the relay journals each one applied once its late answer comes,
	proctest.Eventually(t, 10*time.Second, "every late answer journalled", func() bool {
		n := 0
		for _, l := range logtest.FileLines(t, journal) {
			if l["stage"] == indoubt.StageResolvedApplied && l["via"] == indoubt.ViaLateAnswer {
				n++
			}
		}
		return n == len(lines)
	})

	// reconcile finds every one of them settled applied with the booking's
	// code, none missing, nothing unknown, and exits 0,
	res := proctest.Run(t, "./cmd/relayctl", "reconcile", "--in-doubt-log", journal, "--json")
	require.Equal(t, 0, res.ExitCode, res.Stdout+res.Stderr)
	var report struct {
		Results []reconcile.Result `json:"results"`
		Summary reconcile.Summary  `json:"summary"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &report), res.Stdout)
	got := map[string]string{}
	for _, r := range report.Results {
		detail := string(r.Outcome)
		if r.Answer != nil {
			detail += " " + r.Answer.Code + " " + r.Answer.Message
		}
		got[r.TxID] = detail
	}
	want := map[string]string{}
	for i := range n {
		want[fmt.Sprintf("LATE-%d", i)] = "applied 0000 "
	}
	assert.Equal(t, want, got)
	assert.Equal(t, reconcile.Summary{InDoubt: n, Applied: n, Resolved: n}, report.Summary)

	// and, asked directly once it answers at once again, CORE reached each
	// withdrawal once and booked it exactly once.
	core.Ctl(t, `{"mode":"normal"}`)
	st := core.SettledStats(t)
	assert.Equal(t, int64(n), st.Calls, "each withdrawal reached CORE once")
	for i := range n {
		a, err := proctest.Tx(core.URL, fmt.Sprintf("BAL-%d", i), fmt.Sprintf("BAL ACC%d", i))
		require.NoError(t, err)
		assert.Equal(t, "balance=99900", a.Message, "ACC%d", i)
	}
}

// keys returns the keys of m.
func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestSecondRelayOnTheSameInDoubtJournalRefusesToStart(t *testing.T) {
	// Given a relay running with its in-doubt journal,
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	first := startAdminRelay(t, "--target", "CORE="+closedPortURL(t), "--in-doubt-log", journal)

	// when a second relay, with a breaker log of its own, is started on
	// the same journal,
	second := []string{"--listen", "127.0.0.1:0", "--admin-listen", "",
		"--breaker-log", filepath.Join(t.TempDir(), "breaker.log"),
		"--target", "CORE=" + closedPortURL(t), "--in-doubt-log", journal}
	res := proctest.Run(t, relayPkg, second...)

	// then it exits 1, a runtime error, with one line on stderr that names
	// the journal and says why;
	assert.Equal(t, 1, res.ExitCode, "stderr: %s", res.Stderr)
	lines := stderrLines(res.Stderr)
	if assert.Len(t, lines, 1, "want exactly one line on stderr, got:\n%s", res.Stderr) {
		assert.Contains(t, lines[0], "--in-doubt-log")
		assert.Contains(t, lines[0], journal)
		assert.Contains(t, lines[0], "another relay holds it")
	}

	// once the first relay has stopped, the journal is free again.
	first.Signal(syscall.SIGTERM)
	require.Equal(t, 0, first.Wait())
	proctest.Start(t, relayPkg, second...)
}

// inDoubtRound is one round of a client of
// TestSIGHUPReopensTheInDoubtJournalWhileCallsGoOn: the answers it read.
type inDoubtRound struct {
	answers []hubtest.Response
	err     error
}

// sendInDoubtRounds sends rounds of n transfers on c until stop is closed,
// each round once the last one's answers are all read, and sends each
// round's answers (or the error that ended the rounds) on out. It uses no
// method of c that fails the test, since it runs on a goroutine of its own.
func sendInDoubtRounds(c *hubtest.Client, name string, n int, stop <-chan struct{}, out chan<- inDoubtRound) {
	for round := 0; ; round++ {
		select {
		case <-stop:
			return
		default:
		}
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "%s-%d-%d|CORE|XFER 1001 1002 1\n", name, round, i)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			out <- inDoubtRound{err: err}
			return
		}
		var r inDoubtRound
		for range n {
			line, err := c.ReadLine(10 * time.Second)
			if err == nil {
				var a hubtest.Response
				if a, err = hubtest.ParseResponse(line); err == nil {
					r.answers = append(r.answers, a)
					continue
				}
			}
			out <- inDoubtRound{err: err}
			return
		}
		out <- r
	}
}

func TestSIGHUPReopensTheInDoubtJournalWhileCallsGoOn(t *testing.T) {
	const clients, inFlight = 4, 4
	// Given CORE slower than the relay's target timeout, so that every
	// call ends in doubt, and a relay that journals them and neither trips
	// nor fills,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":10000}`)
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	rotated := journal + ".1"
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target-timeout", "50ms", "--in-doubt-log", journal,
		"--fail-threshold", "1000000", "--max-inflight", "100")

	// and clients that keep transfers in flight all along,
	stop := make(chan struct{})
	rounds := make(chan inDoubtRound, 1024)
	var wg sync.WaitGroup
	for i := range clients {
		c := hubtest.Dial(t, h.Addr())
		wg.Go(func() { sendInDoubtRounds(c, fmt.Sprintf("C%d", i), inFlight, stop, rounds) })
	}
	stopped := false
	stopClients := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
			close(rounds)
		}
	}
	t.Cleanup(stopClients)
	answered := map[string]string{} // txid → code
	waitForAnswers := func(more int, what string) {
		t.Helper()
		want := len(answered) + more
		deadline := time.After(30 * time.Second)
		for len(answered) < want {
			select {
			case r := <-rounds:
				require.NoError(t, r.err)
				for _, a := range r.answers {
					answered[a.TxID] = a.Code
				}
			case <-deadline:
				t.Fatalf("%d answers, not %d, %s", len(answered), want, what)
			}
		}
	}
	waitForAnswers(40, "before the rename")

	// when the journal is renamed, as logrotate does, calls go on, and the
	// relay gets SIGHUP,
	require.NoError(t, os.Rename(journal, rotated))
	waitForAnswers(40, "between the rename and the signal")
	h.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "the relay logs that it reopened its in-doubt journal", func() bool {
		for _, l := range h.LogLines() {
			if l["message"] == "in-doubt journal reopened" {
				return true
			}
		}
		return false
	})
	waitForAnswers(40, "after the reopen")

	// then the relay holds the new file's lock, and no longer the old
	// one's,
	_, err := indoubt.Open(indoubt.Config{Path: journal})
	assert.ErrorIs(t, err, indoubt.ErrLocked)
	old, err := indoubt.Open(indoubt.Config{Path: rotated})
	require.NoError(t, err, "the relay still holds the renamed journal")
	require.NoError(t, old.Close())

	// and once the clients and the relay have stopped,
	stopClients()
	for r := range rounds {
		require.NoError(t, r.err)
		for _, a := range r.answers {
			answered[a.TxID] = a.Code
		}
	}
	h.Signal(syscall.SIGTERM)
	require.Equal(t, 0, h.Wait())

	// every call in doubt is in exactly one of the two files, each line
	// whole, and each file has some.
	inFile := map[string]string{} // txid → file
	for _, path := range []string{rotated, journal} {
		lines := logtest.FileLines(t, path)
		assert.NotEmpty(t, lines, path)
		for _, l := range lines {
			txid, _ := l["txid"].(string)
			if prev, dup := inFile[txid]; dup {
				t.Errorf("%s is in %s and in %s", txid, prev, path)
			}
			inFile[txid] = path
		}
	}
	for txid, code := range answered {
		assert.Equal(t, "E901", code, txid)
		assert.Contains(t, inFile, txid, "an answered call in doubt is in neither file")
	}
	assert.Len(t, inFile, len(answered), "nothing in the files that no client was answered")
}

func TestInDoubtJournalIsOnByDefault(t *testing.T) {
	// Given a relay started with no --in-doubt-log, and CORE slower than
	// its target timeout,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":3000}`)
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target-timeout", "200ms")

	// its start-up line says where the journal is: in-doubt.log in its
	// working directory, as an absolute path,
	var journal string
	for _, l := range h.LogLines() {
		if l["message"] == "relay listening" {
			journal, _ = l["in_doubt_log"].(string)
		}
	}
	require.True(t, filepath.IsAbs(journal), "in_doubt_log %q", journal)
	assert.Equal(t, "in-doubt.log", filepath.Base(journal))

	// and a call in doubt is journalled there before its client hears.
	c := hubtest.Dial(t, h.Addr())
	require.Equal(t, "D1|E901|no answer within target timeout; outcome unknown", c.Exchange("D1|CORE|WD 1001 5").String())
	lines := logtest.FileLines(t, journal)
	require.Len(t, lines, 1)
	assert.Equal(t, "D1", lines[0]["txid"])
}
