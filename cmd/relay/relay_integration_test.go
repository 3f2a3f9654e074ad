package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests start the real relay and fixture binaries on ephemeral
// loopback ports and hold them to docs/PROTOCOL.md (client and target protocols, codes, breaker, bulkhead, breaker log, configuration, shutdown) over TCP and HTTP, as
// an operator or a channel system would see them.

const relayPkg = "./cmd/relay"

// openMessage is the E904 message format of docs/PROTOCOL.md, "Response codes".
var openMessage = regexp.MustCompile(`^circuit open; retry after \d+s$`)

// hub is a running relay and the path of its breaker log.
type hub struct {
	*proctest.Process
	logPath string
}

// startRelay starts the relay on an ephemeral port, without the admin
// listener, with its breaker log in a temporary directory and a short drain
// time, plus args.
func startRelay(t *testing.T, env []string, args ...string) *hub {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "breaker.log")
	base := []string{
		"--listen", "127.0.0.1:0",
		"--admin-listen", "",
		"--breaker-log", logPath,
		"--drain-timeout", "5s",
	}
	p := proctest.StartEnv(t, relayPkg, env, append(base, args...)...)
	return &hub{Process: p, logPath: logPath}
}

// transitions returns the breaker log's lines for target as FROM->TO
// strings, failing the test if the file does not parse or its chains are
// broken.
func (h *hub) transitions(t *testing.T, target string) []string {
	t.Helper()
	entries, fragments, err := breakerlog.ReadFile(h.logPath)
	require.NoError(t, err)
	require.Empty(t, fragments, "torn lines")
	require.NoError(t, breakerlog.CheckChains(entries))
	var out []string
	for _, e := range entries {
		if e.Name == target {
			out = append(out, e.From.String()+"->"+e.To.String())
		}
	}
	return out
}

// waitTransitions waits until the breaker log holds exactly want for target.
func (h *hub) waitTransitions(t *testing.T, target string, want ...string) {
	t.Helper()
	proctest.Eventually(t, 2*time.Second, fmt.Sprintf("breaker log of %s is %v", target, want), func() bool {
		entries, _, err := breakerlog.ReadFile(h.logPath)
		if err != nil {
			return false
		}
		var got []string
		for _, e := range entries {
			if e.Name == target {
				got = append(got, e.From.String()+"->"+e.To.String())
			}
		}
		return strings.Join(got, " ") == strings.Join(want, " ")
	})
	assert.Equal(t, want, h.transitions(t, target))
}

// closedPortURL returns the URL of a loopback port nobody listens on.
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr
}

// echoTarget is an httptest target that answers 0000 with the payload as
// the message and records what it received.
type echoTarget struct {
	*httptest.Server
	mu       sync.Mutex
	bodies   map[string][]byte      // guarded by mu; by X-Tx-Id
	headers  map[string]http.Header // guarded by mu; by X-Tx-Id
	calls    atomic.Int64
	override map[string]string // payload -> message to answer instead; read-only
}

func newEchoTarget(t *testing.T, override map[string]string) *echoTarget {
	e := &echoTarget{bodies: map[string][]byte{}, headers: map[string]http.Header{}, override: override}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		txid := r.Header.Get("X-Tx-Id")
		e.mu.Lock()
		e.bodies[txid] = body
		e.headers[txid] = r.Header.Clone()
		e.mu.Unlock()
		msg := string(body)
		if m, ok := e.override[msg]; ok {
			msg = m
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"code": "0000", "message": msg})
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *echoTarget) body(txid string) ([]byte, http.Header, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, ok := e.bodies[txid]
	return b, e.headers[txid], ok
}

// sendConcurrently writes lines over conns, len(lines)/len(conns) per
// connection, all connections writing at the same instant, and returns
// every answer.
func sendConcurrently(t *testing.T, conns []*hubtest.Client, lines []string) []hubtest.Response {
	t.Helper()
	per := len(lines) / len(conns)
	start := make(chan struct{})
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		payload := strings.Join(lines[i*per:(i+1)*per], "\n") + "\n"
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := c.Write([]byte(payload))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var answers []hubtest.Response
	for _, c := range conns {
		answers = append(answers, c.ReadResponses(per)...)
	}
	return answers
}

