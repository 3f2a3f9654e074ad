package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests start the real relay and fixture binaries and hold them to
// docs/OPERATING.md, "Running it in production": the shutdown delay behind
// a load balancer, the PROXY protocol, and reloading the settings without
// forgetting what the breakers know.

// logMessages returns the relay's log lines whose message is msg.
func logMessages(p *proctest.Process, msg string) []map[string]any {
	var out []map[string]any
	for _, l := range p.LogLines() {
		if l["message"] == msg {
			out = append(out, l)
		}
	}
	return out
}

// reload posts /reload with the bearer token (none when empty) and returns
// the status and the body.
func (r *policyRelay) reload(t *testing.T, token string) (int, string) {
	t.Helper()
	return r.post(t, "/reload", "", token)
}

func TestShutdownDelayServesWhileReadyzSays503(t *testing.T) {
	// Given a relay with a one second shutdown delay and a client
	core := proctest.StartFixture(t, "CORE", "core")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--shutdown-delay", "1s")
	h.mustGet(t, "/readyz")
	c := hubtest.Dial(t, h.Addr())
	require.Equal(t, "0000", c.Exchange("W0|CORE|BAL 1001").Code)

	// When it gets SIGTERM
	signalled := time.Now()
	h.Signal(syscall.SIGTERM)

	// Then /readyz answers 503 at once, /status says draining,
	proctest.Eventually(t, 500*time.Millisecond, "/readyz answers 503 at once", func() bool {
		code, _, err := h.get("/readyz")
		return err == nil && code == http.StatusServiceUnavailable
	})
	assert.True(t, h.status(t).Draining)

	// lines are still answered 0000 for the second, on the connection it
	// had and on a new one,
	assert.Equal(t, "0000", hubtest.Dial(t, h.Addr()).Exchange("N1|CORE|BAL 1001").Code)
	var lastOK time.Time
	var end string
	for i := 0; ; i++ {
		c.Send(fmt.Sprintf("W%d|CORE|BAL 1001", i+1))
		line, err := c.ReadLine(5 * time.Second)
		if err != nil {
			end = "closed"
			break
		}
		a, perr := hubtest.ParseResponse(line)
		require.NoError(t, perr, line)
		if a.Code != "0000" {
			end = a.Code
			break
		}
		lastOK = time.Now()
		time.Sleep(20 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, lastOK.Sub(signalled), 900*time.Millisecond, "lines answered 0000 through the delay")

	// and then the relay drains: E906 or the connection closed, no new
	// connection accepted, exit 0.
	assert.Contains(t, []string{"E906", "closed"}, end)
	assert.Less(t, time.Since(signalled), 5*time.Second)
	assert.Equal(t, 0, h.Wait())
	_, err := net.DialTimeout("tcp", h.Addr(), time.Second)
	assert.Error(t, err)
	require.Len(t, logMessages(h.Process, "leaving service: /readyz answers 503, serving on until the shutdown delay has passed"), 1)
}

func TestProxyProtocolEndToEnd(t *testing.T) {
	// Given a relay that requires PROXY headers from 127.0.0.1 only, with
	// an access log
	core := proctest.StartFixture(t, "CORE", "core")
	access := filepath.Join(t.TempDir(), "access.log")
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--access-log", access,
		"--proxy-protocol", "required", "--proxy-trusted", "127.0.0.1/32", "--log-level", "debug")

	// When the trusted balancer sends a v2 header for its client, the
	// client's lines are served;
	lb := hubtest.DialFrom(t, "127.0.0.1", r.Addr())
	hdr := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 4711}, &net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 9200})
	_, err := hdr.WriteTo(lb)
	require.NoError(t, err)
	assert.Equal(t, "0000", lb.Exchange("P1|CORE|BAL 1001").Code)
	assert.Equal(t, "E903", lb.Exchange("P2|NOPE|x").Code)

	// a connection from an address not trusted, header or not, is refused;
	for _, withHeader := range []bool{true, false} {
		other := hubtest.DialFrom(t, "127.0.0.2", r.Addr())
		if withHeader {
			_, err := hdr.WriteTo(other)
			require.NoError(t, err)
		}
		_, _ = other.Write([]byte("X1|CORE|BAL 1001\n"))
		assert.Empty(t, other.ExpectClosed(), "an untrusted connection gets no answer")
	}

	// and an operator's action through the admin port names the address
	// its PROXY header gave.
	adminConn, err := net.Dial("tcp", strings.TrimPrefix(r.admin, "http://"))
	require.NoError(t, err)
	defer adminConn.Close()
	op := proxyproto.HeaderProxyFromAddrs(2, &net.TCPAddr{IP: net.ParseIP("198.51.100.4"), Port: 50000}, adminConn.RemoteAddr())
	_, err = op.WriteTo(adminConn)
	require.NoError(t, err)
	body := `{"action":"close"}`
	_, err = fmt.Fprintf(adminConn, "POST /breakers/CORE HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(adminConn), nil)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	// Once the relay has stopped, the access log has the client's address
	// for every answer, and the log says who was refused and who acted.
	lb.Close()
	r.Signal(syscall.SIGTERM)
	require.Equal(t, 0, r.Wait())
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(readText(t, access)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		lines = append(lines, m)
	}
	require.Len(t, lines, 2)
	for _, l := range lines {
		assert.Equal(t, "203.0.113.7:4711", l["client"])
	}
	refused := logMessages(r.Process, "connection refused")
	require.Len(t, refused, 2)
	for _, l := range refused {
		assert.Equal(t, "not from a trusted PROXY sender", l["reason"])
		assert.Contains(t, l["remote"], "127.0.0.2:")
	}
	closed := logMessages(r.Process, "connection closed")
	require.NotEmpty(t, closed)
	assert.Equal(t, "203.0.113.7:4711", closed[0]["remote"])
	actions := logMessages(r.Process, "breaker action")
	require.Len(t, actions, 1)
	assert.Equal(t, "198.51.100.4:50000", actions[0]["remote"])
	assert.Equal(t, adminConn.LocalAddr().String(), actions[0]["proxy"])
	assert.Equal(t, "none", actions[0]["auth"])
}

