package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests start the real relay and fixture binaries and hold them to
// docs/PROTOCOL.md, "Synthetic recovery probes": with a probe payload the
// hub probes a recovering target with its own transaction, no customer's
// transaction reaches the target until the breaker has closed, the breaker
// needs probe_successes healthy probes in a row, and probe_expect says
// which answers are healthy.

// probeTxIDPrefix begins the TXID of every synthetic probe.
const probeTxIDPrefix = "PROBE-"

// isProbe reports whether txid is one of the hub's synthetic probes.
func isProbe(txid string) bool { return strings.HasPrefix(txid, probeTxIDPrefix) }

// tripCore fails CORE and sends threshold customer lines on c, which open
// its breaker.
func tripCore(t *testing.T, core *proctest.Fixture, c *hubtest.Client, threshold int) {
	t.Helper()
	core.Ctl(t, `{"mode":"fail"}`)
	for i := range threshold {
		a := c.Exchange(fmt.Sprintf("trip-%d|CORE|BAL 1", i))
		require.Equal(t, "E500", a.Code, a.String())
	}
}

// customersUntilServed sends a customer line on c every few milliseconds
// until one is answered by the target, and returns its TXID and how many
// were refused before it. Every answer before it must be E904.
func customersUntilServed(t *testing.T, c *hubtest.Client, within time.Duration) (served string, refused int) {
	t.Helper()
	deadline := time.Now().Add(within)
	for n := 0; time.Now().Before(deadline); n++ {
		txid := fmt.Sprintf("cust-%d", n)
		a := c.Exchange(txid + "|CORE|BAL 1")
		if a.Code != "E904" {
			require.Equal(t, "0000", a.Code, "the first customer served after recovery: %s", a)
			return txid, refused
		}
		assert.Regexp(t, openMessage, a.Message)
		refused++
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no customer served within %s", within)
	return "", 0
}

func TestSyntheticProbesKeepCustomersOffARecoveringTarget(t *testing.T) {
	// Given CORE behind a relay that probes it with its own BAL HEALTH,
	// needs three healthy probes in a row to close, and probes every
	// 150 ms while it has not closed,
	core := proctest.StartFixture(t, "CORE", "core")
	access := filepath.Join(t.TempDir(), "access.log")
	r := startPolicyRelay(t, nil,
		"--target", "CORE="+core.URL,
		"--fail-threshold", "2", "--reset-timeout", "300ms", "--target-timeout", "1s",
		"--probe-payload", "BAL HEALTH", "--probe-successes", "3", "--probe-interval", "150ms",
		"--access-log", access)
	c := hubtest.Dial(t, r.Addr())

	// when CORE fails and opens the breaker, stays down for a failed probe
	// or more,
	tripCore(t, core, c, 2)
	proctest.Eventually(t, 5*time.Second, "a failed synthetic probe reopens the breaker", func() bool {
		got := r.transitions(t, "CORE")
		return len(got) >= 3 && got[2] == "HALF_OPEN->OPEN"
	})
	// and then recovers,
	core.Ctl(t, `{"mode":"normal","reset":true}`)

	// then customers get E904 all along until the breaker closes,
	served, refused := customersUntilServed(t, c, 10*time.Second)
	t.Logf("%d customer lines refused during recovery", refused)
	assert.Positive(t, refused)

	// no customer's transaction reached CORE before three probes had, each
	// with a TXID of the hub's own (two are not enough),
	got := core.Received(t)
	require.GreaterOrEqual(t, len(got), 4, "three probes and the customer: %v", got)
	assert.Equal(t, []bool{true, true, true}, []bool{isProbe(got[0]), isProbe(got[1]), isProbe(got[2])}, "%v", got)
	assert.Equal(t, served, got[3], "the first customer transaction reaches CORE after the third probe")
	for _, txid := range got[3:] {
		assert.False(t, isProbe(txid), "no probe once closed: %v", got)
	}

	// and the breaker log shows the changes only, a valid chain, with no
	// line for the healthy probes before the last.
	var chain []string
	proctest.Eventually(t, 5*time.Second, "the breaker log has the close", func() bool {
		chain = r.transitions(t, "CORE")
		return len(chain) > 0 && chain[len(chain)-1] == "HALF_OPEN->CLOSED"
	})
	require.GreaterOrEqual(t, len(chain), 5)
	assert.Equal(t, []string{"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN"}, chain[:3])
	assert.Equal(t, []string{"OPEN->HALF_OPEN", "HALF_OPEN->CLOSED"}, chain[len(chain)-2:])

	// /status and the metrics tell the latest probe,
	st := statusOf(t, r.status(t), "CORE")
	require.NotNil(t, st.LastProbe)
	assert.Equal(t, "healthy", st.LastProbe.Outcome)
	assert.Equal(t, "0000", st.LastProbe.Code)
	assert.Equal(t, got[2], st.LastProbe.TxID)
	assert.Equal(t, "BAL HEALTH", st.Settings.ProbePayload)
	assert.Equal(t, 3, st.Settings.ProbeSuccesses)
	assert.Equal(t, 3.0, r.metric(t, `relay_probes_total{outcome="healthy",target="CORE"}`))
	assert.GreaterOrEqual(t, r.metric(t, `relay_probes_total{outcome="failed",target="CORE"}`), 1.0)
	assert.Equal(t, 1.0, r.metric(t, `relay_probe_last_healthy{target="CORE"}`))
	assert.Positive(t, r.metric(t, `relay_probe_last_timestamp_seconds{target="CORE"}`))

	// and the access log has every probe as a synthetic probe with its
	// own TXID.
	r.Signal(os.Interrupt)
	require.Equal(t, 0, r.Wait())
	probes := accessLogProbes(t, access)
	for _, txid := range got[:3] {
		assert.Equal(t, "0000", probes[txid], "access log line of %s", txid)
	}
}

// accessLogProbes returns the code of every synthetic probe in the access
// log at path, by TXID; each must be marked probe and synthetic.
func accessLogProbes(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			TxID      string `json:"txid"`
			Code      string `json:"code"`
			Breaker   string `json:"breaker"`
			Probe     bool   `json:"probe"`
			Synthetic bool   `json:"synthetic"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), sc.Text())
		if !line.Synthetic {
			assert.False(t, isProbe(line.TxID), "a probe's TXID on a customer's line: %s", sc.Text())
			continue
		}
		assert.True(t, isProbe(line.TxID), sc.Text())
		assert.True(t, line.Probe, sc.Text())
		assert.Equal(t, "admitted", line.Breaker, sc.Text())
		out[line.TxID] = line.Code
	}
	require.NoError(t, sc.Err())
	return out
}

func TestProbeExpectJudgesABusinessCode(t *testing.T) {
	// Given two targets on one CORE fixture, each probed with HEALTH, an
	// operation CORE refuses with B204: ACCEPTS counts B204 as healthy,
	// STRICT only 0000 (the flags' default),
	core := proctest.StartFixture(t, "CORE", "core")
	conf := writeFile(t, "relay.toml", fmt.Sprintf(`
[ACCEPTS]
url = %q
probe_expect = ["0000", "B204"]

[STRICT]
url = %q
`, core.URL, core.URL))
	r := startPolicyRelay(t, nil,
		"--target", "CORE="+core.URL, "--config", conf,
		"--fail-threshold", "1", "--reset-timeout", "200ms", "--target-timeout", "1s",
		"--probe-payload", "HEALTH")
	c := hubtest.Dial(t, r.Addr())

	// when both open on a failure and CORE is back,
	core.Ctl(t, `{"mode":"fail"}`)
	for _, target := range []string{"ACCEPTS", "STRICT"} {
		a := c.Exchange("trip-" + target + "|" + target + "|BAL 1")
		require.Equal(t, "E500", a.Code, a.String())
	}
	core.Ctl(t, `{"mode":"normal"}`)

	// then ACCEPTS closes on its first probe's B204,
	r.waitTransitions(t, "ACCEPTS", "CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED")
	// and STRICT's probes fail on it, one after another, each reopening
	// the breaker, which never closes.
	proctest.Eventually(t, 5*time.Second, "STRICT fails three probes", func() bool {
		return strings.Count(strings.Join(r.transitions(t, "STRICT"), " "), "HALF_OPEN->OPEN") >= 3
	})
	for _, tr := range r.transitions(t, "STRICT") {
		assert.NotEqual(t, "HALF_OPEN->CLOSED", tr)
	}
	st := r.status(t)
	accepts, strict := statusOf(t, st, "ACCEPTS"), statusOf(t, st, "STRICT")
	require.NotNil(t, accepts.LastProbe)
	assert.Equal(t, []string{"healthy", "B204"}, []string{accepts.LastProbe.Outcome, accepts.LastProbe.Code})
	assert.Equal(t, []string{"0000", "B204"}, accepts.Settings.ProbeExpect)
	require.NotNil(t, strict.LastProbe)
	assert.Equal(t, []string{"failed", "B204"}, []string{strict.LastProbe.Outcome, strict.LastProbe.Code})
	assert.Equal(t, "OPEN", strict.State)
	a := c.Exchange("refused|STRICT|BAL 1")
	assert.Equal(t, "E904", a.Code, a.String())
	assert.Equal(t, "0000", c.Exchange("served|ACCEPTS|BAL 1").Code)
}

func TestNoSyntheticProbeWhileHeldOrDisabled(t *testing.T) {
	// Given CORE open with a probe payload, held open by an operator,
	core := proctest.StartFixture(t, "CORE", "core")
	r := startPolicyRelay(t, nil,
		"--target", "CORE="+core.URL,
		"--fail-threshold", "1", "--reset-timeout", "100ms", "--target-timeout", "1s",
		"--probe-payload", "BAL HEALTH")
	c := hubtest.Dial(t, r.Addr())
	tripCore(t, core, c, 1)
	r.mustControl(t, "CORE", "open", "")
	core.Ctl(t, `{"mode":"normal","reset":true}`)

	// when five open periods pass, no probe is sent (a check that nothing
	// happens, so it waits out a span rather than polling);
	time.Sleep(500 * time.Millisecond)
	assert.Empty(t, core.Received(t), "no probe while held open")

	// disabled, it admits customers and sends no probe either;
	r.mustControl(t, "CORE", "disable", "")
	assert.Equal(t, "0000", c.Exchange("disabled|CORE|BAL 1").Code)
	assert.Equal(t, []string{"disabled"}, core.Received(t))

	// enabled after a hold, the next open period ends with a probe that
	// closes the breaker.
	r.mustControl(t, "CORE", "open", "")
	r.mustControl(t, "CORE", "enable", "")
	proctest.Eventually(t, 5*time.Second, "the probe closes CORE", func() bool {
		return statusOf(t, r.status(t), "CORE").State == "CLOSED"
	})
	got := core.Received(t)
	require.Len(t, got, 2)
	assert.True(t, isProbe(got[1]), "%v", got)
	entries, _, err := breakerlog.ReadFile(r.logPath)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(entries))
}

func TestFleetOnlyTheLeaseHolderSendsSyntheticProbes(t *testing.T) {
	// Given three hubs sharing CORE's breaker, each with a probe payload,
	// CORE failing long enough for several probes to fail,
	r := startFleetRig(t, same(3, "--fail-threshold", "2", "--reset-timeout", "300ms", "--target-timeout", "1s",
		"--probe-payload", "BAL HEALTH")...)
	r.core.Ctl(t, `{"mode":"fail"}`)
	ca := hubtest.Dial(t, r.hubs[0].Addr())
	ca.Exchange(tx("t1"))
	ca.Exchange(tx("t2"))
	for _, h := range r.hubs {
		proctest.Eventually(t, 2*time.Second, h.id+" opens", func() bool { return h.state(t) == "OPEN" })
	}
	r.core.Ctl(t, `{"mode":"fail","reset":true}`)
	proctest.Eventually(t, 10*time.Second, "three probes fail", func() bool {
		return len(r.core.Received(t)) >= 3
	})

	// when CORE recovers,
	r.core.Ctl(t, `{"mode":"normal"}`)

	// then every hub closes, and customers on each got E904 until then,
	conns := make([]*hubtest.Client, len(r.hubs))
	for i, h := range r.hubs {
		conns[i] = hubtest.Dial(t, h.Addr())
	}
	for i, h := range r.hubs {
		proctest.Eventually(t, 10*time.Second, h.id+" closes", func() bool {
			a := conns[i].Exchange(tx(fmt.Sprintf("%s-%d", h.id, time.Now().UnixNano())))
			if a.Code == "E904" {
				return false
			}
			require.Equal(t, "0000", a.Code, a.String())
			return true
		})
	}

	// and every transaction that reached CORE before the first customer's
	// was a probe, each from one hub only per open period: as many probes
	// as half-open periods in the three breaker logs.
	got := r.core.Received(t)
	probes := 0
	for _, txid := range got {
		if !isProbe(txid) {
			break
		}
		probes++
	}
	for _, txid := range got[probes:] {
		assert.False(t, isProbe(txid), "no probe after the first customer: %v", got)
	}
	halfOpen := 0
	for _, h := range r.hubs {
		for _, tr := range h.transitions(t, "CORE") {
			if tr == "OPEN->HALF_OPEN" {
				halfOpen++
			}
		}
	}
	assert.GreaterOrEqual(t, probes, 4, "%v", got)
	assert.Equal(t, halfOpen, probes, "one probe per open period, from the hub that held the lease")
}

func TestFleetLeaseHolderKeepsProbingThroughSeveralSuccesses(t *testing.T) {
	// Given three hubs sharing CORE's breaker, whose breakers need two
	// healthy probes 2.5 s apart, longer than the probe lease (the target
	// timeout plus a second),
	r := startFleetRig(t, same(3, "--fail-threshold", "2", "--reset-timeout", "200ms", "--target-timeout", "1s",
		"--probe-payload", "BAL HEALTH", "--probe-successes", "2", "--probe-interval", "2500ms")...)
	r.core.Ctl(t, `{"mode":"fail"}`)
	ca := hubtest.Dial(t, r.hubs[0].Addr())
	ca.Exchange(tx("t1"))
	ca.Exchange(tx("t2"))
	for _, h := range r.hubs {
		proctest.Eventually(t, 2*time.Second, h.id+" opens", func() bool { return h.state(t) == "OPEN" })
	}

	// when CORE recovers,
	r.core.Ctl(t, `{"mode":"normal","reset":true}`)

	// then every hub closes after the second probe,
	for _, h := range r.hubs {
		proctest.Eventually(t, 10*time.Second, h.id+" closes", func() bool { return h.state(t) == "CLOSED" })
	}
	// both sent by the hub that holds the lease: the lease outlived the
	// half-open period between them.
	got := r.core.Received(t)
	require.Len(t, got, 2, "%v", got)
	prober := strings.SplitN(strings.TrimPrefix(got[0], probeTxIDPrefix), "-", 2)[0]
	for _, txid := range got {
		assert.True(t, strings.HasPrefix(txid, probeTxIDPrefix+prober+"-"), "every probe from hub %s: %v", prober, got)
	}
}
