// Package fleet makes the breakers of several hubs act as one breaker per
// target, by spreading their state through Redis (docs/FLEET.md). Requests
// never wait for Redis: each hub decides on its own breaker, lock-free as
// ever, and the fleet carries the changes between hubs in the background.
//
// A hub's local trip opens its breaker at once and is then written to the
// store; every other hub adopts it with the open period's remaining time.
// When the period ends, only the hub that wins the probe lease gives its
// breaker a probe permit (relay.Config.ProbePermits); its probe's outcome
// closes or reopens the whole fleet. An operator's action on one hub
// (Control) acts on every hub. While the store cannot be reached, each hub
// falls back to its own breaker and gives its own probe permits; when the
// store is back, the hubs resynchronise.
//
// Typical use, in the relay binary:
//
//	fl, err := fleet.New(fleet.Config{
//		Store:   "redis://127.0.0.1:6379/0",
//		HubID:   "hub-a:9200",
//		Targets: []string{"CORE", "CLAIM"},
//		Logger:  logger,
//	})
//	if err != nil {
//		return err
//	}
//	srv, err := relay.New(relay.Config{
//		Targets:      targets,
//		ProbePermits: true,
//		OnTransition: fl.Observe,
//	})
//	if err != nil {
//		return err
//	}
//	if err := fl.Start(srv); err != nil { // reads the fleet's state before the hub serves
//		return err
//	}
//	defer fl.Close() // after srv.Shutdown, so the last changes are shared
package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/sourcegraph/conc"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultOpTimeout      = 500 * time.Millisecond
	DefaultResyncInterval = time.Second
	// defaultLease is the probe lease of a breaker without a ProbeTimeout.
	defaultLease = 4 * time.Second
)

// Bounds on what waits for the sync loop, so that a flood of messages or
// actions cannot grow memory.
const (
	maxNotes    = 16
	maxControls = 16
	// logBurst is how many warnings a second about content that is not
	// the fleet's are logged; the metric counts every one.
	logBurst = 5
)

// Sources of a target's last change, as Status reports them.
const (
	// SourceLocal is a change this hub made and wrote to the store.
	SourceLocal = "local"
	// SourceRemote is a change another hub made (or an operator's action
	// given to another hub) that this hub applied.
	SourceRemote = "remote"
)

// Hub is what the fleet needs of the hub: each target's breaker.
// *relay.Server implements it; an implementation must be safe for
// concurrent use.
type Hub interface {
	// Breaker returns the breaker of the named target, nil when there is
	// none.
	Breaker(name string) *breaker.Breaker
}

var _ Hub = (*relay.Server)(nil)

// Config configures a Fleet. The zero value of each optional field selects
// the default given in its comment. It is a plain value; New copies it.
type Config struct {
	// Store is the state store's URL: redis://[user:pass@]host:port/db,
	// rediss:// for TLS, ?master_name=NAME for Sentinel, ?addr=host:port
	// (repeated) for Redis Cluster seeds; go-redis options such as
	// dial_timeout may be added as query parameters. Required.
	Store string
	// HubID names this hub in the store, the logs and the status: 1 to 64
	// characters of A-Z a-z 0-9 . _ : -, unique in the fleet. Required.
	HubID string
	// Targets are the canonical names of the targets whose breakers the
	// fleet shares: every target of the hub. At least one.
	Targets []string
	// Logger receives the fleet's logs. The zero Logger logs nothing.
	Logger zerolog.Logger
	// Registerer receives the fleet's metrics. Nil means no metrics.
	Registerer prometheus.Registerer
	// OpTimeout bounds each command to the store, dialling included. Zero
	// means DefaultOpTimeout.
	OpTimeout time.Duration
	// ResyncInterval is how often the fleet reads every target's state
	// from the store, catching up with changes whose message it missed,
	// and how often it tries the store again while it is down. Zero means
	// DefaultResyncInterval.
	ResyncInterval time.Duration
	// Now is the wall clock the propagation lag is measured with, against
	// the sending hub's stamp. Nil means time.Now.
	Now func() time.Time
}

