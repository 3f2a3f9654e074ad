package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/relay/admin"
)

// These tests start the real relay and fixture binaries and hold them to
// docs/PROTOCOL.md, "Per-target settings and policies": per-target settings from a config file, the fallback, manual
// control on the admin port, and the failure-rate trip.

// policyRelay is a running relay with its admin port and breaker log.
type policyRelay struct {
	*hub
	admin string // base URL of the admin port
}

// startPolicyRelay starts the relay with its admin port and breaker log, as
// startRelay does, plus env and args.
func startPolicyRelay(t *testing.T, env []string, args ...string) *policyRelay {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "breaker.log")
	base := []string{
		"--listen", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0",
		"--breaker-log", logPath,
		"--drain-timeout", "5s",
	}
	p := proctest.StartEnv(t, relayPkg, env, append(base, args...)...)
	for _, l := range p.LogLines() {
		if a, ok := l["admin_addr"].(string); ok && a != "" {
			return &policyRelay{hub: &hub{Process: p, logPath: logPath}, admin: "http://" + a}
		}
	}
	t.Fatalf("no admin_addr in the relay's log:\n%s", p.Stderr())
	return nil
}

// control posts {"action": action} to /breakers/target with the bearer
// token (none when empty) and returns the status and the body.
func (r *policyRelay) control(t *testing.T, target, action, token string) (int, string) {
	t.Helper()
	return r.post(t, "/breakers/"+target, `{"action":"`+action+`"}`, token)
}

// post posts body to path on the admin port with the bearer token (none
// when empty) and returns the status and the body.
func (r *policyRelay) post(t *testing.T, path, body, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.admin+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := adminClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	require.NoError(t, err)
	if resp.StatusCode == http.StatusUnauthorized {
		assert.Equal(t, "Bearer", resp.Header.Get("WWW-Authenticate"))
	}
	return resp.StatusCode, string(got)
}

// mustControl is control expecting 200, and returns the target's status.
func (r *policyRelay) mustControl(t *testing.T, target, action, token string) admin.Target {
	t.Helper()
	code, body := r.control(t, target, action, token)
	require.Equal(t, http.StatusOK, code, "%s %s: %s", action, target, body)
	var st admin.Target
	require.NoError(t, json.Unmarshal([]byte(body), &st), body)
	r.waitBreakerLog(t)
	return st
}

// waitBreakerLog waits until the relay has written every breaker state
// change queued so far to its breaker log: the breakers only queue them.
func (r *policyRelay) waitBreakerLog(t *testing.T) {
	t.Helper()
	proctest.Eventually(t, 5*time.Second, "the breaker log has every change queued", func() bool {
		bl := r.status(t).BreakerLog
		return bl != nil && bl.Pending == 0
	})
}

// status decodes GET /status.
func (r *policyRelay) status(t *testing.T) admin.Status {
	t.Helper()
	resp, err := adminClient.Get(r.admin + "/status")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var st admin.Status
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st
}

// metric returns the value of one series of GET /metrics, written as the
// text format writes it, or fails the test.
func (r *policyRelay) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := adminClient.Get(r.admin + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
			return f
		}
	}
	t.Fatalf("no series %s in /metrics", series)
	return 0
}

// writeFile writes body into a file of a temporary directory.
func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// exampleConfig is the absolute path of the documented example file.
func exampleConfig(t *testing.T) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "docs", "relay.example.toml"))
	require.NoError(t, err)
	return path
}

