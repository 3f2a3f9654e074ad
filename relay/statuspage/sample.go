package statuspage

import (
	"math"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// The hub's metrics the page reads (docs/OPERATING.md, "Metrics").
const (
	metricRequests  = "relay_requests_total"
	metricDuration  = "relay_target_duration_seconds"
	metricFallbacks = "relay_fallbacks_total"
	labelTarget     = "target"
	labelCode       = "code"
)

// class is a kind of answer, as the page counts answers per second: a
// grouping of the code label values of relay_requests_total.
type class uint8

const (
	classOK       class = iota // 0000
	classRejected              // Bnnn and E400: the target answered and said no
	classFailed                // E500, E901, E902 and a target's own Ennn: the target failed
	classOpen                  // E904: the breaker refused
	classFull                  // E905: the bulkhead refused
	classHub                   // E906 and E907: the hub could not take or finish it
	numClasses
)

// classOfCode maps each code label value of relay_requests_total to its
// class; a value not listed is not counted.
var classOfCode = map[string]class{
	"0000": classOK,
	"Bnnn": classRejected,
	"E400": classRejected,
	"E500": classFailed,
	"E901": classFailed,
	"E902": classFailed,
	"Ennn": classFailed,
	"E904": classOpen,
	"E905": classFull,
	"E906": classHub,
	"E907": classHub,
}

// counters are one target's cumulative counts at one instant, as read from
// the hub's metrics. It is a plain value.
type counters struct {
	at time.Time
	// codes are relay_requests_total by code label value.
	codes map[string]float64
	// bounds and cumulative are the duration histogram's upper bounds in
	// seconds and its cumulative counts; calls is its total count, the
	// +Inf bucket.
	bounds, cumulative []float64
	calls              float64
	// fallbacks is relay_fallbacks_total: requests the target's breaker
	// refused that its fallback took.
	fallbacks float64
}

// classes returns c's answers by class.
func (c *counters) classes() [numClasses]float64 {
	var out [numClasses]float64
	for code, n := range c.codes {
		if k, ok := classOfCode[code]; ok {
			out[k] += n
		}
	}
	return out
}

// readCounters returns every target's counters from the hub's metric
// families, stamped at.
func readCounters(families []*dto.MetricFamily, at time.Time) map[string]*counters {
	out := make(map[string]*counters)
	get := func(m *dto.Metric) *counters {
		name := labelValue(m, labelTarget)
		c := out[name]
		if c == nil {
			c = &counters{at: at, codes: make(map[string]float64)}
			out[name] = c
		}
		return c
	}
	for _, f := range families {
		switch f.GetName() {
		case metricRequests:
			for _, m := range f.GetMetric() {
				get(m).codes[labelValue(m, labelCode)] += m.GetCounter().GetValue()
			}
		case metricDuration:
			for _, m := range f.GetMetric() {
				c, h := get(m), m.GetHistogram()
				c.calls = float64(h.GetSampleCount())
				c.bounds, c.cumulative = c.bounds[:0], c.cumulative[:0]
				for _, b := range h.GetBucket() {
					if math.IsInf(b.GetUpperBound(), 1) {
						continue
					}
					c.bounds = append(c.bounds, b.GetUpperBound())
					c.cumulative = append(c.cumulative, float64(b.GetCumulativeCount()))
				}
			}
		case metricFallbacks:
			for _, m := range f.GetMetric() {
				get(m).fallbacks += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// labelValue returns the value of m's label name, or "".
func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// rateWindow is how far back the per-second rates, the failure share and
// the latencies look.
const rateWindow = time.Minute

// sparkStep is the width of one bar of the answers sparkline.
const sparkStep = 5 * time.Second

// sparkBars is how many bars the sparkline has: HistorySpan in sparkSteps.
const sparkBars = int(HistorySpan / sparkStep)

// series is one target's sampled counters: those of the last rateWindow
// (one a second), and the answers of the last HistorySpan by class in
// sparkStep bars. Its memory is fixed. It is not safe for concurrent use.
type series struct {
	// recent holds the samples of the last rateWindow, oldest first.
	recent []*counters
	// bars are answers by class per sparkStep, keyed by the bar's index
	// (Unix time / sparkStep) modulo sparkBars; barAt says which index a
	// slot holds.
	bars  [sparkBars][numClasses]float64
	barAt [sparkBars]int64
}

// add appends the sample c and adds the answers since the previous sample
// to the bar of c's time.
func (s *series) add(c *counters) {
	if n := len(s.recent); n > 0 {
		prev, now := s.recent[n-1].classes(), c.classes()
		idx := c.at.UnixNano() / int64(sparkStep)
		slot := int(idx % int64(sparkBars))
		if s.barAt[slot] != idx {
			s.barAt[slot], s.bars[slot] = idx, [numClasses]float64{}
		}
		for k := range now {
			s.bars[slot][k] += max(now[k]-prev[k], 0)
		}
	}
	// The oldest sample kept is at most rateWindow old, give or take half
	// a tick's jitter, so the rates span the whole window.
	drop := 0
	for drop < len(s.recent) && c.at.Sub(s.recent[drop].at) > rateWindow+sampleInterval/2 {
		drop++
	}
	s.recent = append(s.recent[drop:], c)
}

// rates are one target's answers and calls over the last rateWindow (or
// less, when the page has sampled for less). It is a plain value; ok is
// false when there are not yet two samples a second apart.
type rates struct {
	ok     bool
	window time.Duration
	// perSecond is answers per second by class.
	perSecond [numClasses]float64
	// calls is the number of target calls that ended in the window, and
	// failed how many of them ended with one of failureCodes.
	calls, failed float64
	// fallbacksPerSecond is requests per second the target's fallback took.
	fallbacksPerSecond float64
	// p50 and p99 are the call duration quantiles in seconds; beyond says
	// the quantile is past the histogram's last bound, which it then is.
	// NaN when there were no calls.
	p50, p99             float64
	p50Beyond, p99Beyond bool
}

// rates returns the rates between the oldest and the latest sample held.
// failureCodes are the target's failure codes: the share of failed calls
// counts the code labels among them, and "Ennn" when any is a target's own
// code.
func (s *series) rates(failureCodes []string) rates {
	if len(s.recent) < 2 {
		return rates{}
	}
	old, cur := s.recent[0], s.recent[len(s.recent)-1]
	window := cur.at.Sub(old.at)
	if window < time.Second {
		return rates{}
	}
	r := rates{ok: true, window: window}
	secs := window.Seconds()
	a, b := old.classes(), cur.classes()
	for k := range r.perSecond {
		r.perSecond[k] = max(b[k]-a[k], 0) / secs
	}
	r.fallbacksPerSecond = max(cur.fallbacks-old.fallbacks, 0) / secs
	r.calls = max(cur.calls-old.calls, 0)
	for _, label := range failureLabels(failureCodes) {
		r.failed += max(cur.codes[label]-old.codes[label], 0)
	}
	r.p50, r.p50Beyond = histogramDelta(old, cur).quantile(0.5)
	r.p99, r.p99Beyond = histogramDelta(old, cur).quantile(0.99)
	return r
}

// failureLabels returns the code label values that count failed calls for
// a target with failureCodes: each of E400, E500, E901 and E902 that is a
// failure code, and "Ennn" when a target's own code is one (that label
// counts every other error code the target sent, so the share is then an
// upper bound).
func failureLabels(failureCodes []string) []string {
	var out []string
	own := false
	for _, code := range failureCodes {
		switch code {
		case "E400", "E500", "E901", "E902":
			out = append(out, code)
		default:
			own = true
		}
	}
	if own {
		out = append(out, "Ennn")
	}
	return out
}

// histogram is a duration histogram's counts over a span of time: the
// cumulative count at each upper bound, and the total.
type histogram struct {
	bounds, cumulative []float64
	total              float64
}

// histogramDelta returns the calls between old and cur by bucket. Buckets
// are never changed, so both samples have the same bounds (a sample taken
// before any call may have none, and counts as zero).
func histogramDelta(old, cur *counters) histogram {
	h := histogram{bounds: cur.bounds, cumulative: make([]float64, len(cur.cumulative)), total: cur.calls - old.calls}
	for i, n := range cur.cumulative {
		h.cumulative[i] = n
		if i < len(old.cumulative) {
			h.cumulative[i] -= old.cumulative[i]
		}
	}
	return h
}

// quantile returns the q-quantile of h as Prometheus's histogram_quantile
// does: linear within the bucket that holds it, from 0 for the first. When
// it lies beyond the last bound it returns that bound and beyond true. NaN
// when h is empty.
func (h histogram) quantile(q float64) (v float64, beyond bool) {
	if h.total <= 0 {
		return math.NaN(), false
	}
	rank := q * h.total
	lower, below := 0.0, 0.0
	for i, upper := range h.bounds {
		if n := h.cumulative[i]; n >= rank {
			if n == below {
				return upper, false
			}
			return lower + (upper-lower)*(rank-below)/(n-below), false
		}
		lower, below = upper, h.cumulative[i]
	}
	if len(h.bounds) == 0 {
		return math.NaN(), false
	}
	return h.bounds[len(h.bounds)-1], true
}

// spark returns the answers per second by class of the sparkBars bars
// that end with the one holding now, oldest first. The last bar is still
// filling: its rate is over the part of it that has passed.
func (s *series) spark(now time.Time) [sparkBars][numClasses]float64 {
	var out [sparkBars][numClasses]float64
	last := now.UnixNano() / int64(sparkStep)
	for i := range out {
		idx := last - int64(sparkBars-1-i)
		slot := int(idx % int64(sparkBars))
		if s.barAt[slot] != idx {
			continue
		}
		secs := sparkStep.Seconds()
		if i == sparkBars-1 {
			secs = max(time.Duration(now.UnixNano()-idx*int64(sparkStep)).Seconds(), 1)
		}
		for k, n := range s.bars[slot] {
			out[i][k] = n / secs
		}
	}
	return out
}
