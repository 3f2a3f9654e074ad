package statuspage

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
)

// spansOf returns the timeline's runs as "class x+w".
func spansOf(spans []spanView) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Class + " " + strconv.Itoa(s.X) + "+" + strconv.Itoa(s.W)
	}
	return out
}

func TestTimeline(t *testing.T) {
	now := t0.Add(HistorySpan)
	long := t0.Add(-time.Hour) // watched since long before the span
	tests := []struct {
		name    string
		changes []change
		current breaker.State
		started time.Time
		want    []string
	}{
		{name: "closed throughout", current: breaker.Closed, started: long, want: []string{"closed 0+900"}},
		{name: "open throughout", current: breaker.Open, started: long, want: []string{"open 0+900"}},
		{
			name: "an open span, a probe of 3 ms that failed, then recovery",
			changes: []change{
				{at: t0.Add(600 * time.Second), from: breaker.Closed, to: breaker.Open},
				{at: t0.Add(610 * time.Second), from: breaker.Open, to: breaker.HalfOpen},
				{at: t0.Add(610*time.Second + 3*time.Millisecond), from: breaker.HalfOpen, to: breaker.Open},
				{at: t0.Add(620*time.Second + 500*time.Millisecond), from: breaker.Open, to: breaker.HalfOpen},
				{at: t0.Add(621*time.Second + 200*time.Millisecond), from: breaker.HalfOpen, to: breaker.Closed},
			},
			current: breaker.Closed, started: long,
			// Each second is drawn in the worst state it saw: second 620
			// was open, then half-open; 621 half-open, then closed.
			want: []string{"closed 0+600", "open 600+21", "half 621+1", "closed 622+278"},
		},
		{
			name:    "nothing before the page started watching",
			changes: []change{{at: t0.Add(880 * time.Second), from: breaker.Closed, to: breaker.Open}},
			current: breaker.Open, started: t0.Add(870 * time.Second),
			want: []string{"closed 869+11", "open 880+20"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := timeline(history{recent: tt.changes}, tt.current, tt.started, now)
			assert.Equal(t, tt.want, spansOf(got))
			for _, s := range got {
				assert.NotEmpty(t, s.Title)
				assert.Positive(t, s.H)
			}
		})
	}
}

func TestTimelineHeightTellsTheState(t *testing.T) {
	h := history{recent: []change{{at: t0.Add(300 * time.Second), from: breaker.Closed, to: breaker.HalfOpen}, {at: t0.Add(600 * time.Second), from: breaker.HalfOpen, to: breaker.Open}}}
	spans := timeline(h, breaker.Open, t0.Add(-time.Hour), t0.Add(HistorySpan))
	require.Len(t, spans, 3)
	assert.Less(t, spans[0].H, spans[1].H, "closed is thinner than half-open")
	assert.Less(t, spans[1].H, spans[2].H, "half-open is thinner than open")
	assert.Equal(t, timelineHeight, spans[2].H)
	assert.Equal(t, "OPEN 07:10:00–07:15:00 UTC (5 min 00 s)", spans[2].Title)
}

func TestStepPath(t *testing.T) {
	values := make([]float64, sparkBars)
	assert.Empty(t, stepPath(values, 1), "nothing to draw")
	values[0], values[1], values[sparkBars-1] = 10, 10, 5
	assert.Equal(t, "M0 36H0V0H10V36H895V18H900V36Z", stepPath(values, 10))
	// A tiny rate still shows.
	values = make([]float64, sparkBars)
	values[2] = 0.001
	assert.Equal(t, "M0 36H10V35.5H15V36H900V36Z", stepPath(values, 100))
}

