package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }

// incidentPolicy is the breaker policy of the scripted incident, as relay
// and relayctl replay flags: a short reset timeout with backoff, and slow
// calls counted as failures.
var incidentPolicy = []string{
	"--fail-threshold", "3", "--reset-timeout", "300ms", "--max-reset-timeout", "1s",
	"--slow-call", "150ms", "--target-timeout", "3s",
}

// incidentScript is the scripted incident, from the start of the load:
// CORE fails, then answers slowly (300 ms, a failure for --slow-call
// 150ms), then normally again.
var incidentScript = []struct {
	at  time.Duration
	ctl string
}{
	{1000 * time.Millisecond, `{"mode":"fail"}`},
	{2500 * time.Millisecond, `{"mode":"slow","delay_ms":300}`},
	{5000 * time.Millisecond, `{"mode":"normal"}`},
}

// incident runs the real relay with the flags policy in front of a CORE
// and a CLAIM fixture under a steady 200 requests a second (three in four
// to CORE) through the scripted incident, each switch a POST /_ctl to the
// fixture as an operator would send it, and returns the paths of the
// relay's access log and breaker log once the relay has drained and
// stopped.
func incident(t *testing.T, policy []string) (accessLog, breakerLog string) {
	core := proctest.StartFixture(t, "CORE", "core")
	claim := proctest.StartFixture(t, "CLAIM", "claim")
	dir := t.TempDir()
	accessLog, breakerLog = filepath.Join(dir, "access.log"), filepath.Join(dir, "breaker.log")
	relay := proctest.Start(t, "./cmd/relay", append([]string{
		"--listen", "127.0.0.1:0", "--admin-listen", "",
		"--target", "CORE=" + core.URL, "--target", "CLAIM=" + claim.URL,
		"--access-log", accessLog, "--breaker-log", breakerLog,
	}, policy...)...)

	mix, err := loadgen.ParseMix("CORE=3,CLAIM=1")
	require.NoError(t, err)
	var payloads []loadgen.Template
	for _, p := range []string{"BAL ACC{conn}", "SUBMIT P{conn} 100"} {
		tpl, err := loadgen.ParseTemplate(p)
		require.NoError(t, err)
		payloads = append(payloads, tpl)
	}
	g, err := loadgen.New(loadgen.Config{
		Addr: relay.Addr(), Conns: 4, Depth: 64, Rate: 200, Duration: 6500 * time.Millisecond,
		Mix: mix, Payloads: payloads, Drain: 3 * time.Second, Seed: 1,
	})
	require.NoError(t, err)
	start := time.Now()
	scripted := make(chan error, 1)
	go func() {
		for _, step := range incidentScript {
			time.Sleep(time.Until(start.Add(step.at)))
			if err := control(core.URL, step.ctl); err != nil {
				scripted <- err
				return
			}
		}
		scripted <- nil
	}()
	res, err := g.Run(context.Background())
	require.NoError(t, err)
	require.NoError(t, <-scripted)
	require.Empty(t, g.Summary(res).Problems(), "every request is answered once")

	relay.Signal(syscall.SIGTERM)
	require.Equal(t, 0, relay.Wait(), "the relay drains and exits 0")
	return accessLog, breakerLog
}

// control posts body to the fixture's /_ctl, as curl -d does.
func control(fixtureURL, body string) error {
	resp, err := http.Post(fixtureURL+"/_ctl", "application/x-www-form-urlencoded", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /_ctl %s: %s", body, resp.Status)
	}
	return nil
}

// replayReport is the part of relayctl replay --json that the test reads;
// the counts of a target are read as they come, by name.
type replayReport struct {
	Malformed, Late, Approximate int64
	Logged                       []map[string]any `json:"logged"`
	Sets                         []struct {
		Transitions []string         `json:"transitions"`
		Targets     []map[string]any `json:"targets"`
	} `json:"sets"`
}

// loggedCounts are the counts that the log has as well as the replay.
var loggedCounts = []string{"target", "requests", "calls", "failed", "refused", "handed_back", "to_fallback", "probes"}

func TestReplayOfTheHubsAccessLogIsItsBreakerLog(t *testing.T) {
	// Given the access log and the breaker log of a real relay that went
	// through the scripted incident with slow calls and backoff on,
	replayMatchesBreakerLog(t, incidentPolicy)
}

