package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// reconcileCmd is `relayctl reconcile`: its flags, filled by kong. Not for
// concurrent use.
type reconcileCmd struct {
	InDoubtLog  []string      `name:"in-doubt-log" help:"The hub's in-doubt journal (its --in-doubt-log), gzipped or not, or - for standard input; repeat for more, or give files as arguments: a journal and its rotated files are reconciled together." placeholder:"FILE" sep:"none" env:"RELAYCTL_IN_DOUBT_LOG"`
	Files       []string      `arg:"" optional:"" name:"file" help:"More journal files, as --in-doubt-log."`
	JSON        bool          `name:"json" help:"Print the results, bad lines and summary as one JSON document." env:"RELAYCTL_JSON"`
	Timeout     time.Duration `help:"Limit on each look-up." default:"5s" env:"RELAYCTL_TIMEOUT"`
	Concurrency int           `help:"Look-ups at once." default:"4" env:"RELAYCTL_CONCURRENCY"`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYCTL_"`
}

// Validate checks what the tags cannot.
func (c *reconcileCmd) Validate() error {
	switch {
	case len(c.InDoubtLog)+len(c.Files) == 0:
		return errors.New("name the in-doubt journal: --in-doubt-log FILE, FILE arguments, or - for standard input")
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	case c.Concurrency <= 0:
		return fmt.Errorf("--concurrency %d: want more than 0", c.Concurrency)
	}
	return nil
}

// reconcileReport is the --json document. A plain value.
type reconcileReport struct {
	Results  []reconcile.Result  `json:"results"`
	BadLines []reconcile.BadLine `json:"bad_lines"`
	Summary  reconcile.Summary   `json:"summary"`
}

// Run reads the journal, asks each target about each transaction in it and
// prints what it found. Exit status 0 when every transaction is known,
// applied or not; 1 when any is unknown or a journal line could not be
// read (a torn write's fragment, skipped, is not such a line); 2 when the
// journal cannot be read at all.
func (c *reconcileCmd) Run(ctx context.Context, s *streams) error {
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return cmdline.Exit(2, err)
	}
	entries, bad, err := c.readJournals(s.In)
	if err != nil {
		return cmdline.Exit(2, err)
	}
	checker := reconcile.New(reconcile.Config{
		Client:      &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}},
		Timeout:     c.Timeout,
		Concurrency: c.Concurrency,
	})
	results := checker.Check(ctx, entries)
	report := reconcileReport{Results: results, BadLines: bad, Summary: reconcile.Summarize(results, bad)}
	if report.Results == nil {
		report.Results = []reconcile.Result{}
	}
	if report.BadLines == nil {
		report.BadLines = []reconcile.BadLine{}
	}
	if c.JSON {
		enc := json.NewEncoder(s.Out)
		enc.SetIndent("", "  ")
		err = enc.Encode(report)
	} else {
		err = writeReconcile(s.Out, report)
	}
	if err != nil {
		return err
	}
	if !report.Summary.Settled() {
		return cmdline.Exit(1, nil)
	}
	return nil
}

// readJournals reads every journal file named, in the order given, or in
// from standard input for "-". With more than one file, each entry and bad
// line says which file it is in.
func (c *reconcileCmd) readJournals(in io.Reader) ([]reconcile.Entry, []reconcile.BadLine, error) {
	paths := append(append([]string{}, c.InDoubtLog...), c.Files...)
	var entries []reconcile.Entry
	var bad []reconcile.BadLine
	for _, path := range paths {
		e, b, err := readJournal(path, in)
		if err != nil {
			return nil, nil, fmt.Errorf("--in-doubt-log %s: %w", path, err)
		}
		if len(paths) > 1 {
			for i := range e {
				e[i].File = path
			}
			for i := range b {
				b[i].File = path
			}
		}
		entries, bad = append(entries, e...), append(bad, b...)
	}
	return entries, bad, nil
}

// readJournal reads the journal file at path, or in for "-".
func readJournal(path string, in io.Reader) ([]reconcile.Entry, []reconcile.BadLine, error) {
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		in = f
	}
	return reconcile.ReadJournal(in)
}