func TestBreakerTripsAndAnswersE904WithoutCallingTarget(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--fail-threshold", "3", "--reset-timeout", "60")
	c := hubtest.Dial(t, h.Addr())

	// Given a failing CORE (and a reset timeout given as a bare number,
	// which means seconds),
	core.Ctl(t, `{"mode":"fail"}`)

	// when three calls fail in a row, each is answered E500 and the breaker
	// opens;
	for i := range 3 {
		a := c.Exchange(fmt.Sprintf("trip-%d|CORE|BAL 1", i))
		assert.Equal(t, "E500", a.Code, a.String())
	}
	require.Equal(t, int64(3), core.Stats(t).Calls)

	// then every further CORE request is answered E904 at once, without
	// calling the target, with a message that says when to retry.
	for i := range 5 {
		a := c.Exchange(fmt.Sprintf("open-%d|CORE|BAL 1", i))
		assert.Equal(t, "E904", a.Code, a.String())
		assert.Regexp(t, `^circuit open; retry after (59|60)s$`, a.Message)
	}
	assert.Equal(t, int64(3), core.Stats(t).Calls, "an open breaker must not call the target")

	// CLAIM has its own breaker and is untouched.
	a := c.Exchange("claim-1|CLAIM|SUBMIT POL1 100")
	assert.Equal(t, "0000", a.Code, a.String())

	h.waitTransitions(t, "CORE", "CLOSED->OPEN")
	assert.Empty(t, h.transitions(t, "CLAIM"))
}

func TestBreakerHalfOpenAdmitsExactlyOneProbe(t *testing.T) {
	const resetTimeout = 400 * time.Millisecond
	core := proctest.StartFixture(t, "CORE", "core")
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL,
		"--fail-threshold", "2", "--reset-timeout", resetTimeout.String(),
		"--target-timeout", "5s", "--max-inflight", "50")
	c := hubtest.Dial(t, h.Addr())
	conns := make([]*hubtest.Client, 5)
	for i := range conns {
		conns[i] = hubtest.Dial(t, h.Addr())
	}

	trip := func(round string) time.Time {
		t.Helper()
		core.Ctl(t, `{"mode":"fail"}`)
		for i := range 2 {
			a := c.Exchange(fmt.Sprintf("%s-fail-%d|CORE|BAL 1", round, i))
			require.Equal(t, "E500", a.Code, a.String())
		}
		opened := time.Now()
		a := c.Exchange(round + "-open|CORE|BAL 1")
		require.Equal(t, "E904", a.Code, a.String())
		return opened
	}

	// Given an open breaker and a target that has recovered but is slow,
	// so that the probe is still out while the others arrive,
	opened := trip("r1")
	core.Ctl(t, `{"mode":"slow","delay_ms":1000,"reset":true}`)
	waitUntil(opened.Add(resetTimeout))

	// when 30 requests arrive at once over 5 connections after the reset
	// timeout, exactly one is admitted as the probe and the 29 others get
	// E904. A burst that still finds the breaker open (all E904, no call)
	// is repeated until the deadline.
	var answers []hubtest.Response
	proctest.Eventually(t, 5*time.Second, "a burst admits a probe", func() bool {
		lines := make([]string, 30)
		for i := range lines {
			lines[i] = fmt.Sprintf("burst-%d-%d|CORE|BAL hb", time.Now().UnixNano(), i)
		}
		answers = sendConcurrently(t, conns, lines)
		for _, a := range answers {
			if a.Code != "E904" {
				return true
			}
		}
		require.Equal(t, int64(0), core.Stats(t).Calls, "an all-E904 burst called the target")
		return false
	})
	hubtest.ByTxID(t, answers)
	codes := map[string]int{}
	for _, a := range answers {
		codes[a.Code]++
		if a.Code == "E904" {
			assert.Regexp(t, openMessage, a.Message)
		}
	}
	assert.Equal(t, map[string]int{"0000": 1, "E904": 29}, codes)
	st := core.Stats(t)
	assert.Equal(t, int64(1), st.Calls, "exactly one probe reaches the target")
	assert.Equal(t, int64(1), st.MaxInFlight)

	// Then the probe's success has closed the breaker.
	core.Ctl(t, `{"mode":"normal"}`)
	a := c.Exchange("closed-1|CORE|BAL hb")
	assert.Equal(t, "0000", a.Code, a.String())
	assert.Equal(t, int64(2), core.Stats(t).Calls)

	// Given the breaker open again, when the probe fails, the breaker
	// reopens and the reset timeout starts again.
	opened = trip("r2")
	core.Ctl(t, `{"mode":"fail","reset":true}`)
	waitUntil(opened.Add(resetTimeout))
	var probe hubtest.Response
	n := 0
	proctest.Eventually(t, 5*time.Second, "a request is admitted as the probe", func() bool {
		n++
		probe = c.Exchange(fmt.Sprintf("probe-%d|CORE|BAL 1", n))
		return probe.Code != "E904"
	})
	assert.Equal(t, "E500", probe.Code, probe.String())
	a = c.Exchange("reopened|CORE|BAL 1")
	assert.Equal(t, "E904", a.Code, a.String())
	assert.Equal(t, int64(1), core.Stats(t).Calls, "only the probe reached the failing target")

	h.waitTransitions(t, "CORE",
		"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->CLOSED",
		"CLOSED->OPEN", "OPEN->HALF_OPEN", "HALF_OPEN->OPEN")
}

