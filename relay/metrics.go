package relay

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// Names of the hub's metrics and labels, as documented in
// docs/OPERATING.md.
const (
	metricBreakerState     = "relay_breaker_state"
	metricTransitions      = "relay_breaker_transitions_total"
	metricRequests         = "relay_requests_total"
	metricRejections       = "relay_rejections_total"
	metricUnrouted         = "relay_unrouted_total"
	metricInflight         = "relay_bulkhead_inflight"
	metricLimit            = "relay_bulkhead_limit"
	metricDuration         = "relay_target_duration_seconds"
	metricConnectionsOpen  = "relay_connections_open"
	metricLaneWaiting      = "relay_refusal_lane_waiting"
	metricAccessLogDropped = "relay_access_log_dropped_total"
	metricFallbacks        = "relay_fallbacks_total"
	metricPanics           = "relay_panics_total"
	metricConnsOpened      = "relay_target_connections_opened_total"
	metricInDoubt          = "relay_in_doubt_total"
	metricInDoubtLogError  = "relay_in_doubt_log_errors_total"
	metricInDoubtOpen      = "relay_in_doubt_open"
	metricInDoubtOldest    = "relay_in_doubt_oldest_age_seconds"
	metricInDoubtResolved  = "relay_in_doubt_resolved_total"
	metricRetries          = "relay_target_retries_total"
	metricProbes           = "relay_probes_total"
	metricProbeLast        = "relay_probe_last_timestamp_seconds"
	metricProbeLastTook    = "relay_probe_last_duration_seconds"
	metricProbeLastHealthy = "relay_probe_last_healthy"
	metricDedup            = "relay_dedup_total"
	metricDedupEvictions   = "relay_dedup_evictions_total"
	metricDedupRefused     = "relay_dedup_refused_total"
	metricDedupEntries     = "relay_dedup_entries"
	metricDedupFallbacks   = "relay_dedup_store_fallbacks_total"
	metricHubRefusals      = "relay_hub_refusals_total"

	labelTarget    = "target"
	labelCode      = "code"
	labelFrom      = "from"
	labelTo        = "to"
	labelReason    = "reason"
	labelFallback  = "fallback"
	labelTask      = "task"
	labelOutcome   = "outcome"
	labelVia       = "via"
	outcomeHealthy = "healthy"
	outcomeFailed  = "failed"
	reasonOpen     = "open" // E904: the breaker refused
	reasonFull     = "full" // E905: the bulkhead refused

	// codeLabelBusiness stands for every Bnnn a target sends, and
	// codeLabelOtherTargetCode for every Ennn a target sends that a call
	// cannot end with on its own (see callCodeLabel): a target's codes are
	// unbounded input, so they share one label value each.
	codeLabelBusiness        = "Bnnn"
	codeLabelOtherTargetCode = "Ennn"
)

// durationBuckets are the upper bounds, in seconds, of the target call
// duration histogram: fine below 100 ms where a healthy target answers,
// coarse up to and past the default 3 s target timeout. Never changed.
var durationBuckets = [...]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// codeLabel is an index into the fixed set of code label values of
// relay_requests_total. Client input never picks one: the hub's own answers
// use their constant, and a target's answer is folded by callCodeLabel. It
// is a plain value.
type codeLabel uint8

const (
	lblOK              codeLabel = iota // 0000
	lblBusiness                         // Bnnn: any business rejection a target sent
	lblRefused                          // E400
	lblFailed                           // E500
	lblTimeout                          // E901
	lblUnreachable                      // E902
	lblCircuitOpen                      // E904, the hub's own
	lblBulkheadFull                     // E905, the hub's own
	lblUnavailable                      // E906, the hub's own
	lblInternal                         // E907, the hub's own
	lblOtherTargetCode                  // Ennn: any other error code a target sent
	lblNotAllowed                       // E908, the hub's own
	lblTxIDReused                       // E909, the hub's own
	numCodeLabels
)

