package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests run relayctl's admin commands (status, breaker, reload,
// in-doubt) against the real relay and fixture binaries, with the admin
// token the relay and relayctl both read from a file (--admin-token-file).

// adminHub is a running relay, the address of its admin port and the file
// of its admin token.
type adminHub struct {
	*proctest.Process
	admin      string // host:port
	tokenFile  string
	breakerLog string
}

// writeTokenFile writes token and a newline to path with mode 0600; an
// existing file keeps its mode.
func writeTokenFile(t *testing.T, path, token string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(token+"\n"), 0o600))
}

// startAdminHub starts the relay with its client and admin ports on
// ephemeral loopback ports, its admin token in a file, plus args.
func startAdminHub(t *testing.T, args ...string) *adminHub {
	t.Helper()
	dir := t.TempDir()
	h := &adminHub{tokenFile: filepath.Join(dir, "admin-token"), breakerLog: filepath.Join(dir, "breaker.log")}
	writeTokenFile(t, h.tokenFile, "s3cret-token")
	h.Process = proctest.Start(t, "./cmd/relay", append([]string{
		"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--breaker-log", h.breakerLog, "--admin-token-file", h.tokenFile,
	}, args...)...)
	for _, l := range h.LogLines() {
		if a, ok := l["admin_addr"].(string); ok && a != "" {
			h.admin = a
			return h
		}
	}
	t.Fatalf("no admin_addr in the relay's log:\n%s", h.Stderr())
	return nil
}

// ctl runs relayctl with args and the flags that reach h's admin port
// with the token file.
func (h *adminHub) ctl(t *testing.T, args ...string) proctest.Result {
	t.Helper()
	return proctest.Run(t, "./cmd/relayctl", append(args, "--admin", h.admin, "--admin-token-file", h.tokenFile)...)
}

// mustCtl is ctl, failing the test unless relayctl exits 0.
func (h *adminHub) mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	res := h.ctl(t, args...)
	require.Equal(t, 0, res.ExitCode, "relayctl %s: %s%s", strings.Join(args, " "), res.Stdout, res.Stderr)
	return res.Stdout
}

// targetRow returns the line of target in a status table.
func targetRow(t *testing.T, table, target string) string {
	t.Helper()
	for line := range strings.SplitSeq(table, "\n") {
		if strings.HasPrefix(line, target+" ") {
			return line
		}
	}
	t.Fatalf("no row of %s in:\n%s", target, table)
	return ""
}

// breakerChanges returns the FROM->TO of each line of the breaker log.
func breakerChanges(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSuffix(line, "\n")
		parts := strings.Split(line, "|")
		require.Len(t, parts, 3, line)
		out = append(out, parts[1]+":"+parts[2])
	}
	return out
}

