// Package proctest runs the project's real binaries from integration tests,
// the way an operator would: it builds a command once per test process,
// starts it on an ephemeral port, reads the bound address from its JSON log,
// and talks to it over HTTP; over TCP, tests talk to it with hubtest's
// Client.
//
// A started binary must log, as a zerolog JSON line on stderr, the address
// it listens on in a field named "addr" once it is listening, so tests can
// pass --listen 127.0.0.1:0 and still find the port.
//
// Binaries are built with -race when the test binary itself is, so a data
// race in a binary fails the test that started it. Environment variables
// starting with RELAY_ or FIXTURE_ are removed from the environment a binary
// inherits, so an operator's shell cannot change the flags under test.
//
// Typical use, in a package's integration test file:
//
//	func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }
//
//	func TestTrip(t *testing.T) {
//		core := proctest.StartFixture(t, "CORE", "core")
//		relay := proctest.Start(t, "./cmd/relay",
//			"--listen", "127.0.0.1:0", "--target", "CORE="+core.URL)
//		c := hubtest.Dial(t, relay.Addr())
//		a := c.Exchange("tx1|CORE|BAL 1001")
//		assert.Equal(t, "0000", a.Code)
//	}
//
// Integration tests are skipped in -short mode.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayhub/relayhub/internal/testutil/logtest"
)

// Timeouts of the launcher. They bound every wait so a hung binary fails its
// test instead of hanging the test run.
const (
	// BuildTimeout bounds one go build.
	BuildTimeout = 3 * time.Minute
	// StartTimeout bounds the wait for a started binary to log its address.
	StartTimeout = 20 * time.Second
	// WaitTimeout bounds Process.Wait and Run.
	WaitTimeout = 20 * time.Second
	// StopTimeout is how long cleanup waits after SIGTERM before SIGKILL.
	StopTimeout = 5 * time.Second
	// ReadTimeout bounds a fixture's HTTP calls and a wait for its calls
	// in flight to end.
	ReadTimeout = 10 * time.Second
)

// envPrefixes mark the environment variables that configure the relay and
// the fixture.
var envPrefixes = []string{"RELAY_", "FIXTURE_"}

// raceReport is what the race detector prints for every race it finds.
const raceReport = "WARNING: DATA RACE"

// maxLoggedStderr caps how much of a failed test's binary stderr is logged,
// keeping the end, where the failure usually is.
const maxLoggedStderr = 32 << 10

// builds caches one build per package path for the life of the test
// process; guarded by buildsMu.
var (
	buildsMu sync.Mutex
	builds   = map[string]*build{}
	buildDir struct {
		once sync.Once
		path string
		err  error
	}
	moduleRoot struct {
		once sync.Once
		path string
		err  error
	}
)

// build is one package's cached build result. Its once makes concurrent
// Build calls for one package share a single go build.
type build struct {
	once sync.Once
	path string
	err  error
}

// Main runs the tests and then removes the binaries built by Build. Use it
// from TestMain, os.Exit(proctest.Main(m)), where the package has no other
// TestMain; without it the binaries are removed by a later test run.
func Main(m *testing.M) int {
	code := m.Run()
	if buildDir.path != "" {
		_ = os.RemoveAll(buildDir.path)
	}
	return code
}

// Build builds the package pkg (an import path, or a path relative to the
// module root starting with "./", such as "./cmd/relay") once per test
// process and returns the binary's path. Later calls for the same pkg reuse
// the binary, or report the same build error. It skips the test in -short
// mode. It is safe for concurrent use.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short mode")
	}
	buildsMu.Lock()
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	n := len(builds)
	buildsMu.Unlock()

	b.once.Do(func() { b.path, b.err = goBuild(pkg, n) })
	if b.err != nil {
		t.Fatalf("build %s: %v", pkg, b.err)
	}
	return b.path
}

// goBuild runs go build for pkg into its own directory under the shared
// build directory; n keeps two packages with the same base name apart.
func goBuild(pkg string, n int) (string, error) {
	root, err := findModuleRoot()
	if err != nil {
		return "", err
	}
	buildDir.once.Do(func() { buildDir.path, buildDir.err = makeBuildDir() })
	if buildDir.err != nil {
		return "", buildDir.err
	}
	dir := filepath.Join(buildDir.path, strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, path.Base(pkg))
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, pkg)

	ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, nil
}