// readText returns the contents of path.
func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

func TestReloadKeepsTheCountAndAppliesTheNewThreshold(t *testing.T) {
	// Given CORE failing under a settings file with threshold 5, and two
	// failures counted
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"fail"}`)
	config := writeFile(t, "relay.toml", "[CORE]\nfail_threshold = 5\n")
	r := startPolicyRelay(t, []string{"RELAY_ADMIN_TOKEN=tok"}, "--target", "CORE="+core.URL, "--config", config)
	c := hubtest.Dial(t, r.Addr())
	for i := range 2 {
		require.Equal(t, "E500", c.Exchange(fmt.Sprintf("F%d|CORE|BAL 1001", i)).Code)
	}
	require.Equal(t, 2, statusOf(t, r.status(t), "CORE").ConsecutiveFailures)

	// When the file says 3 and the relay is told to reload (the token is
	// needed, as for every admin POST)
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nfail_threshold = 3\n"), 0o600))
	code, _ := r.reload(t, "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := r.reload(t, "tok")
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"added":[],"removed":[],"changed":["CORE"]}`, body)

	// Then CORE is still closed with its two failures, under threshold 3,
	tg := statusOf(t, r.status(t), "CORE")
	assert.Equal(t, "CLOSED", tg.State)
	assert.Equal(t, 2, tg.ConsecutiveFailures)
	assert.Equal(t, 3, tg.Settings.FailThreshold)

	// and the third failure opens it.
	assert.Equal(t, "E500", c.Exchange("F3|CORE|BAL 1001").Code)
	assert.Equal(t, "E904", c.Exchange("F4|CORE|BAL 1001").Code)
	r.waitTransitions(t, "CORE", "CLOSED->OPEN")
	reloaded := logMessages(r.Process, "settings reloaded")
	require.Len(t, reloaded, 1)
	assert.Equal(t, "POST /reload", reloaded[0]["trigger"])
	assert.Equal(t, []any{"CORE"}, reloaded[0]["changed"])
	requested := logMessages(r.Process, "reload requested")
	require.Len(t, requested, 1)
	assert.Equal(t, "token", requested[0]["auth"])
}

