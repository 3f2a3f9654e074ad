package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests install the relay as docs/OPERATING.md says, with make
// install, and hold the installed systemd unit and logrotate snippet to
// the tools that will read them.

// needTool returns the path of the named program, failing the test when it
// is missing: like the Redis and browser tests, these never skip (.ci/run
// installs the tools).
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	// Administration tools live in sbin, which a user's PATH may lack.
	if path := filepath.Join("/usr/sbin", name); isExecutable(path) {
		return path
	}
	t.Fatalf("%s is missing: install the Debian package %s (.ci/run does)", name, pkg)
	return ""
}

// isExecutable reports whether path is an executable file.
func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

// moduleRoot returns the repository's top directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return root
}

// makeInstall runs make install in the repository with the given variables
// and returns its output.
func makeInstall(t *testing.T, vars ...string) string {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory", "install"}, vars...)...)
	cmd.Dir = moduleRoot(t)
	// A make test running this test must not lend its own settings to it.
	cmd.Env = append(proctest.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make install %v:\n%s", vars, out)
	return string(out)
}

func TestMakeInstallAndTheUnitVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries: skipped in -short mode")
	}
	analyze := needTool(t, "systemd-analyze", "systemd")
	needTool(t, "make", "make")

	// Given the relay installed under a prefix of its own, as an operator
	// installs it under /usr/local,
	root := t.TempDir()
	prefix := filepath.Join(root, "usr", "local")
	makeInstall(t, "PREFIX="+prefix, "SYSCONFDIR="+filepath.Join(root, "etc"))

	// then every file is in place, the binaries executable and the
	// settings readable by root and the service's group only,
	modes := map[string]os.FileMode{
		"usr/local/bin/relay":                           0o755,
		"usr/local/bin/relayctl":                        0o755,
		"usr/local/lib/systemd/system/relayhub.service": 0o644,
		"usr/local/lib/sysusers.d/relayhub.conf":        0o644,
		"usr/local/share/doc/relayhub/OPERATING.md":     0o644,
		"usr/local/share/doc/relayhub/status-page.png":  0o644,
		"etc/relayhub/relayhub.env":                     0o640,
		"etc/logrotate.d/relayhub":                      0o644,
	}
	for path, mode := range modes {
		info, err := os.Stat(filepath.Join(root, path))
		if assert.NoError(t, err) {
			assert.Equal(t, mode, info.Mode().Perm(), path)
		}
	}

	// and systemd finds nothing to say about the unit: no error, no
	// warning.
	unit := filepath.Join(prefix, "lib", "systemd", "system", "relayhub.service")
	text, err := os.ReadFile(unit)
	require.NoError(t, err)
	assert.Contains(t, string(text), "ExecStart="+filepath.Join(prefix, "bin", "relay")+"\n")
	assert.Contains(t, string(text), "EnvironmentFile="+filepath.Join(root, "etc", "relayhub", "relayhub.env")+"\n")
	cmd := exec.Command(analyze, "verify", unit)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "systemd-analyze verify:\n%s", out.String())
	assert.Empty(t, out.String(), "systemd-analyze verify must have nothing to say")

	// The installed relay is the relay.
	version, err := exec.Command(filepath.Join(prefix, "bin", "relay"), "--version").Output()
	require.NoError(t, err)
	assert.NotEmpty(t, strings.TrimSpace(string(version)))
}

func TestMakeInstallStagesForAPackageAndKeepsTheSettings(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries: skipped in -short mode")
	}
	needTool(t, "make", "make")

	// Given an install staged in DESTDIR, as a package build does,
	dest := t.TempDir()
	makeInstall(t, "DESTDIR="+dest)

	// the unit names the final paths, not the staging ones;
	unit, err := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/relayhub.service"))
	require.NoError(t, err)
	assert.Contains(t, string(unit), "ExecStart=/usr/local/bin/relay\n")
	assert.Contains(t, string(unit), "EnvironmentFile=/etc/relayhub/relayhub.env\n")
	assert.NotContains(t, string(unit), dest)

	// and an upgrade keeps the operator's settings, putting the shipped
	// ones beside them.
	env := filepath.Join(dest, "etc/relayhub/relayhub.env")
	require.NoError(t, os.WriteFile(env, []byte("RELAY_MAX_CONNS=20000\n"), 0o640))
	out := makeInstall(t, "DESTDIR="+dest)
	assert.Contains(t, out, "kept "+env)
	got, err := os.ReadFile(env)
	require.NoError(t, err)
	assert.Equal(t, "RELAY_MAX_CONNS=20000\n", string(got))
	shipped, err := os.ReadFile(env + ".dist")
	require.NoError(t, err)
	want, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "relayhub.env"))
	require.NoError(t, err)
	assert.Equal(t, string(want), string(shipped))
}