func TestTexts(t *testing.T) {
	assert.Equal(t, "0 s", agoText(-time.Second))
	assert.Equal(t, "59 s", agoText(59*time.Second+900*time.Millisecond))
	assert.Equal(t, "3 min 07 s", agoText(187*time.Second))
	assert.Equal(t, "2 h 05 min", agoText(2*time.Hour+5*time.Minute+30*time.Second))
	assert.Equal(t, "3 d 4 h", agoText(76*time.Hour))
	assert.Equal(t, "1 min", spanText(time.Minute))
	assert.Equal(t, "42 s", spanText(42*time.Second))

	assert.Equal(t, "0", rateText(0))
	assert.Equal(t, "<0.1", rateText(0.04))
	assert.Equal(t, "2.5", rateText(2.5))
	assert.Equal(t, "120", rateText(119.6))
	assert.Equal(t, "56k", rateText(56301))

	assert.Equal(t, "0.52 ms", durationText(0.00052))
	assert.Equal(t, "12 ms", durationText(0.0123))
	assert.Equal(t, "3.0 s", durationText(3))
	assert.Equal(t, "> 10.0 s", latencyText(10, true))

	assert.Equal(t, "<1%", percentText(0.004))
	assert.Equal(t, "40%", percentText(0.4))
}

func TestRetryText(t *testing.T) {
	snap := func(s breaker.State, retry time.Duration, held bool) relay.TargetSnapshot {
		return relay.TargetSnapshot{Snapshot: breaker.Snapshot{State: s, RetryAfter: retry, Held: held}}
	}
	tests := []struct {
		name string
		snap relay.TargetSnapshot
		want string
	}{
		{"closed", snap(breaker.Closed, 0, false), "—"},
		{"open, seconds to go", snap(breaker.Open, 7200*time.Millisecond, false), "7.2 s"},
		{"open, minutes to go", snap(breaker.Open, 150*time.Second, false), "2 min 30 s"},
		{"open, period over", snap(breaker.Open, 0, false), "now"},
		{"held", snap(breaker.Open, 0, true), "held"},
		{"half-open", snap(breaker.HalfOpen, 0, false), "probe out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := retryText(tt.snap)
			assert.Equal(t, tt.want, got)
		})
	}

	// With synthetic probes, the notes say the probe is the hub's own, and
	// a half-open breaker between healthy probes says when the next goes.
	synthetic := snap(breaker.Open, 2*time.Second, false)
	synthetic.Settings.ProbePayload = "BAL HEALTH"
	got, note := retryText(synthetic)
	assert.Equal(t, []string{"2.0 s", "then the hub's own probe"}, []string{got, note})
	between := snap(breaker.HalfOpen, 1500*time.Millisecond, false)
	between.ProbeSuccesses = 2
	got, note = retryText(between)
	assert.Equal(t, []string{"1.5 s", "2 healthy so far; then the next probe"}, []string{got, note})
}

func TestProbeText(t *testing.T) {
	now := t0.Add(time.Minute)
	assert.True(t, probeText(probe{}, now).None)
	out := probeText(probe{start: t0.Add(59 * time.Second)}, now)
	assert.Equal(t, "out", out.Outcome)
	assert.Equal(t, "for 1.0 s", out.Took)
	ok := probeText(probe{start: t0, end: t0.Add(12 * time.Millisecond), to: breaker.Closed}, now)
	assert.Equal(t, []string{"succeeded", "in 12 ms", "1 min 00 s ago", "07:00:00"}, []string{ok.Outcome, ok.Took, ok.Ago, ok.When})
	failed := probeText(probe{start: t0, end: t0.Add(3 * time.Second), to: breaker.Open}, now)
	assert.Equal(t, "failed", failed.Outcome)
	op := probeText(probe{start: t0, end: t0.Add(time.Second), to: breaker.Open, cause: breaker.CauseOperator}, now)
	assert.Equal(t, "ended by operator", op.Outcome)
}

