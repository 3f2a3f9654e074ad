package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/sourcegraph/conc"

	"github.com/relayhub/relayhub/relay/protocol"
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
	for _, pid := range cfg.ServerPIDs {
		if pid <= 0 {
			return nil, fmt.Errorf("loadgen: ServerPIDs: %d is not a process id", pid)
		}
	}
	cfg.Payloads = slices.Clone(cfg.Payloads)
	cfg.ServerPIDs = slices.Clone(cfg.ServerPIDs)
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

	errMu   sync.Mutex
	errSeen map[string]bool // guarded by errMu
	errList []string        // guarded by errMu
}

// slot is one outstanding request in a connection's ring, guarded by the
// connection's mu.
type slot struct {
	seq    uint64
	at     int64 // ns since start: when it was sent, or meant to be with Rate
	target int32
	used   bool
}

// loadConn is one connection of a run: a writer goroutine and a reader
// goroutine share it, and nothing else may use it while they run. Fields
// without a guard belong to one of the two goroutines as their comments
// say, or are read-only.
type loadConn struct {
	run *loadRun
	id  int
	nc  net.Conn

	// tokens holds one value per outstanding request; the writer blocks on
	// it when Depth requests are outstanding.
	tokens   chan struct{}
	quit     chan struct{} // closed when the connection fails
	failOnce sync.Once

	mu          sync.Mutex
	ring        []slot // guarded by mu
	mask        uint64
	outstanding int  // guarded by mu
	writerDone  bool // guarded by mu

	// Writer-owned.
	nextSeq uint64
	line    []byte
	body    []byte // payload of an HTTP request, built before its header

	// Reader-owned; read by Run after both goroutines end.
	codes      []map[string]*int64
	answered   int64
	unmatched  int64
	malformed  int64
	lastAnswer int64
	latencies  []int64
	latencyOK  []bool // per latency: the answer was 0000 or Bnnn
	inOrderSeq uint64 // with an in-order protocol, the last sequence number answered
	answerBody []byte // body of an HTTP answer
}

