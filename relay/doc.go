// Package relay is the relayhub hub. It reads transactions from TCP clients,
// one line each (TXID|TARGET|PAYLOAD), relays each to its target with an
// HTTP POST, and answers one line per transaction (TXID|CODE|MESSAGE). Every
// target has its own circuit breaker and bulkhead, so one slow or dead
// target is refused at once (E904, E905) instead of dragging the hub and the
// other targets down.
//
// The protocol lives in pure functions on byte slices (ParseRequest,
// AppendResponse, DecodeAnswer); the Server owns connections, deadlines and
// buffering, and one method composes the policies: breaker, bulkhead, call,
// record, release.
//
// Each target may have settings of its own (Target.Settings, which
// LoadTargetFile fills from a TOML file over the flags' defaults), the
// optional breaker policies of SPEC §12 (failure rate, slow calls, backoff,
// jitter), and a fallback target that takes its requests while its breaker
// refuses them. Operators control a breaker by hand through
// Server.ControlBreaker, which Admin serves as POST /breakers/{target}.
//
// Observability is optional and off the answer path: Metrics (NewMetrics)
// counts every answer by target and code on a Prometheus registry of the
// caller's; Admin (NewAdmin) serves /metrics, /healthz, /readyz and
// /status; Config.AccessLog writes one JSON line per answer from a
// goroutine of the Server, dropping lines rather than delaying answers.
//
// Typical use:
//
//	reg := prometheus.NewRegistry()
//	metrics, err := relay.NewMetrics(reg)
//	if err != nil {
//		return err
//	}
//	srv, err := relay.New(relay.Config{
//		Targets: []relay.Target{
//			{Name: "CORE", URL: "http://127.0.0.1:9201"},
//			{Name: "CLAIM", URL: "http://127.0.0.1:9202"},
//		},
//		OnTransition: func(t breaker.Transition) { /* append to the breaker log */ },
//		Metrics:      metrics,
//	})
//	if err != nil {
//		return err
//	}
//	admin, err := relay.NewAdmin(relay.AdminConfig{Server: srv, Gatherer: reg})
//	if err != nil {
//		return err
//	}
//	go http.ListenAndServe("127.0.0.1:9280", admin)
//	ln, err := net.Listen("tcp", "127.0.0.1:9200")
//	if err != nil {
//		return err
//	}
//	go srv.Serve(ln)
//	<-ctx.Done()
//	drain, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//	defer cancel()
//	return srv.Shutdown(drain)
package relay