// ptr returns a pointer to s, for optional table fields.
func ptr(s string) *string { return &s }

// waitUntil returns once the wall clock has passed at. It is the one place
// these tests let time pass, because a real breaker's reset timeout can only
// be waited out; callers then poll for its effect with a deadline.
func waitUntil(at time.Time) {
	if d := time.Until(at); d > 0 {
		time.Sleep(d)
	}
}

func TestBulkheadRejectsAtOnceWhenFull(t *testing.T) {
	const limit = 3
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--max-inflight", fmt.Sprint(limit), "--target-timeout", "10s")
	c := hubtest.Dial(t, h.Addr())

	// Given a slow CORE,
	core.Ctl(t, `{"mode":"slow","delay_ms":2000}`)

	// when ten CORE requests arrive at once on one connection,
	lines := make([]string, 10)
	for i := range lines {
		lines[i] = fmt.Sprintf("bh-%d|CORE|BAL bh%d", i, i)
	}
	c.Send(lines...)

	// then the seven over the limit are answered E905 while the three
	// admitted calls are still in flight,
	for range len(lines) - limit {
		a := c.ReadResponse()
		assert.Equal(t, "E905", a.Code, a.String())
	}
	proctest.Eventually(t, time.Second, "the admitted calls are in flight at CORE", func() bool {
		st, err := core.StatsErr()
		return err == nil && st.InFlight == limit
	})

	// CLAIM answers meanwhile,
	a := c.Exchange("bh-claim|CLAIM|SUBMIT POL1 100")
	assert.Equal(t, "0000", a.Code, a.String())
	assert.Equal(t, int64(limit), core.Stats(t).InFlight, "the CLAIM answer must not wait for CORE")

	// and the admitted calls complete normally.
	for _, a := range c.ReadResponses(limit) {
		assert.Equal(t, "0000", a.Code, a.String())
	}
	st := core.Stats(t)
	assert.Equal(t, int64(limit), st.MaxInFlight, "the target never sees more than --max-inflight calls")
	assert.Equal(t, int64(limit), st.Calls)
}

// scriptedTarget is an httptest target whose answer is chosen by the
// payload, so one server can play every way a target answers (docs/PROTOCOL.md, "Target protocol").
// It counts calls per payload.
type scriptedTarget struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int // guarded by mu
}

// scriptedAnswers maps a payload to the HTTP status and body answered.
var scriptedAnswers = map[string]struct {
	status int
	body   string
}{
	"http400":  {http.StatusBadRequest, `{"code":"E400","message":"malformed"}`},
	"http404":  {http.StatusNotFound, `not found`},
	"http503":  {http.StatusServiceUnavailable, `{"code":"0000","message":"status wins"}`},
	"own500":   {http.StatusOK, `{"code":"E500","message":"ledger down"}`},
	"notjson":  {http.StatusOK, `<html>proxy error</html>`},
	"badcode":  {http.StatusOK, `{"code":"X12","message":"what"}`},
	"business": {http.StatusOK, `{"code":"B299","message":"rejected"}`},
}

func newScriptedTarget(t *testing.T) *scriptedTarget {
	st := &scriptedTarget{calls: map[string]int{}}
	st.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		st.mu.Lock()
		st.calls[string(body)]++
		st.mu.Unlock()
		ans, ok := scriptedAnswers[string(body)]
		if !ok {
			ans.status, ans.body = http.StatusTeapot, "unscripted payload"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ans.status)
		_, _ = io.WriteString(w, ans.body)
	}))
	t.Cleanup(st.Close)
	return st
}

func (st *scriptedTarget) callsFor(payload string) int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.calls[payload]
}

