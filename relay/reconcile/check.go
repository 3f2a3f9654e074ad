package reconcile

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// Defaults of Config.
const (
	DefaultTimeout     = targethttp.DefaultStatusTimeout
	DefaultConcurrency = 4
)

// Outcome is what reconciliation found out about one transaction: the
// target's own word on it, or Unknown.
type Outcome = targethttp.Outcome

// Outcomes.
const (
	// Applied: the target says it applied the transaction; Answer is the
	// answer it gave (a Bnnn answer means it was processed and rejected).
	// It said so to the look-up, or to a hub when the client resent the
	// transaction (Result.Resolved).
	Applied = targethttp.Applied
	// NotApplied: the target says it never applied the transaction.
	NotApplied = targethttp.NotApplied
	// Unknown: the target could not be asked, or answered something that
	// is not a look-up answer for this transaction; Reason says which.
	Unknown = targethttp.Unknown
	// Reversed: a hub reversed the transaction (resolved_reversed); a
	// resend must use a new TXID. Only the journal says so: a look-up
	// cannot tell a reversed transaction from one never applied.
	Reversed Outcome = "reversed"
)

// Answer is a target's recorded answer to a transaction. A plain value.
type Answer = targethttp.Answer

// Result is what reconciliation found for one in-doubt transaction. A
// plain value.
type Result struct {
	// Entry is the transaction's first in-doubt line in the journal, or
	// its resolution when the journal has no in-doubt line for it (rotated
	// away, or in another hub's journal).
	Entry
	// Outcome is applied, not_applied or unknown.
	Outcome Outcome `json:"outcome"`
	// Answer is the target's answer, when Applied. For a transaction
	// resolved by a hub it has the code only: the journal keeps no
	// message.
	Answer *Answer `json:"answer,omitempty"`
	// Reason says why the outcome is Unknown.
	Reason string `json:"reason,omitempty"`
	// Resolved is set when the journal has a resolution line for the
	// transaction (resolved_applied, resolved_not_applied or
	// resolved_reversed): a hub or an operator settled it, so it was not
	// looked up.
	Resolved *Resolution `json:"resolved,omitempty"`
	// Expired is set when the journal has an unresolved_expired line for
	// the transaction: a hub gave up on it, and it was looked up.
	Expired *Resolution `json:"expired,omitempty"`
	// Duplicates lists the transaction's other journal lines, in-doubt
	// lines and further resolutions, which were settled once with this
	// one.
	Duplicates []int `json:"duplicates,omitempty"`
	// DuplicateFiles is the journal file of each of Duplicates, when the
	// journal was read from more than one file.
	DuplicateFiles []string `json:"duplicate_files,omitempty"`
}

// Resolution is where, how and by whom a transaction in doubt was
// resolved, or given up on. The code the target recorded, if any, is the
// Result's Answer. A plain value.
type Resolution struct {
	// File and Line are the resolution line's place in the journal, as
	// Entry's.
	File string `json:"file,omitempty"`
	Line int    `json:"line"`
	// Time is when the hub resolved it, and Hub which hub did.
	Time time.Time `json:"time"`
	Hub  string    `json:"hub"`
	// Via is how it was learnt: resend, lookup, late_answer, reversal or
	// operator.
	Via string `json:"via,omitempty"`
}

// Config configures a Checker. The zero value is usable.
type Config struct {
	// Client makes the look-ups. Nil means a client with its own transport
	// and no TLS settings beyond the system's roots.
	Client *http.Client
	// Timeout bounds each look-up. Zero means DefaultTimeout.
	Timeout time.Duration
	// Concurrency is how many look-ups run at once. Zero means
	// DefaultConcurrency.
	Concurrency int
}

// Checker asks targets about in-doubt transactions. It is safe for
// concurrent use.
type Checker struct {
	status      *targethttp.StatusClient
	concurrency int
}

// New returns a Checker configured by cfg.
func New(cfg Config) *Checker {
	c := &Checker{
		status:      targethttp.NewStatusClient(targethttp.StatusConfig{Client: cfg.Client, Timeout: cfg.Timeout}),
		concurrency: cfg.Concurrency,
	}
	if c.concurrency <= 0 {
		c.concurrency = DefaultConcurrency
	}
	return c
}

// Check returns one result per distinct target URL and txid, in journal
// order (of each transaction's first line); another line for the same
// transaction is listed in its result's Duplicates (and its file in
// DuplicateFiles, when entries have a File), whatever the file it is in.
// A transaction with a resolution line (resolved_applied,
// resolved_not_applied or resolved_reversed), before or after its
// in-doubt lines or without any, is settled by the first such line, its
// Resolved, and its target is not asked. Every other transaction is
// looked up, Concurrency at a time, an expired one (unresolved_expired,
// kept in Expired) too; when ctx ends, those not done are Unknown.
func (c *Checker) Check(ctx context.Context, entries []Entry) []Result {
	type key struct{ url, txid string }
	index := make(map[key]int, len(entries))
	var results []Result
	for _, e := range entries {
		k := key{strings.TrimRight(e.URL, "/"), e.TxID}
		i, seen := index[k]
		if !seen {
			i = len(results)
			index[k] = i
			results = append(results, Result{Entry: e})
		}
		results[i].add(e, !seen)
	}
	c.lookupAll(ctx, results)
	return results
}