// Run runs one load test and returns its result. It returns ErrDialAll
// (wrapped with the first dial error) when no connection could be opened,
// and an error when a server's CPU time cannot be read; connection errors
// after that are counted in the result. Cancelling ctx stops sending; the
// outstanding answers still get the Drain.
func (g *Generator) Run(ctx context.Context) (*Result, error) {
	cfg := g.cfg
	r := &loadRun{
		cfg:       cfg,
		targets:   g.targets,
		stop:      make(chan struct{}),
		cancelled: make(chan struct{}),
		exhausted: make(chan struct{}),
		hist:      hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
		okHist:    hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs),
		errSeen:   make(map[string]bool),
	}
	if cfg.Rate > 0 {
		r.interval = float64(time.Second) / cfg.Rate
	}

	wallStart := time.Now()
	conns := r.dialAll(ctx)
	if len(conns) == 0 {
		r.errMu.Lock()
		defer r.errMu.Unlock()
		return nil, fmt.Errorf("%w to %s: %s", ErrDialAll, cfg.Addr, r.errList[0])
	}

	meters, err := startMeters(cfg.ServerPIDs)
	if err != nil {
		for _, c := range conns {
			_ = c.nc.Close()
		}
		return nil, err
	}
	r.start = time.Now()
	if cfg.Requests == 0 {
		r.deadline = int64(cfg.Duration)
		t := time.AfterFunc(cfg.Duration, r.halt)
		defer t.Stop()
	}
	defer context.AfterFunc(ctx, r.cancel)()

	var wg conc.WaitGroup
	for _, c := range conns {
		wg.Go(c.writeLoop)
		wg.Go(c.readLoop)
	}
	var pwg conc.WaitGroup
	progressDone := make(chan struct{})
	if cfg.Progress != nil {
		pwg.Go(func() { r.progressLoop(progressDone) })
	}
	wg.Wait()
	use, meterErr := meters.stop()
	close(progressDone)
	pwg.Wait()

	res := &Result{
		Sent:        r.sent.Load(),
		ConnErrors:  r.connErrors.Load(),
		Wall:        time.Since(wallStart),
		Hist:        r.hist,
		OKHist:      r.okHist,
		Codes:       make([]map[string]int64, len(r.targets)),
		ServerCPU:   use.servers,
		ClientCPU:   use.self,
		MachineBusy: use.machine,
		MeterWall:   use.wall,
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
	if meterErr != nil {
		// A server that went away mid-run shows in the answers; this only
		// says why its CPU time is missing.
		res.ErrorSamples = append(res.ErrorSamples, meterErr.Error())
	}
	return res, nil
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

// runMeters measures the CPU time of the servers, of the generator itself
// and of the whole machine over a run. It is owned by Run's goroutine.
type runMeters struct {
	servers *cpuMeter // nil without ServerPIDs
	self    *cpuMeter // nil where /proc cannot be read
	machine time.Duration
	hasMach bool
	start   time.Time
}

// meterReading is what runMeters measured; a plain value.
type meterReading struct {
	servers []ProcessCPU
	self    time.Duration
	machine time.Duration
	wall    time.Duration
}

// startMeters starts measuring. It fails when a server's CPU time cannot
// be read, since the operator asked for it; the generator's own is best
// effort.
func startMeters(pids []int) (runMeters, error) {
	var m runMeters
	if len(pids) > 0 {
		var err error
		if m.servers, err = startCPUMeter(pids); err != nil {
			return runMeters{}, err
		}
	}
	m.self, _ = startCPUMeter([]int{os.Getpid()})
	if d, err := machineBusy(); err == nil {
		m.machine, m.hasMach = d, true
	}
	m.start = time.Now()
	return m, nil
}

// stop returns the CPU time the servers, the generator and the machine
// used since start. Only a server's is an error to miss.
func (m runMeters) stop() (meterReading, error) {
	var r meterReading
	var err error
	if m.servers != nil {
		r.servers, err = m.servers.stop()
	}
	if m.self != nil {
		if s, e := m.self.stop(); e == nil {
			r.self = s[0].CPU
		}
	}
	if m.hasMach {
		if d, e := machineBusy(); e == nil {
			r.machine, r.wall = d-m.machine, time.Since(m.start)
		}
	}
	return r, err
}

// record adds a batch of latencies in ns to the histogram, and those
// whose ok is set to the histogram of processed transactions.
func (r *loadRun) record(ns []int64, ok []bool) {
	r.histMu.Lock()
	defer r.histMu.Unlock()
	for i, v := range ns {
		us := min(max(v/int64(time.Microsecond), histLowestUS), histHighestUS)
		_ = r.hist.RecordValue(us) // in range by the clamp above
		if ok[i] {
			_ = r.okHist.RecordValue(us)
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

// fail marks the connection failed: the first error is counted, both
// goroutines are told to stop, and closing the socket unblocks them.
func (c *loadConn) fail(err error) {
	c.failOnce.Do(func() {
		c.run.noteError(fmt.Errorf("conn %d: %w", c.id, err))
		close(c.quit)
		_ = c.nc.Close()
	})
}

// writeLoop sends requests until the run stops, the request numbers run
// out or the connection fails. It flushes only before it would block, so
// with Depth > 1 the requests that are ready go out in one write.
//
// With Rate, request n is due at start + n/Rate whichever connection sends
// it, and its latency is measured from that due time rather than from the
// moment it was written. A hub that stalls (all Depth slots taken, or a
// socket that does not drain) therefore shows the stall in the latency of
// every request that should have gone out meanwhile, instead of the
// generator quietly waiting with it (coordinated omission). Falling behind
// the schedule makes the writer send the overdue requests at once.
//
// One delay is the generator's own and is left out: Go timers fire up to
// about a millisecond late, so a request that fell due while its writer was
// asleep on the timer is measured from the moment the writer woke. Without
// this, a sub-millisecond hub would look a millisecond slow at any rate.
func (c *loadConn) writeLoop() {
	r := c.run
	w := &writer{c: c, bw: bufio.NewWriterSize(c.nc, writeBufferSize)}
	defer c.finishWriting(w.bw)
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(c.id)))
	total := r.cfg.Mix.total()
	if r.interval > 0 {
		w.timer = time.NewTimer(time.Hour)
		w.timer.Stop()
		defer w.timer.Stop()
	}
	for !r.halted.Load() && w.acquire() {
		n := r.issued.Add(1) - 1
		if r.cfg.Requests > 0 && n >= r.cfg.Requests {
			<-c.tokens
			r.exhaust()
			return
		}
		at, ok := w.sendTime(n)
		if !ok {
			return
		}
		target := 0
		if len(r.targets) > 1 {
			target = r.cfg.Mix.pick(rng.IntN(total))
		}
		seq := c.register(at, target)
		b := c.appendRequest(c.line[:0], seq, target, n)
		c.line = b
		if _, err := w.bw.Write(b); err != nil {
			c.unregister(seq)
			c.fail(err)
			return
		}
		r.sent.Add(1)
		if n+1 == r.cfg.Requests {
			// The last request is out: writers waiting for a free slot have
			// nothing left to send.
			r.exhaust()
		}
	}
}

// appendRequest appends request n, sequence number seq on this connection,
// to b in the run's protocol.
func (c *loadConn) appendRequest(b []byte, seq uint64, target int, n uint64) []byte {
	r := c.run
	switch r.cfg.Protocol {
	case ProtocolRedisPing:
		return append(b, pingRequest...)
	case ProtocolHTTP:
		c.body = r.cfg.Payloads[target].AppendTo(c.body[:0], n+1, c.id)
		var txid [32]byte
		return appendHTTPRequest(b, r.cfg.Addr, appendLoadTxID(txid[:0], c.id, seq), c.body)
	}
	b = appendLoadTxID(b, c.id, seq)
	b = append(b, r.targets[target]...)
	b = r.cfg.Payloads[target].AppendTo(b, n+1, c.id)
	return append(b, '\n')
}

// writer is the state of one writeLoop, owned by its goroutine.
type writer struct {
	c     *loadConn
	bw    *bufio.Writer
	timer *time.Timer // with Rate only
	woke  int64       // ns since start of the last timer wake-up
}

// acquire takes a token for one more outstanding request. When none is
// free it flushes what is buffered, since nothing more will be written
// until an answer comes, then waits. It returns false when the writer
// should stop instead.
func (w *writer) acquire() bool {
	c, r := w.c, w.c.run
	select {
	case c.tokens <- struct{}{}:
		return true
	default:
	}
	if err := w.bw.Flush(); err != nil {
		c.fail(err)
		return false
	}
	select {
	case c.tokens <- struct{}{}:
		return true
	case <-r.stop:
	case <-r.exhausted:
	case <-c.quit:
	}
	return false
}

// sendTime returns the time request n counts as sent from, waiting for its
// due time with Rate. It returns false, with the token handed back, when
// the request must not be sent: sending is over or the connection failed.
func (w *writer) sendTime(n uint64) (int64, bool) {
	c, r := w.c, w.c.run
	if r.interval == 0 {
		at := r.now()
		if r.deadline > 0 && at >= r.deadline {
			<-c.tokens
			r.halt()
			return 0, false
		}
		return at, true
	}
	at := int64(float64(n) * r.interval)
	if r.deadline > 0 && at >= r.deadline {
		<-c.tokens
		r.halt()
		return 0, false
	}
	if wait := at - r.now(); wait > 0 {
		if err := w.bw.Flush(); err != nil {
			c.fail(err)
			return 0, false
		}
		w.timer.Reset(time.Duration(wait))
		select {
		case <-w.timer.C:
			w.woke = r.now()
		case <-r.cancelled:
			<-c.tokens
			return 0, false
		case <-c.quit:
			return 0, false
		}
	}
	// Requests that fell due while this writer overslept are measured from
	// its wake-up, not from their due time.
	return max(at, w.woke), true
}

// register puts a request sent at at into the ring and returns its
// sequence number. Since the TXIDs are ours to choose, a slot still held by
// an old request that is slow to answer is skipped rather than waited for:
// the caller holds a token, so fewer than Depth requests are outstanding
// and the ring, at least twice Depth, always has a free slot.
func (c *loadConn) register(at int64, target int) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	seq := c.nextSeq + 1
	for c.ring[seq&c.mask].used {
		seq++
	}
	c.ring[seq&c.mask] = slot{seq: seq, at: at, target: int32(target), used: true}
	c.outstanding++
	c.nextSeq = seq
	return seq
}

// unregister takes back a request that could not be written.
func (c *loadConn) unregister(seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ring[seq&c.mask].used = false
	c.outstanding--
}

// finishWriting flushes what is buffered and starts the drain: the reader
// gets Drain to collect the outstanding answers, or is woken at once when
// there are none.
func (c *loadConn) finishWriting(bw *bufio.Writer) {
	if err := bw.Flush(); err != nil {
		c.fail(err)
	}
	c.mu.Lock()
	c.writerDone = true
	empty := c.outstanding == 0
	c.mu.Unlock()
	deadline := time.Now().Add(c.run.cfg.Drain)
	if empty {
		deadline = time.Unix(1, 0) // in the past: wake the reader now
	}
	// An error here means the connection is already closed, which the
	// reader sees on its own.
	_ = c.nc.SetReadDeadline(deadline)
}

// readLoop matches answers to outstanding requests until the writer is
// done and nothing is outstanding, the drain deadline passes, or the
// connection fails.
func (c *loadConn) readLoop() {
	defer c.flushLatencies()
	br := bufio.NewReaderSize(c.nc, readBufferSize)
	if c.run.cfg.Protocol == ProtocolHTTP {
		c.readHTTP(br)
		return
	}
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			if c.handle(line) {
				return
			}
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			c.malformed++
			if err := skipLine(br); err != nil {
				c.endRead(err)
				return
			}
			continue
		}
		if len(line) > 0 {
			c.malformed++ // a partial line before the error
		}
		c.endRead(err)
		return
	}
}

