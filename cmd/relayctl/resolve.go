package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/lockedfile"
	"github.com/relayhub/relayhub/relay/indoubt"
	"github.com/relayhub/relayhub/relay/reconcile"
)

// inDoubtGroup is `relayctl in-doubt`: the list of the hub's calls in
// doubt (the default), and resolve. Not for concurrent use.
type inDoubtGroup struct {
	List    inDoubtCmd        `cmd:"" default:"withargs" help:"List the hub's open calls in doubt with their attempts and next attempt, or its recent ones (--recent); the default."`
	Resolve inDoubtResolveCmd `cmd:"" help:"Settle a transaction in doubt by hand (via operator), once its target's own records say what happened: through the running hub's admin port, or in the journal of a stopped hub."`
}

// inDoubtResolveCmd is `relayctl in-doubt resolve`: its flags, filled by
// kong. Not for concurrent use.
type inDoubtResolveCmd struct {
	TxID       string `arg:"" name:"txid" help:"The transaction to settle."`
	Applied    string `help:"The target applied it, with this code (0000 or Bnnn, as its records say)." placeholder:"CODE" xor:"outcome" required:"" env:"RELAYCTL_APPLIED"`
	NotApplied bool   `name:"not-applied" help:"The target never applied it: a resend is a fresh call." xor:"outcome" required:"" env:"RELAYCTL_NOT_APPLIED"`
	InDoubtLog string `name:"in-doubt-log" help:"The hub's in-doubt journal (its --in-doubt-log). While no hub holds it, the resolution is appended to it directly; while a hub does, it goes through that hub's admin port (--admin). Without it, through --admin." placeholder:"FILE" env:"RELAYCTL_IN_DOUBT_LOG"`
	Target     string `help:"The transaction's target, when the TXID is open at more than one." placeholder:"NAME" env:"RELAYCTL_TARGET"`

	AdminFlags `embed:""`
}

// Validate checks what the tags cannot.
func (c *inDoubtResolveCmd) Validate() error {
	if c.Applied == "" || loadgen.CodeSucceeded([]byte(c.Applied)) {
		return c.validate()
	}
	return fmt.Errorf("--applied %q: want the code the target recorded, 0000 or Bnnn", c.Applied)
}

// Run settles the transaction, resolved_applied with the code or
// resolved_not_applied, via operator. A running hub does it (POST
// /in-doubt/{txid}/resolve on --admin), so that its resolver stops asking
// and its shield learns the outcome; the journal of a stopped hub is
// appended to directly, for the transaction's last in-doubt line, which
// must not be settled already. Exit status 1 when there is no open entry
// for it (or it is open at more than one target and --target is
// missing), or the hub refuses; 2 when the journal cannot be read or
// written, or the hub cannot be asked.
func (c *inDoubtResolveCmd) Run(ctx context.Context, s *streams) error {
	if c.InDoubtLog == "" {
		return c.throughHub(ctx, s)
	}
	// lockedfile.Open would create a journal that is not there.
	if _, err := os.Stat(c.InDoubtLog); err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	f, err := lockedfile.Open(lockedfile.Config{Path: c.InDoubtLog, Perm: 0o640})
	if errors.Is(err, lockedfile.ErrLocked) {
		return c.throughHub(ctx, s) // a running hub holds it
	}
	if err != nil {
		return cmdline.Exit(2, fmt.Errorf("--in-doubt-log %s: %w", c.InDoubtLog, err))
	}
	defer f.Close()
	return c.inJournal(f, s)
}

// inJournal appends the resolution to the journal f, locked.
func (c *inDoubtResolveCmd) inJournal(f *lockedfile.File, s *streams) error {
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

// resolveBody is the JSON of POST /in-doubt/{txid}/resolve. A plain
// value.
type resolveBody struct {
	Target     string `json:"target"`
	Applied    bool   `json:"applied,omitempty"`
	Code       string `json:"code,omitempty"`
	NotApplied bool   `json:"not_applied,omitempty"`
}

// throughHub asks the hub on --admin to settle the transaction. Without
// --target, the hub's list of open entries names it.
func (c *inDoubtResolveCmd) throughHub(ctx context.Context, s *streams) error {
	client, err := c.client()
	if err != nil {
		return err
	}
	target := c.Target
	if target == "" {
		if target, err = c.openTarget(ctx, client); err != nil {
			return err
		}
	}
	body := resolveBody{Target: target, Applied: c.Applied != "", Code: c.Applied, NotApplied: c.NotApplied}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	ans, err := client.do(ctx, http.MethodPost, "/in-doubt/"+url.PathEscape(c.TxID)+"/resolve", b)
	if err != nil {
		return err
	}
	if ans.status != http.StatusOK {
		return client.refused(ans)
	}
	var settled struct {
		Target string `json:"target"` // the canonical name
	}
	if json.Unmarshal(ans.body, &settled) == nil && settled.Target != "" {
		target = settled.Target
	}
	stage := indoubt.StageResolvedNotApplied
	if body.Applied {
		stage = indoubt.StageResolvedApplied
	}
	_, err = fmt.Fprintf(s.Out, "%s at %s: %s via operator (settled by the hub at %s)\n", c.TxID, target, stage, client.base)
	return err
}

// openTarget returns the target at which the hub has the transaction
// open: exit status 1 when none or more than one.
func (c *inDoubtResolveCmd) openTarget(ctx context.Context, client *adminClient) (string, error) {
	list, _, err := fetchOpen(ctx, client)
	if err != nil {
		return "", err
	}
	var found []string
	for _, e := range list.Open {
		if e.TxID == c.TxID {
			found = append(found, e.Target)
		}
	}
	switch len(found) {
	case 0:
		return "", cmdline.Exit(1, fmt.Errorf("%s: not open in doubt at the hub at %s", c.TxID, client.base))
	case 1:
		return found[0], nil
	}
	return "", cmdline.Exit(1, fmt.Errorf("%s: open at %s; name one with --target", c.TxID, strings.Join(found, " and ")))
}
