package replay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/relay"
)

// Report is what a Run found. It is a plain value once Run has returned.
// WriteJSON writes it with the names of its json tags.
type Report struct {
	// Sources are the sources read, in order.
	Sources []SourceReport `json:"sources"`
	// First and Last are the earliest and latest times of the lines read;
	// zero when no line had one.
	First time.Time `json:"first,omitzero"`
	Last  time.Time `json:"last,omitzero"`
	// Lines is how many lines were read; Requests how many of them reached
	// a breaker and were replayed; NoBreaker how many reached none (E900,
	// E903, E906, and E907 in an older log).
	Lines     int64 `json:"lines"`
	Requests  int64 `json:"requests"`
	NoBreaker int64 `json:"no_breaker"`
	// Approximate is how many of the Requests came from lines of a hub
	// that did not yet write what its breaker did: they are placed by the
	// time of their answer, to the millisecond, and their probes are not
	// known.
	Approximate int64 `json:"approximate"`
	// Synthetic is how many lines were the hub's own synthetic probes:
	// replayed as the breakers' own probes with a probe payload in the
	// settings, skipped without; never counted as Requests.
	Synthetic int64 `json:"synthetic"`
	// Malformed is how many lines were skipped as not access log lines;
	// MalformedLines lists the first of them, with why.
	Malformed      int64       `json:"malformed"`
	MalformedLines []LineError `json:"malformed_lines"`
	// Late is how many lines were skipped because their moment came more
	// than the reorder window before a line read earlier; LateLines lists
	// the first of them.
	Late      int64       `json:"late"`
	LateLines []LineError `json:"late_lines"`
	// Logged is what the log says the hub did, per target, with failures
	// judged by the first set's settings.
	Logged []TargetStats `json:"logged"`
	// Sets are the replays, one per set of settings, in Config order.
	Sets []SetReport `json:"sets"`
}

// SourceReport is one source read. A plain value.
type SourceReport struct {
	Name string `json:"name"`
	// Lines is how many lines were read from it.
	Lines int64 `json:"lines"`
	// Error, when not empty, is why it could not be read to its end (a
	// truncated gzip file); the lines before were replayed.
	Error string `json:"error,omitempty"`
}

// SetReport is the replay with one set of settings. A plain value.
type SetReport struct {
	Name string `json:"name"`
	// Settings are the settings each target ran with, as
	// Settings.Describe writes them.
	Settings []TargetSettings `json:"settings"`
	// Transitions are the breakers' state changes, in the order they
	// happened: the breaker log the hub would have written. In JSON, each
	// is its breaker log line.
	Transitions []breaker.Transition
	// Targets are the counts per target.
	Targets []TargetStats `json:"targets"`
}

// MarshalJSON implements json.Marshaler: the transitions are breaker log
// lines.
func (s SetReport) MarshalJSON() ([]byte, error) {
	lines := make([]string, len(s.Transitions))
	for i, t := range s.Transitions {
		line := breakerlog.AppendLine(nil, t)
		lines[i] = string(line[:len(line)-1])
	}
	return marshal(struct {
		Name        string           `json:"name"`
		Settings    []TargetSettings `json:"settings"`
		Transitions []string         `json:"transitions"`
		Targets     []TargetStats    `json:"targets"`
	}{s.Name, s.Settings, lines, s.Targets})
}

// marshal is json.Marshal without the escapes for HTML, which would turn
// a transition's "->" into "-\u003e".
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

// TargetSettings is one target's settings in a SetReport. A plain value.
type TargetSettings struct {
	Target   string `json:"target"`
	Settings string `json:"settings"`
}