// makeBuildDir creates this test process's build directory,
// os.TempDir()/relayhub-proctest/PID-RANDOM, after removing those of test
// processes that are gone: a package whose TestMain cannot call Main (a test
// binary has only one TestMain) leaves its binaries behind until the next
// run sweeps them.
func makeBuildDir() (string, error) {
	parent := filepath.Join(os.TempDir(), "relayhub-proctest")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		pidText, _, _ := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 {
			continue
		}
		// Signal 0 checks existence only; ESRCH means nobody has that pid.
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
	return os.MkdirTemp(parent, strconv.Itoa(os.Getpid())+"-")
}

// goTool returns the go command; go test puts its own GOROOT/bin first in
// PATH, so the binaries are built by the toolchain running the tests.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "go"
}

// findModuleRoot returns the directory of the main module's go.mod.
func findModuleRoot() (string, error) {
	moduleRoot.once.Do(func() {
		out, err := exec.Command(goTool(), "env", "GOMOD").Output()
		if err != nil {
			moduleRoot.err = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			moduleRoot.err = errors.New("go env GOMOD: not inside a module")
			return
		}
		moduleRoot.path = filepath.Dir(gomod)
	})
	return moduleRoot.path, moduleRoot.err
}

// raceExitSleep shortens the race runtime's pause at exit (1 s by default,
// so that other threads can still report), which would otherwise add a
// second to every stop of a race-enabled binary.
const raceExitSleep = "atexit_sleep_ms=50"

// environ returns the test's environment without RELAY_ and FIXTURE_
// variables, with GORACE's exit pause shortened unless it is set, plus extra
// (KEY=VALUE pairs).
func environ(extra []string) []string {
	var env []string
	gorace := raceExitSleep
next:
	for _, kv := range os.Environ() {
		for _, p := range envPrefixes {
			if strings.HasPrefix(kv, p) {
				continue next
			}
		}
		if v, ok := strings.CutPrefix(kv, "GORACE="); ok {
			if !strings.Contains(v, "atexit_sleep_ms") {
				v += " " + raceExitSleep
			}
			gorace = v
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "GORACE="+gorace)
	return append(env, extra...)
}

// Environ returns the environment Start gives a binary: the test's own
// without RELAY_ and FIXTURE_ variables, with the race detector's exit
// pause shortened, plus extra (KEY=VALUE pairs). It is for tests that start
// the binaries through something else, such as a script.
func Environ(extra ...string) []string { return environ(extra) }

// Process is a started binary. Its methods may be called from any
// goroutine, except that Wait, Signal and Kill report failures to the test
// that started it and so belong on that test's goroutine.
type Process struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd

	stdout logtest.Buffer
	stderr logtest.Buffer

	addrFound chan struct{} // closed when addr is set
	addr      string        // written once before addrFound is closed

	done     chan struct{} // closed when the process has exited and its output is read
	exitCode int           // written before done is closed
	waitErr  error         // written before done is closed
}

// Start builds pkg (see Build), starts it with args in a fresh temporary
// working directory, and waits until it logs its listen address (see
// Addr). The test fails if the binary exits first or does not log an
// address within StartTimeout. When the test ends the process is stopped
// with SIGTERM (SIGKILL after StopTimeout), and the test fails if the
// race detector reported a race in it.
func Start(t testing.TB, pkg string, args ...string) *Process {
	t.Helper()
	return StartEnv(t, pkg, nil, args...)
}

// StartEnv is Start with extra environment variables (KEY=VALUE).
func StartEnv(t testing.TB, pkg string, env []string, args ...string) *Process {
	t.Helper()
	bin := Build(t, pkg)
	p := &Process{
		t:         t,
		name:      path.Base(pkg),
		addrFound: make(chan struct{}),
		done:      make(chan struct{}),
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir = t.TempDir()
	p.cmd.Env = environ(env)
	p.cmd.Stdout = &p.stdout
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatalf("%s: stderr pipe: %v", p.name, err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: start: %v", p.name, err)
	}
	go p.readStderr(bufio.NewReader(stderr))
	t.Cleanup(p.stop)

	select {
	case <-p.addrFound:
	case <-p.done:
		t.Fatalf("%s %s exited with status %d before logging its address; stderr:\n%s",
			p.name, strings.Join(args, " "), p.exitCode, p.stderr.String())
	case <-time.After(StartTimeout):
		t.Fatalf("%s %s logged no \"addr\" within %v; stderr:\n%s",
			p.name, strings.Join(args, " "), StartTimeout, p.stderr.String())
	}
	return p
}

// readStderr copies the process's stderr into p.stderr, looking for the
// first "addr" field, then reaps the process. It owns the pipe: exec.Cmd.Wait
// must not run before the pipe is drained.
func (p *Process) readStderr(r *bufio.Reader) {
	defer close(p.done)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			_, _ = p.stderr.Write([]byte(line))
			if p.addr == "" {
				if addr := addrField(line); addr != "" {
					p.addr = addr
					close(p.addrFound)
				}
			}
		}
		if err != nil {
			break
		}
	}
	p.waitErr = p.cmd.Wait()
	p.exitCode = p.cmd.ProcessState.ExitCode()
}