// endRead settles the reader's books when reading stops with err.
func (c *loadConn) endRead(err error) {
	c.mu.Lock()
	done, out := c.writerDone, c.outstanding
	c.mu.Unlock()
	if done && (out == 0 || errors.Is(err, os.ErrDeadlineExceeded)) {
		// The writer finished; whatever is still outstanding when the drain
		// deadline passes is missing, which is not a connection error.
		return
	}
	select {
	case <-c.quit:
		// The writer failed first and closed the socket: already counted.
		return
	default:
	}
	switch {
	case errors.Is(err, io.EOF):
		err = errors.New("connection closed by the hub")
	case errors.Is(err, io.ErrUnexpectedEOF) && c.run.cfg.Protocol == ProtocolHTTP:
		// http.ReadResponse reports a close between answers this way.
		err = errors.New("connection closed by the target")
	}
	c.fail(err)
}

// skipLine discards the rest of an over-long line.
func skipLine(br *bufio.Reader) error {
	for {
		_, err := br.ReadSlice('\n')
		if !errors.Is(err, bufio.ErrBufferFull) {
			return err
		}
	}
}

// readHTTP matches HTTP answers to outstanding requests in order, like
// readLoop does lines.
func (c *loadConn) readHTTP(br *bufio.Reader) {
	for {
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			c.answerBody, err = readCapped(resp.Body, c.answerBody[:0], readBufferSize)
			_ = resp.Body.Close()
		}
		if err != nil {
			c.endRead(err)
			return
		}
		if c.complete(c.nextInOrder(), httpAnswerCode(resp.StatusCode, c.answerBody)) {
			return
		}
	}
}

