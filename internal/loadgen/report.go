package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// LatencySummary holds latency percentiles in microseconds; a plain value.
type LatencySummary struct {
	P50  int64   `json:"p50"`
	P90  int64   `json:"p90"`
	P99  int64   `json:"p99"`
	P999 int64   `json:"p99_9"`
	Max  int64   `json:"max"`
	Mean float64 `json:"mean"`
}

// latencyPercentiles reads the percentiles of a histogram of microseconds.
// An empty histogram gives zeros.
func latencyPercentiles(h *hdrhistogram.Histogram) LatencySummary {
	if h.TotalCount() == 0 {
		return LatencySummary{}
	}
	return LatencySummary{
		P50:  h.ValueAtQuantile(50),
		P90:  h.ValueAtQuantile(90),
		P99:  h.ValueAtQuantile(99),
		P999: h.ValueAtQuantile(99.9),
		Max:  h.Max(),
		Mean: h.Mean(),
	}
}

// Summary is the report of a load run, as printed and as JSON; a plain
// value, built by Generator.Summary.
type Summary struct {
	Addr           string         `json:"addr"`
	Protocol       string         `json:"protocol"`
	Conns          int            `json:"conns"`
	Depth          int            `json:"depth"`
	Rate           float64        `json:"rate"`
	Mix            string         `json:"mix"`
	Sent           int64          `json:"sent"`
	Answered       int64          `json:"answered"`
	ElapsedSeconds float64        `json:"elapsed_seconds"`
	Throughput     float64        `json:"throughput"`
	LatencyUS      LatencySummary `json:"latency_us"`
	// LatencyOKUS covers only the answers that say the target processed
	// the transaction (0000 or Bnnn); OKAnswered counts them.
	LatencyOKUS  LatencySummary              `json:"latency_ok_us"`
	OKAnswered   int64                       `json:"ok_answered"`
	Codes        map[string]int64            `json:"codes"`
	TargetCodes  map[string]map[string]int64 `json:"target_codes"`
	Unmatched    int64                       `json:"unmatched"`
	Malformed    int64                       `json:"malformed"`
	Missing      int64                       `json:"missing"`
	ConnErrors   int64                       `json:"conn_errors"`
	ErrorSamples []string                    `json:"error_samples,omitempty"`
	ServerCPU    []CPUSummary                `json:"server_cpu,omitempty"`
	ClientCPU    CPUSummary                  `json:"client_cpu"`
	// MachineBusyCores is how many CPUs the whole machine kept busy on
	// average during the run: the servers, this tool, and anything else.
	MachineBusyCores float64 `json:"machine_busy_cores"`
	// Phases reports each of Config.Phases; Series counts the answers by
	// code per second of the run (by due time), and Readings are the
	// Watch's. All three are empty without Phases.
	Phases   []PhaseSummary     `json:"phases,omitempty"`
	Series   []map[string]int64 `json:"series,omitempty"`
	Readings []Reading          `json:"readings,omitempty"`
}

// CPUSummary is the CPU time one process used during a run; a plain value.
// The times have the 10ms resolution of /proc/PID/stat.
type CPUSummary struct {
	PID         int     `json:"pid"`
	Seconds     float64 `json:"seconds"`
	PerAnswer   float64 `json:"us_per_answer"` // µs of CPU per answer
	Utilisation float64 `json:"cores"`         // CPU seconds per elapsed second
}

// newCPUSummary relates a CPU time to a run's answers and elapsed time.
func newCPUSummary(pid int, cpu time.Duration, answered int64, elapsed time.Duration) CPUSummary {
	s := CPUSummary{PID: pid, Seconds: cpu.Seconds()}
	if answered > 0 {
		s.PerAnswer = cpu.Seconds() * 1e6 / float64(answered)
	}
	if elapsed > 0 {
		s.Utilisation = cpu.Seconds() / elapsed.Seconds()
	}
	return s
}

