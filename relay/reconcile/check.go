package reconcile

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

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
	// Resolved is set when the journal has a resolved_applied line for
	// the transaction: a hub settled it on a resend, so it was not looked
	// up.
	Resolved *Resolution `json:"resolved,omitempty"`
	// Duplicates lists the transaction's other journal lines, in-doubt
	// lines and further resolutions, which were settled once with this
	// one.
	Duplicates []int `json:"duplicates,omitempty"`
	// DuplicateFiles is the journal file of each of Duplicates, when the
	// journal was read from more than one file.
	DuplicateFiles []string `json:"duplicate_files,omitempty"`
}

// Resolution is where and by whom a transaction in doubt was resolved: a
// client resent it, the hub asked the target, and the target said it had
// applied it. The code it recorded is the Result's Answer. A plain value.
type Resolution struct {
	// File and Line are the resolved_applied line's place in the journal,
	// as Entry's.
	File string `json:"file,omitempty"`
	Line int    `json:"line"`
	// Time is when the hub resolved it, and Hub which hub did.
	Time time.Time `json:"time"`
	Hub  string    `json:"hub"`
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
// A transaction with a resolved_applied line, before or after its in-doubt
// lines or without any, is Applied with that line's code, and its target
// is not asked; the first such line is its Resolved. Every other
// transaction is looked up, Concurrency at a time; when ctx ends, those
// not done are Unknown.
func (c *Checker) Check(ctx context.Context, entries []Entry) []Result {
	type key struct{ url, txid string }
	index := make(map[key]int, len(entries))
	var results []Result
	for _, e := range entries {
		resolution := e.Stage == StageResolvedApplied
		k := key{strings.TrimRight(e.URL, "/"), e.TxID}
		i, seen := index[k]
		if !seen {
			index[k] = len(results)
			results = append(results, Result{Entry: e})
			if resolution {
				results[len(results)-1].resolve(e)
			}
			continue
		}
		r := &results[i]
		switch {
		case resolution && r.Resolved == nil:
			r.resolve(e)
		case !resolution && r.Stage == StageResolvedApplied:
			// The resolution came first (files given out of order, or
			// another hub's journal first): the result is about the call
			// in doubt, and the resolution stays in Resolved.
			r.Entry = e
		default:
			r.Duplicates = append(r.Duplicates, e.Line)
			if e.File != "" {
				r.DuplicateFiles = append(r.DuplicateFiles, e.File)
			}
		}
	}

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
	return results
}

// resolve settles r from e, its transaction's resolved_applied line.
func (r *Result) resolve(e Entry) {
	r.Outcome = Applied
	r.Answer = &Answer{Code: e.Code}
	r.Resolved = &Resolution{File: e.File, Line: e.Line, Time: e.Time, Hub: e.Hub}
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
	Unknown    int `json:"unknown"`
	// Resolved is how many of Applied the journal settled, resolved on a
	// resend, without a look-up.
	Resolved int `json:"resolved"`
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
		switch r.Outcome {
		case Applied:
			s.Applied++
			if r.Resolved != nil {
				s.Resolved++
			}
		case NotApplied:
			s.NotApplied++
		default:
			s.Unknown++
		}
	}
	return s
}