// codeLabelValues are the code label values, by codeLabel.
var codeLabelValues = [numCodeLabels]string{
	lblOK:              protocol.CodeOK,
	lblBusiness:        codeLabelBusiness,
	lblRefused:         protocol.CodeRefused,
	lblFailed:          protocol.CodeTargetFailed,
	lblTimeout:         protocol.CodeTimeout,
	lblUnreachable:     protocol.CodeUnreachable,
	lblCircuitOpen:     protocol.CodeCircuitOpen,
	lblBulkheadFull:    protocol.CodeBulkheadFull,
	lblUnavailable:     protocol.CodeUnavailable,
	lblInternal:        protocol.CodeInternal,
	lblOtherTargetCode: codeLabelOtherTargetCode,
	lblNotAllowed:      protocol.CodeNotAllowed,
	lblTxIDReused:      protocol.CodeTxIDReused,
}

// callCodeLabel folds the code a target call ended with into the fixed
// label set. The codes a call itself produces keep their own label; a
// target's business rejections share "Bnnn" and any other Ennn it sends,
// even one that looks like a hub code such as E904, shares "Ennn", so a
// target can neither grow the label set nor pass for the hub's refusals.
func callCodeLabel(code string) codeLabel {
	switch code {
	case protocol.CodeOK:
		return lblOK
	case protocol.CodeRefused:
		return lblRefused
	case protocol.CodeTargetFailed:
		return lblFailed
	case protocol.CodeTimeout:
		return lblTimeout
	case protocol.CodeUnreachable:
		return lblUnreachable
	}
	if len(code) > 0 && code[0] == 'B' {
		return lblBusiness
	}
	return lblOtherTargetCode
}

// unroutedCodes are the answers that may be attributed to no configured
// target: a malformed line, an unknown target, a line read while shutting
// down (or a connection over the limit) whose target is unknown, and a hub
// bug caught before the target was known.
// task names a kind of goroutine of the Server, for the panics metric and
// the log.
type task uint8

const (
	taskConn       task = iota // serving one client connection
	taskTurnAway               // answering a connection over MaxConns
	taskCallWorker             // running target calls
	taskAccessLog              // writing the access log
	taskProber                 // sending a target's synthetic probes
	taskResolver               // looking up the outcome of a resent transaction in doubt
	numTasks
)

// taskNames are the label values of relay_panics_total.
var taskNames = [numTasks]string{"conn", "turn_away", "call_worker", "access_log", "prober", "resolver"}

var unroutedCodes = [...]string{protocol.CodeMalformed, protocol.CodeUnknownTarget, protocol.CodeUnavailable, protocol.CodeInternal}

// Metrics are the hub's Prometheus metrics. NewMetrics registers them; give
// the result to Config.Metrics of one Server, whose New resolves every label
// child once, per configured target and per code, so that counting a
// request never looks a label up. Label values come only from the
// configuration and the fixed code set, never from client input. A Metrics
// is safe for concurrent use.
type Metrics struct {
	transitions *prometheus.CounterVec
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	fallbacks   *prometheus.CounterVec
	connsOpened *prometheus.CounterVec
	inDoubt     *prometheus.CounterVec
	inDoubtErrs prometheus.Counter
	resolved    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	probes      *prometheus.CounterVec
	probeLast   *prometheus.GaugeVec
	probeTook   *prometheus.GaugeVec
	probeOK     *prometheus.GaugeVec
	shielded    *prometheus.CounterVec
	hubRefusals *prometheus.CounterVec
	shieldFull  *prometheus.CounterVec
	unrouted    [len(unroutedCodes)]prometheus.Counter
	dropped     prometheus.Counter
	panics      [numTasks]prometheus.Counter
	live        *liveCollector
	tls         *tlsMetrics
}

// NewMetrics creates the hub's metrics and registers them with reg. A nil
// reg means a registry of their own that nobody gathers, which keeps the
// hub's accounting without exposing it. It fails if reg already has
// collectors of the same names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{live: newLiveCollector()}
	m.newCallMetrics()
	m.newProbeMetrics()
	m.newShieldMetrics()
	unrouted, panics := m.newHubMetrics()
	for _, c := range m.collectors(unrouted, panics) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
	}
	var err error
	if m.tls, err = registerTLSMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// newCallMetrics creates the metrics of each target's breaker and calls.
