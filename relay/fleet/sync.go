package fleet

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// subscribeLoop receives the change messages until ctx is done, and
// reports (re)subscriptions to the sync loop, which then reads every
// target's state: subscribe first, then read, so no change falls between.
// go-redis reconnects and resubscribes on the next Receive after an error.
// A channel silent for two resync intervals gets a PING, so that a
// connection cut without a reset (a network partition) fails on the write
// once the network is back, rather than staying deaf.
func (f *Fleet) subscribeLoop(ctx context.Context) {
	var backoff time.Duration
	for {
		msg, err := f.pubsub.ReceiveTimeout(ctx, 2*f.resync)
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			_ = f.pubsub.Ping(ctx)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.firstSubOnce.Do(func() { close(f.firstSub) })
			if f.subscribed.Swap(false) {
				// Whether the store went with the channel, or only the
				// channel's node, the targets' commands tell at once.
				f.log.Debug().Err(err).Msg("change subscription lost")
				f.readAll.Store(true)
				f.poke()
			}
			// The channel's node may be a Cluster master that died.
			f.relearn()
			backoff = min(max(2*backoff, 50*time.Millisecond), f.resync)
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		backoff = 0
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				f.subscribed.Store(true)
				f.readAll.Store(true)
				f.firstSubOnce.Do(func() { close(f.firstSub) })
				f.poke()
			}
		case *redis.Message:
			f.receive(m.Payload)
		}
	}
}

// sleep waits d or until ctx is done, and reports whether ctx is still
// live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// receive hands a change message to its target's slot.
func (f *Fleet) receive(payload string) {
	m, err := parseMessage(payload)
	if err != nil {
		f.metrics.contentIgnored()
		f.warnLog.Warn().Int("bytes", len(payload)).Msg("message on the change channel is not the fleet's; ignored")
		return
	}
	if m.hub == f.hubID {
		return
	}
	t := f.byName[m.target]
	if t == nil {
		// A target of other hubs, not this one's.
		return
	}
	t.slotMu.Lock()
	if len(t.notes) < maxNotes {
		t.notes = append(t.notes, m)
	} else {
		t.notes[maxNotes-1] = m
	}
	t.slotMu.Unlock()
	f.poke()
}

// syncLoop runs the fleet's steps until ctx is done: on every wake-up, at
// every resync interval, and when an open period ends or a probe lease may
// be free.
func (f *Fleet) syncLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := f.step(ctx)
		timer.Reset(max(time.Until(next), time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-timer.C:
		}
	}
}

// step does what waits: for each target, write its operator actions and
// its local change, renew the probe lease of a probe just sent, read its
// state when a message or the resync asks for it, and give a probe permit
// when its open period has ended. A target the store does not answer for
// is only tried again once per resync interval, and gives its permits
// itself. With one server (or Sentinel's master) the first failure ends
// the step, as the others would fail too; with a Redis Cluster each
// target is tried, as its shard may be up while another is down. While
// the change channel is lost, a target the store answers for stays
// shared (its writes and its probe lease are the store's), and the other
// hubs' changes reach this hub at each resync. It returns when it wants
// to run again at the latest.
func (f *Fleet) step(ctx context.Context) time.Time {
	now := time.Now()
	readAll := f.readAll.Swap(false)
	if !now.Before(f.nextResync) {
		readAll = true
		f.nextResync = now.Add(f.resync)
	}
	next := f.nextResync
	var failure error
	for _, t := range f.targets {
		if t.down && !readAll {
			continue
		}
		if err := f.syncTarget(ctx, t, readAll); err != nil {
			f.failed(t)
			failure = err
			if !f.cluster {
				break
			}
			continue
		}
		t.down = false
	}
	f.report(failure)
	for _, t := range f.targets {
		if w := f.permit(ctx, t, now); !w.IsZero() && w.Before(next) {
			next = w
		}
		if t.readAgain {
			next = now
		}
	}
	return next
}

// failed records that a command of target t failed: the failure is
// counted, and the target is down until one succeeds; with one server
// (or Sentinel's master) every target is, as their commands would fail
// too. A Redis Cluster client is told to read the cluster's layout again.
func (f *Fleet) failed(t *target) {
	f.metrics.commandFailed()
	if f.cluster {
		t.down = true
		f.relearn()
		return
	}
	for _, o := range f.targets {
		o.down = true
	}
}

// report records which targets decide alone (the store did not answer
// their last command) and whether the store is up: no target alone and the
// change channel subscribed. err is the last failure of a command, if any.
func (f *Fleet) report(err error) {
	var alone []string
	for _, t := range f.targets {
		t.setAlone(t.down)
		if t.down {
			alone = append(alone, t.name)
		}
	}
	subscribed := f.subscribed.Load()
	f.setUp(subscribed && len(alone) == 0, alone, subscribed, err)
}