// readCapped reads r to its end, appending to buf, and fails when that is
// more than limit bytes: no target answer is anywhere near it.
func readCapped(r io.Reader, buf []byte, limit int) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case len(buf) > limit:
			return buf, fmt.Errorf("answer body over %d bytes", limit)
		case errors.Is(err, io.EOF):
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
}

// nextInOrder returns the sequence number the next answer of an in-order
// protocol belongs to. Such answers free the ring's slots oldest first, so
// register never skips a slot and the numbers run 1, 2, 3, ...
func (c *loadConn) nextInOrder() uint64 {
	c.inOrderSeq++
	return c.inOrderSeq
}

// handle processes one answer line and reports whether the reader is done.
func (c *loadConn) handle(line []byte) bool {
	r := c.run
	if r.cfg.Protocol == ProtocolRedisPing {
		code, ok := parseRedisReply(line)
		if !ok {
			c.malformed++
			return false
		}
		return c.complete(c.nextInOrder(), code)
	}
	a, err := protocol.ParseResponse(line)
	if err != nil {
		c.malformed++
		return false
	}
	conn, seq, ok := parseLoadTxID(a.TxID)
	if !ok || conn != c.id {
		c.unmatched++
		r.unmatched.Add(1)
		return false
	}
	return c.complete(seq, a.Code)
}

// complete settles the answer, with code, to request seq of this
// connection and reports whether the reader is done. An answer to a
// request that is not outstanding is unmatched.
func (c *loadConn) complete(seq uint64, code []byte) bool {
	r := c.run
	c.mu.Lock()
	s := &c.ring[seq&c.mask]
	if !s.used || s.seq != seq {
		c.mu.Unlock()
		c.unmatched++
		r.unmatched.Add(1)
		return false
	}
	at, target := s.at, s.target
	s.used = false
	c.outstanding--
	done := c.writerDone && c.outstanding == 0
	c.mu.Unlock()
	<-c.tokens

	now := r.now()
	c.lastAnswer = now
	c.latencies = append(c.latencies, now-at)
	c.latencyOK = append(c.latencyOK, CodeSucceeded(code))
	if len(c.latencies) == latencyBatch {
		c.flushLatencies()
	}
	counts := c.codes[target]
	if p, ok := counts[string(code)]; ok {
		*p++
	} else {
		one := int64(1)
		counts[string(code)] = &one
	}
	c.answered++
	r.answered.Add(1)
	return done
}

func (c *loadConn) flushLatencies() {
	if len(c.latencies) > 0 {
		c.run.record(c.latencies, c.latencyOK)
		c.latencies = c.latencies[:0]
		c.latencyOK = c.latencyOK[:0]
	}
}