func TestOnlyTargetFailuresTrip(t *testing.T) {
	good := proctest.StartFixture(t, "CORE", "core")
	sick := proctest.StartFixture(t, "SICK", "core")
	scripted := newScriptedTarget(t)

	// Each case has a target of its own, and every target trips on its
	// first failure, so one counted failure shows as E904 on the next
	// request.
	type testCase struct {
		name    string
		target  string
		url     string
		ctl     string // fixture control for SICK before the calls, if any
		payload string
		code    string
		trips   bool
	}
	tests := []testCase{
		{name: "B201 business rejection is a success", target: "CORE", url: good.URL, payload: "WD acct 99999999", code: "B201"},
		{name: "other business code is relayed as is", target: "BIZ", url: scripted.URL, payload: "business", code: "B299"},
		{name: "HTTP 400 is E400, a success", target: "BAD", url: scripted.URL, payload: "http400", code: "E400"},
		{name: "HTTP 404 is E400, a success", target: "GONE", url: scripted.URL, payload: "http404", code: "E400"},
		{name: "fixture failure E500 trips", target: "FAIL", url: sick.URL, ctl: `{"mode":"fail"}`, payload: "BAL 1", code: "E500", trips: true},
		{name: "HTTP 503 is E500 whatever the body", target: "UNAV", url: scripted.URL, payload: "http503", code: "E500", trips: true},
		{name: "target's own E500 in a 200 trips", target: "OWN", url: scripted.URL, payload: "own500", code: "E500", trips: true},
		{name: "answer off the protocol is E500", target: "HTML", url: scripted.URL, payload: "notjson", code: "E500", trips: true},
		{name: "code of unknown form is E500", target: "ODD", url: scripted.URL, payload: "badcode", code: "E500", trips: true},
		{name: "E901 timeout trips", target: "SLOW", url: sick.URL, ctl: `{"mode":"slow","delay_ms":5000}`, payload: "BAL 1", code: "E901", trips: true},
		{name: "E902 dropped connection trips", target: "DROP", url: sick.URL, ctl: `{"mode":"drop"}`, payload: "BAL 1", code: "E902", trips: true},
		{name: "E902 closed port trips", target: "DEAD", url: closedPortURL(t), payload: "BAL 1", code: "E902", trips: true},
	}
	args := []string{"--fail-threshold", "1", "--reset-timeout", "1m", "--target-timeout", "300ms"}
	for _, tt := range tests {
		args = append(args, "--target", tt.target+"="+tt.url)
	}
	h := startRelay(t, nil, args...)
	c := hubtest.Dial(t, h.Addr())

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.ctl != "" {
				sick.Ctl(t, tt.ctl)
			}
			sickBefore := sick.Stats(t).Calls
			scriptedBefore := scripted.callsFor(tt.payload)

			a := c.Exchange(fmt.Sprintf("%s-1|%s|%s", tt.target, tt.target, tt.payload))
			require.Equal(t, tt.code, a.Code, a.String())
			// A call that may have reached the target is never sent again.
			switch tt.url {
			case sick.URL:
				assert.Equal(t, sickBefore+1, sick.Stats(t).Calls, "the target got the transaction more than once")
			case scripted.URL:
				assert.Equal(t, scriptedBefore+1, scripted.callsFor(tt.payload), "the target got the transaction more than once")
			}

			for i := 2; i <= 4; i++ {
				a := c.Exchange(fmt.Sprintf("%s-%d|%s|%s", tt.target, i, tt.target, tt.payload))
				if tt.trips {
					assert.Equal(t, "E904", a.Code, "%s must count as a failure: %s", tt.code, a)
				} else {
					assert.Equal(t, tt.code, a.Code, "%s must not count as a failure: %s", tt.code, a)
				}
			}
			if tt.trips {
				h.waitTransitions(t, tt.target, "CLOSED->OPEN")
			} else {
				assert.Empty(t, h.transitions(t, tt.target))
			}
		})
	}
	a := c.Exchange("core-after|CORE|BAL acct")
	assert.Equal(t, "0000", a.Code, a.String())
}

func TestPipelinedLinesAreEachAnsweredOnce(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL,
		"--max-inflight", "500")
	c := hubtest.Dial(t, h.Addr())

	// Given 400 lines to two targets, an unknown target and with missing
	// fields, written in one go on one connection,
	want := map[string]string{}
	var b strings.Builder
	for i := range 400 {
		txid := fmt.Sprintf("p%03d", i)
		var line string
		switch i % 8 {
		case 0, 1, 2:
			line, want[txid] = txid+"|CORE|BAL a"+fmt.Sprint(i), "0000"
		case 3, 4, 5:
			line, want[txid] = txid+"|claim|SUBMIT POL"+fmt.Sprint(i)+" 100", "0000"
		case 6:
			line, want[txid] = txid+"|NOPE|x", "E903"
		case 7:
			line, want[txid] = txid+"|CORE", "E900"
		}
		b.WriteString(line + "\n")
	}
	_, err := c.Write([]byte(b.String()))
	require.NoError(t, err)

	// then every TXID is answered exactly once, with its own result.
	got := c.ReadByTxID(len(want))
	for txid, code := range want {
		if assert.Contains(t, got, txid) {
			assert.Equal(t, code, got[txid].Code, got[txid].String())
		}
	}
	assert.Equal(t, int64(150), core.Stats(t).Calls)
	assert.Equal(t, int64(150), claim.Stats(t).Calls)
}

