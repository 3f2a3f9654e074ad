package main

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/filelimit"
)

// These tests hold the files of deploy/ to the relay they run: the unit's
// limits must fit the settings the environment file ships with, and every
// setting there must be one the relay takes.

// deployFile returns the path of a file of deploy/.
func deployFile(name string) string {
	return filepath.Join("..", "..", "deploy", name)
}

// keyValues reads the KEY=VALUE lines of path, skipping comments, blank
// lines and section headers; a key given twice keeps every value.
func keyValues(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "%s: %q is no KEY=VALUE line", path, line)
		out[k] = append(out[k], v)
	}
	require.NoError(t, sc.Err())
	return out
}

// one returns the only value of key.
func one(t *testing.T, kv map[string][]string, key string) string {
	t.Helper()
	require.Len(t, kv[key], 1, "want one %s", key)
	return kv[key][0]
}

func TestDeployEnvironmentFileIsValid(t *testing.T) {
	env := keyValues(t, deployFile("relayhub.env"))
	var vars []string
	for k, vs := range env {
		assert.True(t, strings.HasPrefix(k, "RELAY_"), "%s is no relay setting", k)
		vars = append(vars, k+"="+vs[len(vs)-1])
	}

	// As shipped, the file names no target and no admin token: the two
	// settings an install must give, which the relay refuses to start
	// without rather than relay to the fixtures' loopback ports or open
	// its admin port to the network unguarded.
	assert.Equal(t, []string{""}, env["RELAY_TARGET"], "the shipped file must leave the targets to the install")
	assert.Equal(t, []string{""}, env["RELAY_ADMIN_TOKEN"], "the shipped file must leave the admin token to the install")
	_, err := parse(t, vars)
	require.EqualError(t, err, "--target: name at least one target")

	// With the targets alone, the admin port beyond loopback still wants
	// its token;
	c, err := parse(t, append(vars, "RELAY_TARGET=CORE=https://core.bank.internal:8443"))
	require.ErrorContains(t, err, "--admin-listen")
	require.ErrorContains(t, err, "needs --admin-token")
	assert.True(t, beyondLoopback(c.AdminListen), "the balancer's check reads /readyz from its own machine")

	// with both, the relay takes the file.
	c, err = parse(t, append(vars, "RELAY_TARGET=CORE=https://core.bank.internal:8443", "RELAY_ADMIN_TOKEN=secret"))
	require.NoError(t, err, "the relay refuses deploy/relayhub.env with its targets and token")
	assert.Equal(t, []targetFlag{{Name: "CORE", URL: "https://core.bank.internal:8443"}}, c.Target)
	assert.Equal(t, "/var/log/relayhub/breaker.log", c.BreakerLog)
	assert.Equal(t, "/var/log/relayhub/access.log", c.AccessLog)
	assert.Equal(t, "/var/lib/relayhub/in-doubt.log", c.InDoubtLog, "in the unit's StateDirectory")
	assert.Positive(t, c.ShutdownDelay, "behind a load balancer, the shipped settings delay the drain")
}

func TestDeployUnitFitsTheEnvironmentFile(t *testing.T) {
	unit := keyValues(t, deployFile("relayhub.service"))
	env := keyValues(t, deployFile("relayhub.env"))
	c, err := parse(t, []string{
		"RELAY_MAX_CONNS=" + one(t, env, "RELAY_MAX_CONNS"),
		"RELAY_SHUTDOWN_DELAY=" + one(t, env, "RELAY_SHUTDOWN_DELAY"),
		"RELAY_DRAIN_TIMEOUT=" + one(t, env, "RELAY_DRAIN_TIMEOUT"),
	})
	require.NoError(t, err)

	// The open file limit covers --max-conns, the connections turned away,
	// the default bulkheads and a fleet's store.
	limit, err := strconv.ParseUint(one(t, unit, "LimitNOFILE"), 10, 64)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, limit, filelimit.Needed(c.MaxConns, []int{c.MaxInflight, c.MaxInflight}, filelimit.StoreConns(true)))

	// Stopping leaves room for the shutdown delay and the drain.
	stop, err := time.ParseDuration(one(t, unit, "TimeoutStopSec"))
	require.NoError(t, err)
	assert.Greater(t, stop, time.Duration(c.ShutdownDelay)+time.Duration(c.DrainTimeout))

	// A mistake in the configuration is not restarted, SIGHUP reloads, and
	// the hub runs as its own user.
	assert.Equal(t, strconv.Itoa(exitUsage), one(t, unit, "RestartPreventExitStatus"))
	assert.Equal(t, "on-failure", one(t, unit, "Restart"))
	assert.Equal(t, "/bin/kill -HUP $MAINPID", one(t, unit, "ExecReload"))
	assert.Equal(t, "relayhub", one(t, unit, "User"))
	assert.Equal(t, "strict", one(t, unit, "ProtectSystem"))
	assert.Equal(t, "/etc/relayhub/relayhub.env", one(t, unit, "EnvironmentFile"))
	// A settings file without RELAY_TARGET gets no target, not the
	// relay's defaults (the EnvironmentFile overrides it).
	assert.Equal(t, "RELAY_TARGET=", one(t, unit, "Environment"))
}

// TestDeployBalancerReachesTheShippedPorts holds deploy/relayhub.env to
// deploy/haproxy.cfg: the balancer, on a machine of its own, sends clients
// to each hub's client port and checks /readyz on its admin port, so both
// are the recipe's ports and listen beyond loopback (where the admin port
// needs the token: TestDeployEnvironmentFileIsValid).
func TestDeployBalancerReachesTheShippedPorts(t *testing.T) {
	env := keyValues(t, deployFile("relayhub.env"))
	recipe, err := os.ReadFile(deployFile("haproxy.cfg"))
	require.NoError(t, err)
	servers := 0
	for _, line := range strings.Split(string(recipe), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "server" {
			continue
		}
		servers++
		// server NAME HOST:PORT check port ADMIN_PORT
		require.Len(t, f, 6, "haproxy.cfg: %q", line)
		require.Equal(t, []string{"check", "port"}, f[3:5], "haproxy.cfg: %q", line)
		_, port, err := net.SplitHostPort(f[2])
		require.NoError(t, err, "haproxy.cfg: %q", line)
		for _, p := range []struct{ key, port string }{
			{"RELAY_LISTEN", port},
			{"RELAY_ADMIN_LISTEN", f[5]},
		} {
			addr := one(t, env, p.key)
			_, got, err := net.SplitHostPort(addr)
			require.NoError(t, err, "%s=%s", p.key, addr)
			assert.Equal(t, p.port, got, "%s=%s: haproxy.cfg's %s", p.key, addr, f[1])
			assert.True(t, beyondLoopback(addr), "%s=%s: the balancer's machine cannot reach it", p.key, addr)
		}
	}
	require.Positive(t, servers, "haproxy.cfg has no server line")
}
