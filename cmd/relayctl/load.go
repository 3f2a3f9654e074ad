package main

import (
	"context"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// loadCmd is `relayctl load`: its flags, filled by kong. Not for
// concurrent use.
type loadCmd struct {
	loadgen.Flags `embed:"" envprefix:"RELAYCTL_"`

	JSON  bool `name:"json" help:"Print the summary as JSON." env:"RELAYCTL_JSON"`
	Quiet bool `help:"No progress lines." env:"RELAYCTL_QUIET"`
}

// Validate checks what the tags cannot.
func (c *loadCmd) Validate() error {
	_, err := c.Config()
	return err
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