func TestMalformedAndEdgeCaseLines(t *testing.T) {
	const maxLine = 1024
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	echo := newEchoTarget(t, map[string]string{"inject": "evil\r\n-|0000|forged"})
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL, "--target", "ECHO="+echo.URL,
		"--max-line-bytes", fmt.Sprint(maxLine))
	c := hubtest.Dial(t, h.Addr())

	txid64 := strings.Repeat("aZ09._:-", 8)
	tests := []struct {
		name    string
		line    string
		txid    string
		code    string
		message *string // exact, when set
	}{
		{name: "bad TXID character", line: "bad!id|CORE|BAL a", txid: "-", code: "E900"},
		{name: "space in TXID", line: "bad id|CORE|BAL a", txid: "-", code: "E900"},
		{name: "empty TXID", line: "|CORE|BAL a", txid: "-", code: "E900"},
		{name: "TXID of 65", line: txid64 + "x|CORE|BAL a", txid: "-", code: "E900"},
		{name: "TXID of 64 with every kind of character", line: txid64 + "|ECHO|ok", txid: txid64, code: "0000", message: ptr("ok")},
		{name: "no separator", line: "justtext", txid: "-", code: "E900"},
		{name: "no payload field", line: "m-nopayload|CORE", txid: "m-nopayload", code: "E900"},
		{name: "empty target", line: "m-notarget||BAL a", txid: "m-notarget", code: "E900"},
		{name: "unknown target", line: "m-unknown|NOPE|BAL a", txid: "m-unknown", code: "E903"},
		{name: "CRLF line end", line: "m-crlf|CORE|BAL crlf\r", txid: "m-crlf", code: "0000", message: ptr("balance=100000")},
		{name: "lower-case target", line: "m-lower|core|BAL a", txid: "m-lower", code: "0000"},
		{name: "mixed-case target", line: "m-mixed|cLaIm|STATUS C-404", txid: "m-mixed", code: "B212"},
		{name: "pipes in payload", line: "m-pipe|ECHO|a|b||c |", txid: "m-pipe", code: "0000", message: ptr("a|b||c |")},
		{name: "empty payload", line: "m-empty|ECHO|", txid: "m-empty", code: "0000", message: ptr("")},
		{name: "UTF-8 payload", line: "m-utf8|ECHO|żółw ✓", txid: "m-utf8", code: "0000", message: ptr("żółw ✓")},
		{name: "control characters cleaned from the message", line: "m-ctl|ECHO|a\tb\rc", txid: "m-ctl", code: "0000", message: ptr("a b c")},
		{name: "target cannot inject a line", line: "m-inject|ECHO|inject", txid: "m-inject", code: "0000", message: ptr("evil  -|0000|forged")},
		{name: "line of exactly --max-line-bytes", line: "m-max|ECHO|" + strings.Repeat("y", maxLine-len("m-max|ECHO|")), txid: "m-max", code: "0000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := c.Exchange(tt.line)
			assert.Equal(t, tt.txid, a.TxID, a.String())
			assert.Equal(t, tt.code, a.Code, a.String())
			if tt.message != nil {
				assert.Equal(t, *tt.message, a.Message)
			}
		})
	}

	t.Run("payload forwarded byte for byte", func(t *testing.T) {
		for txid, want := range map[string]string{
			"m-pipe":  "a|b||c |",
			"m-empty": "",
			"m-utf8":  "żółw ✓",
			"m-ctl":   "a\tb\rc",
			txid64:    "ok",
		} {
			body, hdr, ok := echo.body(txid)
			if assert.True(t, ok, "ECHO got no call for %s", txid) {
				assert.Equal(t, want, string(body), txid)
				assert.Equal(t, txid, hdr.Get("X-Tx-Id"))
				assert.Equal(t, "text/plain; charset=utf-8", hdr.Get("Content-Type"))
			}
		}
	})

	t.Run("blank lines get no answer", func(t *testing.T) {
		c.Send("", "\r", "m-after-blank|NOPE|x")
		a := c.ReadResponse()
		assert.Equal(t, "m-after-blank", a.TxID, "a blank line was answered: %s", a)
		a = c.Exchange("m-after-blank-2|NOPE|x")
		assert.Equal(t, "m-after-blank-2", a.TxID, "a blank line was answered: %s", a)
	})

	t.Run("over-long line then the connection is still usable", func(t *testing.T) {
		calls := echo.calls.Load()
		for _, size := range []int{maxLine + 1, 3 * maxLine, 256 << 10} {
			// The TXID is within the part of the line the hub reads, so it
			// is echoed; a line without a readable TXID is answered "-".
			for _, tc := range []struct{ prefix, txid string }{
				{prefix: "m-long|ECHO|", txid: "m-long"},
				{prefix: "m long|ECHO|", txid: "-"},
			} {
				a := c.Exchange(tc.prefix + strings.Repeat("z", size-len(tc.prefix)))
				assert.Equal(t, tc.txid, a.TxID, "%d bytes: %s", size, a)
				assert.Equal(t, "E900", a.Code, a.String())
				assert.Equal(t, "line too long", a.Message)
				a = c.Exchange("m-after-long|CORE|BAL a")
				assert.Equal(t, "m-after-long", a.TxID, "the rest of the long line was read as a line: %s", a)
				assert.Equal(t, "0000", a.Code, a.String())
			}
		}
		assert.Equal(t, calls, echo.calls.Load(), "an over-long line must not reach the target")
	})
}