// newSummary builds the report of a run.
func newSummary(cfg Config, res *Result) Summary {
	s := Summary{
		Addr:           cfg.Addr,
		Protocol:       cfg.Protocol.String(),
		Conns:          cfg.Conns,
		Depth:          cfg.Depth,
		Rate:           cfg.Rate,
		Mix:            cfg.Mix.String(),
		Sent:           res.Sent,
		Answered:       res.Answered,
		ElapsedSeconds: res.Elapsed.Seconds(),
		LatencyUS:      latencyPercentiles(res.Hist),
		Codes:          make(map[string]int64),
		TargetCodes:    make(map[string]map[string]int64),
		Unmatched:      res.Unmatched,
		Malformed:      res.Malformed,
		Missing:        res.Missing,
		ConnErrors:     res.ConnErrors,
		ErrorSamples:   res.ErrorSamples,
	}
	if res.Elapsed > 0 {
		s.Throughput = float64(res.Answered) / res.Elapsed.Seconds()
	}
	if res.OKHist != nil {
		s.LatencyOKUS = latencyPercentiles(res.OKHist)
		s.OKAnswered = res.OKHist.TotalCount()
	}
	for _, u := range res.ServerCPU {
		s.ServerCPU = append(s.ServerCPU, newCPUSummary(u.PID, u.CPU, res.Answered, res.Elapsed))
	}
	s.ClientCPU = newCPUSummary(os.Getpid(), res.ClientCPU, res.Answered, res.Elapsed)
	if res.MeterWall > 0 {
		s.MachineBusyCores = res.MachineBusy.Seconds() / res.MeterWall.Seconds()
	}
	s.Phases = phaseSummaries(cfg, res.timeline)
	if res.timeline != nil {
		s.Series, s.Readings = res.timeline.seconds, res.timeline.readings
	}
	for i, e := range cfg.Mix.entries {
		tc := make(map[string]int64)
		for code, n := range res.Codes[i] {
			tc[code] += n
			s.Codes[code] += n
		}
		s.TargetCodes[e.Target] = tc
	}
	return s
}

// problems returns a one-line account of what makes the run fail (unmatched
// or missing answers, malformed lines, connection errors), or "" when
// there is nothing.
func (s Summary) Problems() string {
	var p []string
	add := func(n int64, what string) {
		if n > 0 {
			p = append(p, strconv.FormatInt(n, 10)+" "+what)
		}
	}
	add(s.Unmatched, "unmatched answers")
	add(s.Missing, "missing answers")
	add(s.Malformed, "malformed answer lines")
	add(s.ConnErrors, "connection errors")
	return strings.Join(p, ", ")
}

// WriteJSON prints the report as one indented JSON object, for scripts.
func (s Summary) WriteJSON(w io.Writer) error {
	return writeJSON(w, s)
}

// writeJSON prints v as one indented JSON object.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Report is the report of a run of any kind: Summary, IdleSummary,
// ConnectSummary.
type Report interface {
	// WriteJSON prints the report as one indented JSON object.
	WriteJSON(w io.Writer) error
	// WriteText prints the report for a person.
	WriteText(w io.Writer) error
	// Problems returns a one-line account of what makes the run fail, or
	// "" when nothing does.
	Problems() string
}

var (
	_ Report = Summary{}
	_ Report = IdleSummary{}
	_ Report = ConnectSummary{}
)

// Print writes r to w, as JSON when asJSON, and returns r's Problems, for
// the command to exit on.
func Print(w io.Writer, r Report, asJSON bool) (problems string, err error) {
	if asJSON {
		err = r.WriteJSON(w)
	} else {
		err = r.WriteText(w)
	}
	return r.Problems(), err
}

