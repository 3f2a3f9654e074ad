package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// connectCmd holds the flags of `relaybench connect` as kong fills them;
// it is not for concurrent use.
type connectCmd struct {
	Workers   int           `help:"Connections being made at a time." default:"8" env:"RELAYBENCH_WORKERS"`
	Duration  time.Duration `help:"How long to make new connections." default:"5s" env:"RELAYBENCH_DURATION"`
	Resume    bool          `help:"Keep a TLS session cache per worker, so that connections after its first resume a session (with --tls)." env:"RELAYBENCH_RESUME"`
	Timeout   time.Duration `help:"Limit on each connection, from connect to answer." default:"5s" env:"RELAYBENCH_TIMEOUT"`
	ServerPID []int         `name:"server-pid" help:"Measure the CPU time this process uses during the run and report it per connection (repeatable; Linux only)." placeholder:"PID" env:"RELAYBENCH_SERVER_PID"`

	HubFlags `embed:""`
}

// Validate checks what the tags cannot.
func (c *connectCmd) Validate() error {
	_, err := c.config()
	return err
}

// config turns the flags into a loadgen.ConnectConfig.
func (c *connectCmd) config() (loadgen.ConnectConfig, error) {
	switch {
	case c.Workers < 1 || c.Workers > loadgen.MaxConns:
		return loadgen.ConnectConfig{}, fmt.Errorf("--workers %d: want 1 to %d", c.Workers, loadgen.MaxConns)
	case c.Duration <= 0:
		return loadgen.ConnectConfig{}, fmt.Errorf("--duration %s: want more than 0", c.Duration)
	case c.Timeout <= 0:
		return loadgen.ConnectConfig{}, fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	case c.Resume && !c.On():
		return loadgen.ConnectConfig{}, errors.New("--resume: needs --tls")
	}
	for _, pid := range c.ServerPID {
		if pid <= 0 {
			return loadgen.ConnectConfig{}, fmt.Errorf("--server-pid %d: want a process id", pid)
		}
	}
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return loadgen.ConnectConfig{}, err
	}
	return loadgen.ConnectConfig{
		Addr:       c.Addr,
		Workers:    c.Workers,
		Duration:   c.Duration,
		TLS:        tlsConfig,
		Resume:     c.Resume,
		Timeout:    c.Timeout,
		ServerPIDs: c.ServerPID,
	}, nil
}

// Run makes the connections and reports. Exit status: 2 when none
// succeeded, 1 when some failed, 0 otherwise.
func (c *connectCmd) Run(ctx context.Context, s *streams) error {
	cfg, err := c.config()
	if err != nil {
		return err
	}
	p, err := loadgen.NewConnectProbe(cfg)
	if err != nil {
		return err
	}
	sum, err := p.Run(ctx)
	if err != nil {
		return cmdline.Exit(2, err)
	}
	return cmdline.Report(s, sum, c.JSON)
}
