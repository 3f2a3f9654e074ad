// Package replay puts a hub's access log back through the breaker package,
// to answer "what would the breakers have done with other settings?" on
// real traffic: would a threshold of 3 have opened CORE during Tuesday's
// incident, and how many customers would it have refused?
//
// The access log (docs/OPERATING.md, "The access log") records what each
// target's breaker did with each request and when, on the breaker's clock:
// a call's admission ("start") and its result ("end", with the code and
// the duration the breaker judged), a refusal's moment, a probe. Run reads
// those lines from one or more logs (gzipped or not, or standard input),
// puts the moments in time order, and drives one real breaker.Breaker per
// target and settings set with a clock that shows each moment's time: a
// call is admitted at its start and reports at its end, a refusal asks at
// its time. With the settings the hub ran with, the replay's transitions
// are the hub's own breaker log, line for line.
//
// With other settings the breakers decide differently. A call the hub made
// that the replay's breaker refuses is counted as refused; a request the
// hub refused (E904) that the replay's breaker admits gets the outcome,
// code and duration, of the target's latest call that the hub did make and
// that started before it, since the log cannot say what the target would
// have answered. A synthetic probe line (the hub's own probe, "synthetic")
// is no customer's request: with a probe payload in the settings it is
// replayed as the breaker's own probe, else it is skipped (see sim.probe).
// Operator actions on the admin port are not in the access
// log and are not replayed; nor is the bulkhead: a request the hub found
// the bulkhead full for (E905) is admitted and handed back, as in the hub.
//
// Memory does not grow with the size of the logs: lines are read one at a
// time and held only while they may still be reordered, for the
// Config.ReorderWindow behind the latest line read.
//
// Typical use:
//
//	src, err := replay.FileSource("access.log")
//	if err != nil {
//		return err
//	}
//	rep, err := replay.Run(ctx, replay.Config{Sets: []replay.Settings{
//		{Name: "replay", Defaults: relay.TargetSettings{Policy: breaker.Policy{FailThreshold: 3}}},
//	}}, []replay.Source{src})
//	if err != nil {
//		return err
//	}
//	return rep.WriteText(os.Stdout, "")
package replay

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
)

// Config configures a Run. It is a plain value.
type Config struct {
	// Sets are the settings to replay the logs with, each on breakers of
	// its own: one for a replay, two to compare. At least one.
	Sets []Settings
	// ReorderWindow is how far out of time order a line's moments may be
	// and still be replayed in order. The hub writes a line when the
	// answer is made, so a call's start comes up to its duration (at most
	// the target timeout) after later starts; lines also leave the hub's
	// queue slightly out of order. Moments are replayed once they are
	// ReorderWindow behind the latest time read; a line whose moment comes
	// before one already replayed is skipped and counted as late. Zero
	// means DefaultReorderWindow.
	ReorderWindow time.Duration
	// MaxListed is how many malformed and late lines the Report lists; all
	// are counted. Zero means 20.
	MaxListed int
	// Progress, when not nil, is called from Run's goroutine every
	// ProgressInterval or so while it reads, and once at the end.
	Progress func(Progress)
	// ProgressInterval is the time between Progress calls. Zero means
	// 250 ms.
	ProgressInterval time.Duration
}

// DefaultReorderWindow is Config.ReorderWindow's default: well beyond any
// target timeout a hub would run with.
const DefaultReorderWindow = time.Minute

// Progress is how far a Run has got, a plain value.
type Progress struct {
	// Source is the name of the source being read.
	Source string
	// Bytes is how many bytes of the sources have been read, as stored;
	// Size is their total, zero when unknown (standard input).
	Bytes, Size int64
	// Lines is how many lines have been read.
	Lines int64
	// Elapsed is the time since Run began.
	Elapsed time.Duration
	// Done is set on the last call.
	Done bool
}

// The kinds of moment a line gives a breaker.
const (
	kindCall       = iota // admitted, then a result at end
	kindRefused           // refused (E904)
	kindHandedBack        // admitted, then handed back (E905, E907)
)

// arrival is one request reaching a breaker, from one line: what the hub's
// breaker did with it, and for a call its outcome. A plain value, kept
// small because the reorder window holds many.
type arrival struct {
	at          int64  // unix nanoseconds: the hub asked the breaker
	seq         uint64 // order read, to keep equal times in log order
	end         int64  // kindCall: unix nanoseconds of the result
	took        time.Duration
	target      int32 // the target that answered (interned)
	fallbackFor int32 // the target the client named, when target answered as its fallback; else -1
	code        int32 // interned
	kind        uint8
	probe       bool
	synthetic   bool // the hub's own probe (see sim.probe)
}

