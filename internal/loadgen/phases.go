package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/relayhub/relayhub/relay/protocol"
)

// Phase is one named stretch of a run, such as the minutes a benchmark
// keeps its target degraded. A run's phases follow each other from its
// start; Summary.Phases reports each apart.
type Phase struct {
	Name     string
	Duration time.Duration
}

// ParsePhase reads a phase written NAME=DURATION, as in healthy=120s.
func ParsePhase(s string) (Phase, error) {
	name, d, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return Phase{}, fmt.Errorf("phase %q: want NAME=DURATION", s)
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur <= 0 {
		return Phase{}, fmt.Errorf("phase %q: want a duration over 0 after the =", s)
	}
	return Phase{Name: name, Duration: dur}, nil
}

// Watch reads one figure of the server, such as the gauge of its
// concurrency limit. A run with Config.Watch calls it once a second.
type Watch func(ctx context.Context) (float64, error)

// watchTimeout bounds one reading, so a stalled server does not hold up
// the next.
const watchTimeout = 900 * time.Millisecond

// MetricWatch returns a Watch that reads the sample series, written as in
// the Prometheus text format (relay_bulkhead_limit{target="CORE"}), from
// the metrics page at url.
func MetricWatch(url, series string) Watch {
	client := &http.Client{}
	return func(ctx context.Context) (float64, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("%s: HTTP %d", url, resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			rest, ok := strings.CutPrefix(sc.Text(), series+" ")
			if !ok {
				continue
			}
			value, _, _ := strings.Cut(strings.TrimSpace(rest), " ") // a timestamp may follow
			return strconv.ParseFloat(value, 64)
		}
		if err := sc.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: no series %s", url, series)
	}
}

// Reading is one value of the Watch, taken At seconds into the run.
type Reading struct {
	At    float64 `json:"at"`
	Value float64 `json:"value"`
}

// timeline is the per-phase and per-second account of a run with Phases.
// It is guarded by its loadRun's histMu.
type timeline struct {
	ends     []int64 // ns since start at which each phase ends
	phases   []phaseAcc
	seconds  []map[string]int64 // answers by code, per second of due time
	readings []Reading
}

// phaseAcc is what the answers to one phase's requests add up to.
type phaseAcc struct {
	hist, okHist *hdrhistogram.Histogram
	codes        map[string]int64
}

func newTimeline(phases []Phase) *timeline {
	tl := &timeline{}
	var end time.Duration
	for _, p := range phases {
		end += p.Duration
		tl.ends = append(tl.ends, int64(end))
		tl.phases = append(tl.phases, phaseAcc{
			hist:   hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
			okHist: hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
			codes:  make(map[string]int64),
		})
	}
	return tl
}

// add counts one answer, with code and a latency of us µs, to the request
// that was due at (ns since start): in its phase, the last one if it was
// due after them all, and in its second.
func (tl *timeline) add(at, us int64, ok bool, code string) {
	i := min(len(tl.ends)-1, sortSearch(tl.ends, at))
	p := &tl.phases[i]
	_ = p.hist.RecordValue(us) // in range: the caller clamps it
	if ok {
		_ = p.okHist.RecordValue(us)
	}
	p.codes[code]++
	sec := int(max(at, 0) / int64(time.Second))
	for len(tl.seconds) <= sec {
		tl.seconds = append(tl.seconds, make(map[string]int64))
	}
	tl.seconds[sec][code]++
}

// sortSearch returns the index of the first end after at.
func sortSearch(ends []int64, at int64) int {
	i, found := slices.BinarySearch(ends, at)
	if found {
		i++
	}
	return i
}

// watchLoop reads the Watch once a second until done is closed, keeping
// each reading; a failed reading is left out.
func (r *loadRun) watchLoop(done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), watchTimeout)
		v, err := r.cfg.Watch(ctx)
		cancel()
		if err != nil {
			r.noteWatchError(err)
			continue
		}
		at := time.Since(r.start).Seconds()
		r.histMu.Lock()
		r.tl.readings = append(r.tl.readings, Reading{At: at, Value: v})
		r.histMu.Unlock()
	}
}

// noteWatchError keeps a failed reading's error as a sample; it is no
// connection error.
func (r *loadRun) noteWatchError(err error) {
	msg := "watch: " + err.Error()
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if !r.errSeen[msg] && len(r.errList) < maxErrorSamples {
		r.errSeen[msg] = true
		r.errList = append(r.errList, msg)
	}
}

// PhaseSummary is the report of one phase of a run: the answers to the
// requests that fell due in it. A plain value.
type PhaseSummary struct {
	Name         string           `json:"name"`
	StartSeconds float64          `json:"start_seconds"`
	Seconds      float64          `json:"seconds"`
	Answered     int64            `json:"answered"`
	Codes        map[string]int64 `json:"codes"`
	// Goodput is the 0000 answers per second of the phase.
	Goodput     float64        `json:"goodput"`
	LatencyUS   LatencySummary `json:"latency_us"`
	LatencyOKUS LatencySummary `json:"latency_ok_us"`
	// E905ClearSeconds is how long into the phase the bulkhead's refusals
	// stopped: the start of the first ClearRun seconds in a row each with
	// E905 under ClearShare of its answers. Nil when that never happened.
	E905ClearSeconds *float64 `json:"e905_clear_seconds"`
	// Watch sums up the Watch's readings in the phase; nil without any.
	Watch *WatchSummary `json:"watch,omitempty"`
}