func TestBadConfigurationStopsAtStart(t *testing.T) {
	// The exit status says which kind of mistake stopped the relay
	// (docs/PROTOCOL.md, "Configuration"): 2 for its configuration (flags,
	// environment, settings file), 1 for the world it runs in (ports,
	// files it writes).
	const (
		usage   = 2
		runtime = 1
	)
	dir := t.TempDir()
	missingDir := filepath.Join(dir, "no", "such", "dir", "breaker.log")
	badConfig := filepath.Join(dir, "bad.toml")
	require.NoError(t, os.WriteFile(badConfig, []byte("[CORE]\nfail_threshold = 0\n"), 0o600))
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	target := "--target=CORE=http://127.0.0.1:9"
	tests := []struct {
		name string
		env  []string
		args []string
		want *regexp.Regexp // the one stderr line must match
		exit int
	}{
		{name: "zero threshold", args: []string{"--fail-threshold", "0"}, want: regexp.MustCompile(`(?i)fail.threshold`), exit: usage},
		{name: "negative threshold", args: []string{"--fail-threshold=-1"}, want: regexp.MustCompile(`(?i)fail.threshold`), exit: usage},
		{name: "negative threshold after a space", args: []string{"--fail-threshold", "-1"}, want: regexp.MustCompile(`--fail-threshold: must be at least 1, got -1$`), exit: usage},
		{name: "negative window after a space", args: []string{target, "--window", "-1s"}, want: regexp.MustCompile(`--window: must not be negative, got -1s$`), exit: usage},
		{name: "zero max inflight", args: []string{"--max-inflight", "0"}, want: regexp.MustCompile(`(?i)max.inflight`), exit: usage},
		{name: "negative max inflight", args: []string{"--max-inflight=-3"}, want: regexp.MustCompile(`(?i)max.inflight`), exit: usage},
		{name: "zero max conns", args: []string{"--max-conns", "0"}, want: regexp.MustCompile(`(?i)max.conns`), exit: usage},
		{name: "zero max line bytes", args: []string{"--max-line-bytes", "0"}, want: regexp.MustCompile(`(?i)max.line.bytes`), exit: usage},
		{name: "unparsable URL", args: []string{"--target", "CORE=http://%zz"}, want: regexp.MustCompile(`(?i)CORE|url|%zz`), exit: usage},
		{name: "URL without scheme and host", args: []string{"--target", "CORE=just-words"}, want: regexp.MustCompile(`(?i)CORE|url|just-words`), exit: usage},
		{name: "target without URL", args: []string{"--target", "CORE"}, want: regexp.MustCompile(`(?i)target|CORE`), exit: usage},
		{name: "bad reset timeout", args: []string{target, "--reset-timeout", "soon"}, want: regexp.MustCompile(`(?i)reset.timeout|soon`), exit: usage},
		{name: "bad target timeout", args: []string{target, "--target-timeout", "5x"}, want: regexp.MustCompile(`(?i)target.timeout|5x`), exit: usage},
		{name: "negative reset timeout", args: []string{target, "--reset-timeout=-5s"}, want: regexp.MustCompile(`(?i)reset.timeout`), exit: usage},
		{name: "duplicate target", args: []string{target, "--target", "CORE=http://127.0.0.1:10"}, want: regexp.MustCompile(`(?i)duplicate|CORE`), exit: usage},
		{name: "duplicate target in another case", args: []string{target, "--target", "core=http://127.0.0.1:10"}, want: regexp.MustCompile(`(?i)duplicate|CORE`), exit: usage},
		{name: "failure code the hub reserves", args: []string{target, "--failure-codes", "E999"}, want: regexp.MustCompile(`--failure-codes: failure code "E999": .*want E400, E500, E901, E902`), exit: usage},
		{name: "unknown flag", args: []string{target, "--fail-treshold", "3"}, want: regexp.MustCompile(`--fail-treshold`), exit: usage},
		{name: "bad value from the environment", env: []string{"RELAY_MAX_INFLIGHT=0"}, args: []string{target}, want: regexp.MustCompile(`(?i)max.inflight`), exit: usage},
		{name: "unparsable value from the environment", env: []string{"RELAY_FAIL_THRESHOLD=five"}, args: []string{target}, want: regexp.MustCompile(`RELAY_FAIL_THRESHOLD`), exit: usage},
		{name: "state store not redis", args: []string{target, "--state-store", "http://127.0.0.1:6379"}, want: regexp.MustCompile(`--state-store: .*want redis:// or rediss://`), exit: usage},
		{name: "state store with an unknown option", args: []string{target, "--state-store", "redis://127.0.0.1:6379?colour=blue"}, want: regexp.MustCompile(`--state-store: .*colour`), exit: usage},
		{name: "bad hub id", args: []string{target, "--state-store", "redis://127.0.0.1:6379", "--hub-id", "hub a"}, want: regexp.MustCompile(`--hub-id "hub a"`), exit: usage},
		{name: "bad settings file", args: []string{target, "--config", badConfig}, want: regexp.MustCompile(regexp.QuoteMeta("[CORE] fail_threshold: must be at least 1")), exit: usage},
		{name: "missing settings file", args: []string{target, "--config", filepath.Join(dir, "none.toml")}, want: regexp.MustCompile(regexp.QuoteMeta(filepath.Join(dir, "none.toml"))), exit: usage},
		{name: "unopenable breaker log", args: []string{target, "--breaker-log", missingDir}, want: regexp.MustCompile(regexp.QuoteMeta(missingDir)), exit: runtime},
		{name: "unopenable access log", args: []string{target, "--access-log", filepath.Join(dir, "no", "access.log")}, want: regexp.MustCompile(`--access-log: .*` + regexp.QuoteMeta(filepath.Join(dir, "no", "access.log"))), exit: runtime},
		{name: "listen address in use", args: []string{target, "--listen", taken.Addr().String()}, want: regexp.MustCompile(`--listen: .*address already in use`), exit: runtime},
		{name: "admin address in use", args: []string{target, "--admin-listen", taken.Addr().String()}, want: regexp.MustCompile(`--admin-listen: .*address already in use`), exit: runtime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"--listen", "127.0.0.1:0", "--admin-listen", ""}
			if !strings.Contains(strings.Join(tt.args, " "), "--breaker-log") {
				args = append(args, "--breaker-log", filepath.Join(dir, "breaker.log"))
			}
			res := proctest.RunEnv(t, relayPkg, tt.env, append(args, tt.args...)...)
			assert.Equal(t, tt.exit, res.ExitCode, "stderr: %s", res.Stderr)
			var lines []string
			for _, l := range strings.Split(res.Stderr, "\n") {
				if strings.TrimSpace(l) != "" {
					lines = append(lines, l)
				}
			}
			if assert.Len(t, lines, 1, "want exactly one line on stderr, got:\n%s", res.Stderr) {
				assert.Regexp(t, tt.want, lines[0])
			}
		})
	}
}

