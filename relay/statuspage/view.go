package statuspage

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/admin"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/resolver"
)

// pageView is everything the page template draws, computed at one
// instant. It is a plain value; every string in it is text, escaped by
// html/template where it is drawn.
type pageView struct {
	Version     string
	Clock       string // the instant, hh:mm:ss UTC
	Draining    bool
	Connections int
	// InDoubt is the hub's calls in doubt since it started, over every
	// target; InDoubtOpen, those of them not settled yet. Only open ones
	// make the badge amber: a settled call needs nobody.
	InDoubt       int64
	InDoubtOpen   int
	TokenRequired bool
	Targets       []targetView
	// RateWindow is how far back the rates look, as the column headers say it.
	RateWindow string
	// Fleet is the hub's place in its fleet; nil when it runs alone.
	Fleet *fleetView
	// ShieldStore is the fleet's store of the duplicate-TXID shield; nil
	// when the hub has none, or no target has the shield on.
	ShieldStore *shieldStoreView
}

// fleetView is the hub's place in its fleet, in the header.
type fleetView struct {
	HubID     string
	Connected bool // the hub reaches the state store
	// Alone says, while the hub is not connected, which breakers decide
	// alone: "each breaker decides alone", or how many do when a Cluster
	// shard is down, or none when only the change channel is lost.
	Alone string
}

// aloneText is fleetView.Alone for alone of shared targets deciding alone.
func aloneText(alone, shared int) string {
	switch {
	case alone == 0 && shared > 0:
		return "change channel lost: changes reach this hub at each resync"
	case alone < shared:
		return strconv.Itoa(alone) + " of " + strconv.Itoa(shared) + " breakers decide alone"
	default:
		return "each breaker decides alone"
	}
}

// shieldStoreView is the shield's store in the header.
type shieldStoreView struct {
	// Down: the store failed the shield's latest command, so the hub
	// shields on its own memory and a resend to another hub is not
	// recognised.
	Down bool
	// Fallbacks is the shielded requests the store could not serve, as
	// "N fallbacks".
	Fallbacks string
}

// targetView is one target's row and its history row.
type targetView struct {
	Name, URL string
	State     stateView
	InState   string // how long the breaker has been in its state
	Since     string // when it entered it, hh:mm:ss; unchanged, "start" or when a reload added the target
	NotClosed string // while not closed, how long since it left CLOSED
	Retry     string
	RetryNote string

	Failures, Threshold int
	FailShare           string // the failed share of calls, e.g. "2 of 40 (5%)"
	FailShareNote       string // over what, e.g. "calls in 60 s"

	InFlight, MaxInFlight int
	// Limit is the limit in force (or observed); Adaptive says it is
	// computed, and the cell then shows the ceiling, MaxInFlight, beside it.
	Limit        int
	Adaptive     bool
	InFlightBar  int // width of the in-flight bar, of 60
	BulkheadFull bool

	// InDoubt is how many of the target's calls ended in doubt since the
	// hub started.
	InDoubt int64
	// Open is what of them is not settled yet; its zero value when all
	// are.
	Open openView
	// Shield is what the duplicate-TXID shield did with the target's
	// requests since the hub started.
	Shield shieldView

	AnswersTotal string
	Answers      []answerView
	P50, P99     string
	// RateWindow is pageView.RateWindow, for the cells' own labels, which
	// stand in for the column headers on a narrow window.
	RateWindow string

	Probe    probeView
	Failure  failureView
	Fallback fallbackView
	// Fleet is the breaker's state shared with the fleet, a few short
	// texts shown under the state; nil when the hub runs alone.
	Fleet []string

	Timeline  []spanView
	Probes    []probeMark
	Spark     sparkView
	HistoryOK bool // the page has sampled long enough to draw answers
}