// Fleet shares a hub's breaker state with the other hubs of its fleet. It
// is safe for concurrent use. Observe may be called from New on; Start
// begins the sharing and Close ends it.
type Fleet struct {
	client    redis.UniversalClient
	hubID     string
	opTimeout time.Duration
	resync    time.Duration
	now       func() time.Time
	log       zerolog.Logger
	warnLog   zerolog.Logger // log sampled to logBurst lines a second
	metrics   *metrics
	targets   []*target
	byName    map[string]*target

	// wake tells the sync loop that something is waiting for it.
	wake chan struct{}
	// subscribed is set while the subscription is confirmed; firstSub is
	// closed once the first subscription attempt has ended either way.
	subscribed   atomic.Bool
	firstSub     chan struct{}
	firstSubOnce sync.Once
	// readAll asks the sync loop to read every target's state.
	readAll atomic.Bool
	// up is whether the store answered the sync loop's last command and
	// the subscription stands; upKnown is set once the first try ended.
	up      atomic.Bool
	upKnown atomic.Bool

	nextResync time.Time // owned by the sync loop

	startOnce sync.Once
	closeOnce sync.Once
	cancel    context.CancelFunc // set by Start
	pubsub    *redis.PubSub      // set by Start
	// wg owns the subscriber and the sync loop.
	wg conc.WaitGroup
}

// target is the fleet's side of one target's breaker. Its slot and view
// are safe for concurrent use under their mutexes; the rest belongs to the
// sync loop.
type target struct {
	name  string
	keys  []string
	b     *breaker.Breaker // set by Start
	lease time.Duration    // set by Start: the breaker's ProbeTimeout
	reset time.Duration    // set by Start: the breaker's ResetTimeout

	// The slot: what the observer, the subscriber and Control leave for
	// the sync loop. The observer runs under the breaker's lock, so
	// nothing else may be locked while slotMu is held.
	slotMu       sync.Mutex
	change       localChange           // guarded by slotMu
	controls     []relay.BreakerAction // guarded by slotMu
	notes        []message             // guarded by slotMu
	probeStarted bool                  // guarded by slotMu

	// Owned by the sync loop.
	known     int64         // the store's epoch as this hub last applied or wrote it
	permitted int64         // the epoch whose probe lease this hub won; -1 none
	permitEnd time.Time     // when an unused permit is taken back, before the lease lapses
	leaseAt   time.Time     // when to ask for the lease again
	renewAt   time.Time     // when to renew the lease held through a half-open period
	period    time.Duration // base period of the last local change
	readAgain bool          // read the state at the next step

	viewMu sync.Mutex
	view   TargetStatus // guarded by viewMu
}

// localChange is the last change of a breaker's results waiting to be
// written to the store. It is a plain value.
type localChange struct {
	pending bool
	to      breaker.State
	reopen  bool // a failed probe reopened the breaker
	period  time.Duration
	stamp   int64 // wall clock of the change, µs since the Unix epoch
}

// New returns a Fleet for cfg. It checks the configuration and builds the
// store's client, but dials nothing: a store that cannot be reached is
// tried again in the background after Start.
func New(cfg Config) (*Fleet, error) {
	if !ValidName(cfg.HubID) {
		return nil, fmt.Errorf("fleet: hub id %q: want 1 to 64 of A-Z a-z 0-9 . _ : -", cfg.HubID)
	}
	if len(cfg.Targets) == 0 {
		return nil, errors.New("fleet: no targets")
	}
	if cfg.OpTimeout < 0 || cfg.ResyncInterval < 0 {
		return nil, errors.New("fleet: OpTimeout and ResyncInterval must not be negative")
	}
	opTimeout := cfg.OpTimeout
	if opTimeout == 0 {
		opTimeout = DefaultOpTimeout
	}
	f := &Fleet{
		hubID:     cfg.HubID,
		opTimeout: opTimeout,
		resync:    cfg.ResyncInterval,
		now:       cfg.Now,
		log:       cfg.Logger.With().Str("component", "fleet").Str("hub_id", cfg.HubID).Logger(),
		byName:    make(map[string]*target, len(cfg.Targets)),
		wake:      make(chan struct{}, 1),
		firstSub:  make(chan struct{}),
	}
	f.warnLog = f.log.Sample(&zerolog.BurstSampler{Burst: logBurst, Period: time.Second})
	if f.resync == 0 {
		f.resync = DefaultResyncInterval
	}
	if f.now == nil {
		f.now = time.Now
	}
	for _, name := range cfg.Targets {
		if !ValidName(name) || name != strings.ToUpper(name) {
			return nil, fmt.Errorf("fleet: target %q: want a canonical (upper-case) target name", name)
		}
		if f.byName[name] != nil {
			return nil, fmt.Errorf("fleet: target %s given twice", name)
		}
		t := &target{name: name, keys: keys(name), permitted: -1}
		t.view.Name = name
		f.targets = append(f.targets, t)
		f.byName[name] = t
	}
	client, err := newClient(cfg.Store, opTimeout)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if f.metrics, err = newMetrics(cfg.Registerer); err != nil {
		_ = client.Close()
		return nil, err
	}
	f.client = client
	return f, nil
}

