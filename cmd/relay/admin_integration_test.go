package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/admin"
)

// These tests start the real relay and fixture binaries and hold the admin
// port to docs/PROTOCOL.md, "Admin HTTP" and "Shutdown", over HTTP, as Prometheus, a load balancer and an
// operator would see it.

// adminClient makes every admin request of these tests.
var adminClient = &http.Client{Timeout: 5 * time.Second}

// adminRelay is a running relay and the base URL of its admin port.
type adminRelay struct {
	*proctest.Process
	admin string
}

// startAdminRelay starts the relay with its admin port on an ephemeral
// loopback port, its breaker log in a temporary directory, plus args; the
// admin address is read from the start-up line's admin_addr.
func startAdminRelay(t *testing.T, args ...string) *adminRelay {
	t.Helper()
	base := []string{
		"--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0",
		"--breaker-log", filepath.Join(t.TempDir(), "breaker.log"),
	}
	p := proctest.Start(t, "./cmd/relay", append(base, args...)...)
	for _, l := range p.LogLines() {
		if a, ok := l["admin_addr"].(string); ok && a != "" {
			return &adminRelay{Process: p, admin: "http://" + a}
		}
	}
	t.Fatalf("no admin_addr in the relay's log:\n%s", p.Stderr())
	return nil
}

// get returns the status and body of GET path on the admin port, or an
// error when the port does not answer.
func (r *adminRelay) get(path string) (int, string, error) {
	resp, err := adminClient.Get(r.admin + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(body), err
}

// mustGet is get failing the test on error or a status other than 200.
func (r *adminRelay) mustGet(t *testing.T, path string) string {
	t.Helper()
	code, body, err := r.get(path)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "GET %s: %s", path, body)
	return body
}

// status decodes GET /status.
func (r *adminRelay) status(t *testing.T) admin.Status {
	t.Helper()
	var st admin.Status
	require.NoError(t, json.Unmarshal([]byte(r.mustGet(t, "/status")), &st))
	return st
}

// target returns the named target of a status.
func statusOf(t *testing.T, st admin.Status, name string) admin.Target {
	t.Helper()
	for _, tg := range st.Targets {
		if tg.Name == name {
			return tg
		}
	}
	t.Fatalf("no target %s in %+v", name, st)
	return admin.Target{}
}