func (m *Metrics) newCallMetrics() {
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricTransitions,
		Help: "State changes of the target's circuit breaker.",
	}, []string{labelTarget, labelFrom, labelTo})
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricRequests,
		Help: "Answers to request lines for a configured target, by response code; Bnnn and Ennn stand for every business rejection and every other error code the target sent.",
	}, []string{labelTarget, labelCode})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    metricDuration,
		Help:    "Duration of target calls in seconds, whatever their outcome, timeouts included.",
		Buckets: durationBuckets[:],
	}, []string{labelTarget})
	m.fallbacks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricFallbacks,
		Help: "Requests the target's breaker refused that its fallback's breaker admitted; their answers are counted under the fallback in relay_requests_total.",
	}, []string{labelTarget, labelFallback})
	m.connsOpened = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricConnsOpened,
		Help: "Connections opened to the target, each a new TCP (and, for https, TLS) handshake; a kept-alive connection reused is not counted.",
	}, []string{labelTarget})
	m.inDoubt = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricInDoubt,
		Help: "Calls to the target that ended in doubt: the request may have reached the target and the outcome is unknown (see the in-doubt journal).",
	}, []string{labelTarget})
	m.resolved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricInDoubtResolved,
		Help: "Transactions in doubt settled, by outcome (applied, not_applied, reversed, or expired: given up) and by how it was learnt (via resend, lookup, late_answer, reversal or operator).",
	}, []string{labelTarget, labelOutcome, labelVia})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricRetries,
		Help: "Calls tried a second time because the connect to the target was refused or reset, before any byte of the request was sent.",
	}, []string{labelTarget})
	m.hubRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricHubRefusals,
		Help: "Calls to the target the hub did not make for want of its own resources, answered E906 (hub overloaded; not sent) and not counted by the breaker, by reason: descriptors, memory, ports, socket.",
	}, []string{labelTarget, labelReason})
}

// newProbeMetrics creates the metrics of each target's synthetic probes.
func (m *Metrics) newProbeMetrics() {
	m.probes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricProbes,
		Help: "Synthetic recovery probes the hub sent to the target, by outcome: healthy (an answer code of probe_expect) or failed.",
	}, []string{labelTarget, labelOutcome})
	m.probeLast = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricProbeLast,
		Help: "When the target's latest synthetic probe ended, in seconds since the Unix epoch.",
	}, []string{labelTarget})
	m.probeTook = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricProbeLastTook,
		Help: "How long the target's latest synthetic probe took, in seconds.",
	}, []string{labelTarget})
	m.probeOK = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: metricProbeLastHealthy,
		Help: "1 when the target's latest synthetic probe was healthy, 0 when it failed.",
	}, []string{labelTarget})
}

// newShieldMetrics creates the duplicate-TXID shield's metrics per target;
// those of its memory as a whole are collectors (m.collectors).
func (m *Metrics) newShieldMetrics() {
	m.shielded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricDedup,
		Help: "Requests the duplicate-TXID shield dealt with, by outcome: joined the call in flight, replayed a remembered answer, refused_payload (E909), resolved_applied, resolved_not_applied (sent afresh) or unresolved (E901 without a call) for a resend of a call in doubt.",
	}, []string{labelTarget, labelOutcome})
	m.shieldFull = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricDedupRefused,
		Help: "New TXIDs refused E906 without a call because the duplicate-TXID shield was at --dedup-max-entries with calls in flight or in doubt only, which it never forgets before their window.",
	}, []string{labelTarget})
}

