package main_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests build the Debian package with make deb, hold it to dpkg-deb
// and lintian, install it with dpkg on this machine, and purge it again
// (docs/OPERATING.md, "Installing the package"). Installing needs root, as
// CI runs them.

// debFile is one file the package must ship: its mode as dpkg-deb lists
// it, and whether it is a conffile.
type debFile struct {
	path     string
	mode     string
	conffile bool
}

// debFiles are the files of the package, as docs/OPERATING.md lists them.
var debFiles = []debFile{
	{"/usr/bin/relay", "-rwxr-xr-x", false},
	{"/usr/bin/relayctl", "-rwxr-xr-x", false},
	{"/lib/systemd/system/relayhub.service", "-rw-r--r--", false},
	{"/usr/lib/sysusers.d/relayhub.conf", "-rw-r--r--", false},
	{"/etc/logrotate.d/relayhub", "-rw-r--r--", true},
	{"/etc/relayhub/relayhub.env", "-rw-r-----", true},
	{"/usr/share/doc/relayhub/copyright", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/changelog.gz", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/README.md", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/OPERATING.md", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/relay.example.toml", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/relayhub-rules.yml", "-rw-r--r--", false},
	{"/usr/share/doc/relayhub/relayhub-rules.test.yml", "-rw-r--r--", false},
	{"/usr/share/lintian/overrides/relayhub", "-rw-r--r--", false},
}

// debVersion is the form of the package's version: the commit's time and
// hash, .dirty for uncommitted changes.
var debVersion = regexp.MustCompile(`^0\.[0-9]{8}\.[0-9]{6}\+g[0-9a-f]{7,40}(\.dirty)?$`)

func TestDebPackageBuildsLintsInstallsAndPurges(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and installs a package: skipped in -short mode")
	}
	needRoot(t)
	needTool(t, "make", "make")
	needTool(t, "dpkg-deb", "dpkg")
	dpkg := needTool(t, "dpkg", "dpkg")
	lintian := needTool(t, "lintian", "lintian")
	analyze := needTool(t, "systemd-analyze", "systemd")
	systemctl := needTool(t, "systemctl", "systemd")
	needCleanMachine(t)
	nfpm := nfpmBinary(t)

	// Given the package built by make deb into a directory of its own,
	dist := t.TempDir()
	makeDeb(t, "NFPM="+nfpm, "DIST="+dist)
	debs, err := filepath.Glob(filepath.Join(dist, "relayhub_*.deb"))
	require.NoError(t, err)
	require.Len(t, debs, 1, "make deb builds one package")
	deb := debs[0]

	// its checksum is beside it,
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	require.NoError(t, err)
	body, err := os.ReadFile(deb)
	require.NoError(t, err)
	sum := sha256.Sum256(body)
	assert.Equal(t, hex.EncodeToString(sum[:])+"  "+filepath.Base(deb)+"\n", string(sums))

	// its version comes from the commit, and names the file,
	version := runOK(t, "dpkg-deb", "--field", deb, "Version")
	assert.Regexp(t, debVersion, version)
	arch := runOK(t, "dpkg-deb", "--field", deb, "Architecture")
	assert.Equal(t, "relayhub_"+version+"_"+arch+".deb", filepath.Base(deb))
	assert.Equal(t, "relayhub", runOK(t, "dpkg-deb", "--field", deb, "Package"))

	// it holds every file, root's, with its mode, the operator's files as
	// conffiles,
	listed := debContents(t, deb)
	var conffiles []string
	for _, f := range debFiles {
		if assert.Contains(t, listed, f.path) {
			assert.Equal(t, f.mode+" root/root", listed[f.path], f.path)
		}
		if f.conffile {
			conffiles = append(conffiles, f.path)
		}
	}
	assert.ElementsMatch(t, conffiles, strings.Fields(runOK(t, "dpkg-deb", "--info", deb, "conffiles")))
	info := runOK(t, "dpkg-deb", "--info", deb)
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		assert.Contains(t, info, " "+script+" ", "the %s script", script)
	}

	// and lintian finds no error in it; its warnings go to the log.
	cmd := exec.Command(lintian, "--fail-on", "error", "--display-info", deb)
	out, err := cmd.CombinedOutput()
	t.Logf("lintian %s:\n%s", filepath.Base(deb), out)
	require.NoError(t, err, "lintian fails the package")
	for _, line := range strings.Split(string(out), "\n") {
		assert.False(t, strings.HasPrefix(line, "E: "), "lintian: %s", line)
	}

	// When dpkg installs it,
	userExisted := lookupUser("relayhub")
	t.Cleanup(func() { removeTestUser(t, userExisted) })
	t.Cleanup(func() { purgeIfInstalled(t, dpkg) })
	runOK(t, dpkg, "--install", deb)

	// then every file is in place, postinst made the relayhub user, and
	// the settings are readable by its group,
	for _, f := range debFiles {
		info, err := os.Stat(f.path)
		if assert.NoError(t, err, f.path) {
			assert.Equal(t, f.mode, info.Mode().String(), f.path)
		}
	}
	u, err := user.Lookup("relayhub")
	require.NoError(t, err, "postinst creates the relayhub user")
	assert.Equal(t, "/var/lib/relayhub", u.HomeDir)
	g, err := user.LookupGroup("relayhub")
	require.NoError(t, err, "postinst creates the relayhub group")
	assertOwner(t, "/etc/relayhub/relayhub.env", "0", g.Gid)

	// the service is not enabled,
	const wants = "/etc/systemd/system/multi-user.target.wants/relayhub.service"
	_, err = os.Lstat(wants)
	assert.ErrorIs(t, err, os.ErrNotExist, "the package enables nothing")

	// systemd has nothing to say about the unit,
	cmd = exec.Command(analyze, "verify", "/lib/systemd/system/relayhub.service")
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "systemd-analyze verify:\n%s", out)
	assert.Empty(t, string(out), "systemd-analyze verify must have nothing to say")

	// the installed binaries are the package's build,
	assert.Equal(t, version, runOK(t, "/usr/bin/relay", "--version"))
	assert.Equal(t, version, runOK(t, "/usr/bin/relayctl", "--version"))

	// and the copyright file names every Go module built into them.
	copyright, err := os.ReadFile("/usr/share/doc/relayhub/copyright")
	require.NoError(t, err)
	for _, bin := range []string{"/usr/bin/relay", "/usr/bin/relayctl"} {
		for _, line := range strings.Split(runOK(t, "go", "version", "-m", bin), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "dep" {
				assert.Contains(t, string(copyright), "\nFiles: "+f[1]+"/*\n", "deploy/debian/copyright names %s, built into %s", f[1], bin)
			}
		}
	}

	// When the operator has enabled the service, changed the settings and
	// installed the package again, as an upgrade does,
	runOK(t, systemctl, "enable", "relayhub.service")
	const changed = "RELAY_MAX_CONNS=20000\n"
	require.NoError(t, os.WriteFile("/etc/relayhub/relayhub.env", []byte(changed), 0o640))
	runOK(t, dpkg, "--install", deb)

	// then the settings are the operator's still, and the service still
	// enabled.
	text, err := os.ReadFile("/etc/relayhub/relayhub.env")
	require.NoError(t, err)
	assert.Equal(t, changed, string(text), "an upgrade keeps a changed conffile")
	assertOwner(t, "/etc/relayhub/relayhub.env", "0", g.Gid)
	_, err = os.Lstat(wants)
	assert.NoError(t, err, "an upgrade keeps the service enabled")

	// When the hub has run, leaving logs and a call in doubt,
	for path, line := range map[string]string{
		"/var/log/relayhub/access.log":   `{"txid":"T1"}`,
		"/var/lib/relayhub/in-doubt.log": `{"txid":"D1"}`,
	} {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o750))
		require.NoError(t, os.WriteFile(path, []byte(line+"\n"), 0o640))
	}

	// and the package is purged,
	out, err = exec.Command(dpkg, "--purge", "relayhub").CombinedOutput()
	require.NoError(t, err, "dpkg --purge:\n%s", out)

	// then its files are gone, with the logs, the settings' directory and
	// the enable link (and the mask the removal set),
	for _, f := range debFiles {
		_, err := os.Lstat(f.path)
		assert.ErrorIs(t, err, os.ErrNotExist, f.path)
	}
	for _, path := range []string{"/etc/relayhub", "/var/log/relayhub", "/usr/share/doc/relayhub",
		wants, "/etc/systemd/system/relayhub.service"} {
		_, err := os.Lstat(path)
		assert.ErrorIs(t, err, os.ErrNotExist, path)
	}
	assert.Equal(t, "not-installed", packageStatus())

	// but not the call in doubt, which may not be reconciled yet.
	assert.FileExists(t, "/var/lib/relayhub/in-doubt.log")
	assert.Contains(t, string(out), "kept /var/lib/relayhub")
}

