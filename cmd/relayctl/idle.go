package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// probeTarget is the target of the line idle sends to check a connection.
// No hub configures it, so the hub answers E903 from its read loop without
// calling any target.
const probeTarget = "IDLE-PROBE"

// idleCmd is `relayctl idle`: its flags, filled by kong. Not for
// concurrent use.
type idleCmd struct {
	Addr      string        `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"RELAYCTL_ADDR"`
	Conns     int           `help:"Number of connections to open and hold." default:"1000" env:"RELAYCTL_CONNS"`
	Hold      time.Duration `help:"How long to keep them open and silent once the last is open." default:"10s" env:"RELAYCTL_HOLD"`
	Warm      bool          `help:"Send one line on each connection as soon as it is open, so the hub has used its per-connection buffers, as on a connection that served before going idle."`
	Timeout   time.Duration `help:"Limit on each connect, and on the answers to the probe lines sent to every connection at once." default:"5s" env:"RELAYCTL_TIMEOUT"`
	ServerPID int           `name:"server-pid" help:"Hub process whose resident memory (VmRSS) is read before the connections open and at the end of the hold (Linux only); 0 reads none." default:"0" placeholder:"PID" env:"RELAYCTL_SERVER_PID"`
	JSON      bool          `name:"json" help:"Print the summary as JSON." env:"RELAYCTL_JSON"`
}

// Validate checks what the tags cannot.
func (c *idleCmd) Validate() error {
	switch {
	case c.Conns < 1 || c.Conns > maxConns:
		return fmt.Errorf("--conns %d: want 1 to %d", c.Conns, maxConns)
	case c.Hold < 0:
		return fmt.Errorf("--hold %s: want 0 or more", c.Hold)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	case c.ServerPID < 0:
		return fmt.Errorf("--server-pid %d: want a process id", c.ServerPID)
	}
	return nil
}

// idleSummary is the report of an idle run, as printed and as JSON; a
// plain value.
type idleSummary struct {
	Addr        string   `json:"addr"`
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

// Run opens the connections, holds them, measures and reports. Exit
// status: 2 when no connection could be opened, 1 when some could not be
// opened or did not survive the hold, 0 otherwise.
func (c *idleCmd) Run(ctx context.Context, s *streams) error {
	sum, err := runIdle(ctx, idleConfig{
		Addr:      c.Addr,
		Conns:     c.Conns,
		Hold:      c.Hold,
		Warm:      c.Warm,
		Timeout:   c.Timeout,
		ServerPID: c.ServerPID,
	})
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if c.JSON {
		enc := json.NewEncoder(s.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else if err := sum.writeText(s.Out); err != nil {
		return err
	}
	if sum.DialErrors > 0 || sum.Lost > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d connections not opened, %d lost during the hold", sum.DialErrors, sum.Lost)}
	}
	return nil
}

// idleConfig describes one idle run; a plain value.
type idleConfig struct {
	Addr      string
	Conns     int
	Hold      time.Duration
	Warm      bool
	Timeout   time.Duration
	ServerPID int // 0: no memory readings
}

// runIdle opens cfg.Conns connections one after the other, optionally warms
// each with one probe line, keeps them silent for cfg.Hold, reads the
// server's memory, then probes every connection to check the hub still
// serves it. It fails when no connection opens, or when the server's memory
// cannot be read.
func runIdle(ctx context.Context, cfg idleConfig) (idleSummary, error) {
	sum := idleSummary{Addr: cfg.Addr, Conns: cfg.Conns, Warm: cfg.Warm, ServerPID: cfg.ServerPID}
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
		nc, err := d.DialContext(ctx, "tcp", cfg.Addr)
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
		return sum, fmt.Errorf("%w to %s: %s", errDialAll, cfg.Addr, strings.Join(errs.list, "; "))
	}
	if cfg.Warm {
		// A connection lost here is lost for the final probe too, where it
		// is counted.
		_ = probeAll(conns, "W", cfg.Timeout, &errs)
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
	sum.Answered = probeAll(conns, "I", cfg.Timeout, &errs)
	sum.Lost = len(conns) - sum.Answered
	sum.Errors = errs.list
	return sum, nil
}

// probeAll sends one line to an unknown target on every connection, then
// reads one answer from each, within timeout for all of them together,
// and returns how many answered with their own TXID. Writing them all
// before reading any lets the hub answer them in parallel.
func probeAll(conns []net.Conn, prefix string, timeout time.Duration, errs *errorSamples) int {
	deadline := time.Now().Add(timeout)
	sent := make([]bool, len(conns))
	for i, nc := range conns {
		if err := nc.SetDeadline(deadline); err != nil {
			errs.add(err)
			continue
		}
		line := prefix + strconv.Itoa(i+1) + "|" + probeTarget + "|\n"
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
		txid, _, _, ok := parseAnswer(line)
		if !ok || string(txid) != prefix+strconv.Itoa(i+1) {
			errs.add(fmt.Errorf("unexpected answer %q", line))
			continue
		}
		answered++
	}
	return answered
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

// writeText prints the report for a person.
func (s idleSummary) writeText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	mode := "cold"
	if s.Warm {
		mode = "warm (one line each first)"
	}
	fmt.Fprintf(tw, "target\t%s, %d conns, %s\n", s.Addr, s.Conns, mode)
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
