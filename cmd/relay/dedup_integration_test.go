package main_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/admin"
)

// These tests start the real relay and fixture binaries and hold the
// duplicate-TXID shield to docs/PROTOCOL.md, "Resending a transaction": a
// client's resend never makes a second call while the first may have been
// applied.

// startShieldedRelay starts a relay whose target CORE, at coreURL, has the
// shield on and, when statusURL is not empty, a status URL; plus args.
func startShieldedRelay(t *testing.T, coreURL, statusURL string, args ...string) *adminRelay {
	t.Helper()
	conf := "[CORE]\ndedup = true\n"
	if statusURL != "" {
		conf += fmt.Sprintf("status_url = %q\n", statusURL)
	}
	path := writeFile(t, "relay.toml", conf)
	return startAdminRelay(t, append([]string{"--target", "CORE=" + coreURL, "--config", path}, args...)...)
}

// dedupCount is relay_dedup_total of CORE for outcome.
func dedupCount(t *testing.T, h *adminRelay, outcome string) float64 {
	t.Helper()
	m, _ := h.scrape(t)
	return m[`relay_dedup_total{outcome="`+outcome+`",target="CORE"}`]
}

func TestResendAfterATimeoutGetsTheBookedAnswerWithoutASecondCall(t *testing.T) {
	// Given CORE booking at once and answering after 1 s, a relay waiting
	// 300 ms with the shield and CORE's status URL, and a journal,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	journal := filepath.Join(t.TempDir(), "in-doubt.log")
	h := startShieldedRelay(t, core.URL, core.URL+"/tx/{txid}", "--target-timeout", "300ms",
		"--in-doubt-log", journal, "--hub-id", "hub-a")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out and the branch sends it again,
	require.Equal(t, "W1|E901|no answer within target timeout; outcome unknown", c.Exchange("W1|CORE|WD 1001 500").String())
	resent := c.Exchange("W1|CORE|WD 1001 500")

	// then the resend gets the booked answer, CORE took one POST for W1,
	// the balance moved once, and the journal holds the doubt and its
	// resolution.
	assert.Equal(t, "W1|0000|balance=99500", resent.String())
	core.Ctl(t, `{"mode":"normal"}`)
	assert.Equal(t, "B1|0000|balance=99500", c.Exchange("B1|CORE|BAL 1001").String())
	assert.Equal(t, []string{"W1", "B1"}, core.Received(t))
	assert.Equal(t, 1.0, dedupCount(t, h, "resolved_applied"))
	lines := logtest.FileLines(t, journal)
	require.Len(t, lines, 2)
	assert.Equal(t, "request_sent", lines[0]["stage"])
	assert.Equal(t, "resolved_applied", lines[1]["stage"])
	assert.Equal(t, "0000", lines[1]["code"])
	assert.Equal(t, "W1", lines[1]["txid"])

	// and a third copy is answered from memory, with no look-up either.
	assert.Equal(t, "W1|0000|balance=99500", c.Exchange("W1|CORE|WD 1001 500").String())
	assert.Equal(t, 1.0, dedupCount(t, h, "replayed"))
}

func TestResendOfACallNotAppliedIsSentAfresh(t *testing.T) {
	// Given CORE dropping calls before it books them, and the shield with
	// CORE's status URL,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"drop"}`)
	h := startShieldedRelay(t, core.URL, core.URL+"/tx/{txid}")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal is in doubt, CORE recovers and the branch resends,
	first := c.Exchange("W1|CORE|WD 1001 500")
	require.Equal(t, "E902", first.Code, first.String())
	require.Contains(t, first.Message, "outcome unknown")
	core.Ctl(t, `{"mode":"normal"}`)
	resent := c.Exchange("W1|CORE|WD 1001 500")

	// then CORE said it never applied it, so it was sent again, once.
	assert.Equal(t, "W1|0000|balance=99500", resent.String())
	assert.Equal(t, []string{"W1", "W1"}, core.Received(t))
	assert.Equal(t, 1.0, dedupCount(t, h, "resolved_not_applied"))
}