// needRoot fails the test in CI, and skips it elsewhere, unless it runs as
// root: dpkg installs the package on this machine.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	why := "not root (uid " + strconv.Itoa(os.Geteuid()) + "): this test installs a package with dpkg; run it as root, as CI does"
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// needCleanMachine fails the test when the machine has relayhub installed
// or its directories from another install, which the test would change or
// remove.
func needCleanMachine(t *testing.T) {
	t.Helper()
	if status := packageStatus(); status != "not-installed" {
		t.Fatalf("the relayhub package is on this machine (%s): the test installs and purges its own; remove it first (dpkg --purge relayhub)", status)
	}
	for _, dir := range []string{"/etc/relayhub", "/var/lib/relayhub", "/var/log/relayhub"} {
		if _, err := os.Lstat(dir); err == nil {
			t.Fatalf("%s exists: the test installs and purges relayhub, which would change or remove it; move it away first", dir)
		}
	}
}

// packageStatus returns dpkg's status of the relayhub package:
// "not-installed" when dpkg does not know it.
func packageStatus() string {
	out, err := exec.Command("dpkg-query", "--show", "--showformat", "${db:Status-Status}", "relayhub").Output()
	if err != nil || len(out) == 0 {
		return "not-installed"
	}
	return string(out)
}

// purgeIfInstalled purges the package when the test left it on the
// machine, then removes what the purge keeps: the test's call in doubt.
func purgeIfInstalled(t *testing.T, dpkg string) {
	t.Helper()
	if packageStatus() != "not-installed" {
		if out, err := exec.Command(dpkg, "--purge", "relayhub").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge relayhub:\n%s", out)
		}
	}
	assert.NoError(t, os.RemoveAll("/var/lib/relayhub"))
	assert.NoError(t, os.RemoveAll("/var/log/relayhub"))
}