// TargetStats counts what one target's breaker did in a replay, or (in
// Report.Logged) what the log says the hub did. A plain value.
type TargetStats struct {
	Target string `json:"target"`
	// Requests is how many requests named the target.
	Requests int64 `json:"requests"`
	// Calls is how many calls the target's breaker admitted (including
	// requests of a target it is the fallback of) and were made.
	Calls int64 `json:"calls"`
	// Failed is how many of the Calls its breaker counted as failures: a
	// failure code, or slower than slow_call. They reached a sick target.
	Failed int64 `json:"failed"`
	// Inferred is how many of the Calls the hub did not make, so that
	// their outcome is the target's previous one.
	Inferred int64 `json:"inferred"`
	// Refused is how many of the Requests were answered E904.
	Refused int64 `json:"refused"`
	// HandedBack is how many admissions were handed back unused: E905 for
	// a full bulkhead, E907.
	HandedBack int64 `json:"handed_back"`
	// ToFallback is how many of the Requests the target's breaker refused
	// and its fallback took.
	ToFallback int64 `json:"to_fallback"`
	// Probes is how many half-open probes its breaker admitted.
	Probes int64 `json:"probes"`
	// Opened is how many times its breaker opened; NotClosed how long it
	// was open or half-open, up to the last time of the log (in JSON,
	// not_closed_seconds). Neither is in the access log, so both are zero
	// in Report.Logged.
	Opened    int64         `json:"opened"`
	NotClosed time.Duration `json:"-"`
}

// MarshalJSON implements json.Marshaler: NotClosed is in seconds.
func (s TargetStats) MarshalJSON() ([]byte, error) {
	type plain TargetStats
	return marshal(struct {
		plain
		NotClosedSeconds float64 `json:"not_closed_seconds"`
	}{plain(s), s.NotClosed.Seconds()})
}

// stat is one row of the text report: a name and how to read it. A plain
// value.
type stat struct {
	name   string
	logged bool // the row has a value in the logged column
	value  func(TargetStats) string
}