// addrField returns the "addr" string field of a JSON log line, if any.
func addrField(line string) string {
	var fields struct {
		Addr string `json:"addr"`
	}
	if json.Unmarshal([]byte(line), &fields) != nil {
		return ""
	}
	return fields.Addr
}

// Addr returns the address from the first log line with an "addr" field.
func (p *Process) Addr() string {
	<-p.addrFound
	return p.addr
}

// Stderr returns everything the process wrote to stderr so far.
func (p *Process) Stderr() string { return p.stderr.String() }

// Stdout returns everything the process wrote to stdout so far.
func (p *Process) Stdout() string { return p.stdout.String() }

// LogLines returns the stderr lines that parse as JSON objects, in order.
func (p *Process) LogLines() []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.Stderr(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// Done returns a channel closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process; the test fails if that is impossible.
func (p *Process) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// Wait waits for the process to exit and returns its exit status (-1 when
// a signal killed it). If it has not exited within WaitTimeout it is killed
// and the test fails.
func (p *Process) Wait() int {
	p.t.Helper()
	code, ok := p.WaitFor(WaitTimeout)
	if !ok {
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Fatalf("%s did not exit within %v; stderr:\n%s", p.name, WaitTimeout, tail(p.Stderr()))
	}
	return code
}

// WaitFor waits up to d for the process to exit. It returns the exit status
// and true if it did, or 0 and false if it is still running.
func (p *Process) WaitFor(d time.Duration) (code int, exited bool) {
	select {
	case <-p.done:
		return p.exitCode, true
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.exitCode, true
	case <-timer.C:
		return 0, false
	}
}

// Kill kills the process with SIGKILL and waits for it to be reaped.
func (p *Process) Kill() {
	p.t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.t.Errorf("%s: kill: %v", p.name, err)
	}
	<-p.done
}

// stop is the cleanup of Start. It asks politely first so a race-enabled
// binary gets to print the races it found, then checks for them.
func (p *Process) stop() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if _, ok := p.WaitFor(StopTimeout); !ok {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	stderr := p.Stderr()
	if strings.Contains(stderr, raceReport) {
		p.t.Errorf("%s: the race detector reported a data race; stderr:\n%s", p.name, tail(stderr))
		return
	}
	if p.t.Failed() {
		p.t.Logf("%s %s stderr:\n%s", p.name, strings.Join(p.cmd.Args[1:], " "), tail(stderr))
	}
}

// tail returns the end of s, at most maxLoggedStderr bytes.
func tail(s string) string {
	if len(s) <= maxLoggedStderr {
		return s
	}
	return "[...]" + s[len(s)-maxLoggedStderr:]
}

// Result is the outcome of Run. It is a plain value, safe to copy and
// share.
type Result struct {
	// ExitCode is the exit status, -1 when a signal ended the process.
	ExitCode int
	// Stdout and Stderr are everything the process wrote to them.
	Stdout, Stderr string
}

// Run builds pkg (see Build), runs it with args in a fresh temporary working
// directory and waits for it to exit, for binaries expected to stop at
// once, such as on a bad flag. The test fails if it runs longer than
// WaitTimeout.
func Run(t testing.TB, pkg string, args ...string) Result {
	t.Helper()
	return RunEnv(t, pkg, nil, args...)
}

// RunEnv is Run with extra environment variables (KEY=VALUE).
func RunEnv(t testing.TB, pkg string, env []string, args ...string) Result {
	t.Helper()
	bin := Build(t, pkg)
	ctx, cancel := context.WithTimeout(context.Background(), WaitTimeout)
	defer cancel()
	// cmd.Run has finished copying into these before it returns.
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = environ(env)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s still running after %v; stderr:\n%s",
			path.Base(pkg), strings.Join(args, " "), WaitTimeout, tail(stderr.String()))
	}
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("%s: run: %v", path.Base(pkg), err)
	}
	res := Result{ExitCode: cmd.ProcessState.ExitCode(), Stdout: stdout.String(), Stderr: stderr.String()}
	if strings.Contains(res.Stderr, raceReport) {
		t.Errorf("%s: the race detector reported a data race; stderr:\n%s", path.Base(pkg), tail(res.Stderr))
	}
	return res
}