// setUp records whether the store is up, logging and counting each
// change: alone names the targets the store does not answer for, and
// subscribed is whether the change channel stands.
func (f *Fleet) setUp(up bool, alone []string, subscribed bool, err error) {
	if f.up.Swap(up) == up && f.upKnown.Swap(true) && slices.Equal(alone, f.alone) && subscribed == f.heard {
		return
	}
	f.upKnown.Store(true)
	f.alone, f.heard = alone, subscribed
	f.metrics.setUp(up)
	switch {
	case up:
		f.log.Info().Msg("state store reached: breaker state is shared with the fleet")
	case len(alone) == len(f.targets):
		f.log.Warn().Err(err).Msg("state store unreachable: each breaker decides alone until it is back")
	case len(alone) > 0:
		f.log.Warn().Err(err).Strs("targets", alone).Bool("channel", subscribed).
			Msg("state store unreachable for some targets: their breakers decide alone until it is back")
	default:
		f.log.Warn().Msg("change channel not subscribed: the other hubs' changes arrive at each resync until it is back")
	}
}

// take empties the target's slot.
func (t *target) take() (controls []relay.BreakerAction, change localChange, notes []message, probeStarted bool) {
	t.slotMu.Lock()
	defer t.slotMu.Unlock()
	controls, change, notes, probeStarted = t.controls, t.change, t.notes, t.probeStarted
	t.controls, t.change, t.notes, t.probeStarted = nil, localChange{}, nil, false
	return controls, change, notes, probeStarted
}

// giveBack returns what a step could not write to the slot, behind
// anything that arrived meanwhile: a newer change wins over the one given
// back.
func (t *target) giveBack(controls []relay.BreakerAction, change localChange, notes []message) {
	t.slotMu.Lock()
	defer t.slotMu.Unlock()
	if len(controls) > 0 {
		t.controls = append(controls, t.controls...)
		if n := len(t.controls); n > maxControls {
			t.controls = t.controls[n-maxControls:]
		}
	}
	if !t.change.pending {
		t.change = change
	}
	if room := maxNotes - len(t.notes); room > 0 {
		t.notes = append(t.notes, notes[:min(room, len(notes))]...)
	}
}

// syncTarget does one target's part of a step; an error is the store's,
// and what it could not write waits in the slot for the next try.
func (f *Fleet) syncTarget(ctx context.Context, t *target, readAll bool) error {
	controls, change, notes, probeStarted := t.take()
	for i, a := range controls {
		if err := f.control(ctx, t, a); err != nil {
			t.giveBack(controls[i:], change, notes)
			return err
		}
	}
	if change.pending {
		if err := f.flush(ctx, t, change); err != nil {
			t.giveBack(nil, change, notes)
			return err
		}
	}
	if probeStarted && t.permitted == t.known {
		// The probe is out: the lease must outlive it.
		st, err := f.runScript(ctx, scriptLease, t, 0, msText(t.lease))
		if err != nil {
			t.giveBack(nil, localChange{}, notes)
			return err
		}
		if st.code < 0 {
			t.readAgain = true
		}
	}
	if !readAll && len(notes) == 0 && !t.readAgain {
		return nil
	}
	st, err := f.runScript(ctx, scriptRead, t, 0)
	if err != nil {
		t.giveBack(nil, localChange{}, notes)
		return err
	}
	t.readAgain = false
	before := t.known
	f.reconcile(t, st)
	now := f.now()
	for _, n := range notes {
		if before < n.epoch && n.epoch <= t.known {
			f.metrics.observeLag(now.Sub(time.UnixMicro(n.stamp)))
		}
	}
	return nil
}

