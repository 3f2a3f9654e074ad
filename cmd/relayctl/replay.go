package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/protocol"
	"github.com/relayhub/relayhub/relay/replay"
	"github.com/relayhub/relayhub/relay/settingsfile"
)

// replayCmd is `relayctl replay`: its flags, filled by kong. The breaker
// settings are the relay's own flags, with the relay's defaults, and its
// --config file. Not for concurrent use.
type replayCmd struct {
	AccessLog []string `name:"access-log" help:"Access log to replay: a file, gzipped or not, or - for standard input; repeat for more, or give files as arguments. Files are replayed in the order of their first line's time." placeholder:"FILE" sep:"none" env:"RELAYCTL_ACCESS_LOG"`
	Files     []string `arg:"" optional:"" name:"file" help:"More access logs, as --access-log."`

	FailThreshold   int           `help:"As the relay's: consecutive failures that open a breaker." default:"5" env:"RELAYCTL_FAIL_THRESHOLD"`
	ResetTimeout    time.Duration `help:"As the relay's: how long an open breaker refuses before a probe; a bare number is seconds." type:"hubduration" default:"10s" env:"RELAYCTL_RESET_TIMEOUT"`
	TargetTimeout   time.Duration `help:"As the relay's: a half-open probe silent this long plus 1s is replaced." type:"hubduration" default:"3s" env:"RELAYCTL_TARGET_TIMEOUT"`
	FailureCodes    []string      `help:"As the relay's: codes that count as breaker failures, comma-separated or repeated." default:"E500,E901,E902" env:"RELAYCTL_FAILURE_CODES"`
	FailureRate     float64       `help:"As the relay's: also open at this failed share (0 to 1) of the calls within --window; 0 is off." default:"0" env:"RELAYCTL_FAILURE_RATE"`
	Window          time.Duration `help:"As the relay's: the span the failure rate looks back over; 0 means 1m." type:"hubduration" default:"0" env:"RELAYCTL_WINDOW"`
	MinSamples      int           `help:"As the relay's: fewest calls in the window for the failure rate; 0 means 20." default:"0" env:"RELAYCTL_MIN_SAMPLES"`
	SlowCall        time.Duration `help:"As the relay's: a success slower than this is a failure; 0 is off." type:"hubduration" default:"0" env:"RELAYCTL_SLOW_CALL"`
	MaxResetTimeout time.Duration `help:"As the relay's: backoff of the open period up to this; 0 is off." type:"hubduration" default:"0" env:"RELAYCTL_MAX_RESET_TIMEOUT"`
	ResetJitter     float64       `help:"As the relay's: random lengthening of open periods (0 to 1); the replay draws its own shares from --seed." default:"0" env:"RELAYCTL_RESET_JITTER"`
	ProbePayload    string        `help:"As the relay's: with a payload, the log's synthetic probes are replayed as the breakers' own and customers never probe; empty skips them, and customers probe." placeholder:"PAYLOAD" env:"RELAYCTL_PROBE_PAYLOAD"`
	ProbeExpect     []string      `help:"As the relay's: answer codes of a healthy synthetic probe, comma-separated or repeated." default:"0000" env:"RELAYCTL_PROBE_EXPECT"`
	ProbeSuccesses  int           `help:"As the relay's: healthy probes in a row that close a half-open breaker." default:"1" env:"RELAYCTL_PROBE_SUCCESSES"`
	ProbeInterval   time.Duration `help:"As the relay's: the open period after a failed probe and the gap between healthy probes; 0 is off." type:"hubduration" default:"0" env:"RELAYCTL_PROBE_INTERVAL"`
	Config          string        `help:"The relay's per-target settings file (TOML), read as the relay reads it." placeholder:"FILE" env:"RELAYCTL_CONFIG"`
	Compare         []string      `help:"Replay a second time with these settings changed, for every target (KEY=VALUE) or one (TARGET.KEY=VALUE), KEY as in the settings file, VALUE as on the relay's command line, e.g. fail_threshold=3; repeat for more." placeholder:"[TARGET.]KEY=VALUE" sep:"none" env:"RELAYCTL_COMPARE"`
	Target          string        `help:"Show only this target." env:"RELAYCTL_TARGET"`
	Seed            uint64        `help:"Seed of the random shares of --reset-jitter." default:"1" env:"RELAYCTL_SEED"`
	ReorderWindow   time.Duration `help:"How far out of time order a line may be and still replay in order; later ones are skipped and counted." type:"hubduration" default:"1m" env:"RELAYCTL_REORDER_WINDOW"`
	JSON            bool          `name:"json" help:"Print the report as JSON." env:"RELAYCTL_JSON"`
	Quiet           bool          `help:"No progress line." env:"RELAYCTL_QUIET"`
}

