package relay

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

func TestReloadKeepsTheCountAndAppliesTheNewThreshold(t *testing.T) {
	// Given CORE failing with threshold 5 and two failures counted
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 5, time.Minute)})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	for i := range 2 {
		require.Contains(t, c.Exchange(fmt.Sprintf("F%d|CORE|x", i)).String(), "|E500|")
	}

	// When the threshold becomes 3
	res, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL, Settings: settings(0, 3, time.Minute)}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{Changed: []string{"CORE"}}, res)

	// Then the breaker is still closed with its two failures, under the new
	// threshold,
	st := status(t, srv, "CORE")
	assert.Equal(t, breaker.Closed, st.State)
	assert.Equal(t, 2, st.ConsecutiveFailures)
	assert.Equal(t, 3, st.Settings.FailThreshold)

	// and the third failure opens it.
	assert.Contains(t, c.Exchange("F3|CORE|x").String(), "|E500|")
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State)
	assert.Equal(t, "F4|E904|circuit open; retry after 60s", c.Exchange("F4|CORE|x").String())
	assert.Equal(t, 3, core.Calls())
}

func TestReloadAddsAndDrainsTargets(t *testing.T) {
	// Given CORE and CLAIM, with a CLAIM call in flight
	core := hubtest.NewTarget(t, hubtest.Echo)
	claim := hubtest.NewTarget(t, nil)
	claim.Set(claim.BlockThen(hubtest.Echo))
	loans := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: claim.URL})
	reg := withMetrics(t, &cfg)
	var tr hubtest.Transitions
	cfg.OnTransition = tr.Observe
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("C1|CLAIM|slow")
	claim.WaitEntered(t, 1)

	// When a reload drops CLAIM and adds LOANS
	res, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL}, {Name: "loans", URL: loans.URL}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{Added: []string{"LOANS"}, Removed: []string{"CLAIM"}}, res)

	// Then LOANS answers, closed, from the start; CLAIM is unknown to new
	// lines while its call in flight still finishes and is answered;
	assert.Equal(t, "L1|0000|got x", c.Exchange("L1|LOANS|x").String())
	assert.Equal(t, "C2|E903|"+protocol.MsgUnknownTarget, c.Exchange("C2|CLAIM|x").String())
	// The E903's own count drops just after its answer is written.
	hubtest.Eventually(t, func() bool { return srv.serving.activeCalls.Load() == 1 }, "only the CLAIM call is still in flight")
	claim.UnblockAll()
	assert.Equal(t, "C1|0000|got slow", c.ReadResponse().String())
	assert.Equal(t, 1, claim.Calls())

	// the status and the state metric know only the targets served,
	var names []string
	for _, ts := range srv.Targets() {
		names = append(names, ts.Name)
	}
	assert.Equal(t, []string{"CORE", "LOANS"}, names)
	assert.Equal(t, 0.0, hubtest.MetricValue(t, reg, metricBreakerState, labelTarget, "LOANS"))
	assert.False(t, hasSeries(t, reg, metricBreakerState, labelTarget, "CLAIM"), "a removed target keeps no state series")
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricRequests, labelTarget, "CLAIM", labelCode, "0000"), "its counters stay")

	// A target added back gets its breaker back: when CLAIM, served again,
	// is held open by an operator, removed, and added back,
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL}, {Name: "CLAIM", URL: core.URL}})
	require.NoError(t, err)
	assert.Equal(t, "C3|0000|got y", c.Exchange("C3|CLAIM|y").String())
	_, err = srv.ControlBreaker("CLAIM", ActionOpen)
	require.NoError(t, err)
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL}})
	require.NoError(t, err)
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL}, {Name: "CLAIM", URL: core.URL}})
	require.NoError(t, err)

	// so it is still open, and its breaker's changes form one chain, as the
	// breaker log must.
	assert.Equal(t, "C4|E904|"+protocol.MsgHeldOpen, c.Exchange("C4|CLAIM|x").String())
	_, err = srv.ControlBreaker("CLAIM", ActionClose)
	require.NoError(t, err)
	assert.Equal(t, []string{"CLAIM:CLOSED->OPEN", "CLAIM:OPEN->CLOSED"}, tr.List())
	assert.Equal(t, 0.0, hubtest.MetricValue(t, reg, metricBreakerState, labelTarget, "CLAIM"), "its state series is back")
}