// flush writes a breaker's local change to the store, unless the breaker
// has moved on since (a later change, or an operator's, is what counts).
// An open that finds the fleet already open adopts the fleet's period.
func (f *Fleet) flush(ctx context.Context, t *target, ch localChange) error {
	snap := t.b.Snapshot()
	var (
		st  storeState
		err error
	)
	switch ch.to {
	case breaker.Open:
		if snap.State != breaker.Open || snap.Held {
			return nil
		}
		if ch.period > 0 {
			t.period = ch.period
		}
		reopen := "0"
		if ch.reopen {
			reopen = "1"
		}
		st, err = f.runScript(ctx, scriptOpen, t, ch.stamp, reopen, "results", msText(t.period), msText(snap.RetryAfter))
	case breaker.Closed:
		if snap.State != breaker.Closed {
			return nil
		}
		st, err = f.runScript(ctx, scriptClose, t, ch.stamp)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	if st.code != 1 {
		f.reconcile(t, st)
		return nil
	}
	t.known = st.epoch
	openedBy := ""
	if ch.to == breaker.Open {
		openedBy = f.hubID
	}
	t.setView(st.epoch, openedBy, SourceLocal)
	f.log.Info().Str("target", t.name).Int64("epoch", st.epoch).Stringer("to", ch.to).
		Dur("remaining", snap.RetryAfter).Msg("breaker change shared with the fleet")
	return nil
}

// control writes an operator's action to the store.
func (f *Fleet) control(ctx context.Context, t *target, a relay.BreakerAction) error {
	snap := t.b.Snapshot()
	remaining := snap.RetryAfter
	if remaining <= 0 {
		remaining = t.reset
	}
	st, err := f.runScript(ctx, scriptControl, t, f.now().UnixMicro(), string(a), msText(t.reset), msText(remaining))
	if err != nil {
		return err
	}
	t.known = st.epoch
	openedBy := ""
	if st.open {
		openedBy = st.openedBy
	}
	t.setView(st.epoch, openedBy, SourceLocal)
	f.log.Info().Str("target", t.name).Int64("epoch", st.epoch).Str("action", string(a)).Msg("operator action shared with the fleet")
	return nil
}

// reconcile brings the breaker to the state the store holds, when the
// store's epoch is newer than the one this hub knows. A store whose epoch
// is older than the one known lost writes: a restart or a flush emptied
// it, or a failover promoted a replica that had not received the latest
// (replication is asynchronous). What it holds is then no news: a hub
// whose open, held or disabled breaker the store lacks writes it again,
// with its remaining time, past the epoch it knows; any other hub takes
// the store's state.
func (f *Fleet) reconcile(t *target, st storeState) {
	if st.bad != "" {
		f.metrics.contentIgnored()
		f.warnLog.Warn().Str("target", t.name).Strs("keys", splitBad(st.bad)).
			Msg("state store content is not the fleet's; ignored (the next change overwrites it)")
	}
	if st.epoch < t.known {
		if lacks(t.b.Snapshot(), st) {
			f.log.Warn().Str("target", t.name).Int64("store_epoch", st.epoch).Int64("known_epoch", t.known).
				Msg("state store lost the target's state; writing this hub's again")
			// t.known stays: the write moves the epoch past it, so that
			// no hub takes the state written again for one it has seen.
			f.republish(t)
			return
		}
		f.log.Warn().Str("target", t.name).Int64("store_epoch", st.epoch).Int64("known_epoch", t.known).
			Msg("state store lost the target's latest state; taking what it holds")
		t.known = 0
	}
	if st.epoch == t.known {
		return
	}
	t.known = st.epoch
	f.apply(t, st)
	openedBy := ""
	if st.open {
		openedBy = st.openedBy
	}
	t.setView(st.epoch, openedBy, SourceRemote)
	f.metrics.changeApplied()
	f.log.Info().Str("target", t.name).Int64("epoch", st.epoch).Bool("open", st.open).Str("opened_by", openedBy).
		Dur("remaining", st.remaining).Bool("held", st.held).Bool("disabled", st.disabled).
		Msg("fleet's breaker change applied")
}

// lacks reports whether the store's state st is without what the breaker
// snap holds and a store must not lose: an operator's hold or disable, or
// an open period. A half-open breaker is left out: its probe is out, and
// the outcome is written when it comes.
func lacks(snap breaker.Snapshot, st storeState) bool {
	switch {
	case snap.Held:
		return !st.open || !st.held
	case snap.Disabled:
		return !st.disabled
	case snap.State == breaker.Open:
		return !st.open
	}
	return false
}

// republish queues this hub's breaker state to be written again to a store
// that lost it.
func (f *Fleet) republish(t *target) {
	snap := t.b.Snapshot()
	t.slotMu.Lock()
	defer t.slotMu.Unlock()
	switch {
	case snap.Held:
		t.controls = append(t.controls, relay.ActionOpen)
	case snap.Disabled:
		t.controls = append(t.controls, relay.ActionDisable)
	case snap.State == breaker.Open && !t.change.pending:
		t.change = localChange{pending: true, to: breaker.Open, period: t.period, stamp: f.now().UnixMicro()}
	}
	t.readAgain = true
}

// apply makes the breaker what the store says the fleet's is. Manual
// control comes first: a disabled or held state is applied as the
// operator's action; otherwise an operator's hold or disable is ended and
// the fleet's open period or close is adopted.
func (f *Fleet) apply(t *target, st storeState) {
	b := t.b
	snap := b.Snapshot()
	switch {
	case st.disabled:
		if !snap.Disabled {
			b.Disable()
		}
	case st.open && st.held:
		if !snap.Held {
			b.HoldOpen()
		}
	case st.open:
		if snap.Held || snap.Disabled {
			b.Enable()
		}
		b.AdoptOpen(st.remaining, st.period)
	case snap.Held:
		b.ForceClose()
	default:
		if snap.Disabled {
			b.Enable()
		}
		b.AdoptClose()
	}
}