// hubDuration reads a duration flag as the relay's flags read theirs: Go's
// syntax (500ms, 10s) or a bare number of seconds. It is the mapper of
// the fields tagged type:"hubduration"; a plain value.
type hubDuration struct{}

// Decode implements kong.Mapper.
func (hubDuration) Decode(ctx *kong.DecodeContext, target reflect.Value) error {
	var s string
	if err := ctx.Scan.PopValueInto("duration", &s); err != nil {
		return err
	}
	d, err := settingsfile.ParseDuration(s)
	if err != nil {
		return err
	}
	target.SetInt(int64(d))
	return nil
}

var _ kong.Mapper = hubDuration{}

// Validate refuses what the relay refuses in the same flags.
func (c *replayCmd) Validate() error {
	for _, check := range []struct {
		bad  bool
		flag string
		want string
		got  any
	}{
		{c.FailThreshold < 1, "--fail-threshold", "at least 1", c.FailThreshold},
		{c.ResetTimeout <= 0, "--reset-timeout", "more than zero", c.ResetTimeout},
		{c.TargetTimeout <= 0, "--target-timeout", "more than zero", c.TargetTimeout},
		{!(c.FailureRate >= 0 && c.FailureRate <= 1), "--failure-rate", "from 0 (off) to 1", c.FailureRate},
		{!(c.ResetJitter >= 0 && c.ResetJitter <= 1), "--reset-jitter", "from 0 (off) to 1", c.ResetJitter},
		{c.Window < 0, "--window", "0 or more", c.Window},
		{c.MinSamples < 0, "--min-samples", "0 or more", c.MinSamples},
		{c.SlowCall < 0, "--slow-call", "0 or more", c.SlowCall},
		{c.MaxResetTimeout < 0 || c.MaxResetTimeout > 0 && c.MaxResetTimeout <= c.ResetTimeout,
			"--max-reset-timeout", "0 (off) or more than --reset-timeout", c.MaxResetTimeout},
		{c.ReorderWindow <= 0, "--reorder-window", "more than zero", c.ReorderWindow},
		{c.ProbeSuccesses < 1, "--probe-successes", "at least 1", c.ProbeSuccesses},
		{c.ProbeInterval < 0, "--probe-interval", "0 or more", c.ProbeInterval},
	} {
		if check.bad {
			return fmt.Errorf("%s: must be %s, got %v", check.flag, check.want, check.got)
		}
	}
	for _, code := range c.FailureCodes {
		if _, err := protocol.ParseFailureCode(code); err != nil {
			return fmt.Errorf("--failure-codes: %w", err)
		}
	}
	for _, code := range c.ProbeExpect {
		if _, err := relay.ParseProbeCode(code); err != nil {
			return fmt.Errorf("--probe-expect: %w", err)
		}
	}
	if strings.ContainsAny(c.ProbePayload, "\r\n") {
		return errors.New("--probe-payload: must be one line, with no line break")
	}
	return nil
}

