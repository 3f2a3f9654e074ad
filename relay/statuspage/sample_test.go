package statuspage

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistogramQuantile(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.1, 1}
	tests := []struct {
		name       string
		cumulative []float64
		total      float64
		q          float64
		want       float64
		beyond     bool
	}{
		{name: "empty", cumulative: []float64{0, 0, 0, 0}, total: 0, q: 0.5, want: math.NaN()},
		{name: "all in the first bucket, from zero", cumulative: []float64{10, 10, 10, 10}, total: 10, q: 0.5, want: 0.0005},
		{name: "linear within the bucket", cumulative: []float64{0, 0, 100, 100}, total: 100, q: 0.5, want: 0.01 + 0.09*0.5},
		{name: "p99 in a later bucket", cumulative: []float64{50, 90, 99, 100}, total: 100, q: 0.99, want: 0.1},
		{name: "beyond the last bound", cumulative: []float64{0, 0, 0, 1}, total: 10, q: 0.99, want: 1, beyond: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, beyond := histogram{bounds: bounds, cumulative: tt.cumulative, total: tt.total}.quantile(tt.q)
			if math.IsNaN(tt.want) {
				assert.True(t, math.IsNaN(got), "got %v", got)
				return
			}
			assert.InDelta(t, tt.want, got, 1e-12)
			assert.Equal(t, tt.beyond, beyond)
		})
	}
}

func TestFailureLabels(t *testing.T) {
	assert.Equal(t, []string{"E500", "E901", "E902"}, failureLabels([]string{"E500", "E901", "E902"}))
	assert.Equal(t, []string{"E400", "E500", "Ennn"}, failureLabels([]string{"E400", "E500", "E123"}))
	assert.Nil(t, failureLabels(nil))
}

// sampleAt returns CORE's counters at t0+at with the given code counts and
// n calls, all in the 10 ms bucket.
func sampleAt(at time.Duration, codes map[string]float64, calls float64) *counters {
	return &counters{
		at:         t0.Add(at),
		codes:      codes,
		bounds:     []float64{0.001, 0.01, 0.1},
		cumulative: []float64{0, calls, calls},
		calls:      calls,
	}
}

func TestSeriesRates(t *testing.T) {
	var s series
	assert.False(t, s.rates(nil).ok, "no sample")
	s.add(sampleAt(0, map[string]float64{"0000": 0}, 0))
	assert.False(t, s.rates(nil).ok, "one sample")

	// Given 70 s of samples a second, with 10 answers a second of which
	// one fails and two are refused by the open breaker,
	for i := 1; i <= 70; i++ {
		n := float64(i)
		s.add(sampleAt(time.Duration(i)*time.Second, map[string]float64{"0000": 7 * n, "E500": n, "E904": 2 * n, "Bnnn": 0}, 8*n))
	}
	// then the window is the last minute,
	require.LessOrEqual(t, len(s.recent), 62)
	r := s.rates([]string{"E500", "E901", "E902"})
	require.True(t, r.ok)
	assert.Equal(t, time.Minute, r.window)
	assert.InDelta(t, 7, r.perSecond[classOK], 1e-9)
	assert.InDelta(t, 1, r.perSecond[classFailed], 1e-9)
	assert.InDelta(t, 2, r.perSecond[classOpen], 1e-9)
	assert.Zero(t, r.perSecond[classFull])
	// the calls and failures are those of the window,
	assert.InDelta(t, 480, r.calls, 1e-9)
	assert.InDelta(t, 60, r.failed, 1e-9)
	// and the latencies come from the window's histogram.
	assert.InDelta(t, 0.001+0.009*0.5, r.p50, 1e-12)
	assert.False(t, r.p99Beyond)

	// Its sparkline has the answers per second of each 5 s bar.
	bars := s.spark(t0.Add(70 * time.Second))
	full := bars[sparkBars-2] // the bar of 60-64 s, complete
	assert.InDelta(t, 7, full[classOK], 1e-9)
	assert.InDelta(t, 2, full[classOpen], 1e-9)
	assert.Zero(t, bars[0][classOK], "15 minutes ago: nothing")
	last := bars[sparkBars-1] // the bar of 70 s, one sample into it
	assert.InDelta(t, 7, last[classOK], 1e-9)
	// Fifteen minutes later every bar has left the window.
	assert.Zero(t, s.spark(t0.Add(70*time.Second + HistorySpan))[sparkBars-1][classOK])
	assert.Zero(t, s.spark(t0.Add(70*time.Second + HistorySpan))[0][classOK])
}