// seriesLine is one sample line of the Prometheus text format.
var seriesLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) (\S+)$`)

// scrape returns GET /metrics as a map from each series, written as the
// text format writes it (name{label="value",...}, labels sorted), to its
// value, and the raw body.
func (r *adminRelay) scrape(t *testing.T) (map[string]float64, string) {
	t.Helper()
	body := r.mustGet(t, "/metrics")
	out := map[string]float64{}
	for line := range strings.SplitSeq(body, "\n") {
		m := seriesLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		require.NoError(t, err, line)
		out[m[1]] = v
	}
	return out, body
}

// adminReadUntil returns the answer for txid, from answers if it came
// already, else reading from c and keeping every other answer in answers.
func adminReadUntil(c *hubtest.Client, answers map[string]hubtest.Response, txid string) hubtest.Response {
	for {
		if a, ok := answers[txid]; ok {
			return a
		}
		a := c.ReadResponse()
		answers[a.TxID] = a
	}
}

func TestAdminMetricsCountWhatClientsSent(t *testing.T) {
	// Given CORE and CLAIM behind a relay with threshold 3,
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--fail-threshold", "3", "--reset-timeout", "1m")
	c := hubtest.Dial(t, h.Addr())

	// when clients send answers of every kind, unknown targets among them,
	// and CORE fails until its breaker opens,
	exchange := func(line, code string) {
		t.Helper()
		a := c.Exchange(line)
		require.Equal(t, code, a.Code, "%s -> %s", line, a)
	}
	exchange("ok-1|CORE|BAL 1001", "0000")
	exchange("ok-2|claim|SUBMIT P-1 500", "0000")
	exchange("biz-1|CORE|WD 1001 99999999", "B201")
	exchange("biz-2|CORE|HELLO", "B204")
	exchange("who-1|NOPE|x", "E903")
	exchange("who-2|relay_breaker_state|x", "E903")
	exchange("who-3|core\"}|x", "E903")
	exchange("no fields", "E900")
	core.Ctl(t, `{"mode":"fail"}`)
	for i := range 3 {
		exchange(fmt.Sprintf("fail-%d|CORE|BAL 1001", i), "E500")
	}
	exchange("open-1|CORE|BAL 1001", "E904")
	exchange("open-2|core|BAL 1001", "E904")

	// then /metrics counts exactly that, by target and code.
	m, body := h.scrape(t)
	for series, want := range map[string]float64{
		`relay_breaker_state{target="CORE"}`:                                        1,
		`relay_breaker_state{target="CLAIM"}`:                                       0,
		`relay_breaker_transitions_total{from="CLOSED",target="CORE",to="OPEN"}`:    1,
		`relay_breaker_transitions_total{from="OPEN",target="CORE",to="HALF_OPEN"}`: 0,
		`relay_requests_total{code="0000",target="CORE"}`:                           1,
		`relay_requests_total{code="Bnnn",target="CORE"}`:                           2,
		`relay_requests_total{code="E500",target="CORE"}`:                           3,
		`relay_requests_total{code="E904",target="CORE"}`:                           2,
		`relay_requests_total{code="E905",target="CORE"}`:                           0,
		`relay_requests_total{code="0000",target="CLAIM"}`:                          1,
		`relay_rejections_total{reason="open",target="CORE"}`:                       2,
		`relay_rejections_total{reason="full",target="CORE"}`:                       0,
		`relay_unrouted_total{code="E903"}`:                                         3,
		`relay_unrouted_total{code="E900"}`:                                         1,
		`relay_target_duration_seconds_count{target="CORE"}`:                        6,
		`relay_target_duration_seconds_count{target="CLAIM"}`:                       1,
		`relay_target_connections_opened_total{target="CORE"}`:                      1,
		`relay_target_connections_opened_total{target="CLAIM"}`:                     1,
		`relay_bulkhead_inflight{target="CORE"}`:                                    0,
		`relay_connections_open`:                                                    1,
	} {
		got, ok := m[series]
		if assert.True(t, ok, "no series %s", series) {
			assert.Equal(t, want, got, series)
		}
	}
	var total float64
	for series, v := range m {
		if strings.HasPrefix(series, `relay_requests_total{`) && strings.HasSuffix(series, `target="CORE"}`) {
			total += v
		}
	}
	assert.Equal(t, 8.0, total, "every CORE answer counted once")
	assert.Contains(t, body, "\ngo_goroutines ")
	assert.Contains(t, body, "\nprocess_resident_memory_bytes ")

	// A target name a client sent never becomes a label value.
	assert.NotContains(t, body, "NOPE")
	for _, tv := range regexp.MustCompile(`target="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		assert.Contains(t, []string{"CORE", "CLAIM"}, tv[1])
	}
}

