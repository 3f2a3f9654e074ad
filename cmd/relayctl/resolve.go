package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/lockedfile"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// inDoubtGroup is `relayctl in-doubt`: the list of the hub's recent calls
// in doubt (the default), and resolve. Not for concurrent use.
type inDoubtGroup struct {
	List    inDoubtCmd        `cmd:"" default:"withargs" help:"List the hub's recent calls in doubt (the default)."`
	Resolve inDoubtResolveCmd `cmd:"" help:"Settle a transaction in doubt by hand, in the in-doubt journal (via operator), once its target's own records say what happened."`
}

// inDoubtResolveCmd is `relayctl in-doubt resolve`: its flags, filled by
// kong. Not for concurrent use.
type inDoubtResolveCmd struct {
	TxID       string `arg:"" name:"txid" help:"The transaction to settle."`
	Applied    string `help:"The target applied it, with this code (0000 or Bnnn, as its records say)." placeholder:"CODE" xor:"outcome" required:"" env:"RELAYCTL_APPLIED"`
	NotApplied bool   `name:"not-applied" help:"The target never applied it: a resend is a fresh call." xor:"outcome" required:"" env:"RELAYCTL_NOT_APPLIED"`
	InDoubtLog string `name:"in-doubt-log" help:"The hub's in-doubt journal (its --in-doubt-log); it is appended to under the lock the hub takes, so a running hub on it refuses the change." placeholder:"FILE" required:"" env:"RELAYCTL_IN_DOUBT_LOG"`
	Target     string `help:"The transaction's target, when the journal has the TXID at more than one." placeholder:"NAME" env:"RELAYCTL_TARGET"`
}

// Validate checks what the tags cannot.
func (c *inDoubtResolveCmd) Validate() error {
	a := c.Applied
	if a == "" || a == protocol.CodeOK || (a[0] == 'B' && protocol.ValidTargetCode(a)) {
		return nil
	}
	return fmt.Errorf("--applied %q: want the code the target recorded, 0000 or Bnnn", a)
}

// Run appends the resolution to the journal: resolved_applied with the
// code, or resolved_not_applied, via operator, for the transaction's last
// in-doubt line, which must not be settled already. Exit status 1 when
// the journal has no unsettled entry for it (or has it at more than one
// target and --target is missing), 2 when the journal cannot be read,
// locked (a hub runs on it) or written.
func (c *inDoubtResolveCmd) Run(_ context.Context, s *streams) error {
	// lockedfile.Open would create a journal that is not there.
	if _, err := os.Stat(c.InDoubtLog); err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	f, err := lockedfile.Open(lockedfile.Config{Path: c.InDoubtLog, Perm: 0o640})
	if errors.Is(err, lockedfile.ErrLocked) {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: a running hub holds it; settle the entry while the hub is stopped", c.InDoubtLog))
	}
	if err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	defer f.Close()
	open, err := c.find()
	if err != nil {
		return err
	}
	e := indoubt.Entry{
		Time: time.Now(), Hub: open.Hub, TxID: open.TxID, Target: open.Target, URL: open.URL,
		Stage: indoubt.StageResolvedNotApplied, Via: indoubt.ViaOperator,
	}
	if c.Applied != "" {
		e.Stage, e.Code = indoubt.StageResolvedApplied, c.Applied
	}
	if err := decodeSum(open.PayloadSHA256, &e.PayloadSHA256); err != nil {
		return cmdline.Exit(1, fmt.Errorf("journal line %d: payload_sha256: %w", open.Line, err))
	}
	if err := f.Append(append(e.AppendJSON(nil), '\n'), true); err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	_, err = fmt.Fprintf(s.Out, "%s at %s: %s via operator (journal line %d settled)\n", e.TxID, e.Target, e.Stage, open.Line)
	return err
}

// find reads the journal and returns the transaction's unsettled entry.
func (c *inDoubtResolveCmd) find() (reconcile.Entry, error) {
	r, err := os.Open(c.InDoubtLog)
	if err != nil {
		return reconcile.Entry{}, cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	defer r.Close()
	entries, _, err := reconcile.ReadJournal(r)
	if err != nil {
		return reconcile.Entry{}, cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	e, ok := reconcile.Unsettled(entries, c.Target, c.TxID)
	if !ok {
		return reconcile.Entry{}, cmdline.Exit(1, fmt.Errorf("%s: no unsettled in-doubt entry in %s", c.TxID, c.InDoubtLog))
	}
	if c.Target == "" {
		for _, o := range entries {
			if o.TxID == c.TxID && o.Target != e.Target {
				return reconcile.Entry{}, cmdline.Exit(1, fmt.Errorf("%s: in the journal at %s and %s; name one with --target", c.TxID, e.Target, o.Target))
			}
		}
	}
	return e, nil
}

// decodeSum reads a journal line's hex payload_sha256 into sum; an empty
// one (a line edited by hand) leaves it zero.
func decodeSum(h string, sum *[32]byte) error {
	if h == "" {
		return nil
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != len(sum) {
		return fmt.Errorf("%q: want 64 hex digits", h)
	}
	copy(sum[:], b)
	return nil
}