// newHubMetrics creates the metrics of the hub's own doings, and returns
// the vectors whose children it resolved into m.unrouted and m.panics, for
// registering.
func (m *Metrics) newHubMetrics() (unrouted, panics *prometheus.CounterVec) {
	m.inDoubtErrs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: metricInDoubtLogError,
		Help: "Calls in doubt not written to the in-doubt journal (a write or fsync failed, its queue was full, or it took too long); each was answered all the same.",
	})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: metricAccessLogDropped,
		Help: "Access log lines not written because the writer's queue was full or the writer failed.",
	})
	unrouted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricUnrouted,
		Help: "Answers attributed to no configured target (malformed line, unknown target, or shutdown or connection limit before the target was known), by response code.",
	}, []string{labelCode})
	for i, code := range unroutedCodes {
		m.unrouted[i] = unrouted.WithLabelValues(code)
	}
	panics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricPanics,
		Help: "Panics caught in the hub's goroutines, by task; each is also logged with its stack. Any is a bug.",
	}, []string{labelTask})
	for i, name := range taskNames {
		m.panics[i] = panics.WithLabelValues(name)
	}
	return unrouted, panics
}

// collectors returns every collector of m to register, with unrouted and
// panics, the vectors of m.unrouted and m.panics.
func (m *Metrics) collectors(unrouted, panics *prometheus.CounterVec) []prometheus.Collector {
	return []prometheus.Collector{
		m.transitions, m.requests, m.duration, m.fallbacks, m.connsOpened, m.inDoubt, m.resolved, m.inDoubtErrs, m.retries, unrouted, m.dropped, panics, m.live,
		m.probes, m.probeLast, m.probeTook, m.probeOK, m.shielded, m.shieldFull, m.hubRefusals,
		m.shieldFunc(prometheus.CounterValue, metricDedupEvictions, "TXIDs the duplicate-TXID shield forgot before their window ended, to stay within --dedup-max-entries.",
			func(s *Server) int64 { return s.shield.mem.Evictions() }),
		m.shieldFunc(prometheus.GaugeValue, metricDedupEntries, "TXIDs the duplicate-TXID shield remembers, expired ones not yet swept included.",
			func(s *Server) int64 { return s.shield.mem.Len() }),
		m.shieldFunc(prometheus.CounterValue, metricDedupFallbacks, "Commands of the duplicate-TXID shield to the fleet's store that failed (a shielded call makes two: its claim and its outcome), each leaving the hub to shield on its own memory.",
			func(s *Server) int64 { return s.shield.storeFallbacks.Load() }),
	}
}

// countUnrouted counts an answer attributed to no target. code is one of
// unroutedCodes. It does nothing on a nil Metrics.
func (m *Metrics) countUnrouted(code string) {
	if m == nil {
		return
	}
	for i, c := range unroutedCodes {
		if c == code {
			m.unrouted[i].Inc()
			return
		}
	}
	panic("relay: no unrouted metric for code " + code)
}

// countDropped counts an access log line not written. It does nothing on a
// nil Metrics.
func (m *Metrics) countDropped() {
	if m != nil {
		m.dropped.Inc()
	}
}

// countInDoubtLogError counts a call in doubt the journal did not take.
// It does nothing on a nil Metrics.
func (m *Metrics) countInDoubtLogError() {
	if m != nil {
		m.inDoubtErrs.Inc()
	}
}

// countPanic counts a panic caught in a goroutine doing t. It does nothing
// on a nil Metrics.
func (m *Metrics) countPanic(t task) {
	if m != nil {
		m.panics[t].Inc()
	}
}

// bind makes m the Metrics of srv. It fails if m already serves another
// Server: two servers reporting the same target names would collide in
// every series.
func (m *Metrics) bind(srv *Server) error {
	if !m.live.srv.CompareAndSwap(nil, srv) {
		return errors.New("relay: Config.Metrics is already used by another Server")
	}
	return nil
}