func TestBreakerCommandsAgainstARealHub(t *testing.T) {
	// Given a hub in front of a healthy CORE, its admin token in a file,
	core := proctest.StartFixture(t, "CORE", "core")
	h := startAdminHub(t, "--target", "CORE="+core.URL, "--reset-timeout", "30s")
	c := hubtest.Dial(t, h.Addr())
	require.Equal(t, "0000", c.Exchange("B0|CORE|BAL 1001").Code)

	// when an operator opens CORE's breaker, it is held open: the command
	// shows it, status too, a line gets E904 and CORE is not called;
	out := h.mustCtl(t, "breaker", "open", "CORE")
	assert.Regexp(t, `^TARGET +STATE +FAILURES +INFLIGHT/LIMIT +RETRY-AFTER +URL\n`, out)
	assert.Regexp(t, `^CORE +OPEN \(held\) +0 +0/10 +- +`+regexp.QuoteMeta(core.URL)+`$`, targetRow(t, out, "CORE"))
	assert.Regexp(t, `^CORE +OPEN \(held\) `, targetRow(t, h.mustCtl(t, "status"), "CORE"))
	assert.Equal(t, "B1|E904|circuit open; held open by operator", c.Exchange("B1|CORE|BAL 1001").String())
	assert.Equal(t, int64(1), core.SettledStats(t).Calls, "only B0 reached CORE")

	// close brings it back;
	out = h.mustCtl(t, "breaker", "close", "CORE")
	assert.Regexp(t, `^CORE +CLOSED +0 +0/10 +- `, targetRow(t, out, "CORE"))
	assert.Equal(t, "0000", c.Exchange("B2|CORE|BAL 1001").Code)

	// hold is open, the target is matched in any case, and enable starts
	// a normal open period;
	out = h.mustCtl(t, "breaker", "hold", "core")
	assert.Regexp(t, `^CORE +OPEN \(held\) `, targetRow(t, out, "CORE"))
	out = h.mustCtl(t, "breaker", "enable", "CORE")
	assert.Regexp(t, `^CORE +OPEN +0 +0/10 +(30s|29\.\d+s) `, targetRow(t, out, "CORE"))
	assert.Regexp(t, `^B3\|E904\|circuit open; retry after \d+s$`, c.Exchange("B3|CORE|BAL 1001").String())

	// disable makes it pass-through, and --json gives the hub's answer;
	var st struct {
		Name     string `json:"name"`
		State    string `json:"state"`
		Held     bool   `json:"held"`
		Disabled bool   `json:"disabled"`
	}
	require.NoError(t, json.Unmarshal([]byte(h.mustCtl(t, "breaker", "disable", "CORE", "--json")), &st))
	assert.Equal(t, "CORE", st.Name)
	assert.Equal(t, "CLOSED", st.State)
	assert.True(t, st.Disabled)
	assert.Regexp(t, `^CORE +CLOSED \(disabled\) `, targetRow(t, h.mustCtl(t, "status"), "CORE"))
	assert.Equal(t, "0000", c.Exchange("B4|CORE|BAL 1001").Code)
	out = h.mustCtl(t, "breaker", "enable", "CORE")
	assert.Regexp(t, `^CORE +CLOSED +0 `, targetRow(t, out, "CORE"))

	// and every change went to the breaker log.
	assert.Equal(t, []string{"CORE:CLOSED->OPEN", "CORE:OPEN->CLOSED", "CORE:CLOSED->OPEN", "CORE:OPEN->CLOSED"},
		breakerChanges(t, h.breakerLog))

	// An unknown target, a missing token, an action the API does not have:
	// exit 1 for the hub's refusals, 2 (a usage error) for the last, and
	// nothing changes.
	res := h.ctl(t, "breaker", "open", "NOPE")
	assert.Equal(t, 1, res.ExitCode)
	assert.Equal(t, `relayctl: error: POST http://`+h.admin+`/breakers/NOPE: 404 Not Found: unknown target "NOPE"`+"\n", res.Stderr)
	res = proctest.Run(t, "./cmd/relayctl", "breaker", "open", "CORE", "--admin", h.admin)
	assert.Equal(t, 1, res.ExitCode)
	assert.Contains(t, res.Stderr, "401 Unauthorized: missing or wrong bearer token: give the hub's admin token with --admin-token-file")
	res = h.ctl(t, "breaker", "shut", "CORE")
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Stderr, `<action> must be one of "open","hold","close","disable","enable" but got "shut"`)
	assert.Regexp(t, `^CORE +CLOSED +0 `, targetRow(t, h.mustCtl(t, "status"), "CORE"))
	assert.Len(t, breakerChanges(t, h.breakerLog), 4)

	// When the hub's token file gets a new token and the hub a SIGHUP, the
	// old token is refused and the new one taken.
	old := "s3cret-token"
	writeTokenFile(t, h.tokenFile, "n3w-token")
	h.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "the hub re-reads its token file", func() bool {
		return strings.Contains(h.Stderr(), `"message":"admin token file re-read"`)
	})
	res = proctest.RunEnv(t, "./cmd/relayctl", []string{"RELAYCTL_ADMIN_TOKEN=" + old}, "breaker", "close", "CORE", "--admin", h.admin)
	assert.Equal(t, 1, res.ExitCode)
	assert.Contains(t, res.Stderr, "401 Unauthorized: missing or wrong bearer token: the hub did not take the token given")
	h.mustCtl(t, "breaker", "close", "CORE")
}