func TestPerTargetLimitsAreApplied(t *testing.T) {
	// Given CORE and CLAIM, both slow, behind a relay configured by the
	// example file (CORE 40 calls at once, CLAIM 8; the flags say 10, and
	// set a target idle timeout the file does not),
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--config", exampleConfig(t), "--target-idle-timeout", "2s")
	const delay = `{"mode":"slow","delay_ms":1500}`
	core.Ctl(t, delay)
	claim.Ctl(t, delay)

	// when each is flooded past its limit at once,
	var lines []string
	for i := range 45 {
		lines = append(lines, fmt.Sprintf("core-%d|CORE|BAL 1001", i))
	}
	for i := range 10 {
		lines = append(lines, fmt.Sprintf("claim-%d|CLAIM|SUBMIT P-%d 100", i, i))
	}
	c := hubtest.Dial(t, r.Addr())
	c.Send(lines...)

	// then each target sees exactly its own limit of calls at once,
	proctest.Eventually(t, 5*time.Second, "CORE holds 40 calls and CLAIM 8", func() bool {
		cs, err1 := core.StatsErr()
		ls, err2 := claim.StatsErr()
		return err1 == nil && err2 == nil && cs.InFlight == 40 && ls.InFlight == 8
	})
	st := r.status(t)
	assert.Equal(t, 40, statusOf(t, st, "CORE").Inflight)
	assert.Equal(t, 40, statusOf(t, st, "CORE").MaxInflight)
	assert.Equal(t, 40, statusOf(t, st, "CORE").Settings.MaxInflight)
	assert.Equal(t, 30.0, statusOf(t, st, "CORE").Settings.ResetTimeoutSeconds)
	assert.Equal(t, "CORE_DR", statusOf(t, st, "CORE").Fallback)
	assert.Equal(t, 8, statusOf(t, st, "CLAIM").MaxInflight)
	assert.Equal(t, 5.0, statusOf(t, st, "CLAIM").Settings.ResetTimeoutSeconds)
	assert.Equal(t, "http://127.0.0.1:9203", statusOf(t, st, "CORE_DR").URL)
	for _, name := range []string{"CORE", "CLAIM", "CORE_DR"} {
		assert.Equal(t, 2.0, statusOf(t, st, name).Settings.TargetIdleTimeoutSeconds, "%s keeps the flag's value", name)
	}

	// and the rest is refused at once, E905.
	codes := map[string]map[string]int{"core": {}, "claim": {}}
	for _, a := range c.ReadResponses(len(lines)) {
		target, _, _ := strings.Cut(a.TxID, "-")
		codes[target][a.Code]++
	}
	assert.Equal(t, map[string]int{"0000": 40, "E905": 5}, codes["core"])
	assert.Equal(t, map[string]int{"0000": 8, "E905": 2}, codes["claim"])
	assert.Equal(t, int64(40), core.SettledStats(t).MaxInFlight)
	assert.Equal(t, int64(8), claim.SettledStats(t).MaxInFlight)
}

func TestFallbackEndToEnd(t *testing.T) {
	// Given CORE falling back to CORE_DR (which only the file names),
	core := proctest.StartFixture(t, "CORE", "core")
	dr := proctest.StartFixture(t, "CORE_DR", "core")
	conf := writeFile(t, "relay.toml", `
[CORE]
fail_threshold = 2
reset_timeout = "1m"
fallback = "CORE_DR"

[CORE_DR]
url = "`+dr.URL+`"
fail_threshold = 1
reset_timeout = "2m"
`)
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--config", conf)
	c := hubtest.Dial(t, r.Addr())
	a := c.Exchange("ok-1|CORE|BAL 1001")
	require.Equal(t, "ok-1|0000|balance=100000", a.String(), "a healthy CORE answers itself")

	// when CORE fails until its breaker opens,
	core.Ctl(t, `{"mode":"fail"}`)
	for i := range 2 {
		a = c.Exchange(fmt.Sprintf("f-%d|CORE|BAL 1001", i))
		require.Equal(t, "E500", a.Code, a.String())
	}

	// then CORE_DR answers its requests, saying so, and CORE is not called;
	a = c.Exchange("fb-1|CORE|BAL 1001")
	assert.Equal(t, "fb-1|0000|via CORE_DR: balance=100000", a.String())
	a = c.Exchange("fb-2|core|WD 1001 500")
	assert.Equal(t, "fb-2|0000|via CORE_DR: balance=99500", a.String())
	assert.Equal(t, int64(3), core.Stats(t).Calls)
	assert.Equal(t, int64(2), dr.SettledStats(t).Codes["0000"])
	st := statusOf(t, r.status(t), "CORE")
	assert.Equal(t, "OPEN", st.State)
	assert.Equal(t, "CORE_DR", st.Fallback)
	assert.Equal(t, 2.0, r.metric(t, `relay_fallbacks_total{fallback="CORE_DR",target="CORE"}`))
	assert.Equal(t, 2.0, r.metric(t, `relay_requests_total{code="0000",target="CORE_DR"}`))
	assert.Equal(t, 0.0, r.metric(t, `relay_requests_total{code="E904",target="CORE"}`))

	// when CORE_DR fails too, its failure comes through it and opens it,
	dr.Ctl(t, `{"mode":"fail"}`)
	a = c.Exchange("fb-3|CORE|BAL 1001")
	assert.Equal(t, "E500", a.Code, a.String())
	assert.True(t, strings.HasPrefix(a.Message, "via CORE_DR: "), a.String())

	// and then both refuse: E904, with CORE's retry hint (at most its 1 min,
	// where CORE_DR's is 2 min).
	a = c.Exchange("fb-4|CORE|BAL 1001")
	assert.Equal(t, "E904", a.Code, a.String())
	m := regexp.MustCompile(`^circuit open; retry after (\d+)s$`).FindStringSubmatch(a.Message)
	require.NotNil(t, m, a.String())
	secs, _ := strconv.Atoi(m[1])
	assert.LessOrEqual(t, secs, 60)
	assert.Equal(t, int64(3), core.Stats(t).Calls)
	assert.Equal(t, int64(3), dr.SettledStats(t).Calls)

	r.waitTransitions(t, "CORE", "CLOSED->OPEN")
	r.waitTransitions(t, "CORE_DR", "CLOSED->OPEN")
}