// forTarget resolves the label children of one configured target. It
// returns nil on a nil Metrics.
func (m *Metrics) forTarget(name string) *targetMetrics {
	if m == nil {
		return nil
	}
	rm := &targetMetrics{
		duration:    m.duration.WithLabelValues(name),
		connsOpened: m.connsOpened.WithLabelValues(name),
		inDoubt:     m.inDoubt.WithLabelValues(name),
		resolved:    make(map[resolvedKey]prometheus.Counter, len(resolvedSeries)),
		retries:     m.retries.WithLabelValues(name),
		probeLast:   m.probeLast.WithLabelValues(name),
		probeTook:   m.probeTook.WithLabelValues(name),
		probeOK:     m.probeOK.WithLabelValues(name),
		shieldFull:  m.shieldFull.WithLabelValues(name),
		probes: [2]prometheus.Counter{
			m.probes.WithLabelValues(name, outcomeFailed),
			m.probes.WithLabelValues(name, outcomeHealthy),
		},
	}
	for i, code := range codeLabelValues {
		rm.requests[i] = m.requests.WithLabelValues(name, code)
	}
	for _, k := range resolvedSeries {
		rm.resolved[k] = m.resolved.WithLabelValues(name, string(k.outcome), k.via)
	}
	for i, outcome := range shieldOutcomeNames {
		rm.shielded[i] = m.shielded.WithLabelValues(name, outcome)
	}
	for f := targethttp.NoHubFault + 1; f < targethttp.NumHubFaults; f++ {
		rm.hubRefusals[f] = m.hubRefusals.WithLabelValues(name, f.String())
	}
	for from := range rm.transitions {
		for to := range rm.transitions[from] {
			if from != to {
				rm.transitions[from][to] = m.transitions.WithLabelValues(name,
					breaker.State(from).String(), breaker.State(to).String())
			}
		}
	}
	return rm
}

// targetMetrics are one target's label children, resolved once by New. A nil
// *targetMetrics (no Metrics configured) counts nothing. Safe for concurrent
// use.
type targetMetrics struct {
	requests [numCodeLabels]prometheus.Counter
	duration prometheus.Observer
	// transitions is indexed [from][to] by breaker.State; nil where from
	// equals to, which is no change.
	transitions [3][3]prometheus.Counter
	// connsOpened counts the connections opened to the target.
	connsOpened prometheus.Counter
	// inDoubt counts the target's calls that ended in doubt.
	inDoubt prometheus.Counter
	// resolved counts their settlements, by outcome and via; read-only
	// once built.
	resolved map[resolvedKey]prometheus.Counter
	// retries counts the calls tried again after a failed connect.
	retries prometheus.Counter
	// probes counts the synthetic probes, failed [0] and healthy [1]; the
	// gauges tell the latest one.
	probes                        [2]prometheus.Counter
	probeLast, probeTook, probeOK prometheus.Gauge
	// shielded counts the shield's outcomes, by shieldOutcome.
	shielded [numShieldOutcomes]prometheus.Counter
	// shieldFull counts the new TXIDs the shield refused, full.
	shieldFull prometheus.Counter
	// hubRefusals counts the calls not made for want of the hub's own
	// resources, by targethttp.HubFault; nil for NoHubFault.
	hubRefusals [targethttp.NumHubFaults]prometheus.Counter
}

// countHubRefusal counts a call, a client's or a synthetic probe, not
// made for want of the hub's own resource f.
func (rm *targetMetrics) countHubRefusal(f targethttp.HubFault) {
	if rm == nil {
		return
	}
	if c := rm.hubRefusals[f]; c != nil {
		c.Inc()
	}
}

// countShielded counts what the shield did with a request.
func (rm *targetMetrics) countShielded(o shieldOutcome) {
	if rm != nil {
		rm.shielded[o].Inc()
	}
}

// countShieldFull counts a new TXID the shield refused, full.
func (rm *targetMetrics) countShieldFull() {
	if rm != nil {
		rm.shieldFull.Inc()
	}
}

// shieldFunc is a metric without labels whose value is read from the bound
// Server when gathered: 0 before one is bound.
func (m *Metrics) shieldFunc(t prometheus.ValueType, name, help string, value func(*Server) int64) prometheus.Collector {
	read := func() float64 {
		if s := m.live.srv.Load(); s != nil {
			return float64(value(s))
		}
		return 0
	}
	opts := prometheus.Opts{Name: name, Help: help}
	if t == prometheus.CounterValue {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(opts), read)
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts), read)
}