// TestLogrotateSnippetRotatesARunningRelay runs logrotate with the shipped
// snippet, its paths moved to a temporary directory and its signal sent to
// the test's relay, and checks that the breaker log, the access log and the
// in-doubt journal rotate without losing a line: the renamed files hold
// what came before, new files at the paths what came after.
func TestLogrotateSnippetRotatesARunningRelay(t *testing.T) {
	logrotate := needTool(t, "logrotate", "logrotate")

	// Given a relay writing its logs and journal into a directory of its
	// own,
	dir := t.TempDir()
	core := proctest.StartFixture(t, "CORE", "core")
	breakerLog, accessLog := filepath.Join(dir, "breaker.log"), filepath.Join(dir, "access.log")
	inDoubtLog := filepath.Join(dir, "in-doubt.log")
	r := proctest.Start(t, relayPkg, "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--target", "CORE="+core.URL, "--breaker-log", breakerLog, "--access-log", accessLog,
		"--in-doubt-log", inDoubtLog, "--target-timeout", "200ms")
	c := hubtest.Dial(t, r.Addr())
	require.Equal(t, "0000", c.Exchange("B1|CORE|BAL 1001").Code)
	// A call in doubt, so that the journal is not empty (notifempty),
	core.Ctl(t, `{"mode":"slow","delay_ms":5000}`)
	require.Equal(t, "D1|E901|no answer within target timeout; outcome unknown", c.Exchange("D1|CORE|XFER 1001 1002 5").String())
	// and a breaker change (the fifth failure in a row), so that the
	// breaker log is not either.
	core.Ctl(t, `{"mode":"fail"}`)
	for i := range 4 {
		require.Equal(t, "E500", c.Exchange(fmt.Sprintf("F%d|CORE|BAL 1001", i)).Code)
	}
	proctest.Eventually(t, 5*time.Second, "the accesses and the change are written", func() bool {
		a, _ := os.ReadFile(accessLog)
		b, _ := os.ReadFile(breakerLog)
		return bytes.Count(a, []byte("\n")) == 6 && len(b) > 0
	})

	// when logrotate runs the snippet (forced, as on its day),
	snippet, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "relayhub.logrotate"))
	require.NoError(t, err)
	conf := strings.ReplaceAll(string(snippet), "/var/log/relayhub/", dir+"/")
	conf = strings.ReplaceAll(conf, "/var/lib/relayhub/", dir+"/")
	conf = strings.ReplaceAll(conf, "systemctl kill --kill-whom=main --signal=HUP relayhub.service", "kill -HUP "+strconv.Itoa(r.Pid()))
	require.NotEqual(t, string(snippet), conf)
	confPath := filepath.Join(t.TempDir(), "relayhub")
	require.NoError(t, os.WriteFile(confPath, []byte(conf), 0o644))
	cmd := exec.Command(logrotate, "--force", "--state", filepath.Join(t.TempDir(), "status"), confPath)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "logrotate:\n%s", out)

	// then the relay reopens all three, and keeps running,
	proctest.Eventually(t, 5*time.Second, "the relay reopens its logs and journal", func() bool {
		reopened := map[any]bool{}
		for _, l := range r.LogLines() {
			switch l["message"] {
			case "breaker log reopened", "access log reopened", "in-doubt journal reopened":
				reopened[l["message"]] = true
			}
		}
		return len(reopened) == 3
	})
	_, exited := r.WaitFor(0)
	require.False(t, exited, "SIGHUP ended the relay")
	c.Close()
	r.Signal(syscall.SIGTERM)
	require.Equal(t, 0, r.Wait())

	// the rotated files hold every line written before, uncompressed until
	// the next rotation (delaycompress), and the paths hold what came
	// after: nothing.
	rotated, err := filepath.Glob(accessLog + "-*")
	require.NoError(t, err)
	require.Len(t, rotated, 1, "one rotated access log, named by date")
	text, err := os.ReadFile(rotated[0])
	require.NoError(t, err)
	assert.Equal(t, 6, bytes.Count(text, []byte("\n")))
	rotated, err = filepath.Glob(breakerLog + "-*")
	require.NoError(t, err)
	require.Len(t, rotated, 1, "one rotated breaker log, named by date")
	text, err = os.ReadFile(rotated[0])
	require.NoError(t, err)
	assert.Contains(t, string(text), "|CORE|CLOSED->OPEN")
	rotated, err = filepath.Glob(inDoubtLog + "-*")
	require.NoError(t, err)
	require.Len(t, rotated, 1, "one rotated in-doubt journal, named by date")
	text, err = os.ReadFile(rotated[0])
	require.NoError(t, err)
	assert.Equal(t, 1, bytes.Count(text, []byte("\n")))
	assert.Contains(t, string(text), `"txid":"D1"`)
	for _, path := range []string{accessLog, breakerLog, inDoubtLog} {
		info, err := os.Stat(path)
		require.NoError(t, err, "the relay creates %s anew", path)
		assert.Zero(t, info.Size(), path)
	}
}

