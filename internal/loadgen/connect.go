package loadgen

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/relayhub/relayhub/relay/protocol"
)

// ConnectConfig describes a connection-rate run: workers that each, in a
// loop, connect to the hub (with a TLS handshake when TLS is set), send one
// line for a target no hub configures, read its E903 answer and hang up,
// as a channel system that connects per transaction does. The E903 is
// answered by the hub's read loop without a target call, so the run
// measures what a connection costs. It is a plain value; NewConnectProbe
// takes its own copy.
type ConnectConfig struct {
	// Addr is the hub's client address, host:port.
	Addr string
	// Workers is how many connections are being made at a time, 1 to
	// MaxConns; zero means 1.
	Workers int
	// Duration is how long new connections are made. Required.
	Duration time.Duration
	// TLS, when set, makes every connection TLS. Nil means plain TCP.
	TLS *tls.Config
	// Resume makes each worker keep a session cache, so that its
	// connections after the first resume a TLS session instead of a full
	// handshake (when the hub issues session tickets). Without it every
	// handshake is a full one.
	Resume bool
	// Timeout bounds each connection, from connect to answer; zero means
	// 5s.
	Timeout time.Duration
	// ServerPIDs are processes whose CPU time is measured over the run
	// (Linux only); none when empty.
	ServerPIDs []int
}

// ConnectProbe runs connection-rate runs. It is read-only after
// NewConnectProbe, so it is safe for concurrent use, though runs at the
// same time would measure each other.
type ConnectProbe struct {
	cfg ConnectConfig
}

// NewConnectProbe checks cfg, fills in its defaults and returns a
// ConnectProbe for it.
func NewConnectProbe(cfg ConnectConfig) (*ConnectProbe, error) {
	cfg.Workers = cmp.Or(cfg.Workers, 1)
	cfg.Timeout = cmp.Or(cfg.Timeout, 5*time.Second)
	switch {
	case cfg.Workers < 0 || cfg.Workers > MaxConns:
		return nil, fmt.Errorf("loadgen: Workers %d: want 1 to %d", cfg.Workers, MaxConns)
	case cfg.Duration <= 0:
		return nil, fmt.Errorf("loadgen: Duration %s: want more than 0", cfg.Duration)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("loadgen: Timeout %s: want 0 or more", cfg.Timeout)
	case cfg.Resume && cfg.TLS == nil:
		return nil, errors.New("loadgen: Resume needs TLS")
	}
	for _, pid := range cfg.ServerPIDs {
		if pid <= 0 {
			return nil, fmt.Errorf("loadgen: ServerPIDs: %d is not a process id", pid)
		}
	}
	return &ConnectProbe{cfg: cfg}, nil
}

// connectRun is the state of one run, shared by its workers. Each
// connection is closed with a reset (SO_LINGER 0) once it has its answer,
// so that the thousands a run makes leave no TIME_WAIT behind to use up
// the ephemeral ports of the loopback.
type connectRun struct {
	cfg      ConnectConfig
	done     atomic.Int64 // connections that got their answer
	resumed  atomic.Int64 // of those, the ones that resumed a TLS session
	failures atomic.Int64 // connections that failed
	histMu   sync.Mutex
	hist     *hdrhistogram.Histogram // guarded by histMu; µs from connect to answer
	errMu    sync.Mutex
	errs     errorSamples // guarded by errMu
}