// observeProbe counts a synthetic probe and makes it the latest.
func (rm *targetMetrics) observeProbe(p *ProbeResult) {
	if rm == nil {
		return
	}
	ok := 0
	if p.Healthy {
		ok = 1
	}
	rm.probes[ok].Inc()
	rm.probeLast.Set(float64(p.At.UnixNano()) / 1e9)
	rm.probeTook.Set(p.Duration.Seconds())
	rm.probeOK.Set(float64(ok))
}

// countRetry counts a call tried again after a failed connect.
func (rm *targetMetrics) countRetry() {
	if rm != nil {
		rm.retries.Inc()
	}
}

// resolvedKey is a series of relay_in_doubt_resolved_total.
type resolvedKey struct {
	outcome resolver.Outcome
	via     string
}

// resolvedSeries are the outcomes and the ways each can be learnt, each
// series created up front so that it reads 0 before its first count.
var resolvedSeries = []resolvedKey{
	{resolver.Applied, indoubt.ViaResend}, {resolver.Applied, indoubt.ViaLookup},
	{resolver.Applied, indoubt.ViaLateAnswer}, {resolver.Applied, indoubt.ViaOperator},
	{resolver.NotApplied, indoubt.ViaResend}, {resolver.NotApplied, indoubt.ViaLookup}, {resolver.NotApplied, indoubt.ViaOperator},
	{resolver.Reversed, indoubt.ViaReversal}, {resolver.Reversed, indoubt.ViaOperator},
	{resolver.Expired, indoubt.ViaLookup}, {resolver.Expired, indoubt.ViaReversal},
}

// countResolved counts a settlement of a transaction in doubt.
func (rm *targetMetrics) countResolved(o resolver.Outcome, via string) {
	if rm == nil {
		return
	}
	if c := rm.resolved[resolvedKey{o, via}]; c != nil {
		c.Inc()
	}
}

// countInDoubt counts a call that ended in doubt.
func (rm *targetMetrics) countInDoubt() {
	if rm != nil {
		rm.inDoubt.Inc()
	}
}

// countConnOpened counts a connection opened to the target.
func (rm *targetMetrics) countConnOpened() {
	if rm != nil {
		rm.connsOpened.Inc()
	}
}

// count counts one answer with label l. For E904 and E905 that is also
// the rejection, which liveCollector reports from the same counter.
func (rm *targetMetrics) count(l codeLabel) {
	if rm != nil {
		rm.requests[l].Inc()
	}
}

// observeCall counts a finished target call: its code and its duration in
// seconds.
func (rm *targetMetrics) observeCall(l codeLabel, seconds float64) {
	if rm == nil {
		return
	}
	rm.requests[l].Inc()
	rm.duration.Observe(seconds)
}

// transition records a breaker state change. It runs inside the breaker's
// transition observer, under the breaker's lock: a gauge store and a
// counter increment, nothing that could call back.
func (rm *targetMetrics) transition(t breaker.Transition) {
	if rm == nil || int(t.From) >= len(rm.transitions) || int(t.To) >= len(rm.transitions) {
		return
	}
	if c := rm.transitions[t.From][t.To]; c != nil {
		c.Inc()
	}
}

// liveCollector reports what is read from the bound Server at scrape time
// rather than kept up to date on every request: the breakers' states (of
// the targets served now: a target a reload removed has no series), the
// bulkheads' calls in
// flight, the open connections, the connections waiting for a turn in the
// refusal lane, and the rejections, which are the
// E904 and E905 answers of relay_requests_total under another name, so a
// refusal costs one increment, not two. Safe for concurrent use.
type liveCollector struct {
	srv        atomic.Pointer[Server]
	state      *prometheus.Desc
	inflight   *prometheus.Desc
	limit      *prometheus.Desc
	conns      *prometheus.Desc
	laneWait   *prometheus.Desc
	rejections *prometheus.Desc
	open       *prometheus.Desc
	oldest     *prometheus.Desc
}