// freePort returns a loopback port nobody listens on, for a program that
// cannot be told to pick one.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	require.NoError(t, ln.Close())
	return port
}

// TestHAProxyRecipeTakesAStoppingHubOutOfRotation runs the shipped HAProxy
// recipe in front of two hubs, its addresses replaced by theirs, and stops
// one of them while clients keep connecting: every client is answered
// 0000, none meets a refused connection or E906, because the stopping
// hub's /readyz takes it out of rotation within its shutdown delay; and
// the hubs log each client's own address, which the PROXY header carried.
func TestHAProxyRecipeTakesAStoppingHubOutOfRotation(t *testing.T) {
	haproxy := needTool(t, "haproxy", "haproxy")

	// Given two hubs that require PROXY headers from loopback, with a
	// four second shutdown delay,
	core := proctest.StartFixture(t, "CORE", "core")
	dir := t.TempDir()
	hubs := make([]*adminRelay, 2)
	for i := range hubs {
		hubs[i] = startAdminRelay(t, "--target", "CORE="+core.URL, "--shutdown-delay", "4s",
			"--proxy-protocol", "required", "--proxy-trusted", "127.0.0.1",
			"--access-log", filepath.Join(dir, fmt.Sprintf("access%d.log", i)))
	}

	// and HAProxy running the recipe in front of them,
	recipe, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "haproxy.cfg"))
	require.NoError(t, err)
	front := "127.0.0.1:" + freePort(t)
	cfg := strings.Replace(string(recipe), "bind :9200", "bind "+front, 1)
	for i, h := range hubs {
		_, adminPort, err := net.SplitHostPort(strings.TrimPrefix(h.admin, "http://"))
		require.NoError(t, err)
		cfg = strings.Replace(cfg, fmt.Sprintf("10.0.0.1%d:9200 check port 9280", i+1), h.Addr()+" check port "+adminPort, 1)
	}
	require.NotContains(t, cfg, "10.0.0.1", "the test must replace every address of the recipe")
	cfgPath := filepath.Join(t.TempDir(), "haproxy.cfg")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))
	var hlog logtest.Buffer
	lb := exec.Command(haproxy, "-db", "-f", cfgPath)
	lb.Stdout, lb.Stderr = &hlog, &hlog
	require.NoError(t, lb.Start())
	t.Cleanup(func() {
		_ = lb.Process.Signal(syscall.SIGTERM)
		_ = lb.Wait()
	})

	// exchange sends one line on a new connection through the balancer
	// and returns the answer's code ("refused" or "closed" when there is
	// none) and the client's address.
	exchange := func(txid string) (string, string) {
		nc, err := net.DialTimeout("tcp", front, time.Second)
		if err != nil {
			return "refused", ""
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(nc, "%s|CORE|BAL 1001\n", txid); err != nil {
			return "closed", nc.LocalAddr().String()
		}
		line, err := bufio.NewReader(nc).ReadString('\n')
		if err != nil {
			return "closed", nc.LocalAddr().String()
		}
		a, err := hubtest.ParseResponse(line)
		if err != nil {
			return "garbled", nc.LocalAddr().String()
		}
		return a.Code, nc.LocalAddr().String()
	}
	clients := map[string]string{} // TXID -> the client's address
	proctest.Eventually(t, 10*time.Second, "the balancer serves", func() bool {
		code, _ := exchange("W0")
		return code == "0000"
	})

	// When the first hub is told to stop, while clients keep coming,
	stopped := time.Now()
	hubs[0].Signal(syscall.SIGTERM)
	var failures []string
	n := 0
	for time.Since(stopped) < 6*time.Second {
		n++
		txid := fmt.Sprintf("N%d", n)
		code, addr := exchange(txid)
		clients[txid] = addr
		if code != "0000" {
			failures = append(failures, fmt.Sprintf("%s after %v: %s", txid, time.Since(stopped).Round(time.Millisecond), code))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// then no client was turned away, the first hub stopped cleanly, and
	// the balancer marked it down on its /readyz.
	assert.Empty(t, failures)
	assert.Equal(t, 0, hubs[0].Wait())
	assert.Contains(t, hlog.String(), "hubs/hub1 is DOWN")

	// Each hub logged its clients' own addresses, from the PROXY header.
	hubs[1].Signal(syscall.SIGTERM)
	require.Equal(t, 0, hubs[1].Wait())
	seen := 0
	for i := range hubs {
		text, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("access%d.log", i)))
		require.NoError(t, err)
		for _, line := range strings.Split(strings.TrimSpace(string(text)), "\n") {
			var entry struct{ Txid, Client string }
			require.NoError(t, json.Unmarshal([]byte(line), &entry), line)
			if want, ok := clients[entry.Txid]; ok {
				assert.Equal(t, want, entry.Client, entry.Txid)
				seen++
			}
		}
	}
	assert.Equal(t, n, seen, "every client's line is in a hub's access log")
}

