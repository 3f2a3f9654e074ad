package relay

import (
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/reconcile"
	"github.com/relayhub/relayhub/relay/resolver"
)

// takeUpJournal reads the in-doubt journal, when there is one, at New,
// before this hub appends to it, and takes up every entry still open (an
// in-doubt line with no resolution line after it): the resolver settles
// it, and the shield remembers it in doubt, so that a resend is looked up
// rather than sent. An entry past its target's resolve_expire is recorded
// as given up (unresolved_expired); one of a target no longer configured
// is logged and left for reconciliation. A journal that cannot be read is
// logged: the hub serves all the same.
func (s *Server) takeUpJournal() {
	j := s.inDoubt.journal
	if j == nil {
		return
	}
	f, err := os.Open(j.Path())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.obs.log.Error().Err(err).Str("path", j.Path()).Msg("in-doubt journal not read at start: its open entries are not taken up")
		}
		return
	}
	defer f.Close()
	open, _, bad, err := reconcile.ReadOpen(f, time.Now(), 0)
	if err != nil {
		s.obs.log.Error().Err(err).Str("path", j.Path()).Msg("in-doubt journal read cut short at start")
	}
	if len(bad) > 0 {
		s.obs.log.Warn().Int("bad_lines", len(bad)).Str("path", j.Path()).Msg("in-doubt journal has lines that do not read; run relayctl reconcile")
	}
	taken := 0
	for _, e := range open {
		if s.takeUp(e) {
			taken++
		}
	}
	if len(open) > 0 {
		s.obs.log.Info().Int("open", len(open)).Int("taken_up", taken).Str("path", j.Path()).Msg("transactions in doubt taken up from the journal")
	}
	s.pokeResolver()
}

// takeUp takes up e, an open entry of the journal, and reports whether
// the resolver has it now.
func (s *Server) takeUp(e reconcile.Entry) bool {
	rt := s.table.lookup([]byte(e.Target))
	if rt == nil {
		s.obs.log.Warn().Str("target", e.Target).Str("txid", e.TxID).Msg("transaction in doubt of a target no longer configured left for reconciliation")
		return false
	}
	conf := rt.conf.Load()
	ref := &doubtRef{url: e.URL, code: e.Code, msg: protocol.MsgStillUnknown}
	if b, err := hex.DecodeString(e.PayloadSHA256); err == nil && len(b) == len(ref.sum) {
		copy(ref.sum[:], b)
	}
	expire := conf.settings.ResolveTarget(conf.resolve).Expire
	if conf.resolve != resolver.PolicyManual && time.Since(e.Time) >= expire {
		via := conf.resolve.Via()
		countResolved(rt, resolver.Expired, via)
		s.journalSettled(rt, rt.name, ref, e.TxID, indoubt.StageUnresolvedExpired, via, e.Code)
		return false
	}
	if conf.settings.Dedup {
		// The journal keeps neither the client's scope nor the target it
		// named: the target's scope under the called target's name.
		ref.shield, ref.hash, ref.window = rt.name, dedup.Hash(ref.sum[:16]), conf.settings.shieldWindow()
		v, f, _, _ := s.shield.mem.Begin(rt.name, dedup.Scope{}, []byte(e.TxID), ref.hash, func() dedup.Waiter { return discard{} })
		if v == dedup.Claimed {
			s.shield.mem.Settle(f, dedup.InDoubt, ref.code, []byte(ref.msg), ref.window)
		}
	}
	since := s.now().Add(-time.Since(e.Time))
	return s.resolve.r.Add(resolver.Entry{Target: rt.name, TxID: e.TxID, Since: since, Ref: ref})
}