func TestManualControlEndToEnd(t *testing.T) {
	// Given a relay whose admin token comes from the environment, and CORE
	// with threshold 2,
	core := proctest.StartFixture(t, "CORE", "core")
	const token = "op-Secret-42"
	r := startPolicyRelay(t, []string{"RELAY_ADMIN_TOKEN=" + token},
		"--target", "CORE="+core.URL, "--fail-threshold", "2", "--reset-timeout", "300ms")
	c := hubtest.Dial(t, r.Addr())

	// an admin POST without the token, or with another, is refused 401 and
	// changes nothing, while GETs stay open;
	for _, tok := range []string{"", "op-secret-42", token + "x"} {
		code, body := r.control(t, "CORE", "open", tok)
		assert.Equal(t, http.StatusUnauthorized, code, body)
	}
	assert.Equal(t, "CLOSED", statusOf(t, r.status(t), "CORE").State)
	assert.Equal(t, "0000", c.Exchange("t-0|CORE|BAL 1001").Code)

	// open holds CORE open: E904 "held open by operator", CORE not called,
	// and the change in the breaker log;
	st := r.mustControl(t, "core", "open", token)
	assert.Equal(t, "OPEN", st.State)
	assert.True(t, st.Held)
	a := c.Exchange("t-1|CORE|BAL 1001")
	assert.Equal(t, "t-1|E904|circuit open; held open by operator", a.String())
	assert.Equal(t, int64(1), core.Stats(t).Calls)
	r.waitTransitions(t, "CORE", "CLOSED->OPEN")

	// enable starts a normal open period;
	st = r.mustControl(t, "CORE", "enable", token)
	assert.Equal(t, "OPEN", st.State)
	assert.False(t, st.Held)

	// disable closes CORE and lets every call through: failures never trip
	// it, though they are counted;
	st = r.mustControl(t, "CORE", "disable", token)
	assert.Equal(t, "CLOSED", st.State)
	assert.True(t, st.Disabled)
	r.waitTransitions(t, "CORE", "CLOSED->OPEN", "OPEN->CLOSED")
	core.Ctl(t, `{"mode":"fail"}`)
	for i := range 5 {
		a = c.Exchange(fmt.Sprintf("d-%d|CORE|BAL 1001", i))
		assert.Equal(t, "E500", a.Code, a.String())
	}
	st = statusOf(t, r.status(t), "CORE")
	assert.Equal(t, "CLOSED", st.State)
	assert.Equal(t, 5, st.ConsecutiveFailures)
	assert.True(t, st.Disabled)

	// close ends the disable with a count of zero, and the threshold
	// applies again.
	st = r.mustControl(t, "CORE", "close", token)
	assert.Equal(t, "CLOSED", st.State)
	assert.False(t, st.Disabled)
	assert.Zero(t, st.ConsecutiveFailures)
	for i := range 2 {
		assert.Equal(t, "E500", c.Exchange(fmt.Sprintf("c-%d|CORE|BAL 1001", i)).Code)
	}
	a = c.Exchange("c-2|CORE|BAL 1001")
	assert.Equal(t, "E904", a.Code, a.String())
	assert.Regexp(t, openMessage, a.Message)

	// The breaker log holds every change, in unbroken chains, and the
	// relay's log every action.
	r.waitTransitions(t, "CORE", "CLOSED->OPEN", "OPEN->CLOSED", "CLOSED->OPEN")
	var actions []string
	for _, l := range r.LogLines() {
		if l["message"] == "breaker action" {
			assert.Equal(t, "CORE", l["target"])
			assert.NotEmpty(t, l["remote"])
			actions = append(actions, l["action"].(string))
		}
	}
	assert.Equal(t, []string{"open", "enable", "disable", "close"}, actions)
	assert.NotContains(t, r.Stderr(), token, "the token is never logged")

	// Without --admin-token, the same POST needs no token.
	open := startPolicyRelay(t, nil, "--target", "CORE="+core.URL)
	assert.Equal(t, "OPEN", open.mustControl(t, "CORE", "open", "").State)
}