func TestAdminStatusThroughTripProbeAndRecovery(t *testing.T) {
	// Given CORE failing behind a relay with threshold 2 and reset 500 ms,
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--fail-threshold", "2", "--reset-timeout", "500ms", "--target-timeout", "5s", "--target-idle-timeout", "2500ms")
	c := hubtest.Dial(t, h.Addr())
	core.Ctl(t, `{"mode":"fail"}`)

	// when CORE trips, /status shows it open with its retry hint and its
	// settings, and CLAIM untouched;
	for i := range 2 {
		require.Equal(t, "E500", c.Exchange(fmt.Sprintf("f-%d|CORE|BAL 1", i)).Code)
	}
	raw := h.mustGet(t, "/status")
	for _, key := range []string{`"draining":false`, `"goroutines":`, `"connections_open":1`, `"held":false`, `"disabled":false`} {
		assert.Contains(t, raw, key)
	}
	st := h.status(t)
	tg := statusOf(t, st, "CORE")
	assert.Equal(t, "OPEN", tg.State)
	assert.Equal(t, 2, tg.ConsecutiveFailures)
	assert.Greater(t, tg.RetryAfterSeconds, 0.0)
	assert.LessOrEqual(t, tg.RetryAfterSeconds, 0.5)
	assert.Equal(t, 0, tg.Inflight)
	assert.Equal(t, 10, tg.MaxInflight)
	assert.Equal(t, core.URL, tg.URL)
	assert.Equal(t, admin.Settings{
		FailThreshold: 2, ResetTimeoutSeconds: 0.5, TargetTimeoutSeconds: 5, TargetIdleTimeoutSeconds: 2.5,
		ProbeTimeoutSeconds: 6, FailureCodes: []string{"E500", "E901", "E902"},
	}, tg.Settings)
	assert.Equal(t, "CLOSED", statusOf(t, st, "CLAIM").State)
	assert.Greater(t, st.Goroutines, 0)

	// when the open period is over and a slow probe is out, CORE is
	// half-open with one call in flight, and others are refused;
	core.Ctl(t, `{"mode":"slow","delay_ms":1500}`)
	proctest.Eventually(t, 5*time.Second, "CORE's open period ends", func() bool {
		return statusOf(t, h.status(t), "CORE").RetryAfterSeconds == 0
	})
	c.Send("probe|CORE|BAL 1")
	proctest.Eventually(t, 5*time.Second, "the probe reaches CORE", func() bool {
		s, err := core.StatsErr()
		return err == nil && s.InFlight == 1
	})
	tg = statusOf(t, h.status(t), "CORE")
	assert.Equal(t, "HALF_OPEN", tg.State)
	assert.Equal(t, 1, tg.Inflight)
	assert.Zero(t, tg.RetryAfterSeconds)
	answers := map[string]hubtest.Response{}
	c.Send("other|CORE|BAL 1")
	assert.Equal(t, "E904", adminReadUntil(c, answers, "other").Code)

	// then the probe's success closes CORE with no failures.
	assert.Equal(t, "0000", adminReadUntil(c, answers, "probe").Code)
	tg = statusOf(t, h.status(t), "CORE")
	assert.Equal(t, "CLOSED", tg.State)
	assert.Zero(t, tg.ConsecutiveFailures)
	assert.Zero(t, tg.Inflight)
}

func TestAdminReadyzReportsDrainOnSIGTERM(t *testing.T) {
	// Given a relay with a slow call in flight,
	core := proctest.StartFixture(t, "CORE", "core")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--drain-timeout", "10s")
	h.mustGet(t, "/readyz")
	core.Ctl(t, `{"mode":"slow","delay_ms":2500}`)
	c := hubtest.Dial(t, h.Addr())
	c.Send("slow-1|CORE|BAL 1001")
	proctest.Eventually(t, 5*time.Second, "the slow call reaches CORE", func() bool {
		s, err := core.StatsErr()
		return err == nil && s.InFlight == 1
	})

	// when it gets SIGTERM, /readyz answers 503 for the drain while
	// /healthz stays 200 and /status says draining;
	h.Signal(syscall.SIGTERM)
	proctest.Eventually(t, 5*time.Second, "/readyz answers 503", func() bool {
		code, _, err := h.get("/readyz")
		require.NoError(t, err, "the admin port must serve through the drain")
		return code == http.StatusServiceUnavailable
	})
	code, body, err := h.get("/healthz")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, body)
	st := h.status(t)
	assert.True(t, st.Draining)
	assert.Equal(t, 1, statusOf(t, st, "CORE").Inflight)

	// then the call is answered, the relay exits 0 and the admin port
	// closes with it.
	assert.Equal(t, "0000", c.ReadResponse().Code)
	assert.Equal(t, 0, h.Wait())
	_, err = net.DialTimeout("tcp", strings.TrimPrefix(h.admin, "http://"), time.Second)
	assert.Error(t, err)
}