// shieldView is a target's duplicate-TXID shield: off, or its counts.
// Replayed and joined always show; the others only when not zero.
type shieldView struct {
	On               bool
	Replayed, Joined int64
	Refused          int64  // E909
	Resolved         int64  // resends in doubt looked up at the status URL
	SentAfresh       int64  // of Resolved, not applied by the target, so called again
	Unresolved       int64  // resends in doubt answered E901 without a call
	Window           string // how long a TXID is remembered
	NoStatusURL      bool   // a resend in doubt cannot be looked up
}

// openView is a target's calls in doubt not settled yet: how many, how
// long the oldest has waited, and what happens next.
type openView struct {
	Count  int
	Oldest string // how long ago the oldest went in doubt
	// Next says what settles them: the hub's next attempt, or an operator
	// for a manual target.
	Next string
}

// openText describes s's open calls in doubt at now.
func openText(s relay.TargetSnapshot, now time.Time) openView {
	if s.InDoubtOpen == 0 {
		return openView{}
	}
	v := openView{Count: s.InDoubtOpen, Oldest: agoText(now.Sub(s.InDoubtOldest))}
	switch {
	case s.Resolve == "" || s.Resolve == string(resolver.PolicyManual):
		v.Next = "waits for an operator"
	case s.NextResolve.IsZero():
		v.Next = s.Resolve + " under way"
	case !s.NextResolve.After(now):
		v.Next = s.Resolve + " due now"
	default:
		v.Next = s.Resolve + " in " + agoText(s.NextResolve.Sub(now).Round(time.Second))
	}
	return v
}

// stateView is a breaker state as the page shows it: a word, a symbol
// that tells it without colour, and the CSS class that colours it.
type stateView struct {
	Text, Symbol, Class string
	Held, Disabled      bool
}

// answerView is one class of answers per second.
type answerView struct {
	Label, Class, Rate, Title string
}

// probeView is the latest half-open probe.
type probeView struct {
	None            bool
	Outcome, Symbol string
	Class           string
	Took            string
	When, Ago       string
}

// failureView is the latest failed call.
type failureView struct {
	None                bool
	Code, Message, When string
	Ago                 string
}

// fallbackView is the target's fallback, when it has one.
type fallbackView struct {
	Name, State, StateClass string
	Active                  bool   // the target's breaker refuses, so the fallback takes its requests
	Rate                    string // requests per second it took
}

// spanView is one run of the timeline: x and width in seconds of the
// span, the state's class, and a tooltip.
type spanView struct {
	X, W         int
	Y, H         int
	Class, Title string
}

// probeMark is a probe on the timeline: the second it started in, whether
// it succeeded (for its class), and a tooltip.
type probeMark struct {
	X            int
	Class, Title string
}

// sparkView is the sparkline of answers per second: SVG path data of the
// stacked areas (all answers, E904+E905, E904 alone), and the peak.
type sparkView struct {
	All, Refused, Open string
	Peak               string
	Title              string
}

// Geometry of the history row's drawings, in SVG user units.
const (
	timelineWidth  = int(HistorySpan / time.Second) // one unit a second
	timelineHeight = 18
	sparkHeight    = 36
	sparkBarWidth  = timelineWidth / sparkBars
	inFlightWidth  = 60
)

// stateOf returns how the page shows state s.
func stateOf(s breaker.State) stateView {
	switch s {
	case breaker.Open:
		return stateView{Text: "OPEN", Symbol: "✕", Class: "open"}
	case breaker.HalfOpen:
		return stateView{Text: "HALF_OPEN", Symbol: "◐", Class: "half"}
	default:
		return stateView{Text: "CLOSED", Symbol: "●", Class: "closed"}
	}
}

// severity orders states for the timeline, which draws the worst state of
// each second.
func severity(s breaker.State) int {
	switch s {
	case breaker.Open:
		return 2
	case breaker.HalfOpen:
		return 1
	default:
		return 0
	}
}

// targetInput is what targetView is built from.
type targetInput struct {
	snap     relay.TargetSnapshot
	hist     history
	rates    rates
	spark    [sparkBars][numClasses]float64
	fallback *relay.TargetSnapshot // the fallback's snapshot, when there is one
	started  time.Time             // when the page began to watch
	now      time.Time
}