// Observe is the breakers' transition observer (relay.Config.OnTransition):
// it hands each change of a breaker's results to the sync loop, which
// writes it to the store. Changes the fleet applied itself (CauseShared) and
// an operator's (CauseOperator, spread by Control) are not written again.
// It runs under the breaker's lock: it only stores into the target's slot,
// where a later change replaces an earlier one not yet written, and wakes
// the loop; it never blocks and never calls into a breaker.
func (f *Fleet) Observe(t breaker.Transition) {
	tg := f.byName[t.Name]
	if tg == nil {
		return
	}
	tg.slotMu.Lock()
	switch t.Cause {
	case breaker.CauseResults:
		tg.change = localChange{
			pending: true,
			to:      t.To,
			reopen:  t.From == breaker.HalfOpen && t.To == breaker.Open,
			period:  t.Period,
			stamp:   t.At.UnixMicro(),
		}
	case breaker.CauseProbe:
		tg.probeStarted = true
	default:
		tg.slotMu.Unlock()
		return
	}
	tg.slotMu.Unlock()
	f.poke()
}

// Control spreads an operator's action, already applied to this hub's
// breaker of the named target, to every hub of the fleet; they apply it to
// their own breakers without spreading it again. It returns at once (the
// sync loop writes the action to the store), or ErrUnknownTarget.
func (f *Fleet) Control(name string, action relay.BreakerAction) error {
	tg := f.byName[strings.ToUpper(name)]
	if tg == nil {
		return fmt.Errorf("%w %q", relay.ErrUnknownTarget, name)
	}
	if _, err := relay.ParseBreakerAction(string(action)); err != nil {
		return err
	}
	tg.slotMu.Lock()
	if len(tg.controls) == maxControls {
		// Only the latest actions matter: drop the oldest.
		tg.controls = append(tg.controls[:0], tg.controls[1:]...)
	}
	tg.controls = append(tg.controls, action)
	tg.slotMu.Unlock()
	f.poke()
	return nil
}

// poke wakes the sync loop, unless a wake-up is already waiting.
func (f *Fleet) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Status is the fleet as one hub sees it, for status pages. It is a plain
// value.
type Status struct {
	// HubID is this hub's name in the fleet.
	HubID string
	// StoreUp reports that the hub reaches the store and shares its
	// breakers' state; false while each breaker decides alone.
	StoreUp bool
	// Targets are the targets, in configuration order.
	Targets []TargetStatus
}

// TargetStatus is one target's shared state as this hub knows it. It is a
// plain value.
type TargetStatus struct {
	Name string
	// Epoch is the target's epoch in the store as this hub last applied or
	// wrote it: it moves on every open and every close anywhere in the
	// fleet. 0 before any.
	Epoch int64
	// OpenedBy is the hub whose breaker opened the fleet's breaker (or
	// whose operator held it open); empty while it is closed.
	OpenedBy string
	// Source says how the last change reached this hub: SourceLocal,
	// SourceRemote, or empty before any.
	Source string
	// ProbeLease reports that this hub won the probe lease of the current
	// open period: its breaker sends the fleet's one probe.
	ProbeLease bool
}

// Status returns the fleet's state as this hub sees it.
func (f *Fleet) Status() Status {
	st := Status{HubID: f.hubID, StoreUp: f.up.Load(), Targets: make([]TargetStatus, len(f.targets))}
	for i, t := range f.targets {
		st.Targets[i] = t.status()
	}
	return st
}

// Target returns one target's shared state; false when the fleet does not
// share it.
func (f *Fleet) Target(name string) (TargetStatus, bool) {
	t := f.byName[strings.ToUpper(name)]
	if t == nil {
		return TargetStatus{}, false
	}
	return t.status(), true
}