func TestReplayOfAHubWithSyntheticProbesIsItsBreakerLog(t *testing.T) {
	// Given the same with synthetic probes, whose lines the replay takes
	// as the breakers' own probes,
	replayMatchesBreakerLog(t, append([]string{"--probe-payload", "BAL HEALTH", "--probe-successes", "2"}, incidentPolicy...))
}

// replayMatchesBreakerLog runs the incident with the relay flags policy
// and holds relayctl replay, given the same flags, to the relay's breaker
// log and counts.
func replayMatchesBreakerLog(t *testing.T, policy []string) {
	accessLog, breakerLog := incident(t, policy)
	hub, _, err := breakerlog.ReadFile(breakerLog)
	require.NoError(t, err)
	require.NoError(t, breakerlog.CheckChains(hub))

	// when relayctl replays the access log with the relay's settings,
	res := proctest.Run(t, "./cmd/relayctl", append([]string{"replay", "--json", "--access-log", accessLog}, policy...)...)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	var rep replayReport
	require.NoError(t, json.Unmarshal([]byte(res.Stdout), &rep), res.Stdout)
	require.Len(t, rep.Sets, 1)

	// then its transitions are the relay's breaker log, line for line,
	// each within the log's millisecond: the replay's time is the hub's
	// reading just before the breaker's own, so it is the same
	// millisecond or, across a millisecond's edge, the one before.
	got := make([]breakerlog.Entry, len(rep.Sets[0].Transitions))
	for i, line := range rep.Sets[0].Transitions {
		got[i], err = breakerlog.ParseLine(line)
		require.NoError(t, err)
	}
	require.Equal(t, len(hub), len(got), "hub:\n%s\nreplay:\n%s", entries(hub), entries(got))
	for i := range hub {
		assert.Equal(t, [3]string{hub[i].Name, hub[i].From.String(), hub[i].To.String()},
			[3]string{got[i].Name, got[i].From.String(), got[i].To.String()}, "line %d", i+1)
		d := hub[i].At.Sub(got[i].At)
		assert.True(t, d == 0 || d == time.Millisecond, "line %d: hub %s, replay %s", i+1, hub[i], got[i])
	}

	// The incident happened as scripted: CORE opened, probes failed while
	// it failed and while it was slow, and a probe closed it once it
	// recovered. (A machine that stalls for longer than the target timeout
	// makes calls time out, which may open a breaker more; the replay
	// must match the breaker log all the same.)
	var core []string
	for _, e := range hub {
		if e.Name == "CORE" {
			core = append(core, e.From.String()+"->"+e.To.String())
		} else {
			t.Logf("not scripted: %s (calls timed out?)", e)
		}
	}
	require.NotEmpty(t, core)
	assert.Equal(t, "CLOSED->OPEN", core[0])
	changes := strings.Join(core, " ")
	assert.GreaterOrEqual(t, strings.Count(changes, "HALF_OPEN->OPEN"), 2, "probes failed while CORE failed and while it was slow")
	assert.Contains(t, changes, "HALF_OPEN->CLOSED", "a probe closed CORE once it recovered")

	// What the replay's breakers did is what the log says the hub's did,
	// and it guessed no outcome.
	assert.Zero(t, rep.Malformed+rep.Late+rep.Approximate)
	require.Len(t, rep.Logged, 2)
	var probes float64
	for i, logged := range rep.Logged {
		replayed := rep.Sets[0].Targets[i]
		assert.Zero(t, replayed["inferred"], logged["target"])
		for _, count := range loggedCounts {
			assert.Equal(t, logged[count], replayed[count], "%s %s", logged["target"], count)
		}
		probes += logged["probes"].(float64)
		if logged["target"] == "CORE" {
			assert.Positive(t, logged["refused"], "E904 while CORE was open")
			assert.Positive(t, logged["failed"], "calls reached CORE while it was sick")
		}
	}
	halfOpen := float64(strings.Count(entries(hub), "OPEN->HALF_OPEN"))
	if slices.Contains(policy, "--probe-successes") {
		// Up to two probes per half-open period.
		assert.GreaterOrEqual(t, probes, halfOpen)
		assert.LessOrEqual(t, probes, 2*halfOpen)
		return
	}
	assert.Equal(t, halfOpen, probes, "one probe per OPEN->HALF_OPEN")
}

// entries writes a breaker log for a message.
func entries(es []breakerlog.Entry) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.String() + "\n")
	}
	return b.String()
}
