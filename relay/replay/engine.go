package replay

import (
	"context"
	"time"

	"github.com/relayhub/relayhub/relay/protocol"
)

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