func newLiveCollector() *liveCollector {
	return &liveCollector{
		state: prometheus.NewDesc(metricBreakerState,
			"State of the target's circuit breaker: 0 closed, 1 open, 2 half-open.", []string{labelTarget}, nil),
		inflight: prometheus.NewDesc(metricInflight,
			"Calls to the target holding a bulkhead slot now.", []string{labelTarget}, nil),
		limit: prometheus.NewDesc(metricLimit,
			"The target's bulkhead limit now: max_inflight, or the adaptive limit (computed, not enforced, with adaptive_limit = \"observe\").", []string{labelTarget}, nil),
		conns: prometheus.NewDesc(metricConnectionsOpen,
			"Client connections being served now.", nil, nil),
		laneWait: prometheus.NewDesc(metricLaneWaiting,
			"Refusal-heavy client connections holding lines read and waiting for their turn to answer them now.", nil, nil),
		rejections: prometheus.NewDesc(metricRejections,
			"Requests refused without calling the target: reason open is the breaker (E904), full the bulkhead (E905).",
			[]string{labelTarget, labelReason}, nil),
		open: prometheus.NewDesc(metricInDoubtOpen,
			"Transactions in doubt to the target the hub has not settled yet.", []string{labelTarget}, nil),
		oldest: prometheus.NewDesc(metricInDoubtOldest,
			"Age in seconds of the target's oldest transaction in doubt not settled yet; 0 when none.", []string{labelTarget}, nil),
	}
}

// Describe implements prometheus.Collector.
func (lc *liveCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- lc.state
	ch <- lc.inflight
	ch <- lc.limit
	ch <- lc.conns
	ch <- lc.laneWait
	ch <- lc.rejections
	ch <- lc.open
	ch <- lc.oldest
}

// Collect implements prometheus.Collector. Before a Server is bound it
// reports nothing.
func (lc *liveCollector) Collect(ch chan<- prometheus.Metric) {
	s := lc.srv.Load()
	if s == nil {
		return
	}
	for _, r := range s.table.all() {
		ch <- prometheus.MustNewConstMetric(lc.state, prometheus.GaugeValue, float64(r.breaker.Snapshot().State), r.name)
		ch <- prometheus.MustNewConstMetric(lc.inflight, prometheus.GaugeValue, float64(r.bulkhead.InFlight()), r.name)
		ch <- prometheus.MustNewConstMetric(lc.limit, prometheus.GaugeValue, float64(r.limit()), r.name)
		st := s.resolve.r.Stats(r.name)
		age := 0.0
		if !st.Oldest.IsZero() {
			age = max(s.now().Sub(st.Oldest).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(lc.open, prometheus.GaugeValue, float64(st.Open), r.name)
		ch <- prometheus.MustNewConstMetric(lc.oldest, prometheus.GaugeValue, age, r.name)
		if r.metrics != nil {
			ch <- prometheus.MustNewConstMetric(lc.rejections, prometheus.CounterValue,
				counterValue(r.metrics.requests[lblCircuitOpen]), r.name, reasonOpen)
			ch <- prometheus.MustNewConstMetric(lc.rejections, prometheus.CounterValue,
				counterValue(r.metrics.requests[lblBulkheadFull]), r.name, reasonFull)
		}
	}
	ch <- prometheus.MustNewConstMetric(lc.conns, prometheus.GaugeValue, float64(s.ConnectionsOpen()))
	ch <- prometheus.MustNewConstMetric(lc.laneWait, prometheus.GaugeValue, float64(s.lane.waiting.Load()))
}

// counterValue reads a counter's current value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		// A plain counter's Write never fails.
		panic("relay: read counter: " + err.Error())
	}
	return m.GetCounter().GetValue()
}

var _ prometheus.Collector = (*liveCollector)(nil)

// fallbackCounter resolves relay_fallbacks_total of a target and its
// fallback. It returns nil on a nil Metrics or without a fallback.
func (m *Metrics) fallbackCounter(name, fallback string) prometheus.Counter {
	if m == nil || fallback == "" {
		return nil
	}
	return m.fallbacks.WithLabelValues(name, fallback)
}