func TestBadConfigFileStopsTheRelay(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{name: "zero limit", body: "[CORE]\nmax_inflight = 0\n", want: "[CORE] max_inflight: must be at least 1, got 0"},
		{name: "unknown key", body: "[CLAIM]\nmax_in_flight = 4\n", want: "[CLAIM] max_in_flight: unknown key"},
		{name: "unknown fallback", body: "[CORE]\nfallback = \"CORE_DR\"\n", want: "[CORE] fallback: no target CORE_DR"},
		{name: "added target without url", body: "[CORE_DR]\nmax_inflight = 4\n", want: "[CORE_DR] url: missing"},
		{name: "bad duration", body: "[CORE]\nreset_timeout = \"soon\"\n", want: "[CORE] reset_timeout: duration \"soon\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conf := writeFile(t, "bad.toml", tt.body)
			res := proctest.Run(t, relayPkg, "--listen", "127.0.0.1:0", "--admin-listen", "",
				"--breaker-log", filepath.Join(t.TempDir(), "breaker.log"), "--config", conf)
			assert.Equal(t, 2, res.ExitCode, "a mistake in the settings file is a usage error; stderr: %s", res.Stderr)
			lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
			if assert.Len(t, lines, 1, "want exactly one line on stderr, got:\n%s", res.Stderr) {
				assert.Contains(t, lines[0], "config "+conf+": ")
				assert.Contains(t, lines[0], tt.want)
			}
		})
	}
}

func TestFailureRateTripsEndToEnd(t *testing.T) {
	// Given a target failing half its calls at random, and a relay whose
	// consecutive count could never trip but whose failure rate can,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"flaky","fail_ratio":0.5}`)
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--fail-threshold", "1000",
		"--failure-rate", "0.3", "--min-samples", "10", "--window", "10s", "--reset-timeout", "1m")
	c := hubtest.Dial(t, r.Addr())

	// when calls go on until the breaker refuses one,
	calls, failures := 0, 0
	var a hubtest.Response
	for i := range 500 {
		a = c.Exchange(fmt.Sprintf("r-%d|CORE|BAL 1001", i))
		if a.Code == "E904" {
			break
		}
		calls++
		if a.Code == "E500" {
			failures++
		}
	}

	// then it opened on the rate: after at least 10 calls, with at least
	// 30% of them failed, far below the threshold of 1000.
	require.Equal(t, "E904", a.Code, "the breaker never opened after %d calls (%d failed)", calls, failures)
	assert.GreaterOrEqual(t, calls, 10)
	assert.GreaterOrEqual(t, float64(failures)/float64(calls), 0.3)
	assert.Equal(t, int64(calls), core.SettledStats(t).Calls, "the refused call never reached the target")
	st := statusOf(t, r.status(t), "CORE")
	assert.Equal(t, "OPEN", st.State)
	assert.Less(t, st.ConsecutiveFailures, 1000)
	assert.Equal(t, 0.3, st.Settings.FailureRate)
	assert.Equal(t, 10, st.Settings.MinSamples)
	assert.Equal(t, 10.0, st.Settings.WindowSeconds)
	r.waitTransitions(t, "CORE", "CLOSED->OPEN")
}