// removeTestUser removes the relayhub user and group that the package's
// postinst made, unless the user was there before the test: a purge keeps
// them, as Debian packages keep their users.
func removeTestUser(t *testing.T, existed bool) {
	t.Helper()
	if existed {
		return
	}
	if lookupUser("relayhub") {
		if out, err := exec.Command("userdel", "relayhub").CombinedOutput(); err != nil {
			t.Errorf("userdel relayhub:\n%s", out)
		}
	}
	if _, err := user.LookupGroup("relayhub"); err == nil {
		if out, err := exec.Command("groupdel", "relayhub").CombinedOutput(); err != nil {
			t.Errorf("groupdel relayhub:\n%s", out)
		}
	}
}

// lookupUser reports whether the machine has the named user.
func lookupUser(name string) bool {
	_, err := user.Lookup(name)
	return err == nil
}

// assertOwner checks the numeric owner and group of path.
func assertOwner(t *testing.T, path, uid, gid string) {
	t.Helper()
	info, err := os.Stat(path)
	if !assert.NoError(t, err) {
		return
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	require.True(t, ok)
	assert.Equal(t, uid+":"+gid, strconv.FormatUint(uint64(st.Uid), 10)+":"+strconv.FormatUint(uint64(st.Gid), 10), "owner of %s", path)
}

// debContents returns the files and directories of the package, each
// with its mode and owner as dpkg-deb lists them ("-rw-r--r-- root/root"),
// by absolute path.
func debContents(t *testing.T, deb string) map[string]string {
	t.Helper()
	files := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(runOK(t, "dpkg-deb", "--contents", deb)))
	for sc.Scan() {
		// -rw-r--r-- root/root  1819 2026-12-02 03:43 ./etc/logrotate.d/relayhub
		f := strings.Fields(sc.Text())
		require.GreaterOrEqual(t, len(f), 6, "dpkg-deb --contents: %q", sc.Text())
		path := strings.TrimSuffix(strings.TrimPrefix(f[5], "."), "/")
		files[path] = f[0] + " " + f[1]
	}
	require.NoError(t, sc.Err())
	return files
}

// makeDeb runs make deb in the repository with the given variables.
func makeDeb(t *testing.T, vars ...string) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory", "deb"}, vars...)...)
	cmd.Dir = moduleRoot(t)
	// A make test running this test must not lend its own settings to it.
	cmd.Env = append(proctest.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "make deb %v:\n%s", vars, out)
}

// runOK runs a command and returns its standard output, trimmed, failing
// the test when it fails.
func runOK(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s %s:\n%s%s", name, strings.Join(args, " "), out, stderr.String())
	return strings.TrimSpace(string(out))
}

// nfpmModule finds the nfpm that the Makefile runs, module@version.
var nfpmModule = regexp.MustCompile(`github\.com/goreleaser/nfpm/v2/cmd/nfpm@v[0-9][0-9A-Za-z.+-]*`)

// nfpmBinary returns the nfpm that make deb would run, built once and
// kept in the user's cache directory (beside Go's own build cache), by
// version: go run would link it again for every test run.
func nfpmBinary(t *testing.T) string {
	t.Helper()
	makefile, err := os.ReadFile(filepath.Join(moduleRoot(t), "Makefile"))
	require.NoError(t, err)
	module := nfpmModule.Find(makefile)
	require.NotNil(t, module, "the Makefile names no nfpm@version")
	_, version, _ := strings.Cut(string(module), "@")

	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir() // no HOME: kept until the machine's next boot
	}
	dir := filepath.Join(cache, "relayhub-test", "nfpm-"+version)
	bin := filepath.Join(dir, "nfpm")
	if isExecutable(bin) {
		return bin
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	// go install into a directory of this run's, then a rename: a test run
	// beside this one never sees half a binary.
	tmp, err := os.MkdirTemp(dir, "install-")
	require.NoError(t, err)
	defer os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), proctest.BuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "install", string(module))
	cmd.Dir = tmp
	cmd.Env = proctest.Environ("GOBIN="+tmp, "GOFLAGS=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go install %s:\n%s", module, out)
	t.Logf("built nfpm %s in %v into %s", version, time.Since(start).Round(time.Second), dir)
	require.NoError(t, os.Rename(filepath.Join(tmp, "nfpm"), bin))
	return bin
}