// hasSeries reports whether g has a series of the named family whose label
// has value.
func hasSeries(t *testing.T, g prometheus.Gatherer, name, label, value string) bool {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return true
				}
			}
		}
	}
	return false
}

func TestReloadRefusesABadConfigurationWhole(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(3, 5, time.Minute)})
	srv, addr := startServer(t, cfg)
	before := srv.Targets()

	tests := []struct {
		name    string
		targets []Target
		want    string
	}{
		{"no targets", nil, "relay: no targets configured"},
		{"a duplicate", []Target{{Name: "CORE", URL: core.URL}, {Name: "core", URL: core.URL}}, "relay: target CORE configured twice"},
		{"a bad URL", []Target{{Name: "CORE", URL: "ftp://x"}}, `relay: target CORE: URL "ftp://x": want http:// or https:// with a host`},
		{"a bad setting", []Target{{Name: "CORE", URL: core.URL, Settings: &TargetSettings{MaxInflight: -1}}}, "relay: target CORE: MaxInflight must not be negative"},
		{"a bad failure code", []Target{{Name: "CORE", URL: core.URL, Settings: &TargetSettings{FailureCodes: []string{"E904"}}}}, "relay: target CORE: "},
		{"an unknown fallback", []Target{{Name: "CORE", URL: core.URL, Fallback: "DR"}}, `relay: target CORE: fallback "DR" is not a configured target`},
		// The good target before the bad one must not be applied either.
		{"a good target then a bad one", []Target{{Name: "CORE", URL: core.URL, Settings: settings(9, 1, time.Second)}, {Name: "NEW", URL: "::"}}, "relay: target NEW: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := srv.Reload(tt.targets)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, before, srv.Targets(), "a refused reload changes nothing")
		})
	}
	c := hubtest.Dial(t, addr)
	assert.Equal(t, "T1|0000|got x", c.Exchange("T1|CORE|x").String())
}

func TestReloadChangesBulkheadURLAndFailureCodes(t *testing.T) {
	// Given CORE with a bulkhead of one, its one call held in flight
	oldCore := hubtest.NewTarget(t, nil)
	oldCore.Set(oldCore.BlockThen(hubtest.Echo))
	newCore := hubtest.NewTarget(t, hubtest.AnswerStatus(400))
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: oldCore.URL, Settings: settings(1, 1, time.Minute)})
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	c.Send("H1|CORE|held")
	oldCore.WaitEntered(t, 1)
	assert.Equal(t, "B1|E905|"+protocol.MsgBulkheadFull, c.Exchange("B1|CORE|x").String())

	// When a reload moves CORE to another URL with a bulkhead of two and
	// E400 among its failure codes
	s := settings(2, 1, time.Minute)
	s.FailureCodes = []string{"E400", "E500"}
	_, err := srv.Reload([]Target{{Name: "CORE", URL: newCore.URL, Settings: s}})
	require.NoError(t, err)
	st := status(t, srv, "CORE")
	assert.Equal(t, newCore.URL, st.URL)
	assert.Equal(t, 2, st.MaxInFlight)
	assert.Equal(t, 1, st.InFlight, "the held call keeps its slot")

	// Then one more call is admitted, goes to the new URL, and its E400 now
	// counts as a failure,
	assert.Contains(t, c.Exchange("N1|CORE|x").String(), "N1|E400|")
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State)
	assert.Equal(t, 1, newCore.Calls())

	// while the held call finishes at the URL of its admission.
	oldCore.UnblockAll()
	assert.Equal(t, "H1|0000|got held", c.ReadResponse().String())
	assert.Equal(t, 1, oldCore.Calls())
}

