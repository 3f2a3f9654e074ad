package loadgen

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs)
}

func TestLatencyPercentiles(t *testing.T) {
	h := newHist()
	for v := int64(1); v <= 1000; v++ {
		require.NoError(t, h.RecordValue(v))
	}
	require.NoError(t, h.RecordValue(50_000)) // one outlier of 50ms

	got := latencyPercentiles(h)
	// 3 significant digits: values up to 2047 are exact.
	assert.Equal(t, int64(501), got.P50)
	assert.Equal(t, int64(901), got.P90)
	assert.Equal(t, int64(991), got.P99)
	assert.Equal(t, int64(1000), got.P999)
	assert.InDelta(t, 50_000, got.Max, 50, "within the histogram's precision")
	assert.InDelta(t, (500500.0+50_000)/1001, got.Mean, 1)
}

func TestLatencyPercentilesEmpty(t *testing.T) {
	assert.Equal(t, LatencySummary{}, latencyPercentiles(newHist()))
}

func sampleSummary(t *testing.T) Summary {
	t.Helper()
	m, err := ParseMix("CORE=70,CLAIM=30")
	require.NoError(t, err)
	h := newHist()
	for _, us := range []int64{100, 200, 300, 400, 1500} {
		require.NoError(t, h.RecordValue(us))
	}
	return newSummary(Config{Addr: "127.0.0.1:9200", Conns: 16, Depth: 1, Mix: m}, &Result{
		Sent:      7,
		Answered:  5,
		Missing:   2,
		Unmatched: 1,
		Elapsed:   2 * time.Second,
		Hist:      h,
		Codes: []map[string]int64{
			{"0000": 3, "E904": 1},
			{"B204": 1},
		},
	})
}

func TestSummaryText(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, sampleSummary(t).WriteText(&buf))
	want := "" +
		"target      127.0.0.1:9200, 16 conns, depth 1, closed loop, mix CORE=70,CLAIM=30\n" +
		"requests    sent 7, answered 5 in 2.000s\n" +
		"throughput  2.5 answers/s\n" +
		"latency     p50 300µs, p90 1.5ms, p99 1.5ms, p99.9 1.5ms, max 1.5ms\n" +
		"codes       0000 3, B204 1, E904 1\n" +
		"  CLAIM     B204 1\n" +
		"  CORE      0000 3, E904 1\n" +
		"errors      unmatched 1, missing 2, malformed 0, connection 0\n"
	assert.Equal(t, want, buf.String())
}

func TestSummaryJSON(t *testing.T) {
	b, err := json.Marshal(sampleSummary(t))
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	assert.InDelta(t, 2.5, got["throughput"], 1e-9)
	assert.Equal(t, map[string]any{"0000": 3.0, "B204": 1.0, "E904": 1.0}, got["codes"])
	assert.Equal(t, map[string]any{"B204": 1.0}, got["target_codes"].(map[string]any)["CLAIM"])
	lat := got["latency_us"].(map[string]any)
	assert.InDelta(t, 300, lat["p50"], 0)
	assert.InDelta(t, 1500, lat["max"], 0)
	assert.InDelta(t, 2, got["missing"], 0)
}

func TestSummaryProblems(t *testing.T) {
	assert.Equal(t, "1 unmatched answers, 2 missing answers", sampleSummary(t).Problems())
	assert.Empty(t, Summary{Sent: 5, Answered: 5}.Problems())
	assert.Equal(t, "1 malformed answer lines, 3 connection errors",
		Summary{Malformed: 1, ConnErrors: 3}.Problems())
}

func TestRateModeShownInSummary(t *testing.T) {
	s := sampleSummary(t)
	s.Rate = 2500
	var buf bytes.Buffer
	require.NoError(t, s.WriteText(&buf))
	assert.Contains(t, buf.String(), "depth 1, rate 2500/s, mix")
}

func TestProgressPrinter(t *testing.T) {
	snap := Progress{Elapsed: 2 * time.Second, Sent: 2000, Answered: 1990, Rate: 1000, P99: 1500 * time.Microsecond}
	line := "  2.0s  sent 2000  answered 1990  1000/s  p99 1.5ms"
	tests := []struct {
		name string
		tty  bool
		want string
	}{
		{"terminal rewrites one line", true, "\r" + line + "\x1b[K" + "\r" + line + "\x1b[K" + "\n"},
		{"pipe gets plain lines", false, line + "\n" + line + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			p := &ProgressPrinter{W: &buf, TTY: tt.tty}
			p.Print(snap)
			p.Print(snap)
			p.Finish()
			assert.Equal(t, tt.want, buf.String())
		})
	}
}

func TestProgressShowsErrorsOnlyWhenThereAreSome(t *testing.T) {
	s := Progress{Elapsed: time.Second, Unmatched: 2, ConnErrors: 1}
	assert.Contains(t, formatProgress(s), "unmatched 2  conn errors 1")
	assert.NotContains(t, formatProgress(Progress{}), "unmatched")
}