// Run makes connections for the configured duration and reports their
// rate and cost. It fails only when the servers' CPU time cannot be read
// or when not one connection succeeded.
func (p *ConnectProbe) Run(ctx context.Context) (ConnectSummary, error) {
	cfg := p.cfg
	r := &connectRun{cfg: cfg, hist: hdrhistogram.New(histLowestUS, histHighestUS, histSigFigs)}
	meters, err := startMeters(cfg.ServerPIDs)
	if err != nil {
		return ConnectSummary{}, err
	}
	start := time.Now()
	ctx, cancel := context.WithDeadline(ctx, start.Add(cfg.Duration))
	defer cancel()
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Go(func() { r.worker(ctx, w+1) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	reading, meterErr := meters.stop()

	sum := ConnectSummary{
		Addr:           cfg.Addr,
		TLS:            cfg.TLS != nil,
		Resume:         cfg.Resume,
		Workers:        cfg.Workers,
		Connections:    r.done.Load(),
		Resumed:        r.resumed.Load(),
		Failures:       r.failures.Load(),
		ElapsedSeconds: elapsed.Seconds(),
		LatencyUS:      latencyPercentiles(r.hist),
		ErrorSamples:   r.errs.list,
	}
	if elapsed > 0 {
		sum.PerSecond = float64(sum.Connections) / elapsed.Seconds()
	}
	for _, u := range reading.servers {
		sum.ServerCPU = append(sum.ServerCPU, newCPUSummary(u.PID, u.CPU, sum.Connections, elapsed))
	}
	sum.ClientCPU = newCPUSummary(os.Getpid(), reading.self, sum.Connections, elapsed)
	if meterErr != nil {
		return sum, meterErr
	}
	if sum.Connections == 0 {
		return sum, fmt.Errorf("%w to %s: %v", ErrDialAll, cfg.Addr, sum.ErrorSamples)
	}
	return sum, nil
}

// worker makes connections one after the other until ctx is done.
func (r *connectRun) worker(ctx context.Context, id int) {
	var tlsConfig *tls.Config
	if r.cfg.TLS != nil {
		tlsConfig = r.cfg.TLS.Clone()
		tlsConfig.ClientSessionCache = nil
		if r.cfg.Resume {
			tlsConfig.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		}
		if tlsConfig.ServerName == "" {
			// What tls.Dial would send and check: the host dialled.
			tlsConfig.ServerName, _, _ = net.SplitHostPort(r.cfg.Addr)
		}
	}
	d := net.Dialer{Timeout: r.cfg.Timeout}
	prefix := "C" + strconv.Itoa(id) + "-"
	var line []byte
	// A dial can time out at the run's deadline a moment before ctx
	// reports it done: past the deadline, a failure is the run's end.
	end, _ := ctx.Deadline()
	over := func() bool { return ctx.Err() != nil || !time.Now().Before(end) }
	for n := 1; !over(); n++ {
		txid := prefix + strconv.Itoa(n)
		line = append(append(line[:0], txid...), "|"+probeTarget+"|\n"...)
		began := time.Now()
		resumed, err := r.connectOnce(ctx, &d, tlsConfig, line, txid)
		if err != nil {
			if over() {
				return // the run ended during this connection: not a failure
			}
			r.failures.Add(1)
			r.errMu.Lock()
			r.errs.add(err)
			r.errMu.Unlock()
			continue
		}
		us := time.Since(began).Microseconds()
		r.done.Add(1)
		if resumed {
			r.resumed.Add(1)
		}
		r.histMu.Lock()
		_ = r.hist.RecordValue(max(us, histLowestUS))
		r.histMu.Unlock()
	}
}

// connectOnce makes one connection: connect, handshake, one line, its
// answer, close. It reports whether the TLS session was resumed.
func (r *connectRun) connectOnce(ctx context.Context, d *net.Dialer, cfg *tls.Config, line []byte, txid string) (bool, error) {
	raw, err := d.DialContext(ctx, "tcp", r.cfg.Addr)
	if err != nil {
		return false, err
	}
	defer raw.Close()
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	if err := raw.SetDeadline(time.Now().Add(r.cfg.Timeout)); err != nil {
		return false, err
	}
	nc := raw
	if cfg != nil {
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return false, err
		}
		nc = tc
	}
	if _, err := nc.Write(line); err != nil {
		return false, err
	}
	answer, err := bufio.NewReaderSize(nc, 128).ReadSlice('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("connection closed by the hub")
		}
		return false, err
	}
	if a, err := protocol.ParseResponse(answer); err != nil || string(a.TxID) != txid {
		return false, fmt.Errorf("unexpected answer %q", answer)
	}
	tc, isTLS := nc.(*tls.Conn)
	return isTLS && tc.ConnectionState().DidResume, nil
}

// ConnectSummary is the report of a connection-rate run, as printed and as
// JSON; a plain value.
type ConnectSummary struct {
	Addr           string         `json:"addr"`
	TLS            bool           `json:"tls"`
	Resume         bool           `json:"resume"`
	Workers        int            `json:"workers"`
	Connections    int64          `json:"connections"` // that got their answer
	Resumed        int64          `json:"resumed"`     // of those, with a resumed TLS session
	Failures       int64          `json:"failures"`
	ElapsedSeconds float64        `json:"elapsed_seconds"`
	PerSecond      float64        `json:"per_second"`
	LatencyUS      LatencySummary `json:"latency_us"` // from connect to answer
	ServerCPU      []CPUSummary   `json:"server_cpu,omitempty"`
	ClientCPU      CPUSummary     `json:"client_cpu"`
	ErrorSamples   []string       `json:"error_samples,omitempty"`
}

// Problems returns a one-line account of failed connections, or "" when
// there were none.
func (s ConnectSummary) Problems() string {
	if s.Failures == 0 {
		return ""
	}
	return fmt.Sprintf("%d connections failed", s.Failures)
}

// WriteJSON prints the report as one indented JSON object, for scripts.
func (s ConnectSummary) WriteJSON(w io.Writer) error {
	return writeJSON(w, s)
}

// WriteText prints the report for a person; CPU per answer is per
// connection here.
func (s ConnectSummary) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	kind := "plain TCP"
	switch {
	case s.TLS && s.Resume:
		kind = "TLS, resuming sessions"
	case s.TLS:
		kind = "TLS, full handshakes"
	}
	fmt.Fprintf(tw, "target\t%s, %d workers, %s\n", s.Addr, s.Workers, kind)
	fmt.Fprintf(tw, "connections\t%d in %.1fs: %.0f/s, %d resumed, %d failed\n",
		s.Connections, s.ElapsedSeconds, s.PerSecond, s.Resumed, s.Failures)
	fmt.Fprintf(tw, "connect to answer\tp50 %s  p90 %s  p99 %s  max %s\n",
		usString(s.LatencyUS.P50), usString(s.LatencyUS.P90), usString(s.LatencyUS.P99), usString(s.LatencyUS.Max))
	for _, c := range s.ServerCPU {
		fmt.Fprintf(tw, "server cpu\tpid %d: %.2fs, %.1f µs per connection, %.2f cores\n", c.PID, c.Seconds, c.PerAnswer, c.Utilisation)
	}
	fmt.Fprintf(tw, "client cpu\t%.2fs, %.1f µs per connection\n", s.ClientCPU.Seconds, s.ClientCPU.PerAnswer)
	for _, e := range s.ErrorSamples {
		fmt.Fprintf(tw, "  error\t%s\n", e)
	}
	return tw.Flush()
}

// usString prints microseconds in a unit a person reads at a glance.
func usString(us int64) string {
	return (time.Duration(us) * time.Microsecond).String()
}
