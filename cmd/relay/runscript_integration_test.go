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

	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// This test runs scripts/run.sh, the script behind `make run`, on free
// loopback ports (never the default ones) and holds it to its promise:
// however it is stopped, the two fixtures and the relay all exit and their
// ports are free again.

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

func TestRunScriptLeavesNothingRunning(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs Linux's /proc to find the script's processes")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	// The binaries the script runs: the ones the other tests run, under
	// the names the script expects.
	bin := t.TempDir()
	require.NoError(t, os.Symlink(proctest.Build(t, relayPkg), filepath.Join(bin, "relay")))
	require.NoError(t, os.Symlink(proctest.Build(t, proctest.FixturePkg), filepath.Join(bin, "fixture")))

	signalPid := func(sig syscall.Signal) func(int) error {
		return func(pid int) error { return syscall.Kill(pid, sig) }
	}
	signalGroup := func(sig syscall.Signal) func(int) error {
		return func(pid int) error { return syscall.Kill(-pid, sig) }
	}
	tests := []struct {
		name string
		// make starts `make run` (without its build step) in a session of
		// its own, as `setsid make run &` does; otherwise the script is
		// started in a process group of its own.
		make bool
		// stop signals the started process (pid) or its group (-pid).
		stop func(pid int) error
		// exit is the script's exit status; make's own is not checked.
		exit int
	}{
		{name: "SIGTERM to run.sh", stop: signalPid(syscall.SIGTERM), exit: 143},
		{name: "Ctrl-C: SIGINT to run.sh's process group", stop: signalGroup(syscall.SIGINT), exit: 130},
		{name: "terminal closed: SIGHUP to run.sh's process group", stop: signalGroup(syscall.SIGHUP), exit: 129},
		{name: "SIGTERM to make run", make: true, stop: signalPid(syscall.SIGTERM)},
		{name: "Ctrl-C: SIGINT to make run's process group", make: true, stop: signalGroup(syscall.SIGINT)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addrs := freeAddrs(t, 4)
			relayAddr, adminAddr, coreAddr, claimAddr := addrs[0], addrs[1], addrs[2], addrs[3]
			out, err := os.Create(filepath.Join(t.TempDir(), "run.out"))
			require.NoError(t, err)
			t.Cleanup(func() { _ = out.Close() })

			var cmd *exec.Cmd
			if tt.make {
				makePath, err := exec.LookPath("make")
				if err != nil {
					t.Skip("make is not installed")
				}
				// -o build: the binaries are the tests' own, not bin/.
				cmd = exec.Command(makePath, "-o", "build", "run")
				cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			} else {
				cmd = exec.Command(filepath.Join(root, "scripts", "run.sh"))
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			}
			cmd.Dir = root
			cmd.Env = proctest.Environ(
				"RELAYHUB_BIN="+bin,
				"CORE_LISTEN="+coreAddr,
				"CLAIM_LISTEN="+claimAddr,
				"RELAY_LISTEN="+relayAddr,
				"RELAY_ADMIN_LISTEN="+adminAddr,
				"RELAY_BREAKER_LOG="+filepath.Join(t.TempDir(), "breaker.log"),
			)
			// A file, not a pipe: a process left behind cannot hold up Wait.
			cmd.Stdout, cmd.Stderr = out, out
			require.NoError(t, cmd.Start())
			pgid := cmd.Process.Pid
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				_ = cmd.Wait()
			}()
			t.Cleanup(func() {
				// Whatever the test found, nothing it started outlives it.
				left := groupProcesses(t, pgid)
				for pid := range left {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
				if len(left) > 0 {
					t.Logf("killed what was left of the run: %v", left)
				}
				<-exited
				if t.Failed() {
					text, _ := os.ReadFile(out.Name())
					t.Logf("output of the run:\n%s", text)
				}
			})

			// Given the three processes serving, the relay's targets
			// following the fixtures' addresses,
			proctest.Eventually(t, proctest.StartTimeout, "the relay and both fixtures accept connections", func() bool {
				select {
				case <-exited:
					t.Fatalf("the run ended before all three were up: %v", cmd.ProcessState)
				default:
				}
				for _, addr := range []string{relayAddr, coreAddr, claimAddr} {
					nc, err := net.DialTimeout("tcp", addr, time.Second)
					if err != nil {
						return false
					}
					_ = nc.Close()
				}
				return true
			})
			c := proctest.Dial(t, relayAddr)
			a := c.Exchange("run-1|CORE|BAL 1001")
			assert.Equal(t, "0000", a.Code, a.String())
			a = c.Exchange("run-2|CLAIM|SUBMIT P-1 100")
			assert.Equal(t, "0000", a.Code, a.String())
			c.Close()
			var names []string
			for _, name := range groupProcesses(t, pgid) {
				if name == "relay" || name == "fixture" {
					names = append(names, name)
				}
			}
			assert.ElementsMatch(t, []string{"relay", "fixture", "fixture"}, names)

			// when the run is stopped,
			require.NoError(t, tt.stop(pgid))

			// then every process of it exits,
			proctest.Eventually(t, 15*time.Second, "every process of the run exits", func() bool {
				return len(groupProcesses(t, pgid)) == 0
			})
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				t.Fatal("the started process was not reaped")
			}
			if tt.exit != 0 {
				assert.Equal(t, tt.exit, cmd.ProcessState.ExitCode(), "run.sh's exit status")
			}

			// and every port is free again.
			for _, addr := range addrs {
				ln, err := net.Listen("tcp", addr)
				if assert.NoError(t, err, "%s is still taken", addr) {
					_ = ln.Close()
				}
			}
		})
	}
}
