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
	"time"
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
