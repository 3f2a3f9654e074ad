package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/sourcegraph/conc"
)

// Histogram range and precision: 1µs to 60s at 3 significant digits.
const (
	histLowestUS  = 1
	histHighestUS = 60_000_000
	histSigFigs   = 3
)

const (
	// latencyBatch is how many latencies a reader collects before it takes
	// the histogram lock, so 16 readers at 100k answers/s do not contend.
	latencyBatch = 256
	// maxErrorSamples bounds the distinct connection errors kept for the
	// report.
	maxErrorSamples = 5
	// writeBufferSize and readBufferSize are per connection. The read
	// buffer also bounds the answer line the generator accepts: the hub's
	// own lines are far shorter.
	writeBufferSize = 32 << 10
	readBufferSize  = 64 << 10
)

// Limits of a run, so a typo on a command line cannot exhaust the machine.
const (
	// MaxConns is the most connections one run opens.
	MaxConns = 10000
	// MaxDepth is the most requests outstanding on one connection.
	MaxDepth = 65536
	// MaxRate is the highest Rate, in requests per second.
	MaxRate = 1e9
	// RateDepth is the per-connection cap on outstanding requests a command
	// line gets with a Rate and no depth: high enough that the schedule,
	// not the cap, paces the run, small enough to bound memory when the hub
	// stops answering.
	RateDepth = 1024
)

// ErrDialAll is returned by Run (wrapped with the address and the first
// dial error) and by IdleProbe.Run when not one connection could be opened.
var ErrDialAll = errors.New("no connection could be opened")

// Config describes one load run. It is a plain value; New takes its own
// copy.
type Config struct {
	// Addr is the server's address, host:port: the hub's client port, or a
	// reference server's with another Protocol.
	Addr string
	// Conns is the number of connections, at most MaxConns; zero means 1.
	Conns int
	// Depth is the most requests outstanding on one connection, at most
	// MaxDepth; zero means 1. In a closed loop the writer keeps exactly
	// Depth outstanding. With Rate it only caps a connection whose answers
	// fall far behind.
	Depth int
	// Duration is how long requests are sent; ignored when Requests is set.
	// One of the two is required.
	Duration time.Duration
	// Requests is the total number of requests; zero means send for Duration.
	Requests uint64
	// Rate is the total target rate in requests per second, at most
	// MaxRate; zero means a closed loop (send as soon as an answer frees a
	// slot).
	Rate float64
	// Mix picks the target of each request; it must hold at least one entry.
	Mix Mix
	// Payloads holds the payload template of each Mix entry, in order.
	Payloads []Template
	// Drain is how long a connection waits for outstanding answers once it
	// has stopped sending; zero means not at all.
	Drain time.Duration
	// DialTimeout bounds each connect; zero means 5s.
	DialTimeout time.Duration
	// Seed seeds the per-connection random sources of the mix, so a run's
	// sequence of targets can be repeated.
	Seed uint64
	// Progress, when not nil, is called about once a second from a single
	// goroutine while the run lasts. It must not block for long.
	Progress func(Progress)
	// Protocol is what the connections speak; the zero value is the hub's
	// line protocol. With ProtocolHTTP the Mix only chooses payload
	// templates: every request goes to Addr.
	Protocol Protocol
	// ServerPIDs are processes whose CPU time is measured over the run,
	// from the first request to the last answer (Linux only); none when
	// empty.
	ServerPIDs []int
	// TLS, when set, makes every connection TLS, its handshake done while
	// connecting (within DialTimeout). Nil means plain TCP.
	TLS *tls.Config
	// Phases, when set, split the run by each request's due time (its send
	// time in a closed loop) into consecutive named stretches, reported
	// apart with a per-second count of the answers by code
	// (Summary.Phases, Summary.Series): how a server fared before, during
	// and after a change made to it while the run lasts. Requests due after
	// the last phase count in it.
	Phases []Phase
	// Watch, when set, is read once a second while the run lasts and its
	// readings summed up per phase; it needs Phases.
	Watch Watch
}

// Generator runs load tests as its Config describes. It is read-only after
// New, so it is safe for concurrent use; each Run keeps its state apart.
type Generator struct {
	cfg     Config
	targets [][]byte // "|TARGET|" of each Mix entry, ready to append
}

