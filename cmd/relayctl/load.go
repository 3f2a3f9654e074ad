package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Limits of the load flags, so a typo cannot exhaust the machine.
const (
	maxConns = 10000
	maxDepth = 65536
	// rateDepth is the per-connection cap on outstanding requests with
	// --rate and no --depth: high enough that the schedule, not the cap,
	// paces the run, small enough to bound memory when the hub stops
	// answering.
	rateDepth = 1024
)

// loadCmd is `relayctl load`: its flags, filled by kong. Not for
// concurrent use.
type loadCmd struct {
	Addr           string            `help:"Hub client address, host:port." default:"127.0.0.1:9200" env:"RELAYCTL_ADDR"`
	Conns          int               `help:"Number of connections." default:"16" env:"RELAYCTL_CONNS"`
	Depth          int               `help:"Requests outstanding per connection: a closed loop keeps exactly this many in flight; with --rate it caps a connection whose answers fall behind. 0 means 1 in a closed loop and ${rate_depth} with --rate." default:"0" env:"RELAYCTL_DEPTH"`
	Duration       time.Duration     `help:"How long to send (ignored when --requests is given)." default:"10s" env:"RELAYCTL_DURATION"`
	Requests       uint64            `help:"Total number of requests to send; takes precedence over --duration. 0 means use --duration." default:"0" env:"RELAYCTL_REQUESTS"`
	Mix            string            `help:"Targets and their weights, e.g. CORE=70,CLAIM=30; a name without a weight weighs 1." default:"CORE=100" env:"RELAYCTL_MIX"`
	Payload        string            `help:"Payload template: {n} is the request number (1, 2, ...), {conn} the connection number." default:"BAL ACC{conn}" env:"RELAYCTL_PAYLOAD"`
	TargetPayload  map[string]string `name:"target-payload" help:"Payload template for one target, overriding --payload, as NAME=TEMPLATE (repeatable)." placeholder:"NAME=TEMPLATE" mapsep:"none" env:"RELAYCTL_TARGET_PAYLOAD"`
	Rate           float64           `help:"Fixed total rate in requests/s, paced by a schedule; latency is measured from each request's scheduled time. 0 means a closed loop." default:"0" env:"RELAYCTL_RATE"`
	Drain          time.Duration     `help:"How long to wait for outstanding answers once sending stops." default:"5s" env:"RELAYCTL_DRAIN"`
	ConnectTimeout time.Duration     `help:"Timeout of each connect." default:"5s" env:"RELAYCTL_CONNECT_TIMEOUT"`
	Seed           uint64            `help:"Seed of the random choice of targets, for repeatable runs." default:"1" env:"RELAYCTL_SEED"`
	Protocol       string            `help:"What to speak: relay (the hub's line protocol), redis-ping (inline PING to a redis server, as a reference) or http (POST /tx straight to a target over keep-alive, as the hub does; --mix then only picks payloads)." enum:"relay,redis-ping,http" default:"relay" env:"RELAYCTL_PROTOCOL"`
	ServerPID      []int             `name:"server-pid" help:"Measure the CPU time this process uses during the run and report it per answer (repeatable; Linux only)." placeholder:"PID" env:"RELAYCTL_SERVER_PID"`
	JSON           bool              `name:"json" help:"Print the summary as JSON." env:"RELAYCTL_JSON"`
	Quiet          bool              `help:"No progress lines." env:"RELAYCTL_QUIET"`
}

// Validate checks what the tags cannot.
func (c *loadCmd) Validate() error {
	_, err := c.config()
	return err
}

// config turns the flags into a loadConfig.
func (c *loadCmd) config() (loadConfig, error) {
	switch {
	case c.Conns < 1 || c.Conns > maxConns:
		return loadConfig{}, fmt.Errorf("--conns %d: want 1 to %d", c.Conns, maxConns)
	case c.Depth < 0 || c.Depth > maxDepth:
		return loadConfig{}, fmt.Errorf("--depth %d: want 0 to %d", c.Depth, maxDepth)
	case c.Requests == 0 && c.Duration <= 0:
		return loadConfig{}, fmt.Errorf("--duration %s: want more than 0 (or give --requests)", c.Duration)
	case !(c.Rate >= 0) || c.Rate > 1e9:
		return loadConfig{}, fmt.Errorf("--rate %v: want 0 to 1e9 requests/s", c.Rate)
	case c.Drain < 0:
		return loadConfig{}, fmt.Errorf("--drain %s: want 0 or more", c.Drain)
	case c.ConnectTimeout <= 0:
		return loadConfig{}, fmt.Errorf("--connect-timeout %s: want more than 0", c.ConnectTimeout)
	}
	proto, err := parseWire(c.Protocol)
	if err != nil {
		return loadConfig{}, fmt.Errorf("--protocol: %w", err)
	}
	for _, pid := range c.ServerPID {
		if pid <= 0 {
			return loadConfig{}, fmt.Errorf("--server-pid %d: want a process id", pid)
		}
	}
	m, err := parseMix(c.Mix)
	if err != nil {
		return loadConfig{}, fmt.Errorf("--mix: %w", err)
	}
	def, err := parseTemplate(c.Payload)
	if err != nil {
		return loadConfig{}, fmt.Errorf("--payload: %w", err)
	}
	payloads := make([]template, len(m.entries))
	for i := range payloads {
		payloads[i] = def
	}
	for name, tmpl := range c.TargetPayload {
		i := indexOfTarget(m, strings.ToUpper(name))
		if i < 0 {
			return loadConfig{}, fmt.Errorf("--target-payload %s: target not in --mix %s", name, m)
		}
		if payloads[i], err = parseTemplate(tmpl); err != nil {
			return loadConfig{}, fmt.Errorf("--target-payload %s: %w", name, err)
		}
	}
	depth := c.Depth
	if depth == 0 {
		depth = 1
		if c.Rate > 0 {
			depth = rateDepth
		}
	}
	cfg := loadConfig{
		Addr:        c.Addr,
		Conns:       c.Conns,
		Depth:       depth,
		Requests:    c.Requests,
		Rate:        c.Rate,
		Mix:         m,
		Payloads:    payloads,
		Drain:       c.Drain,
		DialTimeout: c.ConnectTimeout,
		Seed:        c.Seed,
		Protocol:    proto,
		ServerPIDs:  c.ServerPID,
	}
	if c.Requests == 0 {
		cfg.Duration = c.Duration
	}
	return cfg, nil
}

func indexOfTarget(m mix, name string) int {
	for i, e := range m.entries {
		if e.Target == name {
			return i
		}
	}
	return -1
}

// Run runs the load test and prints its summary. It fails with status 2
// when no connection could be opened and with status 1 when any answer was
// unmatched or missing or any connection failed.
func (c *loadCmd) Run(ctx context.Context, s *streams) error {
	cfg, err := c.config()
	if err != nil {
		return err
	}
	var p *progressPrinter
	if !c.Quiet {
		p = &progressPrinter{w: s.Err, tty: s.ErrTTY}
		cfg.Progress = p.print
	}
	res, err := runLoad(ctx, cfg)
	if p != nil {
		p.finish()
	}
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	sum := newLoadSummary(cfg, res)
	if c.JSON {
		enc := json.NewEncoder(s.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else if err := sum.writeText(s.Out); err != nil {
		return err
	}
	if bad := sum.problems(); bad != "" {
		return &exitError{code: 1, err: errors.New(bad)}
	}
	return nil
}