// systemdEnvironment reads text as systemd reads an EnvironmentFile
// (systemd.exec(5)) and returns its assignments in order: blank lines and
// lines starting with # or ; are skipped, every other line is KEY=VALUE,
// with the whitespace around the key and the value dropped. There is no
// comment after a value: a # there is part of the value, as systemd has
// it. Quotes and backslashes, which systemd would interpret, fail the
// test: the files of deploy/ and the docs do without them.
func systemdEnvironment(t *testing.T, name, text string) []string {
	t.Helper()
	var out []string
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		require.NotRegexp(t, `\s#`, line, "%s:%d: systemd takes a comment after a value as part of the value", name, i+1)
		require.NotContains(t, line, `"`, "%s:%d: quotes are read by systemd's rules, not kept", name, i+1)
		require.NotContains(t, line, `'`, "%s:%d: quotes are read by systemd's rules, not kept", name, i+1)
		require.NotContains(t, line, `\`, "%s:%d: a backslash is read by systemd's rules, not kept", name, i+1)
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s:%d: %q is no KEY=VALUE line (systemd ignores it)", name, i+1, line)
		k = strings.TrimSpace(k)
		require.Regexp(t, `^[A-Za-z_][A-Za-z0-9_]*$`, k, "%s:%d: systemd ignores the key %q", name, i+1, k)
		out = append(out, k+"="+strings.TrimSpace(v))
	}
	return out
}

// serviceEnvironment returns the relay's environment under
// deploy/relayhub.service with envFile as its EnvironmentFile, as systemd
// builds it: the unit's Environment= assignments first, then the file's,
// a later assignment of a name replacing an earlier one.
func serviceEnvironment(t *testing.T, envFile string) []string {
	t.Helper()
	unit, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "relayhub.service"))
	require.NoError(t, err)
	var assigned []string
	for _, line := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Environment="); ok {
			require.NotContainsf(t, v, `"`, "relayhub.service: the test reads Environment= without quotes")
			assigned = append(assigned, strings.Fields(v)...)
		}
	}
	assigned = append(assigned, systemdEnvironment(t, "relayhub.env", envFile)...)
	var order []string
	value := map[string]string{}
	for _, kv := range assigned {
		k, v, _ := strings.Cut(kv, "=")
		if _, seen := value[k]; !seen {
			order = append(order, k)
		}
		value[k] = v
	}
	env := make([]string, len(order))
	for i, k := range order {
		env[i] = k + "=" + value[k]
	}
	return env
}