func TestEnvironmentConfiguresTheRelay(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelay(t, []string{
		"RELAY_FAIL_THRESHOLD=1",
		"RELAY_RESET_TIMEOUT=1m",
		"RELAY_TARGET=CORE=" + core.URL + ",CLAIM=" + claim.URL,
	})
	c := hubtest.Dial(t, h.Addr())

	// RELAY_TARGET names both targets, comma-separated.
	a := c.Exchange("env-claim|CLAIM|SUBMIT POL1 100")
	assert.Equal(t, "0000", a.Code, a.String())

	// Given RELAY_FAIL_THRESHOLD=1 and no --fail-threshold, one failure
	// opens the breaker (the default would need five).
	core.Ctl(t, `{"mode":"fail"}`)
	a = c.Exchange("env-1|CORE|BAL 1")
	require.Equal(t, "E500", a.Code, a.String())
	a = c.Exchange("env-2|CORE|BAL 1")
	assert.Equal(t, "E904", a.Code, a.String())
	assert.Equal(t, int64(1), core.Stats(t).Calls)
}

func TestMaxConnsRefusesExtraConnections(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	h := startRelay(t, nil, "--target", "CORE="+core.URL, "--max-conns", "2")

	// Given two connections the relay has taken,
	c1 := hubtest.Dial(t, h.Addr())
	c2 := hubtest.Dial(t, h.Addr())
	assert.Equal(t, "0000", c1.Exchange("mc-1|CORE|BAL a").Code)
	assert.Equal(t, "0000", c2.Exchange("mc-2|CORE|BAL a").Code)

	// when a third arrives, it gets one E906 line and is closed.
	c3 := hubtest.Dial(t, h.Addr())
	assert.Equal(t, "-|E906|too many connections\n", c3.ExpectClosed())
	assert.Equal(t, "0000", c1.Exchange("mc-3|CORE|BAL a").Code, "the admitted connections keep working")

	// Once one of the two goes away, a new connection is served again.
	c1.Close()
	n := 0
	proctest.Eventually(t, 5*time.Second, "a connection is accepted after another closed", func() bool {
		n++
		c := hubtest.Dial(t, h.Addr())
		defer c.Close()
		c.Send(fmt.Sprintf("mc-retry-%d|CORE|BAL a", n))
		line, err := c.ReadLine(hubtest.ClientTimeout)
		require.NoError(t, err)
		return strings.HasPrefix(line, fmt.Sprintf("mc-retry-%d|0000|", n))
	})
}