var stats = []stat{
	{"requests", true, func(s TargetStats) string { return itoa(s.Requests) }},
	{"calls made", true, func(s TargetStats) string { return itoa(s.Calls) }},
	{"  failed (reached a sick target)", true, func(s TargetStats) string { return itoa(s.Failed) }},
	{"  outcome inferred", false, func(s TargetStats) string { return itoa(s.Inferred) }},
	{"refused E904", true, func(s TargetStats) string { return itoa(s.Refused) }},
	{"handed back E905", true, func(s TargetStats) string { return itoa(s.HandedBack) }},
	{"to fallback", true, func(s TargetStats) string { return itoa(s.ToFallback) }},
	{"probes", true, func(s TargetStats) string { return itoa(s.Probes) }},
	{"times opened", false, func(s TargetStats) string { return itoa(s.Opened) }},
	{"time open or half-open", false, func(s TargetStats) string { return s.NotClosed.Round(time.Millisecond).String() }},
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// targets returns the names of the targets to show: target alone, or every
// target of the replay in the order first met.
func (r *Report) targets(target string) []string {
	var names []string
	for _, s := range r.Logged {
		if target == "" || strings.EqualFold(s.Target, target) {
			names = append(names, s.Target)
		}
	}
	return names
}

// Has reports whether a request named the target, matched
// case-insensitively.
func (r *Report) Has(target string) bool {
	return len(r.targets(target)) > 0
}

// TargetNames returns the names of the targets that requests named, in
// the order first met.
func (r *Report) TargetNames() []string {
	return r.targets("")
}

// WriteText writes the report for people: what was read, each set's
// settings and transitions (in the breaker log's format), then per target
// a table of the logged counts beside each set's, and the lines skipped.
// With target not empty only that target is shown.
func (r *Report) WriteText(w io.Writer, target string) error {
	bw := &errWriter{w: w}
	r.writeSummary(bw)
	names := r.targets(target)
	for _, set := range r.Sets {
		fmt.Fprintf(bw, "\nsettings %s:\n", set.Name)
		for _, ts := range set.Settings {
			if contains(names, ts.Target) {
				fmt.Fprintf(bw, "  %s: %s\n", ts.Target, ts.Settings)
			}
		}
		shown := filter(set.Transitions, names, func(t breaker.Transition) string { return t.Name })
		fmt.Fprintf(bw, "transitions %s (%d):\n", set.Name, len(shown))
		var line []byte
		for _, t := range shown {
			line = breakerlog.AppendLine(line[:0], t)
			bw.Write(line)
		}
	}
	width := 0
	for _, st := range stats {
		width = max(width, len(st.name))
	}
	for _, name := range names {
		fmt.Fprintln(bw)
		// Every cell is right-aligned; the first column's are padded to
		// one width, so they read left-aligned.
		tw := tabwriter.NewWriter(bw, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "%-*s\tlogged\t", width, name)
		for _, set := range r.Sets {
			fmt.Fprintf(tw, "%s\t", set.Name)
		}
		fmt.Fprintln(tw)
		for _, st := range stats {
			fmt.Fprintf(tw, "%-*s\t", width, st.name)
			if st.logged {
				fmt.Fprintf(tw, "%s\t", st.value(r.logged(name)))
			} else {
				fmt.Fprint(tw, "-\t")
			}
			for _, set := range r.Sets {
				fmt.Fprintf(tw, "%s\t", st.value(set.target(name)))
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
	}
	r.writeSkipped(bw)
	return bw.err
}

func (r *Report) writeSummary(w io.Writer) {
	sources := "sources"
	if len(r.Sources) == 1 {
		sources = "source"
	}
	fmt.Fprintf(w, "read %d lines of %d %s", r.Lines, len(r.Sources), sources)
	if !r.First.IsZero() {
		fmt.Fprintf(w, ", %s to %s", r.First.Format(relay.TimeFormat), r.Last.Format(relay.TimeFormat))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  requests replayed through a breaker: %d\n", r.Requests)
	fmt.Fprintf(w, "  lines that reached no breaker (E900, E903, E906): %d\n", r.NoBreaker)
	if r.Synthetic > 0 {
		fmt.Fprintf(w, "  the hub's synthetic probes (replayed as the breakers' own with a probe_payload, else skipped): %d\n", r.Synthetic)
	}
	if r.Approximate > 0 {
		fmt.Fprintf(w, "  requests from lines without breaker fields, placed by their answer's millisecond, probes unknown: %d\n", r.Approximate)
	}
	if r.Malformed > 0 {
		fmt.Fprintf(w, "  malformed lines skipped: %d\n", r.Malformed)
	}
	if r.Late > 0 {
		fmt.Fprintf(w, "  lines skipped as later than the reorder window allows: %d\n", r.Late)
	}
	for _, s := range r.Sources {
		if s.Error != "" {
			fmt.Fprintf(w, "  %s: read stopped after line %d: %s\n", s.Name, s.Lines, s.Error)
		}
	}
}

func (r *Report) writeSkipped(w io.Writer) {
	for _, l := range []struct {
		what  string
		count int64
		lines []LineError
	}{
		{"malformed lines", r.Malformed, r.MalformedLines},
		{"late lines", r.Late, r.LateLines},
	} {
		if l.count == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%d, first %d):\n", l.what, l.count, len(l.lines))
		for _, e := range l.lines {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}

// logged returns the logged counts of the target name.
func (r *Report) logged(name string) TargetStats {
	for _, s := range r.Logged {
		if s.Target == name {
			return s
		}
	}
	return TargetStats{Target: name}
}

// target returns the counts of the target name.
func (s *SetReport) target(name string) TargetStats {
	for _, t := range s.Targets {
		if t.Target == name {
			return t
		}
	}
	return TargetStats{Target: name}
}

// errWriter keeps the first write error, so the report's many writes need
// one check. Not safe for concurrent use.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

// WriteJSON writes the report as one JSON object, for machines. With
// target not empty only that target's settings, transitions and counts
// are in it.
func (r *Report) WriteJSON(w io.Writer, target string) error {
	names := r.targets(target)
	out := *r
	out.Logged = filter(r.Logged, names, func(s TargetStats) string { return s.Target })
	out.Sets = make([]SetReport, len(r.Sets))
	for i, set := range r.Sets {
		out.Sets[i] = SetReport{
			Name:        set.Name,
			Settings:    filter(set.Settings, names, func(s TargetSettings) string { return s.Target }),
			Transitions: filter(set.Transitions, names, func(t breaker.Transition) string { return t.Name }),
			Targets:     filter(set.Targets, names, func(s TargetStats) string { return s.Target }),
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// filter returns the items whose target, as name tells, is one of names;
// never nil, so that JSON shows an empty list.
func filter[T any](items []T, names []string, name func(T) string) []T {
	out := []T{}
	for _, it := range items {
		if contains(names, name(it)) {
			out = append(out, it)
		}
	}
	return out
}