// WatchSummary is what the Watch's readings did in one phase.
type WatchSummary struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	// Settled is the median of the phase's last SettleTail readings.
	Settled float64 `json:"settled"`
	// SettleSeconds is how long into the phase the readings came to stay
	// within SettleBand of Settled (at least 1 either side) to its end.
	SettleSeconds float64 `json:"settle_seconds"`
}

// The definitions of PhaseSummary's times.
const (
	ClearShare = 0.01
	ClearRun   = 5
	SettleTail = 10
	SettleBand = 0.1
)

// phaseSummaries reports each phase of cfg from the timeline.
func phaseSummaries(cfg Config, tl *timeline) []PhaseSummary {
	if tl == nil {
		return nil
	}
	var out []PhaseSummary
	var start time.Duration
	for i, p := range cfg.Phases {
		acc := tl.phases[i]
		s := PhaseSummary{
			Name:         p.Name,
			StartSeconds: start.Seconds(),
			Seconds:      p.Duration.Seconds(),
			Codes:        acc.codes,
			LatencyUS:    latencyPercentiles(acc.hist),
			LatencyOKUS:  latencyPercentiles(acc.okHist),
			Answered:     acc.hist.TotalCount(),
		}
		s.Goodput = float64(acc.codes[string(protocol.CodeOK)]) / s.Seconds
		first, last := int(start/time.Second), int((start+p.Duration)/time.Second)
		s.E905ClearSeconds = clearAfter(tl.seconds, first, last)
		s.Watch = summariseReadings(tl.readings, start.Seconds(), (start + p.Duration).Seconds())
		out = append(out, s)
		start += p.Duration
	}
	return out
}

// clearAfter returns the seconds from first until the first ClearRun
// seconds in a row, before last, each with E905 under ClearShare of its
// answers (a second without answers breaks the run); nil when none.
func clearAfter(seconds []map[string]int64, first, last int) *float64 {
	run := 0
	for s := first; s < min(last, len(seconds)); s++ {
		var n int64
		for _, c := range seconds[s] {
			n += c
		}
		if n == 0 || float64(seconds[s][string(protocol.CodeBulkheadFull)]) >= ClearShare*float64(n) {
			run = 0
			continue
		}
		run++
		if run == ClearRun {
			v := float64(s - ClearRun + 1 - first)
			return &v
		}
	}
	return nil
}

// summariseReadings sums up the readings taken in [from, to) seconds.
func summariseReadings(all []Reading, from, to float64) *WatchSummary {
	var in []Reading
	for _, r := range all {
		if r.At >= from && r.At < to {
			in = append(in, r)
		}
	}
	if len(in) == 0 {
		return nil
	}
	tail := make([]float64, 0, SettleTail)
	for _, r := range in[max(0, len(in)-SettleTail):] {
		tail = append(tail, r.Value)
	}
	slices.Sort(tail)
	w := &WatchSummary{Min: in[0].Value, Max: in[0].Value, Settled: tail[len(tail)/2]}
	band := max(SettleBand*w.Settled, 1)
	settled := 0 // the first reading of the last run in the band
	for i, r := range in {
		w.Min, w.Max = min(w.Min, r.Value), max(w.Max, r.Value)
		if r.Value < w.Settled-band || r.Value > w.Settled+band {
			settled = i + 1
		}
	}
	if settled > 0 {
		// The median of the tail is in the band, so settled is a reading.
		w.SettleSeconds = in[settled].At - from
	}
	return w
}

// errNoPhases is New's error for a Watch without Phases, whose readings
// would have nowhere to go.
var errNoPhases = errors.New("loadgen: a Watch needs Phases")

// writePhase prints one phase's lines of the text report.
func writePhase(w io.Writer, p PhaseSummary) {
	l := p.LatencyUS
	fmt.Fprintf(w, "phase %s\t%.0fs from %.0fs: %.1f 0000/s, p50 %s, p99 %s, codes %s\n",
		p.Name, p.Seconds, p.StartSeconds, p.Goodput, formatUS(l.P50), formatUS(l.P99), formatCodes(p.Codes))
	if p.E905ClearSeconds != nil {
		fmt.Fprintf(w, "  E905 clear\tafter %.0fs\n", *p.E905ClearSeconds)
	}
	if p.Watch != nil {
		fmt.Fprintf(w, "  watch\t%g to %g, settled at %g after %.1fs\n", p.Watch.Min, p.Watch.Max, p.Watch.Settled, p.Watch.SettleSeconds)
	}
}
