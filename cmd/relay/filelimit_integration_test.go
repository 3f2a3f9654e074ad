package main_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests hold the relay to its promise about its own file descriptors
// (docs/GUARANTEES.md): running out of them is never blamed on a target,
// and a configuration the file limit cannot hold does not start.

// prlimit runs prlimit(1), of util-linux, with args.
func prlimit(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("prlimit", args...).CombinedOutput()
	require.NoError(t, err, "prlimit %s: %s", strings.Join(args, " "), out)
}

func TestOutOfDescriptorsIsNeverBlamedOnTheTarget(t *testing.T) {
	// Given a relay serving a healthy CORE that trips after 2 failures,
	// and a client connected before the flood,
	core := proctest.StartFixture(t, "CORE", "core")
	logPath := filepath.Join(t.TempDir(), "breaker.log")
	h := startAdminRelay(t, "--target", "CORE="+core.URL, "--breaker-log", logPath,
		"--fail-threshold", "2", "--max-conns", "1000")
	c := hubtest.Dial(t, h.Addr())
	assert.Equal(t, "E903", c.Exchange("warm|NONE|x").Code, "the connection is served")

	// when its file limit leaves room for 40 more descriptors, and idle
	// clients take every one of them (the rest wait in the listen queue),
	open, err := h.OpenFDs()
	require.NoError(t, err)
	limit := open + 40
	prlimit(t, "--pid", strconv.Itoa(h.Pid()), fmt.Sprintf("--nofile=%d:%d", limit, limit))
	flood := make([]*hubtest.Client, 80)
	for i := range flood {
		flood[i] = hubtest.Dial(t, h.Addr())
	}
	proctest.Eventually(t, 10*time.Second, "the flood takes every descriptor", func() bool {
		n, err := h.OpenFDs()
		return err == nil && n >= limit
	})

	// then CORE's calls, which need a descriptor each, are answered E906
	// "hub overloaded; not sent", never E902 or E904,
	const calls = 6
	for i := range calls {
		a := c.Exchange(fmt.Sprintf("T%d|CORE|BAL 1001", i))
		assert.Equal(t, "E906", a.Code, a.String())
		assert.Equal(t, "hub overloaded; not sent", a.Message, a.String())
	}
	assert.Zero(t, core.Stats(t).Calls, "CORE was never called")

	// and once the flood has gone, CORE's breaker is CLOSED with no
	// failure counted, the refusals are counted as the hub's own, the
	// breaker log has no line, and CORE answers again.
	for _, fc := range flood {
		fc.Close()
	}
	proctest.Eventually(t, 10*time.Second, "the admin port answers again", func() bool {
		_, _, err := h.get("/healthz")
		return err == nil
	})
	st := statusOf(t, h.status(t), "CORE")
	assert.Equal(t, "CLOSED", st.State)
	assert.Zero(t, st.ConsecutiveFailures)
	series, _ := h.scrape(t)
	assert.Equal(t, float64(calls), series[`relay_hub_refusals_total{reason="descriptors",target="CORE"}`])
	assert.Equal(t, float64(calls), series[`relay_requests_total{code="E906",target="CORE"}`])
	assert.Zero(t, series[`relay_requests_total{code="E902",target="CORE"}`])
	assert.Zero(t, series[`relay_breaker_transitions_total{from="CLOSED",target="CORE",to="OPEN"}`])
	entries, _, err := breakerlog.ReadFile(logPath)
	require.NoError(t, err)
	assert.Empty(t, entries, "no breaker changed state")
	assert.Equal(t, "0000", c.Exchange("after|CORE|BAL 1001").Code)
	assert.Contains(t, h.Stderr(), "hub short of its own resources: call not made, answered E906")
}

func TestStartRefusesMoreConnectionsThanTheFileLimitHolds(t *testing.T) {
	bin := proctest.Build(t, relayPkg)
	for _, tt := range []struct {
		name   string
		nofile string
		conns  string
		want   *regexp.Regexp
	}{
		{name: "hard limit too low", nofile: "256:256", conns: "1000",
			want: regexp.MustCompile(`^relay: error: --max-conns 1000 needs about \d+ descriptors but the file limit \(RLIMIT_NOFILE\) is 256: raise the limit \(ulimit -n, LimitNOFILE= under systemd\) or lower --max-conns$`)},
		{name: "even for a few connections, past the ones turned away", nofile: "1024:1024", conns: "10",
			want: regexp.MustCompile(`^relay: error: --max-conns 10 needs about \d+ descriptors but the file limit \(RLIMIT_NOFILE\) is 1024: `)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), proctest.WaitTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, "prlimit", "--nofile="+tt.nofile, bin,
				"--listen", "127.0.0.1:0", "--admin-listen", "", "--breaker-log", filepath.Join(t.TempDir(), "breaker.log"),
				"--target", "CORE=http://127.0.0.1:9", "--max-conns", tt.conns)
			cmd.Env = proctest.Environ()
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "the relay must refuse to start: %v\n%s", err, out)
			assert.Equal(t, 2, exit.ExitCode(), "a mistake in the configuration")
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			require.Len(t, lines, 1, "one line:\n%s", out)
			assert.Regexp(t, tt.want, lines[0])
		})
	}
}

// TestStartRaisesTheSoftFileLimit starts the relay with a soft limit far
// below what it needs and a hard limit above: it raises the soft one and
// serves.
func TestStartRaisesTheSoftFileLimit(t *testing.T) {
	bin := proctest.Build(t, relayPkg)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "prlimit", "--nofile=256:4096", bin,
		"--listen", "127.0.0.1:0", "--admin-listen", "", "--breaker-log", filepath.Join(t.TempDir(), "breaker.log"),
		"--target", "CORE=http://127.0.0.1:9", "--max-conns", "1000")
	cmd.Env = proctest.Environ()
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	addr := regexp.MustCompile(`"addr":"([^"]+)"`)
	lines := bufio.NewScanner(stderr)
	var m []string
	for m == nil && lines.Scan() {
		m = addr.FindStringSubmatch(lines.Text())
	}
	require.NotNil(t, m, "the relay logs no address: %v", lines.Err())
	go func() {
		for lines.Scan() {
		}
	}()
	nc, err := net.Dial("tcp", m[1])
	require.NoError(t, err)
	defer nc.Close()
	_, err = nc.Write([]byte("T1|NONE|x\n"))
	require.NoError(t, err)
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
	got := make([]byte, 64)
	k, err := nc.Read(got)
	require.NoError(t, err)
	assert.Equal(t, "T1|E903|unknown target\n", string(got[:k]))
}
