package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayhub/relayhub/breakerlog"
	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// registerOpsMetrics registers the metrics of what cmd/relay itself runs
// beside the hub, for the alert rules of deploy/prometheus: the breaker
// log's writer, read from blog when scraped, and, for each port serving
// TLS, relay_tls_certificate_expiry_timestamp_seconds{port}, read from the
// certificate in force when scraped (SIGHUP may replace it).
func registerOpsMetrics(reg prometheus.Registerer, h hubTLS, blog *breakerlog.Queue) error {
	cols := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "relay_breaker_log_errors_total",
			Help: "Failed writes to the breaker log (a write or fsync failed), each logged; the line is written again every second until it succeeds.",
		}, func() float64 { return float64(blog.Status().WriteErrors) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "relay_breaker_log_dropped_total",
			Help: "Breaker state changes the breaker log will not have: its queue was full (a stalled or failing disk), the relay stopped before they were written, or a write left the line torn.",
		}, func() float64 { return float64(blog.Status().Dropped) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_breaker_log_pending",
			Help: "Breaker state changes queued for the breaker log and not yet written.",
		}, func() float64 { return float64(blog.Status().Pending) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_breaker_log_oldest_pending_seconds",
			Help: "How long the oldest breaker state change not yet written to the breaker log has waited; 0 when none waits.",
		}, func() float64 { return blog.Status().OldestPending.Seconds() }),
	}
	for port, files := range map[string]*tlsfiles.Server{"client": h.client, "admin": h.admin} {
		if files == nil {
			continue
		}
		cols = append(cols, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "relay_tls_certificate_expiry_timestamp_seconds",
			Help:        "When the certificate the port serves expires, in seconds since the Unix epoch.",
			ConstLabels: prometheus.Labels{"port": port},
		}, func() float64 { return float64(files.Leaf().NotAfter.Unix()) }))
	}
	for _, c := range cols {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}