// HubID returns this hub's name in the fleet.
func (f *Fleet) HubID() string { return f.hubID }

func (t *target) status() TargetStatus {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	return t.view
}

// setView records a change of the target's shared state for Status.
func (t *target) setView(epoch int64, openedBy, source string) {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.Epoch, t.view.OpenedBy, t.view.Source = epoch, openedBy, source
	t.view.ProbeLease = false
}

// setLease records that this hub won the current probe lease.
func (t *target) setLease() {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.ProbeLease = true
}

// unsetLease records that this hub gave its probe lease up unused.
func (t *target) unsetLease() {
	t.viewMu.Lock()
	defer t.viewMu.Unlock()
	t.view.ProbeLease = false
}

// Start begins sharing the breakers of hub. It subscribes to the change
// channel, then reads every target's state from the store and applies it,
// waiting up to about twice the OpTimeout for that, so that a hub started
// while the fleet is open starts open; then it goes on in the background
// until Close. A store that cannot be reached does not stop it: the
// breakers decide alone, and the fleet keeps trying. It fails only when
// hub lacks a breaker for a target. Start may be called once.
func (f *Fleet) Start(hub Hub) error {
	breakers := make([]*breaker.Breaker, len(f.targets))
	for i, t := range f.targets {
		if breakers[i] = hub.Breaker(t.name); breakers[i] == nil {
			return fmt.Errorf("fleet: the hub has no target %s", t.name)
		}
	}
	started := false
	f.startOnce.Do(func() {
		started = true
		for i, t := range f.targets {
			s := breakers[i].Settings()
			t.b, t.lease, t.reset, t.period = breakers[i], s.ProbeTimeout, s.ResetTimeout, s.ResetTimeout
			if t.lease <= 0 {
				t.lease = defaultLease
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		f.cancel = cancel
		f.pubsub = f.client.Subscribe(ctx, Channel)
		f.wg.Go(func() { f.subscribeLoop(ctx) })
		select {
		case <-f.firstSub:
		case <-time.After(2 * f.opTimeout):
		}
		f.readAll.Store(true)
		f.step(ctx)
		f.wg.Go(func() { f.syncLoop(ctx) })
	})
	if !started {
		return errors.New("fleet: Start called twice")
	}
	return nil
}

// Close stops sharing: the subscriber and the sync loop end, and the
// store's connections are closed. The breakers keep the state they have.
// It returns once every goroutine of the Fleet has ended.
func (f *Fleet) Close() error {
	var err error
	f.closeOnce.Do(func() {
		if f.cancel != nil {
			f.cancel()
			_ = f.pubsub.Close()
		}
		f.wg.Wait()
		err = f.client.Close()
		f.up.Store(false)
		f.metrics.setUp(false)
	})
	return err
}

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
				f.log.Debug().Err(err).Msg("change subscription lost")
				f.poke()
			}
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
// when its open period has ended. While the store is down it only tries
// again once per resync interval, and gives every permit itself. It
// returns when it wants to run again at the latest.
func (f *Fleet) step(ctx context.Context) time.Time {
	now := time.Now()
	readAll := f.readAll.Swap(false)
	if !now.Before(f.nextResync) {
		readAll = true
		f.nextResync = now.Add(f.resync)
	}
	next := f.nextResync
	ok := f.up.Load() || readAll
	var failure error
	if ok {
		for _, t := range f.targets {
			if failure = f.syncTarget(ctx, t, readAll); failure != nil {
				break
			}
		}
	}
	switch {
	case failure != nil:
		f.metrics.commandFailed()
		f.setUp(false, failure)
	case ok && f.subscribed.Load():
		f.setUp(true, nil)
	case ok:
		f.setUp(false, errors.New("change channel not subscribed"))
	}
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

// renewLease renews, every third of the lease, the probe lease this hub
// holds while its breaker is half-open, and returns when to renew it next.
func (f *Fleet) renewLease(ctx context.Context, t *target, now time.Time) time.Time {
	if t.renewAt.IsZero() {
		// The probe's start renewed it.
		t.renewAt = now.Add(t.lease / 3)
	}
	if now.Before(t.renewAt) {
		return t.renewAt
	}
	st, err := f.runScript(ctx, scriptLease, t, 0, msText(t.lease))
	if err != nil {
		f.setUp(false, err)
		f.metrics.commandFailed()
		return time.Time{}
	}
	if st.code < 0 {
		t.readAgain = true
		return now
	}
	t.renewAt = now.Add(t.lease / 3)
	return t.renewAt
}

// setUp records whether the store is up, logging and counting each change.
func (f *Fleet) setUp(up bool, err error) {
	if f.up.Swap(up) == up && f.upKnown.Swap(true) {
		return
	}
	f.upKnown.Store(true)
	f.metrics.setUp(up)
	if up {
		f.log.Info().Msg("state store reached: breaker state is shared with the fleet")
		return
	}
	f.log.Warn().Err(err).Msg("state store unreachable: each breaker decides alone until it is back")
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
// store's epoch is newer than the one this hub knows. A store that lost
// its memory (an epoch older than the one known: a restart, a flush) gets
// this hub's open breaker written again, with its remaining time.
func (f *Fleet) reconcile(t *target, st storeState) {
	if st.bad != "" {
		f.metrics.contentIgnored()
		f.warnLog.Warn().Str("target", t.name).Strs("keys", splitBad(st.bad)).
			Msg("state store content is not the fleet's; ignored (the next change overwrites it)")
	}
	if st.epoch < t.known {
		f.log.Warn().Str("target", t.name).Int64("store_epoch", st.epoch).Int64("known_epoch", t.known).
			Msg("state store lost the target's state; writing this hub's again")
		t.known = 0
		if st.epoch == 0 {
			f.republish(t)
			return
		}
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

// permit gives the breaker its probe permit once its open period has ended:
// through the probe lease while the store is up, at once while it is down.
// A hub whose breaker is half-open on the lease it won keeps the lease for
// as long as it stays so: a breaker that needs several healthy probes
// (breaker.Policy.ProbeSuccesses) stays half-open between them, and no
// other hub may probe meanwhile. It returns when to look again (zero: no
// need).
func (f *Fleet) permit(ctx context.Context, t *target, now time.Time) time.Time {
	snap := t.b.Snapshot()
	if snap.State == breaker.HalfOpen && t.permitted == t.known && f.up.Load() {
		return f.renewLease(ctx, t, now)
	}
	if snap.State != breaker.Open || snap.Held {
		return time.Time{}
	}
	if snap.RetryAfter > 0 {
		return now.Add(snap.RetryAfter)
	}
	if !f.up.Load() {
		t.b.PermitProbe()
		return time.Time{}
	}
	if t.permitted == t.known {
		if now.Before(t.permitEnd) {
			return t.permitEnd
		}
		if !t.b.WithdrawPermit() {
			// The probe is out, and its start renewed the lease.
			return time.Time{}
		}
		// No request came to use the permit: it is taken back before
		// the lease lapses, so the hub that wins it next is the only
		// one that may probe. This hub asks again only after the others
		// had their turn at the lapsed lease.
		t.permitted = -1
		t.unsetLease()
		t.leaseAt = now.Add(t.lease / 5)
		f.log.Info().Str("target", t.name).Int64("epoch", t.known).Msg("probe lease unused: permit taken back")
		return t.leaseAt
	}
	if now.Before(t.leaseAt) {
		return t.leaseAt
	}
	t.renewAt = time.Time{}
	st, err := f.runScript(ctx, scriptLease, t, 0, msText(t.lease))
	if err != nil {
		f.setUp(false, err)
		f.metrics.commandFailed()
		t.b.PermitProbe()
		return time.Time{}
	}
	switch st.code {
	case 1:
		t.permitted = t.known
		// A tenth of the lease, at least 50 ms, is kept for taking the
		// permit back before another hub can win the lease.
		t.permitEnd = now.Add(t.lease - max(t.lease/10, 50*time.Millisecond))
		t.setLease()
		t.b.PermitProbe()
		f.log.Info().Str("target", t.name).Int64("epoch", t.known).Msg("probe lease won: this hub sends the fleet's probe")
		return time.Time{}
	case 0:
		t.leaseAt = now.Add(min(max(st.wait, 5*time.Millisecond), t.lease))
		return t.leaseAt
	default:
		t.readAgain = true
		return now
	}
}
