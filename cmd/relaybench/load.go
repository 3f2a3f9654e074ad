package main

import (
	"context"
	"fmt"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// loadCmd is `relaybench load`: its flags, filled by kong. Not for
// concurrent use.
type loadCmd struct {
	loadgen.Flags `embed:"" envprefix:"RELAYBENCH_"`

	Protocol  string `help:"What to speak: relay (the hub's line protocol), redis-ping (inline PING to a redis server, as a reference) or http (POST /tx straight to a target over keep-alive, as the hub does; --mix then only picks payloads)." enum:"relay,redis-ping,http" default:"relay" env:"RELAYBENCH_PROTOCOL"`
	ServerPID []int  `name:"server-pid" help:"Measure the CPU time this process uses during the run and report it per answer (repeatable; Linux only)." placeholder:"PID" env:"RELAYBENCH_SERVER_PID"`
	JSON      bool   `name:"json" help:"Print the summary as JSON." env:"RELAYBENCH_JSON"`
	Quiet     bool   `help:"No progress lines." env:"RELAYBENCH_QUIET"`
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