func TestReloadWithABrokenFileChangesNothing(t *testing.T) {
	// Given a relay running with a settings file, CORE with one failure
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"fail"}`)
	good := "[CORE]\nfail_threshold = 2\nmax_inflight = 4\n"
	config := writeFile(t, "relay.toml", good)
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--config", config)
	c := hubtest.Dial(t, r.Addr())
	require.Equal(t, "E500", c.Exchange("F1|CORE|BAL 1001").Code)
	before := r.status(t)

	broken := map[string]string{
		"a bad value":    "[CORE]\nfail_threshold = 0\nmax_inflight = 1\n",
		"a syntax error": "[CORE\nfail_threshold = 1\n",
		"an unknown key": "[CORE]\nfail_treshold = 1\n",
	}
	refusals := 0
	for name, text := range broken {
		t.Run(name, func(t *testing.T) {
			// When the file is broken and the relay told to reload, by POST
			// and by SIGHUP,
			require.NoError(t, os.WriteFile(config, []byte(text), 0o600))
			code, body := r.reload(t, "")
			assert.Equal(t, http.StatusUnprocessableEntity, code, body)
			assert.Contains(t, body, config)
			r.Signal(syscall.SIGHUP)
			refusals += 2

			// then each is refused with one error line naming the file,
			proctest.Eventually(t, 5*time.Second, "both reloads are refused", func() bool {
				return len(logMessages(r.Process, "settings reload refused; running settings unchanged")) == refusals
			})
			for _, l := range logMessages(r.Process, "settings reload refused; running settings unchanged") {
				assert.Equal(t, "error", l["level"])
				assert.Contains(t, l["error"], "config "+config)
			}

			// and nothing changed: settings, state, counts.
			after := r.status(t)
			after.Goroutines = before.Goroutines
			assert.Equal(t, before, after)
		})
	}
	assert.Empty(t, logMessages(r.Process, "settings reloaded"))

	// The second failure still opens CORE at the running threshold of 2.
	assert.Equal(t, "E500", c.Exchange("F2|CORE|BAL 1001").Code)
	assert.Equal(t, "E904", c.Exchange("F3|CORE|BAL 1001").Code)
}

// TestSIGHUPWhileLinesFlowLosesNone rotates the access log and the breaker
// log and reloads the settings, by SIGHUP, again and again while clients
// keep sending lines, and a target comes and goes with the reloads. Every
// line is answered once, 0000; the access log's files hold every answer,
// each file whole lines.
func TestSIGHUPWhileLinesFlowLosesNone(t *testing.T) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	dir := t.TempDir()
	access := filepath.Join(dir, "access.log")
	config := filepath.Join(dir, "relay.toml")
	files := []string{
		"[CORE]\nmax_inflight = 64\n",
		fmt.Sprintf("[CORE]\nmax_inflight = 48\nfail_threshold = 3\n\n[CLAIM]\nurl = %q\n", claim.URL),
	}
	require.NoError(t, os.WriteFile(config, []byte(files[0]), 0o600))
	r := startPolicyRelay(t, nil, "--target", "CORE="+core.URL, "--config", config, "--access-log", access)

	// Clients send one line at a time, each waiting for its answer, until
	// the rotations are done.
	const conns, rotations = 4, 20
	var (
		wg   sync.WaitGroup
		stop atomic.Bool
	)
	answers := make([][]hubtest.Response, conns)
	sent := make([]int, conns)
	clients := make([]*hubtest.Client, conns)
	for i := range clients {
		clients[i] = hubtest.Dial(t, r.Addr())
	}
	for i, c := range clients {
		wg.Go(func() {
			for j := 0; !stop.Load(); j++ {
				if _, err := c.Write(fmt.Appendf(nil, "S%d-%d|CORE|BAL 1001\n", i, j)); err != nil {
					return
				}
				sent[i]++
				line, err := c.ReadLine(10 * time.Second)
				if err != nil {
					return
				}
				a, err := hubtest.ParseResponse(line)
				if err != nil {
					return
				}
				answers[i] = append(answers[i], a)
			}
		})
	}
	for hup := range rotations {
		require.NoError(t, os.Rename(access, fmt.Sprintf("%s.%d", access, hup)))
		require.NoError(t, os.WriteFile(config, []byte(files[hup%2]), 0o600))
		r.Signal(syscall.SIGHUP)
		proctest.Eventually(t, 5*time.Second, "the relay reloads", func() bool {
			return len(logMessages(r.Process, "settings reloaded")) == hup+1
		})
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()

	// Every line was answered once, 0000, and every SIGHUP did all three.
	total := 0
	for i := range answers {
		require.Len(t, answers[i], sent[i], "connection %d", i)
		require.Greater(t, sent[i], rotations, "connection %d sent too little to overlap the rotations", i)
		for j, a := range answers[i] {
			assert.Equal(t, fmt.Sprintf("S%d-%d", i, j), a.TxID)
			assert.Equal(t, "0000", a.Code, a.String())
		}
		total += len(answers[i])
	}
	assert.Len(t, logMessages(r.Process, "breaker log reopened"), rotations)
	assert.Len(t, logMessages(r.Process, "access log reopened"), rotations)
	assert.Empty(t, logMessages(r.Process, "settings reload refused; running settings unchanged"))
	hups := rotations

	// Once stopped, the access log's files hold every answer, whole lines.
	r.Signal(syscall.SIGTERM)
	require.Equal(t, 0, r.Wait())
	seen := 0
	for i := 0; i <= hups; i++ {
		path := access
		if i < hups {
			path = fmt.Sprintf("%s.%d", access, i)
		}
		text := readText(t, path)
		if text == "" {
			continue
		}
		require.True(t, strings.HasSuffix(text, "\n"), "%s ends in the middle of a line", path)
		for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
			var m map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &m), "%s: %s", path, l)
			seen++
		}
	}
	assert.Equal(t, total, seen)
}

func TestReloadedTargetsOnTheStatusPageAndInTheAccessLog(t *testing.T) {
	// Given a relay with CORE, and CLAIM from its settings file held open
	// by an operator,
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	withClaim := fmt.Sprintf("[CLAIM]\nurl = %q\n", claim.URL)
	config := writeFile(t, "relay.toml", withClaim)
	access := filepath.Join(t.TempDir(), "access.log")
	r := startAdminRelay(t, "--target", "CORE="+core.URL, "--config", config, "--access-log", access)
	page := func() string {
		t.Helper()
		code, body, _ := getHTML(t, r.admin, "/")
		require.Equal(t, http.StatusOK, code)
		return body
	}
	reload := func() string {
		t.Helper()
		code, body := adminPost(t, r, "/reload", "", "")
		require.Equal(t, http.StatusOK, code, body)
		return body
	}
	code, body := adminPost(t, r, "/breakers/CLAIM", `{"action":"open"}`, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, pageCell(t, page(), "t-CLAIM-state"), "OPEN")

	// when a reload removes CLAIM, its row leaves the page;
	require.NoError(t, os.WriteFile(config, nil, 0o600))
	assert.JSONEq(t, `{"added":[],"removed":["CLAIM"],"changed":[]}`, reload())
	html := page()
	assert.NotContains(t, html, `id="t-CLAIM-`)
	assert.Contains(t, pageCell(t, html, "t-CORE-state"), "CLOSED")

	// when another adds it back, it gets its breaker back, still held
	// open, its row and timeline drawn from the reload on,
	require.NoError(t, os.WriteFile(config, []byte(withClaim), 0o600))
	assert.JSONEq(t, `{"added":["CLAIM"],"removed":[],"changed":[]}`, reload())
	html = page()
	assert.Contains(t, pageCell(t, html, "t-CLAIM-state"), "OPEN")
	assert.Contains(t, pageCell(t, html, "t-CLAIM-state"), "held open")
	since := pageCell(t, html, "t-CLAIM-since")
	assert.Regexp(t, `since \d\d:\d\d:\d\d`, since)
	history := pageCell(t, html, "t-CLAIM-history")
	assert.Contains(t, history, `class="tl open"`)
	assert.NotContains(t, history, `class="tl closed"`, "nothing before the reload is drawn")
	code, body = adminPost(t, r, "/breakers/CLAIM", `{"action":"close"}`, "")
	require.Equal(t, http.StatusOK, code, body)

	// and its answers are in the access log with what its breaker did,
	// when, and for whom.
	c := hubtest.Dial(t, r.Addr())
	require.Equal(t, "0000", c.Exchange("A1|CLAIM|SUBMIT P1 100").Code)
	var line map[string]any
	proctest.Eventually(t, 5*time.Second, "the access log has A1", func() bool {
		for _, l := range strings.Split(readText(t, access), "\n") {
			if strings.Contains(l, `"txid":"A1"`) {
				return json.Unmarshal([]byte(l), &line) == nil
			}
		}
		return false
	})
	assert.Equal(t, "CLAIM", line["target"])
	assert.Equal(t, "admitted", line["breaker"])
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, line["client"])
	start, err := time.Parse(time.RFC3339Nano, fmt.Sprint(line["start"]))
	require.NoError(t, err)
	end, err := time.Parse(time.RFC3339Nano, fmt.Sprint(line["end"]))
	require.NoError(t, err)
	assert.False(t, end.Before(start), "start %v, end %v", start, end)
}
