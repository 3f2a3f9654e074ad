package relay

import (
	"crypto/sha256"
	"sync/atomic"
	"time"

	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/resolver"
	"github.com/relayhub/relayhub/relay/targethttp"
)

// inDoubtJournal is a Server's record of calls in doubt: the journal on
// disk (nil: none), the recent ones in memory, and the hub's name in
// their records (set by New or the first Serve).
type inDoubtJournal struct {
	journal *indoubt.Journal
	recent  *indoubt.Ring
	hubID   atomic.Pointer[string]
}

// journalInDoubt records a call to rt that ended in doubt at end: counted,
// kept among the recent ones, and appended to the journal, if any, which
// returns once the line is fsynced: the caller waits for the disk. A
// journal that fails is logged and counted; the caller answers the client
// all the same.
func (s *Server) journalInDoubt(rt *target, conf *targetConf, txid, payload []byte, res targethttp.Result, end time.Time) {
	rt.inDoubt.Add(1)
	rt.metrics.countInDoubt()
	e := indoubt.Entry{
		Time:          end,
		Hub:           s.inDoubt.hubName(),
		TxID:          string(txid),
		Target:        rt.name,
		URL:           conf.url,
		Code:          res.Code,
		Stage:         res.Stage.String(),
		BytesSent:     res.BytesSent,
		PayloadSHA256: payloadSum(payload),
	}
	if err := s.appendJournal(&e); err != nil {
		if ev := rt.failLog.Error(); ev != nil {
			ev.Err(err).Bytes("txid", txid).Str("path", s.inDoubt.journal.Path()).Msg("in-doubt call not journalled")
		}
	}
}

// appendJournal keeps e among the recent lines and appends it to the
// journal, if any, returning once it is fsynced; a failure is counted and
// returned for the caller to log.
func (s *Server) appendJournal(e *indoubt.Entry) error {
	s.inDoubt.recent.Add(*e)
	if s.inDoubt.journal == nil {
		return nil
	}
	err := s.inDoubt.journal.Append(e)
	if err != nil {
		s.obs.metrics.countInDoubtLogError()
	}
	return err
}

// hubName is the hub's name in its records: Config.HubID, or the default
// of the first listener; empty before one is known.
func (j *inDoubtJournal) hubName() string {
	if id := j.hubID.Load(); id != nil {
		return *id
	}
	return ""
}

// InDoubt returns the recent calls in doubt (the last 1000) that ended at
// or after since, oldest first.
func (s *Server) InDoubt(since time.Time) []indoubt.Entry {
	return s.inDoubt.recent.Since(since)
}

// journalResolved appends to the in-doubt journal that the target applied
// req, a transaction in doubt, with code, as a resend learnt it; it
// returns once the line is fsynced.
func (s *Server) journalResolved(rt *target, conf *targetConf, req protocol.Request, code string) {
	ref := &doubtRef{url: conf.url, sum: payloadSum(req.Payload)}
	countResolved(rt, resolver.Applied, indoubt.ViaResend)
	s.journalSettled(rt, rt.name, ref, string(req.TxID), indoubt.StageResolvedApplied, indoubt.ViaResend, code)
}

// journalSettled appends the resolution line of txid at target (rt, nil
// when no longer configured): its stage, how it was learnt (via) and the
// code; it returns once the line is fsynced. Its time is the system
// clock's, as the journal's other lines.
func (s *Server) journalSettled(rt *target, target string, ref *doubtRef, txid, stage, via, code string) {
	e := indoubt.Entry{
		Time:          time.Now(),
		Hub:           s.inDoubt.hubName(),
		TxID:          txid,
		Target:        target,
		URL:           ref.url,
		Code:          code,
		Stage:         stage,
		Via:           via,
		PayloadSHA256: ref.sum,
	}
	if err := s.appendJournal(&e); err != nil {
		log := s.obs.log
		if rt != nil {
			log = rt.log
		}
		log.Error().Err(err).Str("txid", txid).Str("path", s.inDoubt.journal.Path()).Msg("resolution of an in-doubt call not journalled")
	}
}

// countResolved counts a settlement of one of rt's transactions in doubt.
func countResolved(rt *target, o resolver.Outcome, via string) {
	if rt != nil {
		rt.metrics.countResolved(o, via)
	}
}

// payloadSum is the SHA-256 of a payload, as journalled.
func payloadSum(payload []byte) [sha256.Size]byte { return sha256.Sum256(payload) }

// inDoubtRecent is how many calls in doubt InDoubt remembers.
const inDoubtRecent = indoubt.DefaultRingSize
