package main_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
)

// These tests start the real relay and fixture binaries and hold them to
// docs/PROTOCOL.md, "The life of a transaction in doubt": the hub settles
// every call in doubt on its own — from the target's late answer, a
// look-up of its status_url, or a reversal — journals how, tells its
// shield, pauses while the breaker is open, takes its open entries up
// again after kill -9, and gives up at resolve_expire.

// unknownOutcome is the client's answer to a call that timed out after
// it reached its target.
const unknownOutcome = "E901|no answer within target timeout; outcome unknown"

// resolving is a relay that settles calls in doubt, with its journal.
type resolving struct {
	*policyRelay
	journal string
	args    []string
}

// startResolving starts a relay serving CORE at coreURL with the CORE
// section conf of a settings file, its in-doubt journal at journal (a new
// one when empty), a 300 ms target timeout, plus args.
func startResolving(t *testing.T, coreURL, conf, journal string, args ...string) *resolving {
	t.Helper()
	if journal == "" {
		journal = filepath.Join(t.TempDir(), "in-doubt.log")
	}
	path := writeFile(t, "relay.toml", "[CORE]\n"+conf)
	full := append([]string{"--target", "CORE=" + coreURL, "--config", path,
		"--target-timeout", "300ms", "--in-doubt-log", journal}, args...)
	return &resolving{policyRelay: startPolicyRelay(t, nil, full...), journal: journal, args: full}
}

// settled waits for the journal's resolution line of txid and returns it.
func settled(t *testing.T, journal, txid string) map[string]any {
	t.Helper()
	var line map[string]any
	proctest.Eventually(t, 10*time.Second, txid+" is settled in "+journal, func() bool {
		for _, l := range logtest.FileLines(t, journal) {
			if stage, _ := l["stage"].(string); l["txid"] == txid && (strings.HasPrefix(stage, "resolved_") || strings.HasPrefix(stage, "unresolved_")) {
				line = l
				return true
			}
		}
		return false
	})
	return line
}

// openInDoubt is relay_in_doubt_open of CORE.
func (r *resolving) openInDoubt(t *testing.T) float64 {
	t.Helper()
	return r.metric(t, `relay_in_doubt_open{target="CORE"}`)
}

// resolvedCount is relay_in_doubt_resolved_total of CORE for outcome and via.
func (r *resolving) resolvedCount(t *testing.T, outcome, via string) float64 {
	t.Helper()
	return r.metric(t, fmt.Sprintf(`relay_in_doubt_resolved_total{outcome=%q,target="CORE",via=%q}`, outcome, via))
}

// statusURL and reverseURL are the fixture's look-up and reversal URLs
// as a settings file names them.
func statusURL(base string) string  { return base + "/tx/{txid}" }
func reverseURL(base string) string { return base + "/tx/{txid}/reverse" }

func TestALateBookingIsSettledByTheHubWithoutAResend(t *testing.T) {
	// Given CORE booking at once and answering after 2 s, and a relay
	// that waits 300 ms and knows CORE's status URL,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":2000}`)
	h := startResolving(t, core.URL, fmt.Sprintf("status_url = %q\nresolve_after = \"200ms\"\n", statusURL(core.URL)), "")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out and the branch sends nothing more,
	require.Equal(t, "W1|"+unknownOutcome, c.Exchange("W1|CORE|WD 1001 500").String())

	// then the hub settles it on its own: the journal says applied, with
	// CORE's code, learnt from its late answer or a look-up,
	line := settled(t, h.journal, "W1")
	assert.Equal(t, "resolved_applied", line["stage"])
	assert.Equal(t, "0000", line["code"])
	via, _ := line["via"].(string)
	assert.Contains(t, []string{"late_answer", "lookup"}, via)

	// nothing is open any more, the settlement is counted,
	proctest.Eventually(t, 5*time.Second, "relay_in_doubt_open is 0", func() bool { return h.openInDoubt(t) == 0 })
	assert.Equal(t, 1.0, h.resolvedCount(t, "applied", via))

	// and CORE took one POST for W1, booked once.
	assert.Equal(t, []string{"W1"}, core.Received(t))
	core.Ctl(t, `{"mode":"normal"}`)
	assert.Equal(t, "B1|0000|balance=99500", c.Exchange("B1|CORE|BAL 1001").String())
}