// WriteText prints the report for a person.
func (s Summary) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mode := "closed loop"
	if s.Rate > 0 {
		mode = "rate " + strconv.FormatFloat(s.Rate, 'f', -1, 64) + "/s"
	}
	if s.Protocol != "" && s.Protocol != ProtocolRelay.String() {
		mode += ", protocol " + s.Protocol
	}
	fmt.Fprintf(tw, "target\t%s, %d conns, depth %d, %s, mix %s\n", s.Addr, s.Conns, s.Depth, mode, s.Mix)
	fmt.Fprintf(tw, "requests\tsent %d, answered %d in %.3fs\n", s.Sent, s.Answered, s.ElapsedSeconds)
	fmt.Fprintf(tw, "throughput\t%.1f answers/s\n", s.Throughput)
	l := s.LatencyUS
	fmt.Fprintf(tw, "latency\tp50 %s, p90 %s, p99 %s, p99.9 %s, max %s\n",
		formatUS(l.P50), formatUS(l.P90), formatUS(l.P99), formatUS(l.P999), formatUS(l.Max))
	if s.OKAnswered > 0 && s.OKAnswered < s.Answered {
		l := s.LatencyOKUS
		fmt.Fprintf(tw, "  0000/Bnnn\tp50 %s, p90 %s, p99 %s, p99.9 %s, max %s\n",
			formatUS(l.P50), formatUS(l.P90), formatUS(l.P99), formatUS(l.P999), formatUS(l.Max))
	}
	fmt.Fprintf(tw, "codes\t%s\n", formatCodes(s.Codes))
	if len(s.TargetCodes) > 1 {
		for _, name := range slices.Sorted(maps.Keys(s.TargetCodes)) {
			fmt.Fprintf(tw, "  %s\t%s\n", name, formatCodes(s.TargetCodes[name]))
		}
	}
	fmt.Fprintf(tw, "errors\tunmatched %d, missing %d, malformed %d, connection %d\n",
		s.Unmatched, s.Missing, s.Malformed, s.ConnErrors)
	for _, e := range s.ErrorSamples {
		fmt.Fprintf(tw, "  error\t%s\n", e)
	}
	for _, c := range s.ServerCPU {
		fmt.Fprintf(tw, "server cpu\tpid %d: %.2fs, %.2f cores, %.2fµs per answer\n", c.PID, c.Seconds, c.Utilisation, c.PerAnswer)
	}
	if s.ClientCPU.Seconds > 0 {
		fmt.Fprintf(tw, "load cpu\t%.2fs, %.2f cores, %.2fµs per answer\n", s.ClientCPU.Seconds, s.ClientCPU.Utilisation, s.ClientCPU.PerAnswer)
	}
	if s.MachineBusyCores > 0 {
		fmt.Fprintf(tw, "machine\t%.2f cores busy, all processes\n", s.MachineBusyCores)
	}
	for _, p := range s.Phases {
		writePhase(tw, p)
	}
	return tw.Flush()
}

// formatCodes prints code counts in code order, "0000 812, B201 3"; "none"
// when empty.
func formatCodes(codes map[string]int64) string {
	if len(codes) == 0 {
		return "none"
	}
	parts := make([]string, 0, len(codes))
	for _, c := range slices.Sorted(maps.Keys(codes)) {
		parts = append(parts, c+" "+strconv.FormatInt(codes[c], 10))
	}
	return strings.Join(parts, ", ")
}

// formatUS prints a latency given in microseconds with a readable unit:
// 87µs, 1.204ms, 2.5s.
func formatUS(us int64) string {
	return (time.Duration(us) * time.Microsecond).String()
}

// ProgressPrinter prints the live progress line of a run; its Print is
// what Config.Progress wants. On a terminal it rewrites one line in place;
// elsewhere (a log file, CI) it prints one line per tick. It is called
// from one goroutine at a time, which is all it supports.
type ProgressPrinter struct {
	// W is where the lines go: the diagnostics stream, so a summary on
	// the output stream stays clean.
	W io.Writer
	// TTY says W is a terminal.
	TTY bool

	printed bool
}

// Print writes one progress line.
func (p *ProgressPrinter) Print(s Progress) {
	line := formatProgress(s)
	if p.TTY {
		// \r returns to the start of the line and \x1b[K clears what a
		// longer previous line left behind.
		fmt.Fprintf(p.W, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(p.W, line)
	}
	p.printed = true
}

// Finish ends the progress line on a terminal, so the summary starts on a
// fresh line.
func (p *ProgressPrinter) Finish() {
	if p.TTY && p.printed {
		fmt.Fprintln(p.W)
	}
}

// formatProgress renders one progress line.
func formatProgress(s Progress) string {
	line := fmt.Sprintf("%5.1fs  sent %d  answered %d  %.0f/s  p99 %s",
		s.Elapsed.Seconds(), s.Sent, s.Answered, s.Rate, s.P99)
	if s.Unmatched > 0 || s.ConnErrors > 0 {
		line += fmt.Sprintf("  unmatched %d  conn errors %d", s.Unmatched, s.ConnErrors)
	}
	return line
}
