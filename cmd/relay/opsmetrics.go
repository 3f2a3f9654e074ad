package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// opsMetrics are the metrics of what cmd/relay itself runs beside the hub:
// the breaker log's writes and the TLS certificates' expiry, for the alert
// rules of deploy/prometheus.
type opsMetrics struct {
	breakerLogErrors prometheus.Counter
}

// registerOpsMetrics registers relay_breaker_log_errors_total and, for each
// port serving TLS, relay_tls_certificate_expiry_timestamp_seconds{port},
// read from the certificate in force when scraped (SIGHUP may replace it).
func registerOpsMetrics(reg prometheus.Registerer, h hubTLS) (*opsMetrics, error) {
	m := &opsMetrics{breakerLogErrors: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relay_breaker_log_errors_total",
		Help: "Breaker state changes the breaker log did not take (a write failed); each is logged at error.",
	})}
	cols := []prometheus.Collector{m.breakerLogErrors}
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
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return m, nil
}
