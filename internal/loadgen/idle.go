package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayhub/relayhub/relay/protocol"
)

// probeTarget is the target of the line an IdleProbe sends to check a
// connection. No hub configures it, so the hub answers E903 from its read
// loop without calling any target.
const probeTarget = "IDLE-PROBE"

// IdleConfig describes one idle run. It is a plain value; NewIdleProbe
// takes its own copy.
type IdleConfig struct {
	// Addr is the hub's client address, host:port.
	Addr string
	// Conns is the number of connections to open and hold, 1 to MaxConns.
	Conns int
	// Hold is how long they stay open and silent once the last is open.
	Hold time.Duration
	// Warm sends one line on each connection as soon as it is open, so the
	// hub has used its per-connection buffers, as on a connection that
	// served before going idle.
	Warm bool
	// Timeout bounds each connect, and the answers to the probe lines sent
	// to every connection at once; zero means 5s.
	Timeout time.Duration
	// ServerPID is the hub process whose resident memory is read before
	// the connections open and at the end of the hold (Linux only); zero
	// reads none.
	ServerPID int
	// TLS, when set, makes every connection TLS, its handshake done while
	// connecting, so the memory read includes what an idle TLS connection
	// costs the hub. Nil means plain TCP.
	TLS *tls.Config
	// Protocol is what the warm and probe lines speak: ProtocolRelay (the
	// zero value) sends a line for an unknown target and expects its E903
	// with the line's TXID; ProtocolRedisPing sends an inline PING and
	// expects +PONG, so that the same run measures redis-server as a
	// reference. ProtocolHTTP is refused.
	Protocol Protocol
}

// IdleProbe measures what idle connections cost the hub. It is read-only
// after NewIdleProbe, so it is safe for concurrent use, though runs at the
// same time would measure each other.
type IdleProbe struct {
	cfg IdleConfig
}

// NewIdleProbe checks cfg, fills in its defaults and returns an IdleProbe
// for it.
func NewIdleProbe(cfg IdleConfig) (*IdleProbe, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	switch {
	case cfg.Conns < 1 || cfg.Conns > MaxConns:
		return nil, fmt.Errorf("loadgen: Conns %d: want 1 to %d", cfg.Conns, MaxConns)
	case cfg.Hold < 0:
		return nil, fmt.Errorf("loadgen: Hold %s: want 0 or more", cfg.Hold)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("loadgen: Timeout %s: want 0 or more", cfg.Timeout)
	case cfg.ServerPID < 0:
		return nil, fmt.Errorf("loadgen: ServerPID %d: not a process id", cfg.ServerPID)
	case cfg.Protocol != ProtocolRelay && cfg.Protocol != ProtocolRedisPing:
		return nil, fmt.Errorf("loadgen: Protocol %s: an idle run speaks relay or redis-ping", cfg.Protocol)
	}
	return &IdleProbe{cfg: cfg}, nil
}

// Run opens the connections one after the other, optionally warms each
// with one probe line, keeps them silent for the hold, reads the server's
// memory, then probes every connection to check the hub still serves it.
// It fails with ErrDialAll when no connection opens, and when the server's
// memory cannot be read or ctx is cancelled.
func (p *IdleProbe) Run(ctx context.Context) (IdleSummary, error) {
	cfg := p.cfg
	sum := IdleSummary{Addr: cfg.Addr, Protocol: cfg.Protocol.String(), Conns: cfg.Conns, Warm: cfg.Warm, ServerPID: cfg.ServerPID}
	var errs errorSamples
	if cfg.ServerPID > 0 {
		rss, err := processRSS(cfg.ServerPID)
		if err != nil {
			return sum, err
		}
		sum.RSSBefore = rss
	}

	d := net.Dialer{Timeout: cfg.Timeout}
	conns := make([]net.Conn, 0, cfg.Conns)
	defer func() {
		for _, nc := range conns {
			_ = nc.Close()
		}
	}()
	for range cfg.Conns {
		nc, err := dialConn(ctx, &d, cfg.TLS, cfg.Addr)
		if err != nil {
			if ctx.Err() != nil {
				return sum, ctx.Err()
			}
			sum.DialErrors++
			errs.add(err)
			continue
		}
		conns = append(conns, nc)
	}
	sum.Opened = len(conns)
	if len(conns) == 0 {
		return sum, fmt.Errorf("%w to %s: %s", ErrDialAll, cfg.Addr, strings.Join(errs.list, "; "))
	}
	if cfg.Warm {
		// A connection lost here is lost for the final probe too, where it
		// is counted.
		_ = probeAll(conns, cfg.Protocol, "W", cfg.Timeout, &errs)
	}

	held := time.Now()
	t := time.NewTimer(cfg.Hold)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return sum, ctx.Err()
	}
	sum.HoldSeconds = time.Since(held).Seconds()
	if cfg.ServerPID > 0 {
		rss, err := processRSS(cfg.ServerPID)
		if err != nil {
			return sum, err
		}
		sum.RSSHeld = rss
		sum.KiBPerConn = float64(rss-sum.RSSBefore) / float64(len(conns))
	}
	sum.Answered = probeAll(conns, cfg.Protocol, "I", cfg.Timeout, &errs)
	sum.Lost = len(conns) - sum.Answered
	sum.Errors = errs.list
	return sum, nil
}