// add takes e, a line of r's transaction, into r; first says it is the
// line r was made from.
func (r *Result) add(e Entry, first bool) {
	switch {
	case settles(e.Stage) && r.Resolved == nil:
		r.resolve(e)
	case e.Stage == StageUnresolvedExpired && r.Expired == nil:
		r.Expired = resolution(e)
	case first:
	case !indoubt.IsResolution(e.Stage) && indoubt.IsResolution(r.Stage):
		// The resolution came first (files given out of order, or
		// another hub's journal first): the result is about the call
		// in doubt, and the resolution stays in Resolved or Expired.
		r.Entry = e
	default:
		r.Duplicates = append(r.Duplicates, e.Line)
		if e.File != "" {
			r.DuplicateFiles = append(r.DuplicateFiles, e.File)
		}
	}
}

// settles reports whether a line of stage settles its transaction.
func settles(stage string) bool {
	return stage == StageResolvedApplied || stage == StageResolvedNotApplied || stage == StageResolvedReversed
}

// lookupAll looks up every result the journal does not settle,
// Concurrency at a time.
func (c *Checker) lookupAll(ctx context.Context, results []Result) {
	var lookups []int
	for i := range results {
		if results[i].Resolved == nil {
			lookups = append(lookups, i)
		}
	}
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(c.concurrency, len(lookups)) {
		wg.Go(func() {
			for i := range work {
				r := &results[i]
				r.Outcome, r.Answer, r.Reason = c.lookup(ctx, r.Entry)
			}
		})
	}
	for _, i := range lookups {
		work <- i
	}
	close(work)
	wg.Wait()
}

// resolve settles r from e, its transaction's resolution line.
func (r *Result) resolve(e Entry) {
	switch e.Stage {
	case StageResolvedApplied:
		r.Outcome = Applied
		r.Answer = &Answer{Code: e.Code}
	case StageResolvedNotApplied:
		r.Outcome = NotApplied
	default:
		r.Outcome = Reversed
		if e.Code != "" {
			r.Answer = &Answer{Code: e.Code}
		}
	}
	r.Resolved = resolution(e)
}

// resolution is where e, a resolution line, is and what it says.
func resolution(e Entry) *Resolution {
	return &Resolution{File: e.File, Line: e.Line, Time: e.Time, Hub: e.Hub, Via: e.Via}
}

// lookup asks e's target about e's transaction, at its base URL's
// /tx/{txid}.
func (c *Checker) lookup(ctx context.Context, e Entry) (Outcome, *Answer, string) {
	return c.status.Lookup(ctx, strings.TrimRight(e.URL, "/")+"/tx/"+url.PathEscape(e.TxID), e.TxID)
}

// Summary counts the results of a reconciliation. A plain value.
type Summary struct {
	// InDoubt is the number of distinct transactions settled or looked
	// up.
	InDoubt    int `json:"in_doubt"`
	Applied    int `json:"applied"`
	NotApplied int `json:"not_applied"`
	Reversed   int `json:"reversed"`
	Unknown    int `json:"unknown"`
	// Resolved is how many transactions the journal settled, without a
	// look-up.
	Resolved int `json:"resolved"`
	// Expired is how many a hub gave up on (looked up all the same).
	Expired int `json:"expired"`
	// BadLines is the number of journal lines that could not be read,
	// fragments not counted.
	BadLines int `json:"bad_lines"`
	// Fragments is the number of torn writes skipped (BadLine.Fragment).
	Fragments int `json:"fragments"`
}

// Settled reports whether every transaction is known, applied or not, and
// every journal line was read: nothing is left for a person to look into.
// A fragment leaves nothing: the write it is left of failed, and the hub
// counted it then (relay_in_doubt_log_errors_total) and kept the call
// among those GET /in-doubt lists.
func (s Summary) Settled() bool { return s.Unknown == 0 && s.BadLines == 0 }

// Summarize counts results, bad lines and fragments.
func Summarize(results []Result, bad []BadLine) Summary {
	s := Summary{InDoubt: len(results)}
	for _, b := range bad {
		if b.Fragment {
			s.Fragments++
		} else {
			s.BadLines++
		}
	}
	for _, r := range results {
		if r.Resolved != nil {
			s.Resolved++
		}
		if r.Expired != nil {
			s.Expired++
		}
		switch r.Outcome {
		case Applied:
			s.Applied++
		case NotApplied:
			s.NotApplied++
		case Reversed:
			s.Reversed++
		default:
			s.Unknown++
		}
	}
	return s
}