// newTargetView builds one target's rows.
func newTargetView(in targetInput) targetView {
	s := in.snap
	v := targetView{
		Name:        s.Name,
		URL:         s.URL,
		State:       stateOf(s.State),
		Failures:    s.ConsecutiveFailures,
		Threshold:   s.Settings.FailThreshold,
		InFlight:    s.InFlight,
		MaxInFlight: s.MaxInFlight,
		Limit:       s.Limit,
		Adaptive:    s.LimitMode != relay.LimitStatic,
		InDoubt:     s.InDoubt,
		Open:        openText(s, in.now),
		Shield:      shieldText(s),
	}
	v.State.Held, v.State.Disabled = s.Held, s.Disabled
	// A target a reload added is watched from then on.
	watched, since := in.started, "start"
	if in.hist.added.After(watched) {
		watched, since = in.hist.added, clockText(in.hist.added)
	}
	if in.hist.last.at.IsZero() {
		v.InState, v.Since = agoText(in.now.Sub(watched)), since
	} else {
		v.InState, v.Since = agoText(in.now.Sub(in.hist.last.at)), clockText(in.hist.last.at)
	}
	if s.State != breaker.Closed && !in.hist.leftClosed.IsZero() {
		v.NotClosed = agoText(in.now.Sub(in.hist.leftClosed))
	}
	v.Retry, v.RetryNote = retryText(s)
	if v.Limit == 0 {
		v.Limit = s.MaxInFlight // a snapshot made without one
	}
	if v.Limit > 0 {
		v.InFlightBar = min(s.InFlight*inFlightWidth/v.Limit, inFlightWidth)
		v.BulkheadFull = s.InFlight >= v.Limit
	}
	v.FailShare, v.FailShareNote = failShareText(s, in.rates)
	v.AnswersTotal, v.Answers = answersText(in.rates)
	v.P50, v.P99 = "—", "—"
	if in.rates.ok && !math.IsNaN(in.rates.p50) {
		v.P50, v.P99 = latencyText(in.rates.p50, in.rates.p50Beyond), latencyText(in.rates.p99, in.rates.p99Beyond)
	}
	v.Probe = probeText(in.hist.probe, in.now)
	if sp := s.LastProbe; !sp.At.IsZero() && !sp.At.Before(in.hist.probe.start) {
		v.Probe = syntheticProbeText(sp, in.now)
	}
	v.Failure = failureText(s.LastFailure, in.now)
	if in.fallback != nil {
		fb := stateOf(in.fallback.State)
		v.Fallback = fallbackView{
			Name: in.fallback.Name, State: fb.Text, StateClass: fb.Class,
			Active: s.State != breaker.Closed,
			Rate:   rateText(in.rates.fallbacksPerSecond),
		}
	}
	v.Timeline = timeline(in.hist, s.State, watched, in.now)
	v.Probes = probeMarks(in.hist, in.now)
	v.Spark = sparkline(in.spark)
	v.HistoryOK = in.rates.ok
	return v
}

// shieldText describes s's duplicate-TXID shield.
func shieldText(s relay.TargetSnapshot) shieldView {
	if !s.Settings.Dedup {
		return shieldView{}
	}
	d := s.Dedup
	window := s.Settings.DedupWindow
	if window == 0 {
		window = dedup.DefaultWindow
	}
	return shieldView{
		On: true, Replayed: d.Replayed, Joined: d.Joined, Refused: d.RefusedPayload,
		Resolved: d.ResolvedApplied + d.ResolvedNotApplied, SentAfresh: d.ResolvedNotApplied,
		Unresolved: d.Unresolved, Window: spanText(window), NoStatusURL: s.StatusURL == "",
	}
}

// shieldStoreText describes the shield's store as d tells it; nil when
// the hub has none or shields no target, so there is nothing to tell.
func shieldStoreText(d relay.DedupStatus, shielded bool) *shieldStoreView {
	if !d.Shared || !shielded {
		return nil
	}
	n := strconv.FormatInt(d.StoreFallbacks, 10) + " fallback"
	if d.StoreFallbacks != 1 {
		n += "s"
	}
	return &shieldStoreView{Down: d.StoreDown, Fallbacks: n}
}