func (a *arrival) before(b *arrival) bool {
	return a.at < b.at || a.at == b.at && a.seq < b.seq
}

// Run replays the sources, in the order given, with every set of cfg, and
// reports what happened. Lines that are not access log lines are counted,
// listed up to cfg.MaxListed and skipped; a source that cannot be read to
// its end (a truncated gzip file) is reported and the replay goes on with
// the next. Run fails only for a Config it cannot use, a source it cannot
// open, or ctx ending.
func Run(ctx context.Context, cfg Config, sources []Source) (*Report, error) {
	if len(cfg.Sets) == 0 {
		return nil, errors.New("replay: no settings to replay with")
	}
	if cfg.ReorderWindow < 0 || cfg.MaxListed < 0 || cfg.ProgressInterval < 0 {
		return nil, errors.New("replay: negative ReorderWindow, MaxListed or ProgressInterval")
	}
	e := newEngine(cfg)
	for _, src := range sources {
		if err := e.readSource(ctx, src); err != nil {
			return nil, err
		}
	}
	e.drain(func(*arrival) bool { return true })
	return e.finish(), nil
}

// engine is one Run: the reading, the reorder window and the simulations.
// It is used by one goroutine.
type engine struct {
	cfg    Config
	window int64
	began  time.Time
	sims   []*sim
	names  interner // target names
	codes  interner
	queue  minHeap[arrival]
	seq    uint64
	// latest is the latest time read in any line; replayed the latest
	// arrival time handed to the simulations.
	latest, replayed int64
	first            int64
	parser           lineParser
	report           Report
	bytesDone        int64 // bytes of the sources finished
	size             int64
	lastProgress     time.Time
}

func newEngine(cfg Config) *engine {
	if cfg.ReorderWindow == 0 {
		cfg.ReorderWindow = DefaultReorderWindow
	}
	if cfg.MaxListed == 0 {
		cfg.MaxListed = 20
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = 250 * time.Millisecond
	}
	e := &engine{
		cfg:    cfg,
		window: int64(cfg.ReorderWindow),
		began:  time.Now(),
		queue:  minHeap[arrival]{less: (*arrival).before},
	}
	for i := range cfg.Sets {
		e.sims = append(e.sims, newSim(e, cfg.Sets[i]))
	}
	return e
}

// progressEvery is how many lines pass between looks at the clock for
// Progress and at ctx.
const progressEvery = 4096

func (e *engine) readSource(ctx context.Context, src Source) error {
	lr, err := openLines(src)
	if err != nil {
		return err
	}
	defer lr.close()
	e.size += src.Size
	sr := SourceReport{Name: src.Name}
	defer func() {
		sr.Lines = lr.lines
		e.bytesDone += lr.stored.n
		e.report.Sources = append(e.report.Sources, sr)
	}()
	for {
		line, tooLong, err := lr.next()
		if line == nil && !tooLong {
			if err != nil {
				sr.Error = err.Error()
			}
			return nil
		}
		e.report.Lines++
		if tooLong {
			e.malformed(src.Name, lr.lines, "longer than 64 KiB")
		} else {
			e.line(src.Name, lr.lines, line)
		}
		if err != nil {
			sr.Error = err.Error()
			return nil
		}
		if e.report.Lines%progressEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			e.progress(src.Name, e.bytesDone+lr.stored.n, false)
		}
	}
}

// progress calls Config.Progress if it is time to, or if done.
func (e *engine) progress(source string, bytes int64, done bool) {
	if e.cfg.Progress == nil {
		return
	}
	now := time.Now()
	if !done && now.Sub(e.lastProgress) < e.cfg.ProgressInterval {
		return
	}
	e.lastProgress = now
	e.cfg.Progress(Progress{Source: source, Bytes: bytes, Size: e.size, Lines: e.report.Lines, Elapsed: now.Sub(e.began), Done: done})
}

func (e *engine) malformed(source string, line int64, reason string) {
	e.report.Malformed++
	if len(e.report.MalformedLines) < e.cfg.MaxListed {
		e.report.MalformedLines = append(e.report.MalformedLines, LineError{Source: source, Line: line, Reason: reason})
	}
}

