package relay

import (
	"github.com/relayhub/relayhub/relay/targethttp"
	"github.com/rs/zerolog"
	"github.com/sourcegraph/conc"
)

// observability is what the Server tells its operator: its logs, its
// metrics and its access log. None of it is on an answer's path but the
// counting.
type observability struct {
	log         zerolog.Logger
	panicLog    zerolog.Logger // log sampled to panicLogBurst lines a second
	hubFaultLog zerolog.Logger // log sampled to one line every hubFaultLogPeriod
	// proxyLog logs the connections the PROXY rules refuse, sampled to
	// proxyLogBurst lines a second.
	proxyLog zerolog.Logger
	metrics  *Metrics   // nil without metrics
	access   *accessLog // nil without an access log
	// accessWriter owns the access log's writer, which outlives the
	// goroutines serving clients (serving.clientWork): it writes what they
	// recorded until they have all ended.
	accessWriter conc.WaitGroup
}

// logPanic logs a panic caught in a goroutine doing t, with its stack, and
// counts it.
func (s *Server) logPanic(t task, value any, stack []byte) {
	s.obs.panicLog.Error().Str("task", taskNames[t]).Interface("panic", value).Bytes("stack", stack).Msg("goroutine panicked")
	s.obs.metrics.countPanic(t)
}

// writeAccessLog runs the access log's writer until its queue is closed and
// written out, restarting it after a panic, so the access log never stops
// in silence. The lines the writer held unflushed at the panic are lost and
// counted as dropped.
func (s *Server) writeAccessLog() {
	for s.catchPanic(taskAccessLog, s.obs.access.writeLoop) {
		s.obs.access.dropBuffered()
		s.obs.panicLog.Warn().Msg("access log writer restarted after a panic")
	}
}

// stopAccessLog writes and flushes the access log's queue and ends its
// writer. It runs once every goroutine that records has ended.
func (s *Server) stopAccessLog() {
	if s.obs.access != nil {
		s.obs.access.close()
	}
	s.obs.accessWriter.Wait()
}

// logHubFault logs a call to rt, txid, that res says the hub did not make
// for want of its own resources: the first of a burst, then at most one
// every hubFaultLogPeriod for the whole hub, since the metrics count every
// one and a hub out of descriptors must not also flood its log.
func (s *Server) logHubFault(rt *target, txid []byte, res targethttp.Result) {
	if ev := s.obs.hubFaultLog.Error(); ev != nil {
		ev.Str("target", rt.name).Stringer("reason", res.Fault).Bytes("txid", txid).AnErr("err", res.Err).
			Msg("hub short of its own resources: call not made, answered E906")
	}
}
