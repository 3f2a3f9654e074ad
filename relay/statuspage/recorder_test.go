package statuspage

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// t0 is the start of the tests' fake time.
var t0 = time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC)

// tr returns a transition of CORE at t0+at.
func tr(at time.Duration, from, to breaker.State, cause breaker.Cause) breaker.Transition {
	return breaker.Transition{Name: "CORE", From: from, To: to, At: t0.Add(at), Cause: cause}
}

func TestRecorderFollowsProbes(t *testing.T) {
	tests := []struct {
		name  string
		given []breaker.Transition
		want  probe
	}{
		{name: "none", given: []breaker.Transition{tr(0, breaker.Closed, breaker.Open, breaker.CauseResults)}},
		{
			name: "out",
			given: []breaker.Transition{
				tr(0, breaker.Closed, breaker.Open, breaker.CauseResults),
				tr(5*time.Second, breaker.Open, breaker.HalfOpen, breaker.CauseProbe),
			},
			want: probe{start: t0.Add(5 * time.Second)},
		},
		{
			name: "succeeded",
			given: []breaker.Transition{
				tr(0, breaker.Closed, breaker.Open, breaker.CauseResults),
				tr(5*time.Second, breaker.Open, breaker.HalfOpen, breaker.CauseProbe),
				tr(5*time.Second+20*time.Millisecond, breaker.HalfOpen, breaker.Closed, breaker.CauseResults),
			},
			want: probe{start: t0.Add(5 * time.Second), end: t0.Add(5*time.Second + 20*time.Millisecond), to: breaker.Closed},
		},
		{
			name: "failed, and a later close by the operator does not change it",
			given: []breaker.Transition{
				tr(0, breaker.Closed, breaker.Open, breaker.CauseResults),
				tr(5*time.Second, breaker.Open, breaker.HalfOpen, breaker.CauseProbe),
				tr(8*time.Second, breaker.HalfOpen, breaker.Open, breaker.CauseResults),
				tr(9*time.Second, breaker.Open, breaker.Closed, breaker.CauseOperator),
			},
			want: probe{start: t0.Add(5 * time.Second), end: t0.Add(8 * time.Second), to: breaker.Open},
		},
		{
			name: "ended by the operator",
			given: []breaker.Transition{
				tr(0, breaker.Closed, breaker.Open, breaker.CauseResults),
				tr(5*time.Second, breaker.Open, breaker.HalfOpen, breaker.CauseProbe),
				tr(6*time.Second, breaker.HalfOpen, breaker.Open, breaker.CauseOperator),
			},
			want: probe{start: t0.Add(5 * time.Second), end: t0.Add(6 * time.Second), to: breaker.Open, cause: breaker.CauseOperator},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRecorder()
			for _, x := range tt.given {
				r.Observe(x)
			}
			h := r.history("CORE", t0)
			assert.Equal(t, tt.want, h.probe)
			assert.Len(t, h.recent, len(tt.given))
			assert.Equal(t, tt.given[len(tt.given)-1].At, h.last.at)
			assert.Equal(t, t0, h.leftClosed, "the outage began at the first change")
		})
	}
}

func TestRecorderKeepsHistorySpanAndTheLatest(t *testing.T) {
	// Given changes spread over 20 minutes, the last an hour before the read,
	r := NewRecorder()
	for i := range 20 {
		from, to := breaker.Closed, breaker.Open
		if i%2 == 1 {
			from, to = breaker.Open, breaker.Closed
		}
		r.Observe(tr(time.Duration(i)*time.Minute, from, to, breaker.CauseResults))
	}

	// then it keeps those of the 15 minutes before the latest,
	h := r.history("CORE", t0)
	require.Len(t, h.recent, 16)
	assert.Equal(t, t0.Add(4*time.Minute), h.recent[0].at)

	// and a read at 1h20 returns no recent change but still the latest,
	// with the state it left.
	h = r.history("CORE", t0.Add(80*time.Minute-HistorySpan))
	assert.Empty(t, h.recent)
	assert.Equal(t, t0.Add(19*time.Minute), h.last.at)
	assert.Equal(t, breaker.Closed, h.stateAt(breaker.Closed))

	// A read for a target never seen is empty.
	assert.Zero(t, r.history("CLAIM", t0))
}