// fleetText describes a target's breaker state shared with the fleet, as
// the hub hubID sees it with its breaker in snap; shared is false when the
// fleet does not share the target. The probe lease is told while the
// breaker is not closed and not held, when there is an open period to
// probe.
func fleetText(tf admin.TargetFleet, shared bool, snap relay.TargetSnapshot, hubID string) []string {
	if !shared {
		return []string{"not shared with the fleet"}
	}
	out := []string{"fleet epoch " + strconv.FormatInt(tf.Epoch, 10)}
	if tf.Alone {
		out = append(out, "deciding alone: the store does not answer for it")
	}
	switch {
	case tf.OpenedBy == "":
	case tf.OpenedBy == hubID:
		out = append(out, "opened by "+tf.OpenedBy+" (this hub)")
	default:
		out = append(out, "opened by "+tf.OpenedBy)
	}
	switch tf.Source {
	case "local":
		out = append(out, "last change: this hub")
	case "remote":
		out = append(out, "last change: the fleet")
	}
	switch {
	case tf.ProbeLease:
		out = append(out, "probe lease: this hub")
	case snap.Held:
		out = append(out, "no probe while held")
	case snap.State != breaker.Closed:
		out = append(out, "probe lease: not this hub")
	}
	return out
}

// probeNote says what comes when the open period ends: the hub's own
// probe when synthetic, else a customer's.
func probeNote(synthetic bool) string {
	if synthetic {
		return "then the hub's own probe"
	}
	return "then a probe"
}

// retryText says when the breaker admits its next probe.
func retryText(s relay.TargetSnapshot) (text, note string) {
	synthetic := s.Settings.ProbePayload != ""
	switch {
	case s.State == breaker.HalfOpen && s.ProbeSuccesses > 0 && s.RetryAfter > 0:
		return strconv.FormatFloat(s.RetryAfter.Seconds(), 'f', 1, 64) + " s",
			strconv.Itoa(s.ProbeSuccesses) + " healthy so far; then the next probe"
	case s.State == breaker.HalfOpen:
		return "probe out", "other calls get E904 until it reports"
	case s.State != breaker.Open:
		return "—", ""
	case s.Held:
		return "held", "no probe until an operator closes or enables it"
	case s.RetryAfter <= 0 && synthetic:
		return "now", "the hub's own probe is due"
	case s.RetryAfter <= 0:
		return "now", "the next call is the probe"
	case s.RetryAfter < 10*time.Second:
		return strconv.FormatFloat(s.RetryAfter.Seconds(), 'f', 1, 64) + " s", probeNote(synthetic)
	default:
		return agoText(s.RetryAfter), probeNote(synthetic)
	}
}

// failShareText returns the share of failed calls: the breaker's own
// failure-rate window when that policy is on, else the last rateWindow of
// the metrics.
func failShareText(s relay.TargetSnapshot, r rates) (share, note string) {
	if s.Settings.FailureRate > 0 {
		note = "in the breaker's " + spanText(s.Settings.Window) + " window, trips at " + percentText(s.Settings.FailureRate)
		if s.RecentCalls == 0 {
			return "no calls", note
		}
		return shareText(float64(s.RecentFailures), float64(s.RecentCalls)), note
	}
	if !r.ok {
		return "—", "measuring"
	}
	note = "of calls in the last " + spanText(r.window.Round(time.Second))
	if r.calls == 0 {
		return "no calls", note
	}
	return shareText(r.failed, r.calls), note
}

// classLabels name each class of answers on the page.
var classLabels = [numClasses]struct{ label, class, title string }{
	classOK:       {"0000", "ok", "processed by the target"},
	classRejected: {"Bnnn E400", "rej", "answered by the target with a business rejection or a refusal of a malformed request"},
	classFailed:   {"failed", "fail", "E500, E901, E902 or an error code of the target's own: the target failed"},
	classOpen:     {"E904", "open", "refused by the open breaker, without a call"},
	classFull:     {"E905", "full", "refused by the full bulkhead, without a call"},
	classHub:      {"E906 E907", "hub", "the hub shutting down, or a hub bug"},
}

