package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

func TestParsePhase(t *testing.T) {
	p, err := ParsePhase("degraded=90s")
	require.NoError(t, err)
	assert.Equal(t, Phase{Name: "degraded", Duration: 90 * time.Second}, p)

	for _, bad := range []string{"degraded", "=90s", "degraded=soon", "degraded=0s", "degraded=-1s"} {
		_, err := ParsePhase(bad)
		assert.Error(t, err, bad)
	}
}

func TestTimelineSplitsAnswersByPhaseAndSecond(t *testing.T) {
	// Given two phases of 2 s and answers due in each, one after both
	phases := []Phase{{"healthy", 2 * time.Second}, {"degraded", 2 * time.Second}}
	tl := newTimeline(phases)
	tl.add(int64(100*time.Millisecond), 1000, true, "0000")
	tl.add(int64(1500*time.Millisecond), 3000, true, "0000")
	tl.add(int64(2*time.Second), 90_000, false, "E901") // the first instant of degraded
	tl.add(int64(3*time.Second), 50, false, "E905")
	tl.add(int64(5*time.Second), 2000, true, "0000") // after the last phase: counted in it

	// When the phases are summed up
	got := phaseSummaries(Config{Phases: phases}, tl)

	// Then each holds the answers to its own requests
	require.Len(t, got, 2)
	assert.Equal(t, "healthy", got[0].Name)
	assert.Equal(t, map[string]int64{"0000": 2}, got[0].Codes)
	assert.InDelta(t, 1.0, got[0].Goodput, 1e-9, "two 0000 over 2 s")
	assert.InDelta(t, 3000, got[0].LatencyUS.Max, 3, "within the histogram's precision")
	assert.Equal(t, map[string]int64{"0000": 1, "E901": 1, "E905": 1}, got[1].Codes)
	assert.InDelta(t, 2.0, got[1].StartSeconds, 1e-9)
	assert.Equal(t, int64(3), got[1].Answered)
	assert.InDelta(t, 2000, got[1].LatencyOKUS.Max, 2, "only the 0000 among the processed")
	// And each second of due time has its own count
	require.Len(t, tl.seconds, 6)
	assert.Equal(t, map[string]int64{"E901": 1}, tl.seconds[2])
	assert.Equal(t, map[string]int64{"E905": 1}, tl.seconds[3])
}

func TestClearAfterWantsFiveCleanSecondsInARow(t *testing.T) {
	sec := func(ok, refused int64) map[string]int64 { return map[string]int64{"0000": ok, "E905": refused} }
	seconds := []map[string]int64{
		sec(0, 100), sec(50, 50), // a phase before: left out
		sec(10, 90), sec(99, 1), sec(100, 0), sec(100, 0), sec(100, 0), // 1 % is not under 1 %
		sec(100, 5), sec(199, 1), sec(100, 0), {}, sec(100, 0), // a second without answers breaks the run
		sec(100, 0), sec(100, 0), sec(100, 0), sec(100, 0), sec(100, 0),
	}

	got := clearAfter(seconds, 2, len(seconds))

	require.NotNil(t, got)
	assert.InDelta(t, 9.0, *got, 0, "seconds 11 to 15 are the first clean run, 9 s into the phase")
	assert.Nil(t, clearAfter(seconds, 2, 14), "not within a phase that ends sooner")
}

func TestSummariseReadingsFindsWhenTheValueSettled(t *testing.T) {
	// Given a limit read each second that falls from 20 to about 10 in a
	// phase from 100 s to 120 s
	var all []Reading
	values := []float64{20, 20, 16, 13, 11, 10, 11, 10, 10, 10, 11, 10, 10, 10, 10, 10, 10, 10, 10, 10}
	for i, v := range values {
		all = append(all, Reading{At: 100.5 + float64(i), Value: v})
	}
	all = append(all, Reading{At: 99.5, Value: 20}, Reading{At: 120.5, Value: 30}) // other phases

	got := summariseReadings(all, 100, 120)

	require.NotNil(t, got)
	assert.InDelta(t, 10.0, got.Settled, 0)
	assert.InDelta(t, 10.0, got.Min, 0)
	assert.InDelta(t, 20.0, got.Max, 0)
	assert.InDelta(t, 4.5, got.SettleSeconds, 1e-9, "within 10 ± 1 from the reading at 104.5 s on")

	flat := summariseReadings([]Reading{{At: 1, Value: 10}, {At: 2, Value: 10}}, 0, 3)
	assert.InDelta(t, 0.0, flat.SettleSeconds, 0, "a value that never moved settled at once")
	assert.Nil(t, summariseReadings(all, 200, 210), "no readings, no summary")
}

func TestMetricWatchReadsOneSeries(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "# HELP relay_bulkhead_limit the limit\n"+
			"# TYPE relay_bulkhead_limit gauge\n"+
			"relay_bulkhead_limit{target=\"CLAIM\"} 10\n"+
			"relay_bulkhead_limit{target=\"CORE\"} 7\n")
	}))
	defer srv.Close()
	ctx := t.Context()

	v, err := MetricWatch(srv.URL+"/metrics", `relay_bulkhead_limit{target="CORE"}`)(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 7.0, v, 0)

	_, err = MetricWatch(srv.URL+"/metrics", `relay_bulkhead_limit{target="BAL"}`)(ctx)
	assert.ErrorContains(t, err, "no series")
	_, err = MetricWatch(srv.URL+"/nothing", "x")(ctx)
	assert.ErrorContains(t, err, "HTTP 404")
}

func TestLoadWithPhasesReportsEachAndTheWatch(t *testing.T) {
	// Given a paced run of 1.5 s in two phases, with a Watch
	f := fakerelay.New(t, fakerelay.Config{})
	cfg := testLoadConfig(t, f.Addr)
	cfg.Requests, cfg.Duration, cfg.Rate, cfg.Depth = 0, 1500*time.Millisecond, 200, RateDepth
	cfg.Phases = []Phase{{"first", 500 * time.Millisecond}, {"second", time.Second}}
	var reads atomic.Int64
	cfg.Watch = func(context.Context) (float64, error) { return float64(reads.Add(1)), nil }
	g := newGenerator(t, cfg)

	// When it runs
	res := runTestLoad(t, cfg)
	sum := g.Summary(res)

	// Then every answer is in one phase, by its due time
	require.Len(t, sum.Phases, 2)
	assert.Equal(t, res.Answered, sum.Phases[0].Answered+sum.Phases[1].Answered)
	assert.InDelta(t, 100, sum.Phases[0].Answered, 2, "0.5 s at 200/s")
	assert.InDelta(t, 200, sum.Phases[0].Goodput, 4)
	assert.Len(t, sum.Series, 2, "two seconds of due time")
	// And the Watch was read once a second: its one reading, at 1 s, in
	// the second phase
	require.Len(t, sum.Readings, 1)
	assert.Nil(t, sum.Phases[0].Watch)
	require.NotNil(t, sum.Phases[1].Watch)
	assert.InDelta(t, 1.0, sum.Phases[1].Watch.Settled, 0)
}