// writeReconcile prints one line per transaction, the bad journal lines,
// then the summary.
func writeReconcile(w io.Writer, r reconcileReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTCOME\tTXID\tTARGET\tCODE\tLINE\tDETAIL")
	for _, res := range r.Results {
		line := place(res.File, res.Line)
		for i, d := range res.Duplicates {
			file := ""
			if i < len(res.DuplicateFiles) {
				file = res.DuplicateFiles[i]
			}
			line += "," + place(file, d)
		}
		code := res.Code
		if rv := res.Resolved; rv != nil {
			if rv.File != res.File || rv.Line != res.Line {
				line += "," + place(rv.File, rv.Line)
			}
			if indoubt.IsResolution(res.Stage) {
				// No in-doubt line in the journal: what the client got
				// then is not known, and the code is in DETAIL.
				code = ""
			}
		}
		if ex := res.Expired; ex != nil && (ex.File != res.File || ex.Line != res.Line) {
			line += "," + place(ex.File, ex.Line)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", outcomeWord(res.Outcome), res.TxID, res.Target,
			orDash(code), line, reconcileDetail(res))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range r.BadLines {
		if b.Fragment {
			fmt.Fprintf(w, "torn journal line %s skipped: %s\n", place(b.File, b.Line), b.Error)
		} else {
			fmt.Fprintf(w, "bad journal line %s: %s\n", place(b.File, b.Line), b.Error)
		}
	}
	sum := r.Summary
	bad := ""
	if sum.BadLines > 0 {
		bad = fmt.Sprintf("; %d bad journal %s", sum.BadLines, plural(sum.BadLines, "line", "lines"))
	}
	if sum.Fragments > 0 {
		bad += fmt.Sprintf("; %d torn %s skipped", sum.Fragments, plural(sum.Fragments, "fragment", "fragments"))
	}
	resolved, reversed := "", ""
	if sum.Resolved > 0 {
		resolved = fmt.Sprintf(" (%d resolved in the journal)", sum.Resolved)
	}
	if sum.Reversed > 0 {
		reversed = fmt.Sprintf(", %d reversed", sum.Reversed)
	}
	if sum.Expired > 0 {
		bad = fmt.Sprintf("; %d given up by the hub", sum.Expired) + bad
	}
	_, err := fmt.Fprintf(w, "%d in doubt: %d applied%s, %d not applied%s, %d unknown%s\n",
		sum.InDoubt, sum.Applied, resolved, sum.NotApplied, reversed, sum.Unknown, bad)
	return err
}

// place is a journal line's number, after its file and a colon when the
// journal was read from more than one file.
func place(file string, line int) string {
	if file == "" {
		return strconv.Itoa(line)
	}
	return file + ":" + strconv.Itoa(line)
}

// outcomeWord is an outcome as the table shows it.
func outcomeWord(o reconcile.Outcome) string {
	return strings.ReplaceAll(string(o), "_", " ")
}

// reconcileDetail is the target's answer of an applied transaction, and
// who learnt it when a hub did on a resend, or why an outcome is unknown.
func reconcileDetail(r reconcile.Result) string {
	switch {
	case r.Resolved != nil:
		code := "-"
		if r.Answer != nil {
			code = orDash(r.Answer.Code)
		}
		return fmt.Sprintf("%s, resolved %s by %s at %s", code, viaWords(r.Resolved.Via),
			orDash(r.Resolved.Hub), r.Resolved.Time.UTC().Format(indoubt.TimeFormat))
	case r.Expired != nil && r.Answer != nil:
		return strings.TrimSpace(r.Answer.Code+" "+r.Answer.Message) + "; the hub gave up at " + r.Expired.Time.UTC().Format(indoubt.TimeFormat)
	case r.Expired != nil:
		return strings.TrimSpace(r.Reason + "; the hub gave up at " + r.Expired.Time.UTC().Format(indoubt.TimeFormat))
	case r.Answer != nil:
		return strings.TrimSpace(r.Answer.Code + " " + r.Answer.Message)
	case r.Reason != "":
		return r.Reason
	}
	return "-"
}

// viaWords says how a resolution was learnt, for the DETAIL column.
func viaWords(via string) string {
	switch via {
	case indoubt.ViaResend, "":
		return "on resend"
	case indoubt.ViaLookup:
		return "by look-up"
	case indoubt.ViaLateAnswer:
		return "by a late answer"
	case indoubt.ViaReversal:
		return "by reversal"
	case indoubt.ViaOperator:
		return "by an operator"
	}
	return "via " + via
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