// onThisMachine returns env as the test's machine can run it: the ports of
// RELAY_LISTEN and RELAY_ADMIN_LISTEN made 0, so that the relay picks free
// ones (and logs them), a host address the machine lacks made 0.0.0.0,
// which is beyond loopback as it was, and the paths under /var/log/relayhub
// and /var/lib/relayhub moved into dir. Every other setting is kept.
func onThisMachine(t *testing.T, env []string, dir string) []string {
	t.Helper()
	out := make([]string, len(env))
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "RELAY_LISTEN" || (k == "RELAY_ADMIN_LISTEN" && v != ""):
			host, _, err := net.SplitHostPort(v)
			require.NoError(t, err, "%s=%s", k, v)
			if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
				host = "0.0.0.0"
			}
			v = net.JoinHostPort(host, "0")
		case strings.HasPrefix(v, "/var/log/relayhub/"), strings.HasPrefix(v, "/var/lib/relayhub/"):
			v = filepath.Join(dir, filepath.Base(v))
		}
		out[i] = k + "=" + v
	}
	return out
}

// withLine returns the settings file text with the line of key set to
// value, failing the test unless the file has exactly one such line.
func withLine(t *testing.T, text, key, value string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	i := lineOf(t, lines, key)
	lines[i] = key + "=" + value
	return strings.Join(lines, "\n")
}

// withoutLine returns the settings file text without the line of key,
// failing the test unless the file has exactly one such line.
func withoutLine(t *testing.T, text, key string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	i := lineOf(t, lines, key)
	return strings.Join(append(lines[:i:i], lines[i+1:]...), "\n")
}

// lineOf returns the index of the one line of lines that sets key.
func lineOf(t *testing.T, lines []string, key string) int {
	t.Helper()
	found := -1
	for i, l := range lines {
		if strings.HasPrefix(l, key+"=") {
			require.Equal(t, -1, found, "relayhub.env sets %s twice", key)
			found = i
		}
	}
	require.GreaterOrEqual(t, found, 0, "relayhub.env has no line %s=", key)
	return found
}

// startupLine returns the relay's "relay listening" log line.
func startupLine(t *testing.T, p *proctest.Process) map[string]any {
	t.Helper()
	for _, l := range p.LogLines() {
		if l["message"] == "relay listening" {
			return l
		}
	}
	t.Fatalf("no start-up line in the relay's log:\n%s", p.Stderr())
	return nil
}

// readyz returns the status of GET /readyz on the admin port whose bound
// address is adminAddr, over loopback.
func readyz(t *testing.T, adminAddr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(adminAddr)
	require.NoError(t, err)
	resp, err := adminClient.Get("http://127.0.0.1:" + port + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	return resp.StatusCode
}

// TestShippedSettingsRelayOnlyToTheTargetsTheyName starts the relay with
// the environment systemd gives it from deploy/relayhub.service and
// deploy/relayhub.env, on free ports: as shipped, and with a file that
// lacks the targets' line, it refuses to start with one line naming
// --target, never relaying to its defaults (the fixtures' loopback ports
// of make run); with the targets but no admin token it refuses with one
// line naming the admin port; with both, it relays to exactly the targets
// the file names and serves /readyz.
func TestShippedSettingsRelayOnlyToTheTargetsTheyName(t *testing.T) {
	shipped, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "relayhub.env"))
	require.NoError(t, err)
	core := proctest.StartFixture(t, "CORE", "core")
	const token = "3f9c0a7e51d84b26c9e07f1a5b3d8e42"

	refusals := []struct {
		name string
		file string
		want string // the one line on stderr
	}{
		{"as shipped", string(shipped), "relay: error: --target: name at least one target"},
		{"without the targets' line", withoutLine(t, string(shipped), "RELAY_TARGET"), "relay: error: --target: name at least one target"},
		{"with the targets, without the token", withLine(t, string(shipped), "RELAY_TARGET", "CORE="+core.URL),
			`relay: error: --admin-listen "0.0.0.0:0": beyond loopback the admin port needs --admin-token (better RELAY_ADMIN_TOKEN) or --admin-token-file: anyone who reaches it could hold every breaker open`},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			env := onThisMachine(t, serviceEnvironment(t, tt.file), t.TempDir())
			res := proctest.RunEnv(t, relayPkg, env)
			assert.Equal(t, 2, res.ExitCode, "a mistake in the configuration, which systemd does not retry")
			assert.Equal(t, tt.want+"\n", res.Stderr)
		})
	}

	t.Run("with the targets and the token", func(t *testing.T) {
		file := withLine(t, string(shipped), "RELAY_TARGET", "CORE="+core.URL)
		file = withLine(t, file, "RELAY_ADMIN_TOKEN", token)
		dir := t.TempDir()
		r := proctest.StartEnv(t, relayPkg, onThisMachine(t, serviceEnvironment(t, file), dir))
		start := startupLine(t, r)
		assert.Equal(t, []any{"CORE=" + core.URL}, start["targets"], "exactly the targets the file names")
		adminAddr, _ := start["admin_addr"].(string)
		require.NotEmpty(t, adminAddr, "the shipped settings serve the admin port")
		assert.Equal(t, http.StatusOK, readyz(t, adminAddr))

		c := hubtest.Dial(t, r.Addr())
		assert.Equal(t, "0000", c.Exchange("T1|CORE|BAL 1001").Code)
		assert.Equal(t, "E903", c.Exchange("T2|CLAIM|STATUS C1").Code, "no default CLAIM beside the targets named")
		assert.Equal(t, int64(1), core.SettledStats(t).Calls)
		c.Close()
		// The shipped shutdown delay; a second signal cuts it short.
		r.Signal(syscall.SIGTERM)
		proctest.Eventually(t, 5*time.Second, "/readyz answers 503 once told to stop", func() bool {
			return readyz(t, adminAddr) == http.StatusServiceUnavailable
		})
		r.Signal(syscall.SIGTERM)
		assert.Equal(t, 0, r.Wait())
		_, err := os.Stat(filepath.Join(dir, "breaker.log"))
		assert.NoError(t, err, "the breaker log where the settings put it")
	})
}

