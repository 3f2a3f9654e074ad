package main

import (
	"context"
	"fmt"
	"time"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// idleCmd is `relaybench idle`: its flags, filled by kong. Not for
// concurrent use.
type idleCmd struct {
	HubFlags `embed:""`

	Conns     int           `help:"Number of connections to open and hold." default:"1000" env:"RELAYBENCH_CONNS"`
	Hold      time.Duration `help:"How long to keep them open and silent once the last is open." default:"10s" env:"RELAYBENCH_HOLD"`
	Warm      bool          `help:"Send one line on each connection as soon as it is open, so the hub has used its per-connection buffers, as on a connection that served before going idle." env:"RELAYBENCH_WARM"`
	Timeout   time.Duration `help:"Limit on each connect, and on the answers to the probe lines sent to every connection at once." default:"5s" env:"RELAYBENCH_TIMEOUT"`
	Protocol  string        `help:"What the warm and probe lines speak: relay (a line for an unknown target, answered E903) or redis-ping (inline PING, to measure a redis server as a reference)." enum:"relay,redis-ping" default:"relay" env:"RELAYBENCH_PROTOCOL"`
	ServerPID int           `name:"server-pid" help:"Hub process whose resident memory (VmRSS) is read before the connections open and at the end of the hold (Linux only); 0 reads none." default:"0" placeholder:"PID" env:"RELAYBENCH_SERVER_PID"`
}

// Validate checks what the tags cannot.
func (c *idleCmd) Validate() error {
	switch {
	case c.Conns < 1 || c.Conns > loadgen.MaxConns:
		return fmt.Errorf("--conns %d: want 1 to %d", c.Conns, loadgen.MaxConns)
	case c.Hold < 0:
		return fmt.Errorf("--hold %s: want 0 or more", c.Hold)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout %s: want more than 0", c.Timeout)
	case c.ServerPID < 0:
		return fmt.Errorf("--server-pid %d: want a process id", c.ServerPID)
	}
	return nil
}

// Run opens the connections, holds them, measures and reports. Exit
// status: 2 when no connection could be opened, 1 when some could not be
// opened or did not survive the hold, 0 otherwise.
func (c *idleCmd) Run(ctx context.Context, s *streams) error {
	tlsConfig, err := c.ClientConfig()
	if err != nil {
		return err
	}
	proto, err := loadgen.ParseProtocol(c.Protocol)
	if err != nil {
		return err
	}
	p, err := loadgen.NewIdleProbe(loadgen.IdleConfig{
		Addr:      c.Addr,
		Conns:     c.Conns,
		Hold:      c.Hold,
		Warm:      c.Warm,
		Timeout:   c.Timeout,
		ServerPID: c.ServerPID,
		TLS:       tlsConfig,
		Protocol:  proto,
	})
	if err != nil {
		return err
	}
	sum, err := p.Run(ctx)
	if err != nil {
		return cmdline.Exit(2, err)
	}
	return cmdline.Report(s, sum, c.JSON)
}