// IdleSummary is the report of an idle run, as printed and as JSON; a
// plain value.
type IdleSummary struct {
	Addr        string   `json:"addr"`
	Protocol    string   `json:"protocol"`
	Conns       int      `json:"conns"`
	Opened      int      `json:"opened"`
	DialErrors  int      `json:"dial_errors"`
	Warm        bool     `json:"warm"`
	HoldSeconds float64  `json:"hold_seconds"`
	Answered    int      `json:"answered"` // connections that answered the final probe
	Lost        int      `json:"lost"`     // connections open at the start of the hold that did not
	ServerPID   int      `json:"server_pid,omitempty"`
	RSSBefore   int64    `json:"rss_before_kib,omitempty"`
	RSSHeld     int64    `json:"rss_held_kib,omitempty"`
	KiBPerConn  float64  `json:"kib_per_conn,omitempty"`
	Errors      []string `json:"error_samples,omitempty"`
}

// Problems returns a one-line account of what makes the run fail
// (connections that could not be opened or did not survive the hold), or
// "" when there is nothing.
func (s IdleSummary) Problems() string {
	if s.DialErrors == 0 && s.Lost == 0 {
		return ""
	}
	return fmt.Sprintf("%d connections not opened, %d lost during the hold", s.DialErrors, s.Lost)
}

// probeAll sends one line to an unknown target on every connection (with
// ProtocolRedisPing, an inline PING), then reads one answer from each,
// within timeout for all of them together, and returns how many answered
// with their own TXID (+PONG). Writing them all before reading any lets
// the server answer them in parallel.
func probeAll(conns []net.Conn, proto Protocol, prefix string, timeout time.Duration, errs *errorSamples) int {
	deadline := time.Now().Add(timeout)
	sent := make([]bool, len(conns))
	for i, nc := range conns {
		if err := nc.SetDeadline(deadline); err != nil {
			errs.add(err)
			continue
		}
		line := pingRequest
		if proto == ProtocolRelay {
			line = prefix + strconv.Itoa(i+1) + "|" + probeTarget + "|\n"
		}
		if _, err := io.WriteString(nc, line); err != nil {
			errs.add(err)
			continue
		}
		sent[i] = true
	}
	answered := 0
	for i, nc := range conns {
		if !sent[i] {
			continue
		}
		// One line is all that comes back, so a small reader loses
		// nothing when it is dropped.
		line, err := bufio.NewReaderSize(nc, 128).ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("connection closed by the hub")
			}
			errs.add(err)
			continue
		}
		if !probeAnswered(proto, line, prefix+strconv.Itoa(i+1)) {
			errs.add(fmt.Errorf("unexpected answer %q", line))
			continue
		}
		answered++
	}
	return answered
}

// probeAnswered reports whether line answers the probe line with TXID
// txid, or for ProtocolRedisPing the PING.
func probeAnswered(proto Protocol, line []byte, txid string) bool {
	if proto == ProtocolRedisPing {
		code, ok := parseRedisReply(line)
		return ok && line[0] == '+' && string(code) == "PONG"
	}
	a, err := protocol.ParseResponse(line)
	return err == nil && string(a.TxID) == txid
}

// errorSamples keeps up to maxErrorSamples distinct error messages. Owned
// by one goroutine.
type errorSamples struct {
	list []string
}

func (e *errorSamples) add(err error) {
	msg := err.Error()
	for _, m := range e.list {
		if m == msg {
			return
		}
	}
	if len(e.list) < maxErrorSamples {
		e.list = append(e.list, msg)
	}
}

// WriteJSON prints the report as one indented JSON object, for scripts.
func (s IdleSummary) WriteJSON(w io.Writer) error {
	return writeJSON(w, s)
}

// WriteText prints the report for a person.
func (s IdleSummary) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mode := "cold"
	if s.Warm {
		mode = "warm (one line each first)"
	}
	fmt.Fprintf(tw, "target\t%s (%s), %d conns, %s\n", s.Addr, s.Protocol, s.Conns, mode)
	fmt.Fprintf(tw, "connections\topened %d, dial errors %d, held %.1fs, answered the probe %d, lost %d\n",
		s.Opened, s.DialErrors, s.HoldSeconds, s.Answered, s.Lost)
	if s.ServerPID > 0 {
		fmt.Fprintf(tw, "server rss\tpid %d: %d KiB before, %d KiB held, %.2f KiB per connection\n",
			s.ServerPID, s.RSSBefore, s.RSSHeld, s.KiBPerConn)
	}
	for _, e := range s.Errors {
		fmt.Fprintf(tw, "  error\t%s\n", e)
	}
	return tw.Flush()
}