func TestResendInDoubtWithoutAStatusURLIsNotSent(t *testing.T) {
	// Given a late CORE and the shield without a status URL,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	h := startShieldedRelay(t, core.URL, "", "--target-timeout", "300ms")
	c := hubtest.Dial(t, h.Addr())

	// when a withdrawal times out and is sent again,
	require.Equal(t, "E901", c.Exchange("W1|CORE|WD 1001 500").Code)
	resent := c.Exchange("W1|CORE|WD 1001 500")

	// then the resend is told to wait, and CORE saw one call.
	assert.Equal(t, "W1|E901|outcome still unknown; do not resend yet", resent.String())
	assert.Equal(t, []string{"W1"}, core.Received(t))
	assert.Equal(t, 1.0, dedupCount(t, h, "unresolved"))
}

func TestAShieldFullOfCallsInDoubtRefusesNewTXIDsRatherThanForgetOne(t *testing.T) {
	// Given a late CORE (it books at once and answers after 3 s), and a
	// relay that waits 500 ms for it with a shield of 200 entries,
	const bound, conns, each = 200, 4, 75 // 300 transactions
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":3000}`)
	h := startShieldedRelay(t, core.URL, "", "--target-timeout", "500ms",
		"--dedup-max-entries", fmt.Sprint(bound), "--max-inflight", "1000", "--fail-threshold", "100000")
	cs := make([]*hubtest.Client, conns)
	for i := range cs {
		cs[i] = hubtest.Dial(t, h.Addr())
	}
	// send sends every transaction, each connection its share at once,
	// and returns the answers by TXID.
	send := func() map[string]hubtest.Response {
		answers := make([][]hubtest.Response, conns)
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() {
				lines := make([]string, each)
				for j := range lines {
					lines[j] = fmt.Sprintf("F%d-%d|CORE|WD 1001 1", i, j)
				}
				c.Send(lines...)
				answers[i] = c.ReadResponses(each)
			})
		}
		wg.Wait()
		return hubtest.ByTxID(t, slices.Concat(answers...))
	}
	const (
		inDoubtMsg = "E901|no answer within target timeout; outcome unknown"
		fullMsg    = "E906|shield full of calls in doubt; not sent"
	)

	// when 300 transactions are sent at once, and each is sent again once
	// all are answered,
	first := send()
	again := send()

	// then the shield took what it holds, which ended in doubt (or, on a
	// busy machine, a few not sent, which it forgets), and refused the
	// others without a call;
	inDoubt, refused := 0, 0
	for txid, a := range first {
		switch a.Code + "|" + a.Message {
		case inDoubtMsg:
			inDoubt++
		case fullMsg:
			refused++
		default:
			assert.Equal(t, txid+"|E901|no answer within target timeout; not sent", a.String())
		}
	}
	assert.LessOrEqual(t, inDoubt, bound)
	assert.Positive(t, refused)
	// the resends found every call in doubt still remembered;
	for txid, a := range again {
		if first[txid].Code+"|"+first[txid].Message == inDoubtMsg {
			assert.Equal(t, txid+"|E901|outcome still unknown; do not resend yet", a.String())
		}
		if a.Code == "E906" {
			assert.Equal(t, txid+"|"+fullMsg, a.String())
			refused++
		}
	}
	// and no transaction reached CORE twice.
	seen := map[string]bool{}
	for _, txid := range core.Received(t) {
		assert.False(t, seen[txid], "%s reached CORE twice", txid)
		seen[txid] = true
	}
	m, _ := h.scrape(t)
	assert.Equal(t, float64(refused), m[`relay_dedup_refused_total{target="CORE"}`])
	assert.Zero(t, m[`relay_dedup_evictions_total`])
}

