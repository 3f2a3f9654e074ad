// Package relay is the relayhub hub. It reads transactions from TCP clients,
// one line each (TXID|TARGET|PAYLOAD), relays each to its target with an
// HTTP POST, and answers one line per transaction (TXID|CODE|MESSAGE). Every
// target has its own circuit breaker and bulkhead, so one slow or dead
// target is refused at once (E904, E905) instead of dragging the hub and the
// other targets down. The contract is docs/PROTOCOL.md.
//
// The package is the hub's core: the Server owns listeners and
// connections (server.go); a connection reads and writes, with its
// deadlines and buffering (conn.go, answerwriter.go); an admitter decides,
// in one method that composes the policies for a request — certificate
// check, shield, breaker, bulkhead, call, record, release (admit.go) —
// and one callHold carries each transaction in flight (hold.go). Its neighbours each do one job: relay/protocol parses and
// writes lines, relay/targethttp calls a target over HTTP, relay/admin
// serves the admin port, relay/settingsfile reads the per-target settings
// file.
//
// Each target may have settings of its own (Target.Settings, which
// settingsfile.Load fills from a TOML file over the flags' defaults), the
// optional breaker policies (breaker.Policy: failure rate, slow calls,
// backoff, jitter), and a fallback target that takes its requests while its
// breaker refuses them. Operators control a breaker by hand through
// Server.ControlBreaker, which relay/admin serves as POST /breakers/{target}.
//
// A running Server changes its targets and settings with Reload, keeping
// every breaker's state and counts; Withdraw takes it out of a load
// balancer's rotation ahead of Shutdown; and with Config.ProxyProtocol it
// takes each client's address from a trusted balancer's PROXY header.
//
// Observability is optional and off the answer path: Metrics (NewMetrics)
// counts every answer by target and code on a Prometheus registry of the
// caller's; Config.AccessLog writes one JSON line per answer from a
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