// line takes one line: parsed, turned into an arrival, queued, and the
// arrivals that can no longer be overtaken replayed.
func (e *engine) line(source string, n int64, line []byte) {
	rec, err := e.parser.parse(line)
	if err != nil {
		e.malformed(source, n, err.Error())
		return
	}
	a := arrival{fallbackFor: -1, took: rec.took}
	switch {
	case rec.use != useNone:
		a.at, a.end, a.probe, a.synthetic = rec.start, rec.end, rec.probe, rec.synthetic && rec.use == useAdmitted
		switch rec.use {
		case useAdmitted:
			a.kind = kindCall
			if a.end == 0 {
				a.end = a.at + int64(a.took)
			}
		case useRefused:
			a.kind = kindRefused
		default:
			a.kind = kindHandedBack
		}
	case isHubCode(rec.code) || rec.target == nil:
		// The request reached no breaker: malformed, unknown target,
		// shutting down; or a line of an older hub for which the log
		// does not say (E907).
		e.report.NoBreaker++
		e.seeTime(rec.time)
		return
	default:
		// A line of a hub before the breaker fields: its time is when the
		// answer was made, to the millisecond, and a call started its
		// duration earlier.
		e.report.Approximate++
		a.at = rec.time
		switch string(rec.code) {
		case protocol.CodeCircuitOpen:
			a.kind = kindRefused
		case protocol.CodeBulkheadFull:
			a.kind = kindHandedBack
		default:
			a.kind = kindCall
			a.end = rec.time
			a.at = rec.time - int64(rec.took)
		}
	}
	a.target = e.intern(rec.target)
	if rec.fallbackFor != nil {
		a.fallbackFor = e.intern(rec.fallbackFor)
	}
	a.code = e.code(rec.code)
	e.seeTime(max(rec.time, a.end))
	if a.at < e.replayed {
		e.report.Late++
		if len(e.report.LateLines) < e.cfg.MaxListed {
			e.report.LateLines = append(e.report.LateLines, LineError{Source: source, Line: n,
				Reason: "its moment is more than the reorder window before a line read earlier"})
		}
		return
	}
	if a.synthetic {
		e.report.Synthetic++
	} else {
		e.report.Requests++
	}
	e.seq++
	a.seq = e.seq
	e.queue.push(a)
	horizon := e.latest - e.window
	e.drain(func(a *arrival) bool { return a.at <= horizon })
}

// isHubCode reports whether code is one the hub answers before any breaker
// is asked, or (E907) one an older log cannot place.
func isHubCode(code []byte) bool {
	switch string(code) {
	case protocol.CodeMalformed, protocol.CodeUnknownTarget, protocol.CodeUnavailable, protocol.CodeInternal:
		return true
	}
	return false
}

// seeTime notes a time read from a line.
func (e *engine) seeTime(t int64) {
	if t > e.latest {
		e.latest = t
	}
	if e.first == 0 || t < e.first {
		e.first = t
	}
}

// drain replays the queued arrivals, in time order, while ready says so of
// the earliest.
func (e *engine) drain(ready func(*arrival) bool) {
	for e.queue.len() > 0 && ready(e.queue.min()) {
		a := e.queue.pop()
		e.replayed = a.at
		for _, s := range e.sims {
			s.arrive(&a)
		}
	}
}

// intern returns the number of the target name, numbering it if it is new.
func (e *engine) intern(name []byte) int32 {
	id, added := e.names.id(name)
	if added {
		for _, s := range e.sims {
			s.targets = append(s.targets, nil)
		}
	}
	return id
}

// code returns the number of a code.
func (e *engine) code(c []byte) int32 {
	id, _ := e.codes.id(c)
	return id
}

// interner numbers strings in the order they are first met, so that the
// many copies of a few target names and codes cost an int32 each. Not safe
// for concurrent use.
type interner struct {
	ids     map[string]int32
	strings []string
}

// id returns the number of s and whether it was new.
func (in *interner) id(s []byte) (int32, bool) {
	if id, ok := in.ids[string(s)]; ok {
		return id, false
	}
	if in.ids == nil {
		in.ids = map[string]int32{}
	}
	id := int32(len(in.strings))
	in.strings = append(in.strings, string(s))
	in.ids[string(s)] = id
	return id, true
}

// finish ends every simulation at the latest time read and builds the
// report.
func (e *engine) finish() *Report {
	r := &e.report
	if r.MalformedLines == nil {
		r.MalformedLines = []LineError{}
	}
	if r.LateLines == nil {
		r.LateLines = []LineError{}
	}
	if e.first != 0 {
		r.First, r.Last = time.Unix(0, e.first).UTC(), time.Unix(0, e.latest).UTC()
	}
	for i, s := range e.sims {
		s.finish(e.latest)
		sr := SetReport{Name: s.set.Name, Transitions: s.transitions}
		for id, t := range s.targets {
			if t == nil {
				continue
			}
			sr.Targets = append(sr.Targets, t.stats)
			if i == 0 {
				r.Logged = append(r.Logged, s.logged[id])
			}
			sr.Settings = append(sr.Settings, TargetSettings{Target: t.name, Settings: s.set.Describe(t.name)})
		}
		r.Sets = append(r.Sets, sr)
	}
	e.progress("", e.bytesDone, true)
	return r
}

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
