package hubtest

import (
	"iter"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// MetricValue returns the value of the first series of the named family in
// g whose labels include the given name/value pairs: a counter's or
// gauge's value, a histogram's sample count. The test fails when there is
// no such series.
func MetricValue(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	for m := range series(t, g, name, labels) {
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// MetricSum adds up the counters of every series of the named family in g
// whose labels include the given name/value pairs; it is 0 when there is
// none.
func MetricSum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	sum := 0.0
	for m := range series(t, g, name, labels) {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// series gathers g and yields the series of the named family whose labels
// include the given name/value pairs.
func series(t testing.TB, g prometheus.Gatherer, name string, labels []string) iter.Seq[*dto.Metric] {
	t.Helper()
	families, err := g.Gather()
	require.NoError(t, err)
	return func(yield func(*dto.Metric) bool) {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		next:
			for _, m := range f.GetMetric() {
				for i := 0; i+1 < len(labels); i += 2 {
					if labelOf(m, labels[i]) != labels[i+1] {
						continue next
					}
				}
				if !yield(m) {
					return
				}
			}
		}
	}
}

// labelOf returns the value of m's label name, "" when it has none.
func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