// balancerSettings returns the lines docs/OPERATING.md, "Behind a load
// balancer", puts in each hub's relayhub.env: the sh block after "On each
// hub, in `relayhub.env`".
func balancerSettings(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(moduleRoot(t), "docs", "OPERATING.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(doc), "\nOn each hub, in `relayhub.env`")
	require.True(t, ok, "docs/OPERATING.md has no balancer settings for relayhub.env")
	_, block, ok := strings.Cut(rest, "\n```sh\n")
	require.True(t, ok, "no sh block after the balancer settings' heading")
	block, _, ok = strings.Cut(block, "\n```\n")
	require.True(t, ok, "the balancer settings' block does not end")
	return block + "\n"
}

// TestOperatingBalancerSettingsStartAHub starts a hub with the settings
// docs/OPERATING.md gives each hub behind a load balancer, over the shipped
// relayhub.env with the targets an install names, in the environment
// systemd would give it, on free ports: it starts, its admin port beyond
// loopback answers /readyz 200 without a token, as a balancer's check
// asks it, and 503 from the moment it is told to stop, for the settings'
// shutdown delay.
func TestOperatingBalancerSettingsStartAHub(t *testing.T) {
	shipped, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy", "relayhub.env"))
	require.NoError(t, err)
	core := proctest.StartFixture(t, "CORE", "core")
	settings := balancerSettings(t)
	doc := systemdEnvironment(t, "docs/OPERATING.md", settings)
	require.Contains(t, doc, "RELAY_PROXY_PROTOCOL=required", "the block read is the balancer's")

	// The operator's relayhub.env: the shipped one with its targets, and
	// the block's lines after it (the later assignment wins, as when each
	// line is edited in place).
	file := withLine(t, string(shipped), "RELAY_TARGET", "CORE="+core.URL) + "\n" + settings
	env := onThisMachine(t, serviceEnvironment(t, file), t.TempDir())
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "RELAY_ADMIN_LISTEN="); ok {
			require.Equal(t, "0.0.0.0:0", v, "the block's admin address, beyond loopback as written")
		}
	}
	// StartEnv fails the test, with the relay's error, if it refuses them.
	r := proctest.StartEnv(t, relayPkg, env)
	start := startupLine(t, r)
	assert.Equal(t, "required", start["proxy_protocol"])
	assert.Equal(t, true, start["admin_token"])
	adminAddr, _ := start["admin_addr"].(string)
	require.NotEmpty(t, adminAddr)
	assert.Equal(t, http.StatusOK, readyz(t, adminAddr), "the balancer's check, which carries no token")

	r.Signal(syscall.SIGTERM)
	proctest.Eventually(t, 5*time.Second, "/readyz answers 503 once told to stop", func() bool {
		return readyz(t, adminAddr) == http.StatusServiceUnavailable
	})
	_, exited := r.WaitFor(0)
	assert.False(t, exited, "the hub serves on through its shutdown delay")
	r.Signal(syscall.SIGTERM)
	assert.Equal(t, 0, r.Wait())
}
