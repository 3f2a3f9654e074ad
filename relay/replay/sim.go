package replay

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
)

// sim is the replay of the log with one set of settings: a breaker per
// target, on a clock of its own that shows the time of the moment being
// replayed, and the calls in flight, which report at their end. It is
// used by the engine's goroutine only.
type sim struct {
	e           *engine
	set         Settings
	clock       clock
	rand        func() float64
	targets     []*simTarget // by interned name; nil until the target is first met
	logged      []TargetStats
	inFlight    minHeap[inFlight]
	seq         uint64
	transitions []breaker.Transition
}

// clock is a sim's breaker clock: it shows what the sim set. The breakers
// read it only from the sim's goroutine.
type clock struct{ now time.Time }

// Now implements breaker.Clock.
func (c *clock) Now() time.Time { return c.now }

var _ breaker.Clock = (*clock)(nil)

// simTarget is one target of a sim, used by the sim's goroutine only.
type simTarget struct {
	name     string
	id       int32
	breaker  *breaker.Breaker
	settings relay.TargetSettings
	slowCall time.Duration
	failing  []int8 // by interned code: 0 not yet known, 1 a success, 2 a failure
	fallback int32  // -1 for none
	// last is the outcome of the latest call the hub made to the target
	// by start: what a call the hub did not make is taken to have got.
	last     outcome
	stats    TargetStats
	openedAt time.Time // when the breaker last left CLOSED
}

// outcome is what one call got. A plain value.
type outcome struct {
	code  int32
	took  time.Duration
	known bool
}

// inFlight is a call the sim's breaker admitted, waiting for its end. A
// plain value.
type inFlight struct {
	end    int64
	seq    uint64
	t      *simTarget
	ticket breaker.Ticket
	failed bool
	took   time.Duration
}

func (c *inFlight) before(d *inFlight) bool {
	return c.end < d.end || c.end == d.end && c.seq < d.seq
}

func newSim(e *engine, set Settings) *sim {
	src := rand.New(rand.NewPCG(set.Seed, set.Seed^0x9e3779b97f4a7c15))
	return &sim{e: e, set: set, rand: src.Float64, inFlight: minHeap[inFlight]{less: (*inFlight).before}}
}

// setClock moves the sim's clock to t, unix nanoseconds.
func (s *sim) setClock(t int64) { s.clock.now = time.Unix(0, t).UTC() }

// target returns the sim's target id, creating its breaker at the current
// time if it has none yet: a breaker's clock must never go back before the
// time it was made.
func (s *sim) target(id int32) *simTarget {
	if t := s.targets[id]; t != nil {
		return t
	}
	name := s.e.names.strings[id]
	ts, fallback := s.set.target(name)
	// As the hub does: a probe payload makes the probes the hub's own.
	ts.SyntheticProbes = ts.ProbePayload != ""
	t := &simTarget{name: name, id: id, settings: ts, fallback: -1}
	if fallback != "" {
		t.fallback = s.e.intern([]byte(fallback))
	}
	t.stats.Target = name
	t.breaker = breaker.New(breaker.Settings{
		Name:         name,
		Policy:       ts.Policy,
		Clock:        &s.clock,
		OnTransition: s.observer(t),
		Rand:         s.rand,
		ProbeTimeout: ts.TargetTimeout + relay.ProbeGrace,
	})
	t.slowCall = t.breaker.Settings().SlowCall
	s.targets[id] = t
	for int(id) >= len(s.logged) {
		s.logged = append(s.logged, TargetStats{})
	}
	s.logged[id].Target = name
	return t
}

// observer records t's breaker's transitions. It runs under the breaker's
// lock, on the sim's goroutine.
func (s *sim) observer(t *simTarget) func(breaker.Transition) {
	return func(tr breaker.Transition) {
		s.transitions = append(s.transitions, tr)
		if tr.To == breaker.Open {
			t.stats.Opened++
		}
		switch {
		case tr.From == breaker.Closed:
			t.openedAt = tr.At
		case tr.To == breaker.Closed:
			t.stats.NotClosed += tr.At.Sub(t.openedAt)
		}
	}
}

// failed reports whether a call to t that got code counts as a failure by
// t's failure codes (the breaker judges slowness itself).
func (t *simTarget) failed(e *engine, code int32) bool {
	for int(code) >= len(t.failing) {
		t.failing = append(t.failing, 0)
	}
	if t.failing[code] == 0 {
		t.failing[code] = 1
		for _, c := range t.settings.FailureCodes {
			if c == e.codes.strings[code] {
				t.failing[code] = 2
			}
		}
	}
	return t.failing[code] == 2
}

// sick reports whether the breaker counts a call to t with this outcome as
// a failure: a failure code, or a success slower than slow_call.
func (t *simTarget) sick(e *engine, code int32, took time.Duration) bool {
	return t.failed(e, code) || t.slowCall > 0 && took > t.slowCall
}

