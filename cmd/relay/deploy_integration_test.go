package main_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
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
	c := proctest.Dial(t, r.Addr())
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
		a, err := proctest.ParseAnswer(line)
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