func TestSyntheticProbeText(t *testing.T) {
	now := t0.Add(time.Minute)
	ok := syntheticProbeText(relay.ProbeResult{At: t0, Healthy: true, Code: "B404", Duration: 12 * time.Millisecond}, now)
	assert.Equal(t, []string{"synthetic B404 healthy", "✓", "in 12 ms", "1 min 00 s ago", "07:00:00"}, []string{ok.Outcome, ok.Symbol, ok.Took, ok.Ago, ok.When})
	failed := syntheticProbeText(relay.ProbeResult{At: t0, Code: "E901", Duration: 3 * time.Second}, now)
	assert.Equal(t, []string{"synthetic E901 failed", "open"}, []string{failed.Outcome, failed.Class})
}

func TestTargetView(t *testing.T) {
	// Given CORE open for 40 s after a failed probe, its bulkhead full,
	// with the failure-rate policy on, and its fallback CORE_DR,
	now := t0.Add(10 * time.Minute)
	core := relay.TargetSnapshot{
		Name: "CORE", URL: "http://core", Fallback: "CORE_DR",
		Snapshot: breaker.Snapshot{
			State: breaker.Open, ConsecutiveFailures: 6, RetryAfter: 3 * time.Second,
			RecentCalls: 40, RecentFailures: 30,
		},
		InFlight: 10, MaxInFlight: 10,
		Settings:    relay.TargetSettings{Policy: breaker.Policy{FailThreshold: 5, FailureRate: 0.5, Window: time.Minute}},
		LastFailure: relay.Failure{At: now.Add(-2 * time.Second), Code: "E901", Message: "no answer within target timeout"},
	}
	dr := relay.TargetSnapshot{Name: "CORE_DR", Snapshot: breaker.Snapshot{State: breaker.Closed}}
	h := history{
		recent: []change{
			{at: now.Add(-40 * time.Second), from: breaker.Closed, to: breaker.Open},
			{at: now.Add(-20 * time.Second), from: breaker.Open, to: breaker.HalfOpen, cause: breaker.CauseProbe},
			{at: now.Add(-17 * time.Second), from: breaker.HalfOpen, to: breaker.Open},
		},
		last:       change{at: now.Add(-17 * time.Second), from: breaker.HalfOpen, to: breaker.Open},
		probe:      probe{start: now.Add(-20 * time.Second), end: now.Add(-17 * time.Second), to: breaker.Open},
		leftClosed: now.Add(-40 * time.Second),
	}
	r := rates{ok: true, window: time.Minute, fallbacksPerSecond: 12}

	// then its row says so, each column in words.
	v := newTargetView(targetInput{snap: core, hist: h, rates: r, fallback: &dr, started: t0, now: now})
	assert.Equal(t, stateView{Text: "OPEN", Symbol: "✕", Class: "open"}, v.State)
	assert.Equal(t, "17 s", v.InState)
	assert.Equal(t, "07:09:43", v.Since)
	assert.Equal(t, "40 s", v.NotClosed)
	assert.Equal(t, "3.0 s", v.Retry)
	assert.Equal(t, "30 of 40 (75%)", v.FailShare)
	assert.Equal(t, "in the breaker's 1 min window, trips at 50%", v.FailShareNote)
	assert.Equal(t, inFlightWidth, v.InFlightBar)
	assert.True(t, v.BulkheadFull)
	assert.Equal(t, "failed", v.Probe.Outcome)
	assert.Equal(t, "in 3.0 s", v.Probe.Took)
	assert.Equal(t, failureView{Code: "E901", Message: "no answer within target timeout", When: "07:09:58", Ago: "2 s ago"}, v.Failure)
	assert.Equal(t, fallbackView{Name: "CORE_DR", State: "CLOSED", StateClass: "closed", Active: true, Rate: "12"}, v.Fallback)
	require.Len(t, v.Probes, 1)
	assert.Equal(t, probeMark{X: 880, Class: "open", Title: "probe at 07:09:40 UTC: failed in 3.0 s"}, v.Probes[0])
	assert.Equal(t, []string{"closed 299+561", "open 860+20", "half 880+3", "open 883+17"}, spansOf(v.Timeline), "nothing before the page started")

	// Closed again, it is no longer out of CLOSED.
	core.State = breaker.Closed
	assert.Empty(t, newTargetView(targetInput{snap: core, hist: h, rates: r, started: t0, now: now}).NotClosed)
}