func TestCopiesOfACallInFlightJoinIt(t *testing.T) {
	// Given a slow CORE and the shield,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"slow","delay_ms":500}`)
	h := startShieldedRelay(t, core.URL, "")

	// when two connections send W2 at once,
	c1, c2 := hubtest.Dial(t, h.Addr()), hubtest.Dial(t, h.Addr())
	var wg sync.WaitGroup
	answers := make([]string, 2)
	for i, c := range []*hubtest.Client{c1, c2} {
		wg.Go(func() { answers[i] = c.Exchange("W2|CORE|WD 1001 700").String() })
	}
	wg.Wait()

	// then CORE got one call, and both copies the same answer.
	assert.Equal(t, "W2|0000|balance=99300", answers[0])
	assert.Equal(t, answers[0], answers[1])
	assert.Equal(t, []string{"W2"}, core.Received(t))
	assert.Equal(t, 1.0, dedupCount(t, h, "joined"))
}

func TestResendAfterAnAnswerIsReplayedAndAnotherPayloadRefused(t *testing.T) {
	// Given the shield on CORE,
	core := proctest.StartFixture(t, "CORE", "core")
	h := startShieldedRelay(t, core.URL, "")
	c := hubtest.Dial(t, h.Addr())

	// when W3 is answered, then sent again, then sent with another amount,
	first := c.Exchange("W3|CORE|WD 1001 200").String()
	again := c.Exchange("W3|CORE|WD 1001 200").String()
	other := c.Exchange("W3|CORE|WD 1001 900").String()

	// then the copy gets the first answer, the other payload E909, and
	// CORE saw one call; a business rejection is remembered the same way.
	assert.Equal(t, "W3|0000|balance=99800", first)
	assert.Equal(t, first, again)
	assert.Equal(t, "W3|E909|TXID reused with a different payload", other)
	assert.Equal(t, "W4|B201|insufficient funds", c.Exchange("W4|CORE|WD 1001 99999999").String())
	assert.Equal(t, "W4|B201|insufficient funds", c.Exchange("W4|CORE|WD 1001 99999999").String())
	assert.Equal(t, []string{"W3", "W4"}, core.Received(t))
	assert.Equal(t, 2.0, dedupCount(t, h, "replayed"))
	assert.Equal(t, 1.0, dedupCount(t, h, "refused_payload"))
	m, _ := h.scrape(t)
	assert.Equal(t, 1.0, m[`relay_requests_total{code="E909",target="CORE"}`])

	// and /status shows the shield: its memory, and the target's counts.
	st := h.status(t)
	require.NotNil(t, st.Dedup)
	assert.Equal(t, "local", st.Dedup.Store)
	assert.Equal(t, int64(2), st.Dedup.Entries)
	core1 := statusOf(t, st, "CORE").Dedup
	require.NotNil(t, core1)
	assert.Equal(t, admin.TargetDedup{WindowSeconds: 600, Replayed: 2, RefusedPayload: 1}, *core1)
}

func TestWithoutTheShieldEveryLineIsACall(t *testing.T) {
	// Given CORE without the shield (the default),
	core := proctest.StartFixture(t, "CORE", "core")
	h := startAdminRelay(t, "--target", "CORE="+core.URL)
	c := hubtest.Dial(t, h.Addr())

	// when the same line is sent twice, both reach CORE (which remembers
	// the id itself).
	c.Exchange("W5|CORE|WD 1001 200")
	c.Exchange("W5|CORE|WD 1001 200")
	assert.Equal(t, []string{"W5", "W5"}, core.Received(t))
}