func TestACallTheTargetNeverAppliedIsSettledAndItsResendIsAFreshCall(t *testing.T) {
	// Given CORE reading each call and hanging up without applying it, and
	// a relay with the shield and CORE's status URL,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"drop"}`)
	h := startResolving(t, core.URL, fmt.Sprintf("dedup = true\nstatus_url = %q\nresolve_after = \"200ms\"\n", statusURL(core.URL)), "")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal is in doubt and CORE recovers,
	first := c.Exchange("W1|CORE|WD 1001 500")
	require.Equal(t, "E902", first.Code, first.String())
	require.Contains(t, first.Message, "outcome unknown")
	core.Ctl(t, `{"mode":"normal"}`)

	// then the hub learns from a look-up that CORE never applied it,
	line := settled(t, h.journal, "W1")
	assert.Equal(t, "resolved_not_applied", line["stage"])
	assert.Equal(t, "lookup", line["via"])
	assert.Positive(t, core.Stats(t).Lookups)
	proctest.Eventually(t, 5*time.Second, "relay_in_doubt_open is 0", func() bool { return h.openInDoubt(t) == 0 })
	assert.Equal(t, 1.0, h.resolvedCount(t, "not_applied", "lookup"))

	// and a resend afterwards is one fresh call, booked once.
	lookups := core.Stats(t).Lookups
	assert.Equal(t, "W1|0000|balance=99500", c.Exchange("W1|CORE|WD 1001 500").String())
	assert.Equal(t, []string{"W1", "W1"}, core.Received(t))
	assert.Equal(t, lookups, core.Stats(t).Lookups, "no look-up for the resend: the hub knew")
}

func TestTheReversePolicyUndoesABookingOnceAndItsResendGetsE910(t *testing.T) {
	// Given CORE booking at once and answering after 2 s, and a relay
	// that reverses CORE's calls in doubt, with the shield and no wait
	// for late answers,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":2000}`)
	h := startResolving(t, core.URL, fmt.Sprintf("dedup = true\nresolve = \"reverse\"\nreverse_url = %q\nresolve_after = \"200ms\"\nlate_answer_grace = \"0s\"\n",
		reverseURL(core.URL)), "")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal CORE booked times out,
	require.Equal(t, "W2|"+unknownOutcome, c.Exchange("W2|CORE|WD 1001 700").String())

	// then the hub reverses it, once, and journals it reversed,
	line := settled(t, h.journal, "W2")
	assert.Equal(t, "resolved_reversed", line["stage"])
	assert.Equal(t, "reversal", line["via"])
	assert.Equal(t, "0000", line["code"])
	assert.Equal(t, 1.0, h.resolvedCount(t, "reversed", "reversal"))
	assert.Equal(t, int64(1), core.Stats(t).Reversals)

	// a resend is refused with no call,
	assert.Equal(t, "W2|E910|transaction reversed; resend under a new TXID", c.Exchange("W2|CORE|WD 1001 700").String())
	assert.Equal(t, []string{"W2"}, core.Received(t))

	// and the balance is back where it started.
	core.Ctl(t, `{"mode":"normal"}`)
	assert.Equal(t, "B1|0000|balance=100000", c.Exchange("B1|CORE|BAL 1001").String())
	assert.Equal(t, int64(1), core.Stats(t).Reversals, "reversed once")
}

// nextResolve is the next attempt of CORE's open entries in /status;
// zero when none is scheduled.
func (r *resolving) nextResolve(t *testing.T) time.Time {
	t.Helper()
	if next := statusOf(t, r.status(t), "CORE").NextResolve; next != nil {
		return *next
	}
	return time.Time{}
}

func TestNoLookUpReachesATargetWhileItsBreakerIsOpen(t *testing.T) {
	// Given CORE booking at once and answering after 2 s, and a relay
	// whose breaker opens on one failure and stays open a minute, with
	// CORE's status URL and no wait for late answers,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":2000}`)
	h := startResolving(t, core.URL, fmt.Sprintf("status_url = %q\nresolve_after = \"200ms\"\nlate_answer_grace = \"0s\"\n", statusURL(core.URL)), "",
		"--fail-threshold", "1", "--reset-timeout", "1m")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out, which opens the breaker,
	require.Equal(t, "W1|"+unknownOutcome, c.Exchange("W1|CORE|WD 1001 500").String())
	require.Equal(t, "OPEN", statusOf(t, h.status(t), "CORE").State)

	// then, while the hub's next attempt comes and goes twice, no look-up
	// reaches CORE,
	var first, second time.Time
	proctest.Eventually(t, 5*time.Second, "the hub schedules an attempt", func() bool {
		first = h.nextResolve(t)
		return !first.IsZero()
	})
	proctest.Eventually(t, 5*time.Second, "the hub puts its attempt off twice", func() bool {
		next := h.nextResolve(t)
		if second.IsZero() && next.After(first) {
			second = next
		}
		return !second.IsZero() && next.After(second)
	})
	assert.Zero(t, core.Stats(t).Lookups)
	assert.Equal(t, 1.0, h.openInDoubt(t))

	// and once the breaker closes, a look-up settles it.
	h.mustControl(t, "CORE", "close", "")
	line := settled(t, h.journal, "W1")
	assert.Equal(t, "resolved_applied", line["stage"])
	assert.Equal(t, "lookup", line["via"])
	assert.Positive(t, core.Stats(t).Lookups)
}

