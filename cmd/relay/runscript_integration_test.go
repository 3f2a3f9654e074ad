package main_test

import (
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

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests run scripts/run.sh, the script behind `make run`, on free
// loopback ports (never the default ones) and hold it to its promises:
// however it is stopped, the two fixtures and the relay all exit and their
// ports are free again, a stop asked for is a success, and a second copy
// needs nothing but other ports.

// freeAddrs returns n distinct loopback addresses nobody listens on.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		// Held until all are picked, so no two are the same.
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// groupProcesses returns the processes of process group pgid that have not
// exited, by pid, with their command names, read from /proc. Zombies (exited,
// not yet reaped by their parent) do not count: they hold no port.
func groupProcesses(t *testing.T, pgid int) map[int]string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	procs := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and ')'.
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if pgrp, err := strconv.Atoi(fields[2]); err == nil && pgrp == pgid {
			procs[pid] = s[open+1 : end]
		}
	}
	return procs
}

// runScript is a started scripts/run.sh, or make run.
type runScript struct {
	cmd    *exec.Cmd
	out    string // the file of its stdout and stderr
	pgid   int
	exited chan struct{}
	// relay, admin, core and claim are the addresses it serves.
	relay, admin, core, claim string
}

// startRun starts the script in dir (a checkout, the script in its
// scripts/) on free ports, through make when viaMake, with the binaries
// in bin and extra variables, and waits until all three of its processes
// accept connections. Whatever the test finds, nothing it started
// outlives it.
func startRun(t *testing.T, dir, bin string, viaMake bool, extra ...string) *runScript {
	t.Helper()
	addrs := freeAddrs(t, 4)
	r := &runScript{relay: addrs[0], admin: addrs[1], core: addrs[2], claim: addrs[3], exited: make(chan struct{})}
	out, err := os.Create(filepath.Join(t.TempDir(), "run.out"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = out.Close() })
	r.out = out.Name()
	if viaMake {
		makePath, err := exec.LookPath("make")
		if err != nil {
			t.Skip("make is not installed")
		}
		// -o build: the binaries are the tests' own, not bin/. A session
		// of its own, as `setsid make run &` gives it.
		r.cmd = exec.Command(makePath, "-o", "build", "run")
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		r.cmd = exec.Command(filepath.Join(dir, "scripts", "run.sh"))
		r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	r.cmd.Dir = dir
	r.cmd.Env = proctest.Environ(append([]string{
		"RELAYHUB_BIN=" + bin,
		"CORE_LISTEN=" + r.core,
		"CLAIM_LISTEN=" + r.claim,
		"RELAY_LISTEN=" + r.relay,
		"RELAY_ADMIN_LISTEN=" + r.admin,
	}, extra...)...)
	// A file, not a pipe: a process left behind cannot hold up Wait.
	r.cmd.Stdout, r.cmd.Stderr = out, out
	require.NoError(t, r.cmd.Start())
	r.pgid = r.cmd.Process.Pid
	go func() {
		defer close(r.exited)
		_ = r.cmd.Wait()
	}()
	t.Cleanup(func() {
		left := groupProcesses(t, r.pgid)
		for pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(left) > 0 {
			t.Logf("killed what was left of the run: %v", left)
		}
		<-r.exited
		if t.Failed() {
			t.Logf("output of the run:\n%s", r.output(t))
		}
	})

	proctest.Eventually(t, proctest.StartTimeout, "the relay and both fixtures accept connections", func() bool {
		select {
		case <-r.exited:
			t.Fatalf("the run ended before all three were up: %v\n%s", r.cmd.ProcessState, r.output(t))
		default:
		}
		for _, addr := range []string{r.relay, r.core, r.claim} {
			nc, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return false
			}
			_ = nc.Close()
		}
		return true
	})
	return r
}

// output returns what the run has written so far.
func (r *runScript) output(t *testing.T) string {
	t.Helper()
	text, err := os.ReadFile(r.out)
	require.NoError(t, err)
	return string(text)
}

// serves checks that the relay answers for both targets, the fixtures'.
func (r *runScript) serves(t *testing.T) {
	t.Helper()
	c := hubtest.Dial(t, r.relay)
	defer c.Close()
	a := c.Exchange("run-1|CORE|BAL 1001")
	assert.Equal(t, "0000", a.Code, a.String())
	a = c.Exchange("run-2|CLAIM|SUBMIT P-1 100")
	assert.Equal(t, "0000", a.Code, a.String())
}

// waitStopped waits until every process of the run has exited and the
// started one is reaped, then checks that every port is free again.
func (r *runScript) waitStopped(t *testing.T) {
	t.Helper()
	proctest.Eventually(t, 15*time.Second, "every process of the run exits", func() bool {
		return len(groupProcesses(t, r.pgid)) == 0
	})
	select {
	case <-r.exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the started process was not reaped")
	}
	for _, addr := range []string{r.relay, r.admin, r.core, r.claim} {
		ln, err := net.Listen("tcp", addr)
		if assert.NoError(t, err, "%s is still taken", addr) {
			_ = ln.Close()
		}
	}
}

