package main

import (
	"context"
	"encoding/json"
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
	"github.com/relayhub/relayhub/relay/reconcile"
)

// reconcileCmd is `relayctl reconcile`: its flags, filled by kong. Not for
// concurrent use.
type reconcileCmd struct {
	InDoubtLog  string        `name:"in-doubt-log" required:"" help:"The hub's in-doubt journal (its --in-doubt-log), or - for standard input." placeholder:"FILE" env:"RELAYCTL_IN_DOUBT_LOG"`
	JSON        bool          `name:"json" help:"Print the results, bad lines and summary as one JSON document." env:"RELAYCTL_JSON"`
	Timeout     time.Duration `help:"Limit on each look-up." default:"5s" env:"RELAYCTL_TIMEOUT"`
	Concurrency int           `help:"Look-ups at once." default:"4" env:"RELAYCTL_CONCURRENCY"`

	loadgen.TLSFlags `embed:"" envprefix:"RELAYCTL_"`
}

// Validate checks what the tags cannot.
func (c *reconcileCmd) Validate() error {
	switch {
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
// read; 2 when the journal cannot be read at all.
func (c *reconcileCmd) Run(ctx context.Context, s *streams) error {
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return cmdline.Exit(2, err)
	}
	in := s.In
	if c.InDoubtLog != "-" {
		f, err := os.Open(c.InDoubtLog)
		if err != nil {
			return cmdline.Exit(2, fmt.Errorf("--in-doubt-log: %w", err))
		}
		defer f.Close()
		in = f
	}
	entries, bad, err := reconcile.ReadJournal(in)
	if err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
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

// writeReconcile prints one line per transaction, the bad journal lines,
// then the summary.
func writeReconcile(w io.Writer, r reconcileReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTCOME\tTXID\tTARGET\tCODE\tLINE\tDETAIL")
	for _, res := range r.Results {
		line := strconv.Itoa(res.Line)
		for _, d := range res.Duplicates {
			line += "," + strconv.Itoa(d)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", outcomeWord(res.Outcome), res.TxID, res.Target,
			orDash(res.Code), line, reconcileDetail(res))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, b := range r.BadLines {
		fmt.Fprintf(w, "bad journal line %d: %s\n", b.Line, b.Error)
	}
	sum := r.Summary
	bad := ""
	if sum.BadLines > 0 {
		bad = fmt.Sprintf("; %d bad journal %s", sum.BadLines, plural(sum.BadLines, "line", "lines"))
	}
	_, err := fmt.Fprintf(w, "%d in doubt: %d applied, %d not applied, %d unknown%s\n",
		sum.InDoubt, sum.Applied, sum.NotApplied, sum.Unknown, bad)
	return err
}

// outcomeWord is an outcome as the table shows it.
func outcomeWord(o reconcile.Outcome) string {
	return strings.ReplaceAll(string(o), "_", " ")
}

// reconcileDetail is the target's answer of an applied transaction, or why
// an outcome is unknown.
func reconcileDetail(r reconcile.Result) string {
	switch {
	case r.Answer != nil:
		return strings.TrimSpace(r.Answer.Code + " " + r.Answer.Message)
	case r.Reason != "":
		return r.Reason
	}
	return "-"
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