func TestFleetShieldsAResendToAnotherHubAndFallsBackWhenRedisDies(t *testing.T) {
	// Given three hubs sharing a real Redis, with the shield on,
	r := startFleetRig(t, same(3, "--dedup")...)
	a, b, c := r.hubs[0], r.hubs[1], r.hubs[2]
	ca := hubtest.Dial(t, a.Addr())

	// when W3 is answered by hub a and resent to hubs b and c, once with
	// another amount,
	first := ca.Exchange("W3|CORE|WD 1001 300").String()
	// Hub a stores the answer just after its client has it; a resend
	// sooner would be told the outcome is still unknown.
	proctest.Eventually(t, 5*time.Second, "hub a stores W3's answer", func() bool {
		v, _ := r.rdb.Get(context.Background(), "rh:{CORE}:tx:W3").Result()
		return strings.HasPrefix(v, "1|A|")
	})
	again := hubtest.Dial(t, b.Addr()).Exchange("W3|CORE|WD 1001 300").String()
	other := hubtest.Dial(t, c.Addr()).Exchange("W3|CORE|WD 1001 900").String()

	// then b answers from the store, c refuses the other payload, and
	// CORE saw one call.
	assert.Equal(t, "W3|0000|balance=99700", first)
	assert.Equal(t, first, again)
	assert.Equal(t, "W3|E909|TXID reused with a different payload", other)
	assert.Equal(t, []string{"W3"}, r.core.Received(t))
	assert.Equal(t, 1.0, b.metric(t, `relay_dedup_total{outcome="replayed",target="CORE"}`))
	assert.Equal(t, "shared", b.status(t).Dedup.Store)

	// And when Redis is killed, a hub shields on its own memory: its
	// resend is still answered without a call, and the fallbacks are
	// counted and shown.
	r.redis.Kill()
	w4 := ca.Exchange("W4|CORE|WD 1001 100").String()
	assert.Equal(t, "W4|0000|balance=99600", w4)
	assert.Equal(t, w4, ca.Exchange("W4|CORE|WD 1001 100").String())
	assert.Equal(t, []string{"W3", "W4"}, r.core.Received(t))
	assert.Positive(t, a.metric(t, "relay_dedup_store_fallbacks_total"))
	st := a.status(t)
	assert.Equal(t, "local_fallback", st.Dedup.Store)
	assert.Positive(t, st.Dedup.StoreFallbacks)
}

func TestARefusedCallIsNotRememberedAndItsResendIsAFreshTry(t *testing.T) {
	// Given the shield on CORE, and CORE's breaker held open by an
	// operator,
	core := proctest.StartFixture(t, "CORE", "core")
	h := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--dedup")
	h.mustControl(t, "CORE", "open", "")
	c := hubtest.Dial(t, h.Addr())

	// when W1 is refused E904, the breaker closed, and W1 sent again,
	assert.Equal(t, "W1|E904|circuit open; held open by operator", c.Exchange("W1|CORE|WD 1001 500").String())
	h.mustControl(t, "CORE", "close", "")
	resent := c.Exchange("W1|CORE|WD 1001 500").String()

	// then the resend was a call, the first CORE saw.
	assert.Equal(t, "W1|0000|balance=99500", resent)
	assert.Equal(t, []string{"W1"}, core.Received(t))
	assert.Zero(t, h.metric(t, `relay_dedup_total{outcome="replayed",target="CORE"}`))
}

func TestAResendInDoubtIsLookedUpAtTheFallbackThatMadeTheCall(t *testing.T) {
	// Given CORE held open, its fallback CORE_DR booking at once and
	// answering late, both with the shield and a status URL,
	core := proctest.StartFixture(t, "CORE", "core")
	dr := proctest.StartFixture(t, "CORE_DR", "core")
	dr.Ctl(t, `{"mode":"late","delay_ms":1000}`)
	conf := writeFile(t, "relay.toml", fmt.Sprintf(`[CORE]
dedup = true
status_url = %q
fallback = "CORE_DR"

[CORE_DR]
url = %q
dedup = true
status_url = %q
`, core.URL+"/tx/{txid}", dr.URL, dr.URL+"/tx/{txid}"))
	h := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--config", conf, "--target-timeout", "300ms")
	h.mustControl(t, "CORE", "open", "")
	c := hubtest.Dial(t, h.Addr())

	// when W1, taken by CORE_DR, times out, and is sent again to CORE,
	require.Equal(t, "W1|E901|via CORE_DR: no answer within target timeout; outcome unknown", c.Exchange("W1|CORE|WD 1001 500").String())
	resent := c.Exchange("W1|CORE|WD 1001 500").String()

	// then CORE_DR, which booked it, was asked, not CORE, which never saw
	// it: the resend gets the booking and no one a second call.
	assert.Equal(t, "W1|0000|via CORE_DR: balance=99500", resent)
	assert.Empty(t, core.Received(t))
	assert.Equal(t, []string{"W1"}, dr.Received(t))
}