// answersText returns the answers per second in all, and each class that
// had any (OK always).
func answersText(r rates) (string, []answerView) {
	if !r.ok {
		return "—", nil
	}
	var total float64
	var out []answerView
	for k, rate := range r.perSecond {
		total += rate
		if rate == 0 && class(k) != classOK {
			continue
		}
		l := classLabels[k]
		out = append(out, answerView{Label: l.label, Class: l.class, Rate: rateText(rate), Title: l.title})
	}
	return rateText(total), out
}

// probeText describes the latest probe.
func probeText(p probe, now time.Time) probeView {
	if p.start.IsZero() {
		return probeView{None: true}
	}
	v := probeView{When: clockText(p.start), Ago: agoText(now.Sub(p.start)) + " ago"}
	if p.end.IsZero() {
		v.Outcome, v.Symbol, v.Class = "out", "…", "half"
		v.Took = "for " + durationText(now.Sub(p.start).Seconds())
		return v
	}
	v.Took = "in " + durationText(p.end.Sub(p.start).Seconds())
	switch {
	case p.cause != breaker.CauseResults:
		v.Outcome, v.Symbol, v.Class = "ended by "+p.cause.String(), "■", "neutral"
	case p.to == breaker.Closed:
		v.Outcome, v.Symbol, v.Class = "succeeded", "✓", "closed"
	default:
		v.Outcome, v.Symbol, v.Class = "failed", "✕", "open"
	}
	return v
}

// syntheticProbeText describes the hub's latest synthetic probe: its
// outcome and answer code, and how long it took.
func syntheticProbeText(p relay.ProbeResult, now time.Time) probeView {
	v := probeView{When: clockText(p.At), Ago: agoText(now.Sub(p.At)) + " ago", Took: "in " + durationText(p.Duration.Seconds())}
	if p.Healthy {
		v.Outcome, v.Symbol, v.Class = "synthetic "+p.Code+" healthy", "✓", "closed"
	} else {
		v.Outcome, v.Symbol, v.Class = "synthetic "+p.Code+" failed", "✕", "open"
	}
	return v
}

// failureText describes the latest failed call.
func failureText(f relay.Failure, now time.Time) failureView {
	if f.At.IsZero() {
		return failureView{None: true}
	}
	return failureView{Code: f.Code, Message: f.Message, When: clockText(f.At), Ago: agoText(now.Sub(f.At)) + " ago"}
}

// timeline returns the runs of breaker state over the HistorySpan before
// now, one unit a second, each second drawn in the worst state it saw so
// a probe of a few milliseconds still shows. current is the state now;
// nothing is drawn before started, when the page began to watch the target
// (when a reload added it, for a target added so).
func timeline(h history, current breaker.State, started, now time.Time) []spanView {
	start := now.Add(-HistorySpan)
	var cols [timelineWidth]int // severity of each second; -1 before started
	for i := range cols {
		if start.Add(time.Duration(i+1) * time.Second).Before(started) {
			cols[i] = -1
		}
	}
	mark := func(s breaker.State, from, to time.Time) {
		a := max(int(from.Sub(start)/time.Second), 0)
		b := min(int((to.Sub(start)+time.Second-1)/time.Second), timelineWidth)
		for i := a; i < b; i++ {
			if cols[i] >= 0 {
				cols[i] = max(cols[i], severity(s))
			}
		}
	}
	state, at := h.stateAt(current), start
	for _, c := range h.recent {
		mark(state, at, c.at)
		state, at = c.to, c.at
	}
	mark(state, at, now)

	var out []spanView
	for i := 0; i < timelineWidth; {
		j := i + 1
		for j < timelineWidth && cols[j] == cols[i] {
			j++
		}
		if cols[i] >= 0 {
			out = append(out, timelineSpan(cols[i], i, j, start))
		}
		i = j
	}
	return out
}