// New checks cfg, fills in its defaults and returns a Generator for it.
func New(cfg Config) (*Generator, error) {
	if cfg.Conns == 0 {
		cfg.Conns = 1
	}
	if cfg.Depth == 0 {
		cfg.Depth = 1
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	switch {
	case cfg.Conns < 0 || cfg.Conns > MaxConns:
		return nil, fmt.Errorf("loadgen: Conns %d: want 1 to %d", cfg.Conns, MaxConns)
	case cfg.Depth < 0 || cfg.Depth > MaxDepth:
		return nil, fmt.Errorf("loadgen: Depth %d: want 1 to %d", cfg.Depth, MaxDepth)
	case cfg.Requests == 0 && cfg.Duration <= 0:
		return nil, fmt.Errorf("loadgen: Duration %s: want more than 0 (or set Requests)", cfg.Duration)
	case !(cfg.Rate >= 0) || cfg.Rate > MaxRate:
		return nil, fmt.Errorf("loadgen: Rate %v: want 0 to %g requests/s", cfg.Rate, float64(MaxRate))
	case cfg.Drain < 0:
		return nil, fmt.Errorf("loadgen: Drain %s: want 0 or more", cfg.Drain)
	case cfg.DialTimeout < 0:
		return nil, fmt.Errorf("loadgen: DialTimeout %s: want 0 or more", cfg.DialTimeout)
	case int(cfg.Protocol) >= len(protocolNames):
		return nil, fmt.Errorf("loadgen: Protocol %d: unknown", cfg.Protocol)
	case len(cfg.Mix.entries) == 0 || len(cfg.Payloads) != len(cfg.Mix.entries):
		return nil, errors.New("loadgen: a Mix with one payload template per target is required")
	}
	if cfg.Watch != nil && len(cfg.Phases) == 0 {
		return nil, errNoPhases
	}
	for _, p := range cfg.Phases {
		if p.Duration <= 0 {
			return nil, fmt.Errorf("loadgen: phase %q: Duration %s: want more than 0", p.Name, p.Duration)
		}
	}
	for _, pid := range cfg.ServerPIDs {
		if pid <= 0 {
			return nil, fmt.Errorf("loadgen: ServerPIDs: %d is not a process id", pid)
		}
	}
	cfg.Payloads = slices.Clone(cfg.Payloads)
	cfg.ServerPIDs = slices.Clone(cfg.ServerPIDs)
	cfg.Phases = slices.Clone(cfg.Phases)
	g := &Generator{cfg: cfg}
	for _, e := range cfg.Mix.entries {
		g.targets = append(g.targets, []byte("|"+e.Target+"|"))
	}
	return g, nil
}

// Summary returns the report of a run of this Generator.
func (g *Generator) Summary(res *Result) Summary {
	return newSummary(g.cfg, res)
}

// Progress is the state of a run at one progress tick, a plain value.
type Progress struct {
	Elapsed    time.Duration // since the first request
	Sent       int64
	Answered   int64
	Rate       float64       // answers per second since the previous tick
	P99        time.Duration // of every answer so far
	Unmatched  int64
	ConnErrors int64
}

// Result is the outcome of a run. It is not safe for concurrent use
// (Hist has no lock of its own); Run hands it over complete.
type Result struct {
	Sent       int64
	Answered   int64
	Unmatched  int64 // answers whose TXID matched no outstanding request
	Malformed  int64 // lines that are not TXID|CODE|MESSAGE
	Missing    int64 // requests sent but never answered
	ConnErrors int64 // connections that failed to open or failed mid-run
	// ErrorSamples holds up to maxErrorSamples distinct connection errors.
	ErrorSamples []string
	// Elapsed runs from the start to the last matched answer; throughput is
	// measured over it, so the drain wait does not dilute it.
	Elapsed time.Duration
	// Wall is the whole run, dial to the end of the drain.
	Wall time.Duration
	// Hist holds the latencies in microseconds.
	Hist *hdrhistogram.Histogram
	// OKHist holds the latencies, in microseconds, of the answers that say
	// the target processed the transaction (0000 or Bnnn): fast refusals
	// mixed in cannot flatter them.
	OKHist *hdrhistogram.Histogram
	// Codes counts answers per Mix entry (by index) and code.
	Codes []map[string]int64
	// ServerCPU is the CPU time each of ServerPIDs used during the run.
	ServerCPU []ProcessCPU
	// ClientCPU is the CPU time this process used during the run, so a
	// benchmark can tell how much of the machine the load itself took.
	ClientCPU time.Duration
	// MachineBusy is the CPU time the whole machine spent busy during the
	// run, all CPUs together; zero where /proc/stat cannot be read.
	MachineBusy time.Duration
	// MeterWall is the wall time MachineBusy was measured over.
	MeterWall time.Duration
	// timeline is the account of Config.Phases; nil without them.
	timeline *timeline
}

// loadRun is the state shared by the connections of one run. It is safe
// for concurrent use by them: fields set before the goroutines start are
// read-only afterwards, the rest are atomics or guarded.
type loadRun struct {
	cfg      Config
	start    time.Time
	deadline int64   // ns since start when sending stops; 0 with Requests
	interval float64 // ns between requests of the whole run with Rate
	targets  [][]byte

	// stop ends sending: the duration is over or ctx was cancelled. A
	// writer asleep until a request falls due still sends it, since it fell
	// due within the duration; only cancelled wakes it.
	stop     chan struct{}
	stopOnce sync.Once
	halted   atomic.Bool
	// cancelled is closed when ctx is cancelled: stop at once.
	cancelled  chan struct{}
	cancelOnce sync.Once
	// exhausted is closed when every request number has been handed out, to
	// wake writers waiting for a free slot with nothing left to send.
	exhausted     chan struct{}
	exhaustedOnce sync.Once

	issued     atomic.Uint64 // request numbers handed out
	sent       atomic.Int64
	answered   atomic.Int64
	unmatched  atomic.Int64
	connErrors atomic.Int64

	histMu sync.Mutex
	hist   *hdrhistogram.Histogram // guarded by histMu
	okHist *hdrhistogram.Histogram // guarded by histMu
	tl     *timeline               // guarded by histMu; nil without Phases

	errMu   sync.Mutex
	errSeen map[string]bool // guarded by errMu
	errList []string        // guarded by errMu
}

// Run runs one load test and returns its result. It returns ErrDialAll
// (wrapped with the first dial error) when no connection could be opened,
// and an error when a server's CPU time cannot be read; connection errors
// after that are counted in the result. Cancelling ctx stops sending; the
// outstanding answers still get the Drain.
func (g *Generator) Run(ctx context.Context) (*Result, error) {
	r := newLoadRun(g.cfg, g.targets)
	wallStart := time.Now()
	conns := r.dialAll(ctx)
	if len(conns) == 0 {
		r.errMu.Lock()
		defer r.errMu.Unlock()
		return nil, fmt.Errorf("%w to %s: %s", ErrDialAll, r.cfg.Addr, r.errList[0])
	}

	meters, err := startMeters(r.cfg.ServerPIDs)
	if err != nil {
		for _, c := range conns {
			_ = c.nc.Close()
		}
		return nil, err
	}
	r.start = time.Now()
	if r.cfg.Requests == 0 {
		r.deadline = int64(r.cfg.Duration)
		t := time.AfterFunc(r.cfg.Duration, r.halt)
		defer t.Stop()
	}
	defer context.AfterFunc(ctx, r.cancel)()
	stopProgress := r.startProgress()
	r.drive(conns)
	use, meterErr := meters.stop()
	stopProgress()
	res := r.result(conns, time.Since(wallStart), use)
	if meterErr != nil {
		// A server that went away mid-run shows in the answers; this only
		// says why its CPU time is missing.
		res.ErrorSamples = append(res.ErrorSamples, meterErr.Error())
	}
	return res, nil
}

// newLoadRun returns the state of a run of cfg over targets, before any
// connection is dialled.
func newLoadRun(cfg Config, targets [][]byte) *loadRun {
	r := &loadRun{
		cfg:       cfg,
		targets:   targets,
		stop:      make(chan struct{}),
		cancelled: make(chan struct{}),
		exhausted: make(chan struct{}),
		hist:      hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
		okHist:    hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
		errSeen:   make(map[string]bool),
	}
	if len(cfg.Phases) > 0 {
		r.tl = newTimeline(cfg.Phases)
	}
	if cfg.Rate > 0 {
		r.interval = float64(time.Second) / cfg.Rate
	}
	return r
}

// drive runs each connection's writer and reader until every connection
// is done.
func (r *loadRun) drive(conns []*loadConn) {
	var loops conc.WaitGroup
	for _, c := range conns {
		loops.Go(c.writeLoop)
		loops.Go(c.readLoop)
	}
	loops.Wait()
}

// startProgress starts the progress reports and the Watch's readings when
// Config asks for them, and returns what stops them and waits until they
// have.
func (r *loadRun) startProgress() (stop func()) {
	var progress conc.WaitGroup
	done := make(chan struct{})
	if r.cfg.Progress != nil {
		progress.Go(func() { r.progressLoop(done) })
	}
	if r.cfg.Watch != nil {
		progress.Go(func() { r.watchLoop(done) })
	}
	return func() {
		close(done)
		progress.Wait()
	}
}

// result closes conns, whose goroutines are done, and sums up the run:
// wall is how long it took from the first dial, use the CPU time it cost.
func (r *loadRun) result(conns []*loadConn, wall time.Duration, use meterReading) *Result {
	res := &Result{
		Sent:        r.sent.Load(),
		ConnErrors:  r.connErrors.Load(),
		Wall:        wall,
		Hist:        r.hist,
		OKHist:      r.okHist,
		Codes:       make([]map[string]int64, len(r.targets)),
		ServerCPU:   use.servers,
		ClientCPU:   use.self,
		MachineBusy: use.machine,
		MeterWall:   use.wall,
		timeline:    r.tl,
	}
	for i := range res.Codes {
		res.Codes[i] = make(map[string]int64)
	}
	var last int64
	for _, c := range conns {
		_ = c.nc.Close()
		res.Answered += c.answered
		res.Unmatched += c.unmatched
		res.Malformed += c.malformed
		// Both goroutines are done, so whatever is still outstanding was
		// sent and never answered.
		res.Missing += int64(c.outstanding)
		last = max(last, c.lastAnswer)
		for i, m := range c.codes {
			for code, n := range m {
				res.Codes[i][code] += *n
			}
		}
	}
	res.Elapsed = time.Duration(last)
	if res.Elapsed <= 0 {
		res.Elapsed = time.Since(r.start)
	}
	r.errMu.Lock()
	res.ErrorSamples = r.errList
	r.errMu.Unlock()
	return res
}

// dialAll opens the connections one after the other, counting failures.
func (r *loadRun) dialAll(ctx context.Context) []*loadConn {
	d := net.Dialer{Timeout: r.cfg.DialTimeout}
	ringSize := uint64(1) << bits.Len(uint(2*r.cfg.Depth-1)) // power of two >= 2*Depth
	var conns []*loadConn
	for i := 1; i <= r.cfg.Conns; i++ {
		nc, err := dialConn(ctx, &d, r.cfg.TLS, r.cfg.Addr)
		if err != nil {
			r.noteError(err)
			continue
		}
		c := &loadConn{
			run:    r,
			id:     i,
			nc:     nc,
			tokens: make(chan struct{}, r.cfg.Depth),
			quit:   make(chan struct{}),
			ring:   make([]slot, ringSize),
			mask:   ringSize - 1,
			codes:  make([]map[string]*int64, len(r.targets)),
		}
		for j := range c.codes {
			c.codes[j] = make(map[string]*int64)
		}
		c.latencies = make([]int64, 0, latencyBatch)
		c.latencyOK = make([]bool, 0, latencyBatch)
		conns = append(conns, c)
	}
	return conns
}

// halt stops sending on every connection.
func (r *loadRun) halt() {
	r.stopOnce.Do(func() {
		r.halted.Store(true)
		close(r.stop)
	})
}

// cancel stops sending at once, even a request already due.
func (r *loadRun) cancel() {
	r.cancelOnce.Do(func() { close(r.cancelled) })
	r.halt()
}

func (r *loadRun) exhaust() {
	r.exhaustedOnce.Do(func() { close(r.exhausted) })
}

// now returns the time since the start of the run, in ns.
func (r *loadRun) now() int64 { return int64(time.Since(r.start)) }

// noteError counts a failed connection and keeps its error as a sample.
func (r *loadRun) noteError(err error) {
	r.connErrors.Add(1)
	msg := err.Error()
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if !r.errSeen[msg] && len(r.errList) < maxErrorSamples {
		r.errSeen[msg] = true
		r.errList = append(r.errList, msg)
	}
}

// record adds a batch of latencies in ns to the histogram, and those
// whose ok is set to the histogram of processed transactions. With
// Phases, due and codes hold each answer's due time and code for the
// timeline.
func (r *loadRun) record(ns []int64, ok []bool, due []int64, codes []string) {
	r.histMu.Lock()
	defer r.histMu.Unlock()
	for i, v := range ns {
		us := min(max(v/int64(time.Microsecond), histLowestUS), histHighestUS)
		_ = r.hist.RecordValue(us) // in range by the clamp above
		if ok[i] {
			_ = r.okHist.RecordValue(us)
		}
		if r.tl != nil {
			r.tl.add(due[i], us, ok[i], codes[i])
		}
	}
}

// progressLoop reports once a second until done is closed.
func (r *loadRun) progressLoop(done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var prevAnswered int64
	prev := time.Duration(0)
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		elapsed := time.Since(r.start)
		answered := r.answered.Load()
		r.histMu.Lock()
		p99 := time.Duration(r.hist.ValueAtQuantile(99)) * time.Microsecond
		r.histMu.Unlock()
		r.cfg.Progress(Progress{
			Elapsed:    elapsed,
			Sent:       r.sent.Load(),
			Answered:   answered,
			Rate:       float64(answered-prevAnswered) / (elapsed - prev).Seconds(),
			P99:        p99,
			Unmatched:  r.unmatched.Load(),
			ConnErrors: r.connErrors.Load(),
		})
		prevAnswered, prev = answered, elapsed
	}
}
