package fleet

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the fleet's metrics, as documented in docs/OPERATING.md.
const (
	metricStoreUp     = "relay_state_store_up"
	metricPropagation = "relay_state_propagation_seconds"
	metricErrors      = "relay_state_store_errors_total"
	metricApplied     = "relay_state_changes_applied_total"
)

// Kinds of relay_state_store_errors_total: a command the store failed or
// did not answer in time, and content in the store or on the channel that
// is not the fleet's (logged and ignored).
const (
	errKindCommand = "command"
	errKindContent = "content"
)

// propagationBuckets are the upper bounds, in seconds, of the propagation
// histogram: fine around the milliseconds a change takes on one network,
// coarse up to the seconds of a resync.
var propagationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// metrics are the fleet's Prometheus metrics. Every method is a no-op on a
// nil *metrics (no Registerer). Label values come from a fixed set. It is
// safe for concurrent use.
type metrics struct {
	up          prometheus.Gauge
	propagation prometheus.Histogram
	cmdErrors   prometheus.Counter
	badContent  prometheus.Counter
	applied     prometheus.Counter
}

// newMetrics registers the fleet's metrics with reg; nil reg means none.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: metricErrors,
		Help: "State store trouble: kind=command for a command that failed or timed out, kind=content for store or channel content that is not the fleet's (ignored).",
	}, []string{"kind"})
	m := &metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metricStoreUp,
			Help: "1 while the hub reaches the state store and shares breaker state with the fleet, 0 while each breaker decides alone.",
		}),
		propagation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    metricPropagation,
			Help:    "Time from another hub's breaker change (its wall clock) to this hub's breaker applying it; includes the clock skew between the two hubs.",
			Buckets: propagationBuckets,
		}),
		cmdErrors:  errs.WithLabelValues(errKindCommand),
		badContent: errs.WithLabelValues(errKindContent),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricApplied,
			Help: "Breaker changes of other hubs (or operator actions given to them) that this hub applied to its own breakers.",
		}),
	}
	for _, c := range []prometheus.Collector{m.up, m.propagation, errs, m.applied} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return nil, fmt.Errorf("fleet: metrics registered twice: %w", err)
			}
			return nil, fmt.Errorf("fleet: metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) setUp(up bool) {
	if m == nil {
		return
	}
	if up {
		m.up.Set(1)
	} else {
		m.up.Set(0)
	}
}

func (m *metrics) observeLag(d time.Duration) {
	if m != nil {
		m.propagation.Observe(max(d, 0).Seconds())
	}
}

func (m *metrics) commandFailed() {
	if m != nil {
		m.cmdErrors.Inc()
	}
}

func (m *metrics) contentIgnored() {
	if m != nil {
		m.badContent.Inc()
	}
}

func (m *metrics) changeApplied() {
	if m != nil {
		m.applied.Inc()
	}
}