// advance reports the calls in flight that ended at or before t.
func (s *sim) advance(t int64) {
	for s.inFlight.len() > 0 && s.inFlight.min().end <= t {
		c := s.inFlight.pop()
		s.setClock(c.end)
		c.t.breaker.Done(c.ticket, c.failed, c.took)
	}
}

// arrive replays one request: the breaker of the target the client named
// is asked at the request's time, then, if it refuses, its fallback's.
func (s *sim) arrive(a *arrival) {
	s.advance(a.at)
	s.setClock(a.at)
	real := s.target(a.target)
	if a.synthetic {
		s.probe(a, real)
		return
	}
	if a.kind == kindCall {
		real.last = outcome{code: a.code, took: a.took, known: true}
	}
	s.logArrival(a, real)

	named := real
	if a.fallbackFor >= 0 {
		named = s.target(a.fallbackFor)
	}
	named.stats.Requests++
	if s.ask(a, named, real) {
		return
	}
	if named.fallback >= 0 {
		fb := s.target(named.fallback)
		if s.ask(a, fb, real) {
			named.stats.ToFallback++
			return
		}
	}
	named.stats.Refused++
}

// probe replays one of the hub's synthetic probes to t. With a probe
// payload in the set's settings, the breaker takes it as the hub's did: as
// its own probe if one is due then (AllowProbe), judged by the set's
// probe_expect; a probe the breaker is not due is skipped. Without a probe
// payload the set's hub would not have sent it: it is skipped, and the
// customers' requests probe the breaker, as they do in such a hub. Either
// way it is no customer's request.
func (s *sim) probe(a *arrival, t *simTarget) {
	if s == s.e.sims[0] {
		s.logged[a.target].Probes++
	}
	if !t.settings.SyntheticProbes {
		return
	}
	ticket, _, err := t.breaker.AllowProbe()
	if err != nil {
		return
	}
	t.stats.Probes++
	healthy := slices.Contains(t.probeExpect(), s.e.codes.strings[a.code])
	s.seq++
	s.inFlight.push(inFlight{end: a.end, seq: s.seq, t: t, ticket: ticket, failed: !healthy, took: a.took})
}

// probeExpect returns the answer codes of t's healthy synthetic probes.
func (t *simTarget) probeExpect() []string {
	if len(t.settings.ProbeExpect) == 0 {
		return []string{relay.DefaultProbeExpect}
	}
	return t.settings.ProbeExpect
}

// ask asks t's breaker to admit a; real is the target that answered a in
// the hub. It reports whether the breaker admitted it.
func (s *sim) ask(a *arrival, t, real *simTarget) bool {
	ticket, _, err := t.breaker.Allow()
	if err != nil {
		return false
	}
	if ticket.Probe() {
		t.stats.Probes++
	}
	o, end := t.last, a.at+int64(t.last.took)
	if t == real {
		switch a.kind {
		case kindHandedBack:
			t.breaker.Cancel(ticket)
			t.stats.HandedBack++
			return true
		case kindCall:
			o, end = outcome{code: a.code, took: a.took, known: true}, a.end
		}
	}
	if t != real || a.kind != kindCall {
		// The hub did not make this call: it gets what the target last
		// answered, or succeeds at once if it never answered yet.
		t.stats.Inferred++
		if !o.known {
			o.code, end = s.e.code([]byte(protocol.CodeOK)), a.at
		}
	}
	t.stats.Calls++
	sick := t.sick(s.e, o.code, o.took)
	if sick {
		t.stats.Failed++
	}
	s.seq++
	s.inFlight.push(inFlight{end: end, seq: s.seq, t: t, ticket: ticket, failed: t.failed(s.e, o.code), took: o.took})
	return true
}

// logArrival counts what the hub did with a, in the first sim's terms.
func (s *sim) logArrival(a *arrival, real *simTarget) {
	if s != s.e.sims[0] {
		return
	}
	named := a.target
	if a.fallbackFor >= 0 {
		named = a.fallbackFor
		s.target(named)
		s.logged[named].ToFallback++
	}
	s.logged[named].Requests++
	l := &s.logged[a.target]
	switch a.kind {
	case kindCall:
		l.Calls++
		if real.sick(s.e, a.code, a.took) {
			l.Failed++
		}
	case kindRefused:
		s.logged[named].Refused++
	case kindHandedBack:
		l.HandedBack++
	}
	if a.probe {
		l.Probes++
	}
}

// finish reports every call still in flight and closes the accounts at
// last, the latest time of the log.
func (s *sim) finish(last int64) {
	s.advance(1<<63 - 1)
	end := time.Unix(0, last).UTC()
	for _, t := range s.targets {
		if t != nil && t.breaker.Snapshot().State != breaker.Closed {
			t.stats.NotClosed += end.Sub(t.openedAt)
		}
	}
}
