package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// loadCmd is `relaybench load`: its flags, filled by kong. Not for
// concurrent use.
type loadCmd struct {
	loadgen.Flags `embed:"" envprefix:"RELAYBENCH_"`

	Protocol  string   `help:"What to speak: relay (the hub's line protocol), redis-ping (inline PING to a redis server, as a reference) or http (POST /tx straight to a target over keep-alive, as the hub does; --mix then only picks payloads)." enum:"relay,redis-ping,http" default:"relay" env:"RELAYBENCH_PROTOCOL"`
	ServerPID []int    `name:"server-pid" help:"Measure the CPU time this process uses during the run and report it per answer (repeatable; Linux only)." placeholder:"PID" env:"RELAYBENCH_SERVER_PID"`
	Phase     []string `name:"phase" help:"Split the run into consecutive phases by each request's due time, NAME=DURATION each (repeatable, in order), and report each apart: answers by code, 0000/s, latency, when E905 cleared." placeholder:"NAME=DURATION" sep:"none" env:"RELAYBENCH_PHASE"`
	WatchURL  string   `name:"watch-url" help:"A metrics page (Prometheus text) to read --watch-series from once a second, summed up per phase: where it settled and when. Needs --phase." placeholder:"URL" env:"RELAYBENCH_WATCH_URL"`
	Series    string   `name:"watch-series" help:"The series to read from --watch-url, e.g. relay_bulkhead_limit{target=\"CORE\"}." env:"RELAYBENCH_WATCH_SERIES"`
	JSON      bool     `name:"json" help:"Print the summary as JSON." env:"RELAYBENCH_JSON"`
	Quiet     bool     `help:"No progress lines." env:"RELAYBENCH_QUIET"`
}

// Validate checks what the tags cannot.
func (c *loadCmd) Validate() error {
	_, err := c.Config()
	return err
}

// Config turns the flags into a loadgen.Config: those of every hub load,
// then the protocol and the servers to measure.
func (c *loadCmd) Config() (loadgen.Config, error) {
	cfg, err := c.Flags.Config()
	if err != nil {
		return loadgen.Config{}, err
	}
	if cfg.Protocol, err = loadgen.ParseProtocol(c.Protocol); err != nil {
		return loadgen.Config{}, fmt.Errorf("--protocol: %w", err)
	}
	for _, pid := range c.ServerPID {
		if pid <= 0 {
			return loadgen.Config{}, fmt.Errorf("--server-pid %d: want a process id", pid)
		}
	}
	cfg.ServerPIDs = c.ServerPID
	for _, p := range c.Phase {
		phase, err := loadgen.ParsePhase(p)
		if err != nil {
			return loadgen.Config{}, fmt.Errorf("--phase: %w", err)
		}
		cfg.Phases = append(cfg.Phases, phase)
	}
	switch {
	case (c.WatchURL == "") != (c.Series == ""):
		return loadgen.Config{}, errors.New("--watch-url and --watch-series go together")
	case c.WatchURL != "" && len(cfg.Phases) == 0:
		return loadgen.Config{}, errors.New("--watch-url needs --phase")
	case c.WatchURL != "":
		cfg.Watch = loadgen.MetricWatch(c.WatchURL, c.Series)
	}
	return cfg, nil
}

// Run runs the load test and prints its summary. It fails with status 2
// when no connection could be opened and with status 1 when any answer was
// unmatched or missing or any connection failed.
func (c *loadCmd) Run(ctx context.Context, s *streams) error {
	cfg, err := c.Config()
	if err != nil {
		return err
	}
	return cmdline.RunLoad(ctx, s, cfg, c.Quiet, c.JSON)
}