func TestTargetViewOfATargetAddedByAReload(t *testing.T) {
	// Given a page watching since t0, and LOANS added by a reload 30 s ago
	// with no change since,
	now := t0.Add(10 * time.Minute)
	loans := relay.TargetSnapshot{Name: "LOANS", Snapshot: breaker.Snapshot{State: breaker.Closed}, MaxInFlight: 10}
	h := history{added: now.Add(-30 * time.Second)}

	// then its row has been CLOSED since the reload, and its timeline
	// starts there.
	v := newTargetView(targetInput{snap: loans, hist: h, started: t0, now: now})
	assert.Equal(t, "30 s", v.InState)
	assert.Equal(t, "07:09:30", v.Since)
	assert.Equal(t, []string{"closed 869+31"}, spansOf(v.Timeline))

	// Once its breaker opens, the row tells that change, and the timeline
	// draws it after the reload's closed span.
	h.recent = []change{{at: now.Add(-10 * time.Second), from: breaker.Closed, to: breaker.Open}}
	h.last, h.leftClosed = h.recent[0], h.recent[0].at
	loans.State = breaker.Open
	v = newTargetView(targetInput{snap: loans, hist: h, started: t0, now: now})
	assert.Equal(t, "10 s", v.InState)
	assert.Equal(t, "07:09:50", v.Since)
	assert.Equal(t, []string{"closed 869+21", "open 890+10"}, spansOf(v.Timeline))
}

func TestFleetText(t *testing.T) {
	tests := []struct {
		name   string
		tf     admin.TargetFleet
		shared bool
		snap   breaker.Snapshot
		want   []string
	}{
		{name: "not shared", snap: breaker.Snapshot{State: breaker.Closed}, want: []string{"not shared with the fleet"}},
		{name: "closed, before any change", shared: true, snap: breaker.Snapshot{State: breaker.Closed}, want: []string{"fleet epoch 0"}},
		{
			name: "closed by another hub", shared: true, snap: breaker.Snapshot{State: breaker.Closed},
			tf:   admin.TargetFleet{Epoch: 8, Source: "remote"},
			want: []string{"fleet epoch 8", "last change: the fleet"},
		},
		{
			name: "opened here, probing here", shared: true, snap: breaker.Snapshot{State: breaker.HalfOpen},
			tf:   admin.TargetFleet{Epoch: 7, OpenedBy: "a", Source: "local", ProbeLease: true},
			want: []string{"fleet epoch 7", "opened by a (this hub)", "last change: this hub", "probe lease: this hub"},
		},
		{
			name: "opened by another hub, which probes", shared: true, snap: breaker.Snapshot{State: breaker.Open},
			tf:   admin.TargetFleet{Epoch: 7, OpenedBy: "b", Source: "remote"},
			want: []string{"fleet epoch 7", "opened by b", "last change: the fleet", "probe lease: not this hub"},
		},
		{
			name: "held open by an operator of another hub", shared: true, snap: breaker.Snapshot{State: breaker.Open, Held: true},
			tf:   admin.TargetFleet{Epoch: 9, OpenedBy: "c", Source: "remote"},
			want: []string{"fleet epoch 9", "opened by c", "last change: the fleet", "no probe while held"},
		},
		{
			name: "its shard of the store down", shared: true, snap: breaker.Snapshot{State: breaker.Open},
			tf:   admin.TargetFleet{Epoch: 3, OpenedBy: "a", Source: "local", ProbeLease: true, Alone: true},
			want: []string{"fleet epoch 3", "deciding alone: the store does not answer for it", "opened by a (this hub)", "last change: this hub", "probe lease: this hub"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, fleetText(tt.tf, tt.shared, relay.TargetSnapshot{Name: "CORE", Snapshot: tt.snap}, "a"))
		})
	}
}

