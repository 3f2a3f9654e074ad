package reconcile

import (
	"cmp"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/relayhub/relayhub/relay/indoubt"
)

// Open returns the transactions still open in entries, the journal's
// lines in journal order: those whose last in-doubt line (by target and
// txid) has no resolution line after it. A restarted hub takes them up.
// An entry whose in-doubt line is older than expire at now is returned in
// expired instead, for the hub to record as given up; expire <= 0 keeps
// every one open. Both keep journal order, each transaction once, as its
// last in-doubt line.
//
// An unresolved_expired line closes its transaction as a settlement does:
// the hub gave up, and only an operator settles it now (Unsettled finds
// it).
func Open(entries []Entry, now time.Time, expire time.Duration) (open, expired []Entry) {
	for _, e := range lastStates(entries) {
		if indoubt.IsResolution(e.Stage) {
			continue
		}
		if expire > 0 && !e.Time.After(now.Add(-expire)) {
			expired = append(expired, e)
		} else {
			open = append(open, e)
		}
	}
	return open, expired
}

// ReadOpen is Open on the journal read from r (gzipped or not), for a hub's
// take-up at start: it keeps only the entries still open as it reads, so a
// journal of millions of settled lines costs no more memory than its open
// ones. bad and err are as ReadJournal's.
func ReadOpen(r io.Reader, now time.Time, expire time.Duration) (open, expired []Entry, bad []BadLine, err error) {
	type key struct{ target, txid string }
	last := make(map[key]Entry) // each open transaction's last in-doubt line
	err = scanJournal(r, func(e Entry) {
		k := key{e.Target, e.TxID}
		if indoubt.IsResolution(e.Stage) {
			delete(last, k)
		} else {
			last[k] = e
		}
	}, func(b BadLine) { bad = append(bad, b) })
	open, expired = Open(slices.SortedFunc(maps.Values(last), func(a, b Entry) int { return cmp.Compare(a.Line, b.Line) }), now, expire)
	return open, expired, bad, err
}

// Unsettled returns the last in-doubt line of txid at target (any target
// when target is empty) when nothing has settled it since: it is open, or a
// hub gave up on it (unresolved_expired). ok is false when the journal has
// no in-doubt line for it, or a settlement follows its last one.
func Unsettled(entries []Entry, target, txid string) (e Entry, ok bool) {
	for i := len(entries) - 1; i >= 0; i-- {
		l := entries[i]
		if l.TxID != txid || (target != "" && l.Target != target) {
			continue
		}
		if settles(l.Stage) {
			return Entry{}, false
		}
		if !indoubt.IsResolution(l.Stage) {
			return l, true
		}
	}
	return Entry{}, false
}

// lastStates returns, per target and txid, the transaction's last line,
// ordered by where that line is in entries.
func lastStates(entries []Entry) []Entry {
	type key struct{ target, txid string }
	last := make(map[key]int, len(entries))
	for i, e := range entries {
		last[key{e.Target, e.TxID}] = i
	}
	out := make([]Entry, 0, len(last))
	for i, e := range entries {
		if last[key{e.Target, e.TxID}] == i {
			out = append(out, e)
		}
	}
	return out
}
