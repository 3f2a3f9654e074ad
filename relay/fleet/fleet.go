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
// Dedup shares the duplicate-TXID shield (relay/dedup) through the same
// store, so that a client's resend to any hub finds its transaction. Unlike
// the breakers' state it is on the request path: each of its commands is
// bounded by the OpTimeout, and a failure sends the hub back to its own
// memory.
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
	"github.com/relayhub/relayhub/relay/protocol"
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
	// up is whether the store answered the sync loop's last command of
	// every target and the subscription stands; upKnown is set once the
	// first try ended.
	up      atomic.Bool
	upKnown atomic.Bool
	// cluster is set for a Redis Cluster store, whose shards may fail one
	// by one: a command that fails for one target says nothing of the
	// others'.
	cluster bool

	// Owned by the sync loop: when to read every target again, and the
	// targets found alone and whether the channel stood, as last logged.
	nextResync time.Time
	alone      []string
	heard      bool

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
	// down is set while the store does not answer the target's commands
	// (its shard of a Redis Cluster, or the whole store, is gone): the
	// target's breaker gives its own probe permits.
	down bool

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
	_, f.cluster = client.(*redis.ClusterClient)
	return f, nil
}

// relearn has a Redis Cluster client read the cluster's layout again, in
// the background, after a command or the subscription failed. go-redis
// does so on its own only on a MOVED reply or once a minute, and a dead
// master sends none: without it, a hub would knock at a dead master for
// up to a minute after its replica took over. go-redis runs at most one
// reload at a time, 200 ms apart.
func (f *Fleet) relearn() {
	if cc, ok := f.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
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
	tg := f.byName[protocol.CanonicalTarget(name)]
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
