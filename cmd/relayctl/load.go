package main

import (
	"context"
	"errors"

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
	var p *loadgen.ProgressPrinter
	if !c.Quiet {
		p = &loadgen.ProgressPrinter{W: s.Err, TTY: s.ErrTTY}
		cfg.Progress = p.Print
	}
	g, err := loadgen.New(cfg)
	if err != nil {
		return err
	}
	res, err := g.Run(ctx)
	if p != nil {
		p.Finish()
	}
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	sum := g.Summary(res)
	if c.JSON {
		err = sum.WriteJSON(s.Out)
	} else {
		err = sum.WriteText(s.Out)
	}
	if err != nil {
		return err
	}
	if bad := sum.Problems(); bad != "" {
		return &exitError{code: 1, err: errors.New(bad)}
	}
	return nil
}