func TestAHubKilledWithAnEntryOpenSettlesItWhenRestarted(t *testing.T) {
	// Given CORE booking at once and answering after 2 s, and a relay
	// with CORE's status URL that waits a second before its first look-up
	// and not at all for late answers,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":2000}`)
	conf := fmt.Sprintf("status_url = %q\nresolve_after = \"1s\"\nlate_answer_grace = \"0s\"\n", statusURL(core.URL))
	h := startResolving(t, core.URL, conf, "")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out and the hub is killed with SIGKILL the
	// moment its client has the answer,
	a := c.Exchange("W1|CORE|WD 1001 500")
	h.Kill()
	require.Equal(t, "W1|"+unknownOutcome, a.String())
	lines := logtest.FileLines(t, h.journal)
	require.Len(t, lines, 1, "W1 is in doubt, unsettled")
	assert.Equal(t, "request_sent", lines[0]["stage"])
	assert.Zero(t, core.Stats(t).Lookups)

	// then the hub restarted on the same journal takes W1 up and settles
	// it with a look-up.
	again := startResolving(t, core.URL, conf, h.journal)
	line := settled(t, again.journal, "W1")
	assert.Equal(t, "resolved_applied", line["stage"])
	assert.Equal(t, "lookup", line["via"])
	assert.Equal(t, "0000", line["code"])
	proctest.Eventually(t, 5*time.Second, "relay_in_doubt_open is 0", func() bool { return again.openInDoubt(t) == 0 })
	assert.Equal(t, []string{"W1"}, core.Received(t))
}

func TestAnEntryNeverSettledExpiresAtResolveExpire(t *testing.T) {
	// Given CORE slower than the relay, a status URL nothing listens on,
	// and entries that expire after 3 s,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":5000}`)
	h := startResolving(t, core.URL, fmt.Sprintf("status_url = %q\nresolve_after = \"200ms\"\nresolve_max_interval = \"500ms\"\nresolve_expire = \"3s\"\nlate_answer_grace = \"0s\"\n",
		statusURL(closedPortURL(t))), "")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out,
	require.Equal(t, "W1|"+unknownOutcome, c.Exchange("W1|CORE|WD 1001 500").String())
	assert.Zero(t, h.resolvedCount(t, "expired", "lookup"))

	// then the hub gives it up after 3 s: the journal says so, and the
	// metric moves.
	line := settled(t, h.journal, "W1")
	assert.Equal(t, "unresolved_expired", line["stage"])
	assert.Equal(t, "lookup", line["via"])
	assert.Equal(t, 1.0, h.resolvedCount(t, "expired", "lookup"))
	assert.Zero(t, h.openInDoubt(t))
}

func TestFleetASettlementOnOneHubAnswersAResendOnAnother(t *testing.T) {
	// Given two hubs sharing a real Redis, each with the shield and CORE's
	// status URL, and CORE booking at once and answering after 2 s,
	store := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: store.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":2000}`)
	conf := fmt.Sprintf("dedup = true\nstatus_url = %q\nresolve_after = \"200ms\"\n", statusURL(core.URL))
	a := startResolving(t, core.URL, conf, "", "--state-store", store.URL(), "--hub-id", "a")
	b := startResolving(t, core.URL, conf, "", "--state-store", store.URL(), "--hub-id", "b")

	// when W3 times out on hub a, which settles it,
	require.Equal(t, "W3|"+unknownOutcome, hubtest.Dial(t, a.Addr()).Exchange("W3|CORE|WD 1001 300").String())
	line := settled(t, a.journal, "W3")
	require.Equal(t, "resolved_applied", line["stage"])
	proctest.Eventually(t, 5*time.Second, "hub a stores W3's settled answer", func() bool {
		v, _ := rdb.Get(context.Background(), "rh:{CORE}:tx:W3").Result()
		return strings.HasPrefix(v, "1|A|")
	})

	// then W3 resent to hub b gets the settled answer, and CORE saw one
	// call and no look-up from hub b.
	lookups := core.Stats(t).Lookups
	assert.Equal(t, "W3|0000|balance=99700", hubtest.Dial(t, b.Addr()).Exchange("W3|CORE|WD 1001 300").String())
	assert.Equal(t, []string{"W3"}, core.Received(t))
	assert.Equal(t, lookups, core.Stats(t).Lookups)
	assert.Empty(t, logtest.FileLines(t, b.journal), "hub b had nothing in doubt")
}