func TestReloadCommandAgainstARealHub(t *testing.T) {
	// Given a hub with a settings file, in front of a failing CORE,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"fail"}`)
	config := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nfail_threshold = 5\n"), 0o600))
	h := startAdminHub(t, "--target", "CORE="+core.URL, "--config", config)
	c := hubtest.Dial(t, h.Addr())
	threshold := func() float64 {
		t.Helper()
		var st struct {
			Targets []struct {
				Settings struct {
					FailThreshold float64 `json:"fail_threshold"`
				} `json:"settings"`
			} `json:"targets"`
		}
		require.NoError(t, json.Unmarshal([]byte(h.mustCtl(t, "status", "--json")), &st))
		require.Len(t, st.Targets, 1)
		return st.Targets[0].Settings.FailThreshold
	}
	require.Equal(t, 5.0, threshold())

	// when the file says 2 and the hub is told to reload,
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nfail_threshold = 2\n"), 0o600))
	out := h.mustCtl(t, "reload")

	// relayctl prints what the hub answered and the new threshold holds:
	// two failures open the breaker;
	assert.Equal(t, "settings reloaded: added none; removed none; changed CORE\n", out)
	assert.Equal(t, 2.0, threshold())
	assert.Equal(t, "E500", c.Exchange("R1|CORE|BAL 1001").Code)
	assert.Equal(t, "E500", c.Exchange("R2|CORE|BAL 1001").Code)
	assert.Equal(t, "E904", c.Exchange("R3|CORE|BAL 1001").Code)

	// and when the file is broken, reload exits 1 with the hub's reason,
	// and nothing changes.
	require.NoError(t, os.WriteFile(config, []byte("[CORE]\nfail_threshold = 0\n"), 0o600))
	res := h.ctl(t, "reload")
	assert.Equal(t, 1, res.ExitCode)
	assert.Empty(t, res.Stdout)
	assert.Equal(t, "relayctl: error: POST http://"+h.admin+"/reload: 422 Unprocessable Entity: settings refused, the hub keeps its running settings: "+
		"config "+config+": [CORE] fail_threshold: must be at least 1, got 0\n", res.Stderr)
	assert.Equal(t, 2.0, threshold())
	assert.Regexp(t, `^CORE +OPEN +2 `, targetRow(t, h.mustCtl(t, "status"), "CORE"), "the breaker as it was")
}

func TestInDoubtCommandAgainstARealHub(t *testing.T) {
	// Given a CORE that books at once and answers after a minute (past
	// the hub's late reading, whose settlement would be listed too), and
	// a hub that waits 200 ms,
	core := proctest.StartFixture(t, "CORE", "core")
	core.Ctl(t, `{"mode":"late","delay_ms":60000}`)
	h := startAdminHub(t, "--target", "CORE="+core.URL, "--target-timeout", "200ms", "--hub-id", "hub-it")
	c := hubtest.Dial(t, h.Addr())
	assert.Equal(t, "0 open calls in doubt\n", lastLine(h.mustCtl(t, "in-doubt")))
	assert.Equal(t, "0 calls in doubt\n", lastLine(h.mustCtl(t, "in-doubt", "--recent")))

	// when a withdrawal times out after CORE took it,
	a := c.Exchange("LATE-1|CORE|WD 1001 100")
	require.Equal(t, "LATE-1|E901|no answer within target timeout; outcome unknown", a.String())

	// then in-doubt lists it open, waiting for an operator (CORE has no
	// status_url), once the hub has taken it up after its answer,
	var out string
	proctest.Eventually(t, 5*time.Second, "in-doubt lists LATE-1 open", func() bool {
		out = h.mustCtl(t, "in-doubt")
		return strings.Contains(out, " LATE-1 ")
	})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^SINCE +AGE +TXID +TARGET +RESOLVE +ATTEMPTS +NEXT$`, lines[0])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z +\d+s +LATE-1 +CORE +manual +0 +operator \(relayctl in-doubt resolve\)$`, lines[1])
	assert.Equal(t, "1 open call in doubt", lines[2])

	// --recent lists it among the recent calls in doubt, as a table and
	// as the hub's JSON,
	out = h.mustCtl(t, "in-doubt", "--recent")
	lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^TIME +TXID +TARGET +CODE +STAGE +BYTES-SENT +URL$`, lines[0])
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z +LATE-1 +CORE +E901 +request_sent +\d+ +`+regexp.QuoteMeta(core.URL)+`$`, lines[1])
	assert.Equal(t, "1 call in doubt", lines[2])
	var list struct {
		InDoubt []map[string]any `json:"in_doubt"`
	}
	require.NoError(t, json.Unmarshal([]byte(h.mustCtl(t, "in-doubt", "--recent", "--json")), &list))
	require.Len(t, list.InDoubt, 1)
	assert.Subset(t, list.InDoubt[0], map[string]any{"txid": "LATE-1", "target": "CORE", "hub": "hub-it", "code": "E901", "stage": "request_sent"})

	// and --since leaves out those that ended before it.
	since, err := time.Parse(time.RFC3339Nano, list.InDoubt[0]["time"].(string))
	require.NoError(t, err)
	out = h.mustCtl(t, "in-doubt", "--since", since.Format(time.RFC3339Nano))
	assert.Contains(t, out, " LATE-1 ")
	later := since.Add(time.Millisecond).Format(time.RFC3339Nano)
	assert.Equal(t, "0 calls in doubt since "+later+"\n", lastLine(h.mustCtl(t, "in-doubt", "--since", later)))
	res := h.ctl(t, "in-doubt", "--since", "yesterday")
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Stderr, `--since "yesterday": want an RFC 3339 time`)

	// And when an operator settles it, the running hub does, and it is
	// open no more.
	out = h.mustCtl(t, "in-doubt", "resolve", "LATE-1", "--applied", "0000")
	assert.Equal(t, "LATE-1 at CORE: resolved_applied via operator (settled by the hub at http://"+h.admin+")\n", out)
	assert.Equal(t, "0 open calls in doubt\n", lastLine(h.mustCtl(t, "in-doubt")))
	res = h.ctl(t, "in-doubt", "resolve", "LATE-1", "--applied", "0000")
	assert.Equal(t, 1, res.ExitCode, res.Stderr)
	assert.Contains(t, res.Stderr, "LATE-1: not open in doubt at the hub")
}

