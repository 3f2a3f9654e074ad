package statuspage

import (
	"sync"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// HistorySpan is how far back the page draws each target's breaker
// states and answers.
const HistorySpan = 15 * time.Minute

// maxChanges bounds the state changes a Recorder keeps per target: a
// breaker flapping as fast as a 500 ms reset timeout lets it changes state
// about 3600 times in HistorySpan, so the whole span fits.
const maxChanges = 4096

// Recorder keeps the recent breaker state changes of every target, for the
// page's timelines and its "last probe" and "in state" columns: those of
// the last HistorySpan (at most maxChanges per target), and whatever their
// age each target's latest change and latest probe. Its Observe is the
// hub's transition observer, and its Reloaded hears of the hub's reloads;
// give the Recorder to New. It is safe for concurrent use; its memory is
// bounded by the number of targets.
type Recorder struct {
	mu      sync.Mutex
	targets map[string]*targetChanges // guarded by mu; keyed by target name
	// changed holds a token when a change was observed that the page has
	// not yet drawn; Observe never waits to put one there.
	changed chan struct{}
}

// targetChanges is one target's part of a Recorder.
type targetChanges struct {
	// recent[first:] are the changes of the last HistorySpan, oldest
	// first; what is before first has been dropped and is overwritten
	// once first reaches maxChanges, so the array holds at most twice
	// maxChanges and a change costs O(1), amortized.
	recent []change
	first  int
	// last is the latest change, kept after it leaves recent.
	last change
	// probe is the latest probe, kept after it leaves recent; its start
	// is zero when the breaker has admitted none.
	probe probe
	// leftClosed is when the breaker last left CLOSED: the start of the
	// outage while it is not closed.
	leftClosed time.Time
	// added is when a reload added the target; zero for a target the hub
	// started with.
	added time.Time
}

// change is one breaker state change, as a Recorder keeps it.
type change struct {
	at       time.Time
	from, to breaker.State
	cause    breaker.Cause
}

// probe is a half-open probe: admitted at start, ended at end (zero while
// it is out) with the change that ended it.
type probe struct {
	start, end time.Time
	to         breaker.State // the state the probe's end led to
	cause      breaker.Cause // what ended it
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{targets: make(map[string]*targetChanges), changed: make(chan struct{}, 1)}
}

// Observe records t. It is meant as the hub's transition observer
// (relay.Config.OnTransition, after the breaker log's): it runs under the
// breaker's lock, so it only appends under a lock of its own and never
// waits or calls back into the hub.
func (r *Recorder) Observe(t breaker.Transition) {
	c := change{at: t.At, from: t.From, to: t.To, cause: t.Cause}
	r.mu.Lock()
	tc := r.targets[t.Name]
	if tc == nil {
		tc = &targetChanges{}
		r.targets[t.Name] = tc
	}
	tc.add(c)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// Reloaded tells r what a reload of the hub changed: res is what
// relay.Server.Reload returned, and at the breakers' clock read just before
// it was called. A target removed is forgotten, as the page no longer shows
// it. A target added starts afresh at at, with no change before it: its
// breaker is a new one, CLOSED, whatever a target of the same name removed
// earlier went through; changes observed from at on are its own and stay.
func (r *Recorder) Reloaded(res relay.ReloadResult, at time.Time) {
	r.mu.Lock()
	for _, name := range res.Removed {
		delete(r.targets, name)
	}
	for _, name := range res.Added {
		tc := &targetChanges{added: at}
		if old := r.targets[name]; old != nil {
			for _, c := range old.recent[old.first:] {
				if !c.at.Before(at) {
					tc.add(c)
				}
			}
		}
		r.targets[name] = tc
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// add appends c, drops what is older than HistorySpan before it or beyond
// maxChanges, and follows the probe.
func (tc *targetChanges) add(c change) {
	tc.last = c
	if c.from == breaker.Closed {
		tc.leftClosed = c.at
	}
	switch {
	case c.to == breaker.HalfOpen:
		tc.probe = probe{start: c.at}
	case c.from == breaker.HalfOpen && !tc.probe.start.IsZero() && tc.probe.end.IsZero():
		tc.probe.end, tc.probe.to, tc.probe.cause = c.at, c.to, c.cause
	}
	tc.recent = append(tc.recent, c)
	for tc.first < len(tc.recent) && c.at.Sub(tc.recent[tc.first].at) > HistorySpan {
		tc.first++
	}
	tc.first = max(tc.first, len(tc.recent)-maxChanges)
	if tc.first >= maxChanges {
		tc.recent = tc.recent[:copy(tc.recent, tc.recent[tc.first:])]
		tc.first = 0
	}
}

// history is what a Recorder knows of one target at one instant. It is a
// plain value, a copy.
type history struct {
	recent     []change  // the changes of the last HistorySpan before the read, oldest first
	last       change    // the latest change; zero at when there has been none
	probe      probe     // the latest probe; zero start when there has been none
	leftClosed time.Time // when the breaker last left CLOSED; zero when it never has
	added      time.Time // when a reload added the target; zero for a target the hub started with
}

// history returns what r holds for target name, with the changes since
// since.
func (r *Recorder) history(name string, since time.Time) history {
	r.mu.Lock()
	defer r.mu.Unlock()
	tc := r.targets[name]
	if tc == nil {
		return history{}
	}
	h := history{last: tc.last, probe: tc.probe, leftClosed: tc.leftClosed, added: tc.added}
	i := tc.first
	for i < len(tc.recent) && tc.recent[i].at.Before(since) {
		i++
	}
	h.recent = append([]change(nil), tc.recent[i:]...)
	return h
}

// stateAt returns the breaker's state at the start of the changes h
// holds: the first one's from, or the current state (current) when there
// are none.
func (h history) stateAt(current breaker.State) breaker.State {
	if len(h.recent) > 0 {
		return h.recent[0].from
	}
	return current
}