func TestReloadSetsAndDropsAFallback(t *testing.T) {
	// Given CORE open, without a fallback
	core := hubtest.NewTarget(t, hubtest.AnswerStatus(500))
	dr := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Minute)})
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	require.Contains(t, c.Exchange("F1|CORE|x").String(), "|E500|")

	// When a reload adds CORE_DR as its fallback, CORE_DR takes its requests,
	_, err := srv.Reload([]Target{
		{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Minute), Fallback: "CORE_DR"},
		{Name: "CORE_DR", URL: dr.URL},
	})
	require.NoError(t, err)
	assert.Equal(t, breaker.Open, status(t, srv, "CORE").State, "CORE stays open")
	assert.Equal(t, "F2|0000|via CORE_DR: got x", c.Exchange("F2|CORE|x").String())
	assert.Equal(t, 1.0, hubtest.MetricValue(t, reg, metricFallbacks, labelTarget, "CORE", labelFallback, "CORE_DR"))
	assert.Equal(t, "CORE_DR", status(t, srv, "CORE").Fallback)

	// and once a reload drops it, CORE refuses on its own again.
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL, Settings: settings(0, 1, time.Minute)}, {Name: "CORE_DR", URL: dr.URL}})
	require.NoError(t, err)
	assert.Equal(t, "F3|E904|circuit open; retry after 60s", c.Exchange("F3|CORE|x").String())
}

func TestReloadAfterShutdownIsRefused(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, _ := startServer(t, cfg)
	require.NoError(t, srv.Close())
	_, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL}})
	assert.ErrorIs(t, err, ErrReloadClosed)
}

// TestReloadUnderLoad reloads over and over while lines flow on several
// connections, switching settings, bulkhead sizes, URLs and a target that
// comes and goes. Every line of a target that stays is answered once, with
// 0000; the race detector watches the target table and the confs.
func TestReloadUnderLoad(t *testing.T) {
	a := hubtest.NewTarget(t, hubtest.Echo)
	b := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: a.URL, Settings: settings(64, 5, time.Minute)})
	srv, addr := startServer(t, cfg)
	configs := [][]Target{
		{{Name: "CORE", URL: a.URL, Settings: settings(64, 5, time.Minute)}},
		{{Name: "CORE", URL: b.URL, Settings: settings(100, 3, time.Second)}, {Name: "EXTRA", URL: a.URL}},
		{{Name: "CORE", URL: a.URL, Settings: &TargetSettings{MaxInflight: 48, TargetTimeout: 2 * time.Second}}, {Name: "EXTRA", URL: b.URL, Fallback: "CORE"}},
	}
	stop := make(chan struct{})
	var reloader sync.WaitGroup
	reloads := 0
	reloader.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, err := srv.Reload(configs[i%len(configs)])
			assert.NoError(t, err)
			reloads++
			time.Sleep(time.Millisecond)
		}
	})
	// Waves of 40 lines in flight stay within every bulkhead size.
	const conns, wave, waves = 4, 10, 30
	clients := make([]*hubtest.Client, conns)
	for n := range clients {
		clients[n] = hubtest.Dial(t, addr)
	}
	for w := range waves {
		for n, c := range clients {
			for i := range wave {
				c.Send(fmt.Sprintf("T%d-%d-%d|CORE|p%d", n, w, i, i))
			}
		}
		for n, c := range clients {
			got := hubtest.Lines(c.ReadByTxID(wave))
			for i := range wave {
				txid := fmt.Sprintf("T%d-%d-%d", n, w, i)
				assert.Equal(t, fmt.Sprintf("%s|0000|got p%d", txid, i), got[txid])
			}
		}
	}
	close(stop)
	reloader.Wait()
	assert.Positive(t, reloads)
	assert.Equal(t, conns*wave*waves, a.Calls()+b.Calls())
}

func TestReloadCannotAddATargetWhenBreakersShareState(t *testing.T) {
	// Given a hub whose breakers wait for probe permits (fleet mode),
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL}, Target{Name: "CLAIM", URL: core.URL})
	cfg.ProbePermits = true
	srv, _ := startServer(t, cfg)

	// a reload that adds a new target is refused whole,
	_, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL}, {Name: "CLAIM", URL: core.URL}, {Name: "LOANS", URL: core.URL}})
	require.ErrorContains(t, err, "target LOANS: a reload cannot add a target")
	assert.Len(t, srv.Targets(), 2)

	// while removing a target and adding it back, with its breaker, works.
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL}})
	require.NoError(t, err)
	res, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL}, {Name: "CLAIM", URL: core.URL}})
	require.NoError(t, err)
	assert.Equal(t, []string{"CLAIM"}, res.Added)
}