// probeMarks returns the probes of the HistorySpan before now, for the
// timeline: a probe lasts milliseconds, so its second is drawn open, and a
// mark of its own shows it.
func probeMarks(h history, now time.Time) []probeMark {
	start := now.Add(-HistorySpan)
	var out []probeMark
	for i, c := range h.recent {
		if c.to != breaker.HalfOpen {
			continue
		}
		m := probeMark{X: int(c.at.Sub(start) / time.Second), Class: "out", Title: "probe at " + clockText(c.at) + " UTC"}
		if i+1 < len(h.recent) {
			end := h.recent[i+1]
			p := probeText(probe{start: c.at, end: end.at, to: end.to, cause: end.cause}, now)
			m.Class, m.Title = p.Class, m.Title+": "+p.Outcome+" "+p.Took
		}
		out = append(out, m)
	}
	return out
}

// severityStates are the states by severity.
var severityStates = [...]breaker.State{breaker.Closed, breaker.HalfOpen, breaker.Open}

// timelineSpan returns the run from second i to second j after start in
// the state of severity sev.
func timelineSpan(sev, i, j int, start time.Time) spanView {
	sv := stateOf(severityStates[sev])
	from, to := start.Add(time.Duration(i)*time.Second), start.Add(time.Duration(j)*time.Second)
	span := spanView{X: i, W: j - i, Class: sv.Class,
		Title: fmt.Sprintf("%s %s–%s UTC (%s)", sv.Text, clockText(from), clockText(to), agoText(to.Sub(from)))}
	// Height tells the state without colour: a thin band closed, half
	// height half-open, full height open.
	switch severityStates[sev] {
	case breaker.Open:
		span.Y, span.H = 0, timelineHeight
	case breaker.HalfOpen:
		span.Y, span.H = timelineHeight/4, timelineHeight/2
	default:
		span.Y, span.H = timelineHeight/2-2, 4
	}
	return span
}

// sparkline draws the answers per second of each bar as stacked step
// areas: every answer, then the refusals (E904 and E905), then E904 alone,
// each from the bottom, scaled to the peak.
func sparkline(bars [sparkBars][numClasses]float64) sparkView {
	var all, refused, open [sparkBars]float64
	peak := 0.0
	for i, b := range bars {
		for _, n := range b {
			all[i] += n
		}
		refused[i] = b[classOpen] + b[classFull]
		open[i] = b[classOpen]
		peak = max(peak, all[i])
	}
	scale := math.Max(peak, 1)
	v := sparkView{
		All: stepPath(all[:], scale), Refused: stepPath(refused[:], scale), Open: stepPath(open[:], scale),
		Peak: rateText(peak) + "/s",
	}
	v.Title = "answers per second, " + strconv.Itoa(int(sparkStep/time.Second)) + " s bars; peak " + v.Peak
	return v
}

// stepPath returns SVG path data for a step area of values scaled to
// scale over sparkHeight, one bar of sparkBarWidth per value; "" when all
// are zero.
func stepPath(values []float64, scale float64) string {
	var b strings.Builder
	b.WriteString("M0 " + strconv.Itoa(sparkHeight))
	prev, drawn := float64(sparkHeight), false
	for i, v := range values {
		y := float64(sparkHeight)
		if v > 0 {
			drawn = true
			// Any answer at all shows at least half a unit high.
			y = math.Min(math.Round(float64(sparkHeight)*(1-v/scale)*10)/10, float64(sparkHeight)-0.5)
		}
		if y != prev {
			b.WriteString("H" + strconv.Itoa(i*sparkBarWidth) + "V" + strconv.FormatFloat(y, 'f', -1, 64))
			prev = y
		}
	}
	if !drawn {
		return ""
	}
	b.WriteString("H" + strconv.Itoa(len(values)*sparkBarWidth) + "V" + strconv.Itoa(sparkHeight) + "Z")
	return b.String()
}
