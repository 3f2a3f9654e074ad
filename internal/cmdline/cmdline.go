// Package cmdline is what the project's client commands, relayctl and
// relaybench, share around kong: where a command writes (Streams), how it
// ends with an exit status of its own (Exit), the main function's
// parse-signal-run-exit loop (Main), and a load run with its report
// (RunLoad).
//
// Typical use, in a command's main:
//
//	parser, err := kong.New(&cli, kong.Name("relayctl"))
//	if err != nil {
//		panic(err)
//	}
//	cmdline.Main(parser, os.Args[1:], "RELAYCTL_")
//
// and in a command's Run method:
//
//	func (c *sendCmd) Run(ctx context.Context, s *cmdline.Streams) error {
//		...
//		return cmdline.Exit(1, nil) // the answer line, already printed, says why
//	}
package cmdline

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/mattn/go-isatty"

	"github.com/relayhub/relayhub/internal/envcheck"
	"github.com/relayhub/relayhub/internal/loadgen"
)

// Streams are where a command reads and writes. The summary goes to Out,
// progress and diagnostics to Err, so Out stays clean for --json. Each is
// used by one goroutine at a time.
type Streams struct {
	In     io.Reader // standard input, for a file given as -
	Out    io.Writer
	Err    io.Writer
	ErrTTY bool // Err is a terminal: progress rewrites one line
}

// ExitError ends a command with a given status; an immutable value.
// Without Err nothing more is printed, for outcomes the command has
// already shown (a rejected transaction's answer line).
type ExitError struct {
	Code int
	Err  error
}

// Exit returns the error that ends a command with status code, printing
// err when it is not nil.
func Exit(code int, err error) error {
	return &ExitError{Code: code, Err: err}
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return "exit status " + strconv.Itoa(e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitCode makes kong exit with the command's status.
func (e *ExitError) ExitCode() int { return e.Code }

// Code is the exit status err stands for: 0 for nil, an ExitError's
// code, 1 for any other error.
func Code(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := errors.AsType[*ExitError](err); ok {
		return ee.Code
	}
	return 1
}

// ExitUsage is the exit status of every command of the project when its
// command line or environment is wrong (docs/TOOLS.md, "Exit status"):
// the status Unix tools give a usage error, rather than kong's own 80.
const ExitUsage = 2

// Main parses args with parser, refuses any variable of the environment
// that begins with envPrefix but is none of the command's (envcheck), and
// runs the chosen command with a context that SIGINT or SIGTERM cancel (a
// second signal kills a run that is draining) and Streams on the
// process's standard files, then exits with the command's status. A
// mistake in the command line or the environment exits ExitUsage.
func Main(parser *kong.Kong, args []string, envPrefix string) {
	kctx, err := parser.Parse(args)
	if err == nil {
		err = envcheck.Check(parser.Model, envPrefix, os.Environ())
	}
	if err != nil {
		parser.FatalIfErrorf(Exit(ExitUsage, err))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop)

	kctx.BindTo(ctx, (*context.Context)(nil))
	err = kctx.Run(&Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, ErrTTY: isatty.IsTerminal(os.Stderr.Fd())})
	if ee, ok := errors.AsType[*ExitError](err); ok && ee.Err == nil {
		os.Exit(ee.Code)
	}
	kctx.FatalIfErrorf(err)
}

// Report prints a run's report with loadgen.Print and returns what ends
// the command: the printing's error, else exit status 1 when the run had
// problems, else nil.
func Report(s *Streams, r loadgen.Report, asJSON bool) error {
	problems, err := loadgen.Print(s.Out, r, asJSON)
	if err == nil && problems != "" {
		return Exit(1, errors.New(problems))
	}
	return err
}

// RunLoad runs the load test cfg describes, with progress lines on Err
// unless quiet, and prints its summary. It fails with status 2 when no
// connection could be opened and with status 1 when any answer was
// unmatched or missing or any connection failed.
func RunLoad(ctx context.Context, s *Streams, cfg loadgen.Config, quiet, asJSON bool) error {
	var p *loadgen.ProgressPrinter
	if !quiet {
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
		return Exit(2, err)
	}
	return Report(s, g.Summary(res), asJSON)
}