// settingsKeys returns the breaker flags as keys of the relay's settings
// file, KEY=VALUE, so that replay.Settings.Override reads them as the
// relay reads its file. Those at zero, which select a default or turn a
// policy off, are left out, as the relay leaves them out of its breakers.
func (c *replayCmd) settingsKeys() []string {
	var keys []string
	for _, f := range []struct {
		key, value string
		zero       bool
	}{
		{"fail_threshold", strconv.Itoa(c.FailThreshold), false},
		{"reset_timeout", c.ResetTimeout.String(), false},
		{"target_timeout", c.TargetTimeout.String(), false},
		{"failure_codes", strings.Join(c.FailureCodes, ","), false},
		{"failure_rate", strconv.FormatFloat(c.FailureRate, 'g', -1, 64), c.FailureRate == 0},
		{"window", c.Window.String(), c.Window == 0},
		{"min_samples", strconv.Itoa(c.MinSamples), c.MinSamples == 0},
		{"slow_call", c.SlowCall.String(), c.SlowCall == 0},
		{"max_reset_timeout", c.MaxResetTimeout.String(), c.MaxResetTimeout == 0},
		{"reset_jitter", strconv.FormatFloat(c.ResetJitter, 'g', -1, 64), c.ResetJitter == 0},
		{"probe_payload", c.ProbePayload, c.ProbePayload == ""},
		{"probe_expect", strings.Join(c.ProbeExpect, ","), strings.Join(c.ProbeExpect, ",") == relay.DefaultProbeExpect},
		{"probe_successes", strconv.Itoa(c.ProbeSuccesses), c.ProbeSuccesses == 1},
		{"probe_interval", c.ProbeInterval.String(), c.ProbeInterval == 0},
	} {
		if !f.zero {
			keys = append(keys, f.key+"="+f.value)
		}
	}
	return keys
}

// sets returns the settings to replay with: the flags and --config, and
// with --compare a second set.
func (c *replayCmd) sets() ([]replay.Settings, error) {
	base, err := replay.Settings{Seed: c.Seed}.Override("replay", "flags", c.settingsKeys())
	if err != nil {
		return nil, err
	}
	if c.Config != "" {
		targets, err := replay.LoadFile(c.Config, base.Defaults)
		if err != nil {
			return nil, err
		}
		base.Targets = targets
	}
	sets := []replay.Settings{base}
	if len(c.Compare) > 0 {
		other, err := base.Override("compare", "--compare", c.Compare)
		if err != nil {
			return nil, err
		}
		sets = append(sets, other)
	}
	return sets, nil
}

// Run replays the access logs and prints the report. Malformed lines are
// counted, listed and skipped: they do not change the exit status, 0.
// It fails (status 1) on a settings file or --compare it cannot use, a
// log file it cannot open, or a --target that no line names.
func (c *replayCmd) Run(ctx context.Context, s *streams) error {
	sets, err := c.sets()
	if err != nil {
		return err
	}
	paths := append(append([]string{}, c.AccessLog...), c.Files...)
	if len(paths) == 0 {
		return fmt.Errorf("name an access log: --access-log FILE, FILE arguments, or - for standard input")
	}
	var sources []replay.Source
	for _, p := range paths {
		src, err := replay.FileSource(p)
		if err != nil {
			return fmt.Errorf("access log: %w", err)
		}
		sources = append(sources, src)
	}
	if sources, err = replay.OrderSources(sources); err != nil {
		return fmt.Errorf("access log: %w", err)
	}
	cfg := replay.Config{Sets: sets, ReorderWindow: c.ReorderWindow}
	var p *replayProgress
	if !c.Quiet && s.ErrTTY {
		p = &replayProgress{w: s.Err}
		cfg.Progress = p.print
	}
	rep, err := replay.Run(ctx, cfg, sources)
	if err != nil {
		return err
	}
	if c.Target != "" && !rep.Has(c.Target) {
		return fmt.Errorf("--target %s: no request in the access log names it (it names %s)", c.Target, strings.Join(rep.TargetNames(), ", "))
	}
	if c.JSON {
		return rep.WriteJSON(s.Out, c.Target)
	}
	return rep.WriteText(s.Out, c.Target)
}

// replayProgress rewrites one line on a terminal while a replay reads. It
// is used from the replay's goroutine only.
type replayProgress struct {
	w       io.Writer
	printed bool
}

func (p *replayProgress) print(pr replay.Progress) {
	if pr.Done {
		if p.printed {
			// \r and \x1b[K clear the line for the report.
			fmt.Fprint(p.w, "\r\x1b[K")
		}
		return
	}
	rate := float64(pr.Lines) / math.Max(pr.Elapsed.Seconds(), 1e-3)
	line := fmt.Sprintf("%s  %d lines  %.0f lines/s", pr.Source, pr.Lines, rate)
	if pr.Size > 0 {
		line = fmt.Sprintf("%5.1f%%  %s", 100*float64(pr.Bytes)/float64(pr.Size), line)
	}
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	p.printed = true
}