// scriptBin returns a directory with the binaries the script runs: the
// ones the other tests run, under the names the script expects.
func scriptBin(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	require.NoError(t, os.Symlink(proctest.Build(t, relayPkg), filepath.Join(bin, "relay")))
	require.NoError(t, os.Symlink(proctest.Build(t, proctest.FixturePkg), filepath.Join(bin, "fixture")))
	return bin
}

func TestRunScriptLeavesNothingRunning(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs Linux's /proc to find the script's processes")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	bin := scriptBin(t)

	signalPid := func(sig syscall.Signal) func(int) error {
		return func(pid int) error { return syscall.Kill(pid, sig) }
	}
	signalGroup := func(sig syscall.Signal) func(int) error {
		return func(pid int) error { return syscall.Kill(-pid, sig) }
	}
	tests := []struct {
		name string
		// make starts `make run` (without its build step) in a session of
		// its own; otherwise the script is started in a process group of
		// its own.
		make bool
		// stop signals the started process (pid) or its group (-pid).
		stop func(pid int) error
		sig  syscall.Signal
		// exit is the script's exit status. make's own is its child's,
		// or, when make got the signal itself, death by that signal, as
		// GNU make passes a fatal signal on to itself once its child is
		// done: either way without a line saying a recipe failed.
		exit int
	}{
		{name: "SIGTERM to run.sh", stop: signalPid(syscall.SIGTERM), exit: 0},
		{name: "Ctrl-C: SIGINT to run.sh's process group", stop: signalGroup(syscall.SIGINT), exit: 0},
		{name: "terminal closed: SIGHUP to run.sh's process group", stop: signalGroup(syscall.SIGHUP), exit: 129},
		{name: "SIGTERM to make run", make: true, stop: signalPid(syscall.SIGTERM), sig: syscall.SIGTERM},
		{name: "SIGTERM to make run's process group", make: true, stop: signalGroup(syscall.SIGTERM), sig: syscall.SIGTERM},
		{name: "Ctrl-C: SIGINT to make run's process group", make: true, stop: signalGroup(syscall.SIGINT), sig: syscall.SIGINT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given the three processes serving, the relay's targets
			// following the fixtures' addresses,
			// (the relay's files in a directory of the test's, not the
			// checkout's)
			files := t.TempDir()
			r := startRun(t, root, bin, tt.make, "RELAY_BREAKER_LOG="+filepath.Join(files, "breaker.log"),
				"RELAY_IN_DOUBT_LOG="+filepath.Join(files, "in-doubt.log"))
			r.serves(t)
			var names []string
			for _, name := range groupProcesses(t, r.pgid) {
				if name == "relay" || name == "fixture" {
					names = append(names, name)
				}
			}
			assert.ElementsMatch(t, []string{"relay", "fixture", "fixture"}, names)

			// when the run is stopped,
			require.NoError(t, tt.stop(r.pgid))

			// then every process of it exits and every port is free again,
			r.waitStopped(t)

			// and a stop asked for is no failure.
			if !tt.make {
				assert.Equal(t, tt.exit, r.cmd.ProcessState.ExitCode(), "run.sh's exit status")
				return
			}
			assert.NotContains(t, r.output(t), "make: ***", "make reports a failed recipe")
			ws := r.cmd.ProcessState.Sys().(syscall.WaitStatus)
			assert.True(t, ws.Exited() && ws.ExitStatus() == 0 || ws.Signaled() && ws.Signal() == tt.sig, "make's status: %v", r.cmd.ProcessState)
		})
	}
}

func TestRunScriptSecondCopyNeedsOnlyOtherPorts(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs Linux's /proc to find the script's processes")
	}
	// Given a checkout of the script of its own, where the copies' files
	// land,
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "run.sh"))
	require.NoError(t, err)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "scripts"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "scripts", "run.sh"), script, 0o755))
	bin := scriptBin(t)

	// when two copies run side by side, told nothing but their ports,
	first := startRun(t, dir, bin, false)
	second := startRun(t, dir, bin, false)

	// then both serve, each with a breaker log and an in-doubt journal
	// of its own, named after its port,
	first.serves(t)
	second.serves(t)
	for _, r := range []*runScript{first, second} {
		_, port, err := net.SplitHostPort(r.relay)
		require.NoError(t, err)
		assert.FileExists(t, filepath.Join(dir, "breaker-"+port+".log"))
		assert.FileExists(t, filepath.Join(dir, "in-doubt-"+port+".log"))
		assert.Contains(t, r.output(t), `"breaker_log":"`+filepath.Join(dir, "breaker-"+port+".log")+`"`)
	}

	// and each stops cleanly.
	for _, r := range []*runScript{first, second} {
		require.NoError(t, syscall.Kill(r.pgid, syscall.SIGTERM))
		r.waitStopped(t)
		assert.Equal(t, 0, r.cmd.ProcessState.ExitCode(), "run.sh's exit status")
	}
}