// lastLine returns the last line of out, with its newline.
func lastLine(out string) string {
	i := strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")
	return out[i+1:]
}

func TestAdminTokenFileOpenToOthersIsRefused(t *testing.T) {
	// relayctl refuses the file before it asks anything, with the hub's
	// rules for it: exit 2, one line naming the flag and the file.
	path := filepath.Join(t.TempDir(), "admin-token")
	writeTokenFile(t, path, "s3cret-token")
	require.NoError(t, os.Chmod(path, 0o644))
	for _, cmd := range [][]string{{"status"}, {"breaker", "open", "CORE"}, {"reload"}, {"in-doubt"}} {
		res := proctest.Run(t, "./cmd/relayctl", append(cmd, "--admin", "127.0.0.1:1", "--admin-token-file", path)...)
		assert.Equal(t, 2, res.ExitCode, cmd)
		assert.Equal(t, "relayctl: error: --admin-token-file: "+path+": mode 0644 gives group or others access to the token; chmod 600 it\n", res.Stderr, cmd)
	}

	// A token both ways is refused as a usage error.
	require.NoError(t, os.Chmod(path, 0o600))
	res := proctest.Run(t, "./cmd/relayctl", "status", "--admin-token", "t", "--admin-token-file", path)
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Stderr, "--admin-token and --admin-token-file: give one or the other")
}

func TestAdminCommandsSayTheLinePortIsNoAdminPort(t *testing.T) {
	// Given a hub, when status, breaker, reload or in-doubt is pointed at
	// its line port by mistake, each says that the address does not speak
	// HTTP and where the admin port is, and exits 2: the hub was not asked.
	h := startAdminHub(t)
	for _, cmd := range [][]string{{"status"}, {"breaker", "open", "CORE"}, {"reload"}, {"in-doubt"}} {
		res := proctest.Run(t, "./cmd/relayctl", append(cmd, "--admin", h.Addr(), "--admin-token-file", h.tokenFile)...)
		assert.Equal(t, 2, res.ExitCode, cmd)
		assert.Contains(t, res.Stderr, "the address does not speak HTTP (it answered \"-|E900|", cmd)
		assert.Contains(t, res.Stderr, "it is not the hub's admin port, which is the hub's --admin-listen, 127.0.0.1:9280 unless set\n", cmd)
		assert.NotContains(t, res.Stderr, "malformed HTTP", cmd)
	}
	// The admin port itself still answers.
	assert.Contains(t, h.mustCtl(t, "status"), "CORE")
}