func TestRecorderBoundsAFlappingBreaker(t *testing.T) {
	// Given a breaker changing state every millisecond, far more often
	// than maxChanges in HistorySpan,
	r := NewRecorder()
	for i := range 3 * maxChanges {
		from, to := breaker.Open, breaker.HalfOpen
		if i%2 == 1 {
			from, to = breaker.HalfOpen, breaker.Open
		}
		r.Observe(tr(time.Duration(i)*time.Millisecond, from, to, breaker.CauseResults))
	}
	// then it keeps the newest maxChanges, in an array that never grew
	// much past twice them.
	h := r.history("CORE", t0)
	require.Len(t, h.recent, maxChanges)
	assert.Equal(t, t0.Add(time.Duration(3*maxChanges-1)*time.Millisecond), h.recent[maxChanges-1].at)
	assert.Equal(t, t0.Add(time.Duration(2*maxChanges)*time.Millisecond), h.recent[0].at)
	assert.LessOrEqual(t, cap(r.targets["CORE"].recent), 3*maxChanges)
}

func TestRecorderReloaded(t *testing.T) {
	// Given CORE opened, CLAIM opened, and LOANS opened and then removed by
	// an earlier reload, its old breaker still reporting a late change,
	r := NewRecorder()
	on := func(name string, at time.Duration, from, to breaker.State) {
		r.Observe(breaker.Transition{Name: name, From: from, To: to, At: t0.Add(at), Cause: breaker.CauseResults})
	}
	on("CORE", 0, breaker.Closed, breaker.Open)
	on("CLAIM", time.Second, breaker.Closed, breaker.Open)
	on("LOANS", 2*time.Second, breaker.Closed, breaker.Open)
	on("LOANS", 3*time.Second, breaker.Open, breaker.HalfOpen)
	reloadAt := t0.Add(10 * time.Second)

	// when a reload at 10 s removes CLAIM and adds LOANS back, whose new
	// breaker opens at 12 s, before the Recorder hears of the reload,
	on("LOANS", 12*time.Second, breaker.Closed, breaker.Open)
	<-r.changed
	r.Reloaded(relay.ReloadResult{Added: []string{"LOANS"}, Removed: []string{"CLAIM"}, Changed: []string{"CORE"}}, reloadAt)

	// then CORE keeps its history, CLAIM is forgotten, and LOANS starts at
	// the reload with only its new breaker's change, no probe and its outage
	// from 12 s; the page is told to draw again.
	core := r.history("CORE", t0)
	require.Len(t, core.recent, 1)
	assert.Zero(t, core.added)
	assert.Zero(t, r.history("CLAIM", t0))
	assert.NotContains(t, r.targets, "CLAIM")
	loans := r.history("LOANS", t0)
	assert.Equal(t, reloadAt, loans.added)
	require.Len(t, loans.recent, 1)
	assert.Equal(t, t0.Add(12*time.Second), loans.last.at)
	assert.Equal(t, breaker.Open, loans.last.to)
	assert.Zero(t, loans.probe)
	assert.Equal(t, t0.Add(12*time.Second), loans.leftClosed)
	assert.Len(t, r.changed, 1)

	// A target added for the first time starts at the reload, empty.
	r.Reloaded(relay.ReloadResult{Added: []string{"CARDS"}}, reloadAt)
	assert.Equal(t, history{added: reloadAt}, r.history("CARDS", t0))
}

func TestRecorderObserveNeverWaits(t *testing.T) {
	// Given nobody draining the change signal, many changes are observed
	// without blocking, and one token says there was a change.
	r := NewRecorder()
	for i := range 100 {
		r.Observe(tr(time.Duration(i)*time.Second, breaker.Closed, breaker.Open, breaker.CauseResults))
	}
	assert.Len(t, r.changed, 1)
}

// TestRecorderHammer runs observers of several targets against readers,
// for the race detector.
func TestRecorderHammer(t *testing.T) {
	r := NewRecorder()
	var wg sync.WaitGroup
	for _, name := range []string{"CORE", "CLAIM", "CARDS"} {
		wg.Go(func() {
			for i := range 2000 {
				r.Observe(breaker.Transition{Name: name, From: breaker.Closed, To: breaker.Open, At: t0.Add(time.Duration(i) * time.Second)})
			}
		})
		wg.Go(func() {
			for range 200 {
				_ = r.history(name, t0)
			}
		})
	}
	wg.Go(func() {
		// Reloads add and remove LOANS while the others change.
		for i := range 400 {
			at := t0.Add(time.Duration(i) * time.Second)
			r.Observe(breaker.Transition{Name: "LOANS", From: breaker.Closed, To: breaker.Open, At: at})
			res := relay.ReloadResult{Added: []string{"LOANS"}}
			if i%2 == 1 {
				res = relay.ReloadResult{Removed: []string{"LOANS"}}
			}
			r.Reloaded(res, at)
		}
	})
	wg.Go(func() {
		for range 1000 {
			select {
			case <-r.changed:
			default:
			}
		}
	})
	wg.Wait()
	for _, name := range []string{"CORE", "CLAIM", "CARDS"} {
		assert.Equal(t, t0.Add(1999*time.Second), r.history(name, t0).last.at)
	}
}
