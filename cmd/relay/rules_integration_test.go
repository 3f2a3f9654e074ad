package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/proctest"
	"github.com/relayhub/relayhub/internal/testutil/redistest"
)

// These tests hold deploy/prometheus/relayhub-rules.yml to its unit tests
// and to the metrics a running hub serves, so that a renamed metric breaks
// the build rather than an alert.

// promtool runs Prometheus's promtool (Debian's prometheus package, which
// .ci/run installs) in dir and returns its output.
func promtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is missing: install Debian's prometheus package (.ci/run does)")
	cmd := exec.Command(path, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

func TestAlertRulesPassTheirUnitTests(t *testing.T) {
	dir := filepath.Join(moduleRoot(t), "deploy", "prometheus")
	assert.Contains(t, promtool(t, dir, "check", "rules", "relayhub-rules.yml"), "SUCCESS")
	assert.Contains(t, promtool(t, dir, "test", "rules", "relayhub-rules.test.yml"), "SUCCESS")
}

// relayMetricName is a metric of the hub's own in a rule or its test.
var relayMetricName = regexp.MustCompile(`\brelay_[a-z_]+\b`)

// metricFamily is a "# TYPE name kind" line of /metrics.
var metricFamily = regexp.MustCompile(`(?m)^# TYPE (\S+) `)

func TestAlertRulesNameMetricsTheHubServes(t *testing.T) {
	// Given the names the rules and their tests use,
	dir := filepath.Join(moduleRoot(t), "deploy", "prometheus")
	var names []string
	for _, f := range []string{"relayhub-rules.yml", "relayhub-rules.test.yml"} {
		body, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		names = append(names, relayMetricName.FindAllString(string(body), -1)...)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	require.NotEmpty(t, names)

	// and a hub with everything an alert watches turned on: TLS, a fleet's
	// store, the in-doubt journal, the access log and the shield,
	p := newPKI(t)
	store := redistest.Start(t)
	core := proctest.StartFixture(t, "CORE", "core")
	dir2 := t.TempDir()
	h := startAdminRelay(t, append(p.hubArgs(), "--target", "CORE="+core.URL,
		"--state-store", store.URL(), "--hub-id", "rules",
		"--in-doubt-log", filepath.Join(dir2, "in-doubt.log"), "--access-log", filepath.Join(dir2, "access.log"),
		"--dedup")...)

	// then every one of them is a metric family of its /metrics.
	_, body := h.scrape(t)
	var served []string
	for _, m := range metricFamily.FindAllStringSubmatch(body, -1) {
		served = append(served, m[1])
	}
	for _, name := range names {
		assert.Contains(t, served, name, "the alert rules name %s, which the hub does not serve", name)
	}
}