func TestSIGTERMDrainsCallsInFlight(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	h := startRelay(t, nil,
		"--target", "CORE="+core.URL, "--target", "CLAIM="+claim.URL, "--target", "DEAD="+closedPortURL(t),
		"--fail-threshold", "1", "--reset-timeout", "1m", "--target-timeout", "10s")
	c := hubtest.Dial(t, h.Addr())

	// Given a breaker log with a line in it and a slow call in flight,
	a := c.Exchange("dead-1|DEAD|x")
	require.Equal(t, "E902", a.Code, a.String())
	core.Ctl(t, `{"mode":"slow","delay_ms":2500}`)
	c.Send("slow-1|CORE|BAL a")
	proctest.Eventually(t, 5*time.Second, "the slow call reaches CORE", func() bool {
		st, err := core.StatsErr()
		return err == nil && st.InFlight == 1
	})

	// when the relay gets SIGTERM,
	h.Signal(syscall.SIGTERM)

	// then it stops accepting connections,
	proctest.Eventually(t, 5*time.Second, "new connections are refused", func() bool {
		nc, err := net.DialTimeout("tcp", h.Addr(), time.Second)
		if err != nil {
			return true
		}
		_ = nc.Close()
		return false
	})

	// lines read after the signal are answered E906 and not forwarded,
	answers := map[string]hubtest.Response{}
	n := 0
	proctest.Eventually(t, 5*time.Second, "a line sent after SIGTERM is answered E906", func() bool {
		n++
		txid := fmt.Sprintf("after-%d", n)
		c.Send(txid + "|CLAIM|STATUS C-1")
		return readUntil(c, answers, txid).Code == "E906"
	})
	c.Send("late|CORE|BAL a")
	a = readUntil(c, answers, "late")
	assert.Equal(t, "E906", a.Code, a.String())

	// the call in flight is still answered,
	a = readUntil(c, answers, "slow-1")
	assert.Equal(t, "0000", a.Code, a.String())
	assert.Equal(t, int64(1), core.Stats(t).Calls, "nothing sent after SIGTERM reached CORE")

	// and the relay exits 0 with its breaker log closed and intact.
	assert.Equal(t, 0, h.Wait())
	entries, _, err := breakerlog.ReadFile(h.logPath)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(entries))
	if assert.Len(t, entries, 1) {
		assert.Equal(t, "DEAD", entries[0].Name)
		assert.Equal(t, breaker.Closed, entries[0].From)
		assert.Equal(t, breaker.Open, entries[0].To)
	}
}

// readUntil returns the answer for txid, from answers if it came already,
// else reading from c and keeping every other answer in answers.
func readUntil(c *hubtest.Client, answers map[string]hubtest.Response, txid string) hubtest.Response {
	for {
		if a, ok := answers[txid]; ok {
			return a
		}
		a := c.ReadResponse()
		answers[a.TxID] = a
	}
}