func TestShieldText(t *testing.T) {
	on := relay.TargetSettings{Dedup: true}
	tests := []struct {
		name string
		snap relay.TargetSnapshot
		want shieldView
	}{
		{name: "off", snap: relay.TargetSnapshot{Dedup: relay.DedupCounts{Replayed: 3}}, want: shieldView{}},
		{
			name: "on, nothing yet, no status URL", snap: relay.TargetSnapshot{Settings: on},
			want: shieldView{On: true, Window: "10 min", NoStatusURL: true},
		},
		{
			name: "every outcome, with a status URL and a window of its own",
			snap: relay.TargetSnapshot{
				Settings:  relay.TargetSettings{Dedup: true, DedupWindow: 90 * time.Second},
				StatusURL: "http://core/tx/{txid}",
				Dedup:     relay.DedupCounts{Joined: 3, Replayed: 12, RefusedPayload: 2, ResolvedApplied: 3, ResolvedNotApplied: 1, Unresolved: 1},
			},
			want: shieldView{On: true, Replayed: 12, Joined: 3, Refused: 2, Resolved: 4, SentAfresh: 1, Unresolved: 1, Window: "1 min 30 s"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, shieldText(tt.snap))
		})
	}
}

func TestShieldStoreText(t *testing.T) {
	tests := []struct {
		name     string
		d        relay.DedupStatus
		shielded bool
		want     *shieldStoreView
	}{
		{name: "no store", d: relay.DedupStatus{Entries: 5}, shielded: true},
		{name: "a store, no target shielded", d: relay.DedupStatus{Shared: true, StoreDown: true}},
		{name: "shared", d: relay.DedupStatus{Shared: true}, shielded: true, want: &shieldStoreView{Fallbacks: "0 fallbacks"}},
		{name: "shared again after a fallback", d: relay.DedupStatus{Shared: true, StoreFallbacks: 1}, shielded: true, want: &shieldStoreView{Fallbacks: "1 fallback"}},
		{name: "down", d: relay.DedupStatus{Shared: true, StoreDown: true, StoreFallbacks: 7}, shielded: true, want: &shieldStoreView{Down: true, Fallbacks: "7 fallbacks"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, shieldStoreText(tt.d, tt.shielded))
		})
	}
}

func TestAloneTextSaysWhichBreakersDecideAlone(t *testing.T) {
	assert.Equal(t, "each breaker decides alone", aloneText(3, 3))
	assert.Equal(t, "each breaker decides alone", aloneText(0, 0), "a fleet sharing no target")
	assert.Equal(t, "1 of 3 breakers decide alone", aloneText(1, 3), "one Cluster shard down")
	assert.Equal(t, "change channel lost: changes reach this hub at each resync", aloneText(0, 3))
}

func TestOpenText(t *testing.T) {
	now := t0.Add(10 * time.Minute)
	open := func(policy string, next time.Time) relay.TargetSnapshot {
		return relay.TargetSnapshot{InDoubt: 5, InDoubtOpen: 2, InDoubtOldest: now.Add(-4*time.Minute - 7*time.Second), Resolve: policy, NextResolve: next}
	}
	for _, tt := range []struct {
		name string
		snap relay.TargetSnapshot
		want openView
	}{
		{name: "all settled", snap: relay.TargetSnapshot{InDoubt: 5}, want: openView{}},
		{name: "manual", snap: open("manual", time.Time{}), want: openView{Count: 2, Oldest: "4 min 07 s", Next: "waits for an operator"}},
		{name: "look-up to come", snap: open("lookup", now.Add(2400*time.Millisecond)), want: openView{Count: 2, Oldest: "4 min 07 s", Next: "lookup in 2 s"}},
		{name: "reversal due", snap: open("reverse", now), want: openView{Count: 2, Oldest: "4 min 07 s", Next: "reverse due now"}},
		{name: "attempt in flight", snap: open("lookup", time.Time{}), want: openView{Count: 2, Oldest: "4 min 07 s", Next: "lookup under way"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, openText(tt.snap, now))
		})
	}
}
