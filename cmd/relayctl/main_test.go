package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
)

// parse runs the command line through kong as main does, without exiting.
func parse(t *testing.T, args ...string) (*cli, *kong.Context, error) {
	t.Helper()
	var c cli
	p, err := newParser(&c, kong.Exit(func(int) { t.Fatal("kong tried to exit") }))
	require.NoError(t, err)
	kctx, err := p.Parse(args)
	return &c, kctx, err
}

func TestParseLoadDefaults(t *testing.T) {
	c, kctx, err := parse(t, "load")
	require.NoError(t, err)
	assert.Equal(t, "load", kctx.Command())
	cfg, err := c.Load.Config()
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9200", cfg.Addr)
	assert.Equal(t, 16, cfg.Conns)
	assert.Equal(t, 1, cfg.Depth, "closed loop keeps one in flight")
	assert.Equal(t, 10*time.Second, cfg.Duration)
	assert.Zero(t, cfg.Requests)
	assert.Zero(t, cfg.Rate)
	assert.Equal(t, "CORE=100", cfg.Mix.String())
	assert.Equal(t, 5*time.Second, cfg.Drain)
}

func TestParseLoadFlags(t *testing.T) {
	c, _, err := parse(t, "load", "--mix", "core=70,claim=30", "--requests", "1000", "--duration", "1s",
		"--rate", "5000", "--payload", "BAL {n}", "--target-payload", "claim=SUBMIT P{conn} 100")
	require.NoError(t, err)
	cfg, err := c.Load.Config()
	require.NoError(t, err)
	assert.Equal(t, uint64(1000), cfg.Requests)
	assert.Zero(t, cfg.Duration, "--requests takes precedence")
	assert.Equal(t, loadgen.RateDepth, cfg.Depth, "with --rate the depth is only a cap")
	require.Len(t, cfg.Payloads, 2)
	assert.Equal(t, "BAL 7", string(cfg.Payloads[0].AppendTo(nil, 7, 2)))
	assert.Equal(t, "SUBMIT P2 100", string(cfg.Payloads[1].AppendTo(nil, 7, 2)))
}

func TestParseSendResendFlags(t *testing.T) {
	c, _, err := parse(t, "send", "CORE")
	require.NoError(t, err)
	assert.Empty(t, c.Send.ResendOn, "resending is off by default")
	assert.Equal(t, time.Second, c.Send.ResendAfter)
	assert.Equal(t, 5, c.Send.ResendMax)

	c, _, err = parse(t, "send", "--resend-on", "E901,e902", "--resend-on", " E906", "--resend-after", "250ms", "--resend-max", "2", "CORE")
	require.NoError(t, err)
	codes, err := c.Send.resendCodes()
	require.NoError(t, err)
	assert.Equal(t, []string{"E901", "E902", "E906"}, codes, "repeated and comma-separated, in canonical form")
	assert.Equal(t, 250*time.Millisecond, c.Send.ResendAfter)
	assert.Equal(t, 2, c.Send.ResendMax)
}

func TestParseFromEnvironment(t *testing.T) {
	t.Setenv("RELAYCTL_ADDR", "127.0.0.1:19200")
	t.Setenv("RELAYCTL_CONNS", "3")
	t.Setenv("RELAYCTL_MIX", "CLAIM=1")
	c, _, err := parse(t, "load")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:19200", c.Load.Addr)
	assert.Equal(t, 3, c.Load.Conns)
	assert.Equal(t, "CLAIM=1", c.Load.Mix)
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"bad mix", []string{"load", "--mix", "CORE=x"}, "--mix"},
		{"no conns", []string{"load", "--conns", "0"}, "--conns"},
		{"negative rate", []string{"load", "--rate", "-1"}, "--rate"},
		{"zero duration", []string{"load", "--duration", "0s"}, "--duration"},
		{"payload for a target not in the mix", []string{"load", "--target-payload", "CLAIM=X"}, "not in --mix"},
		{"bad txid", []string{"send", "--txid", "a|b", "CORE", "BAL A"}, "--txid"},
		{"send without target", []string{"send"}, "expected \"<target>\""},
		{"resend-on not a code", []string{"send", "--resend-on", "E9", "CORE"}, `--resend-on "E9"`},
		{"resend-max zero", []string{"send", "--resend-on", "E901", "--resend-max", "0", "CORE"}, "--resend-max 0: want 1 or more"},
		{"resend-after negative", []string{"send", "--resend-on", "E901", "--resend-after=-1s", "CORE"}, "--resend-after -1s: want 0 or more"},
		{"status with zero timeout", []string{"status", "--timeout", "0s"}, "--timeout"},
		{"load speaks only the hub's protocol", []string{"load", "--protocol", "http"}, "unknown flag --protocol"},
		{"load measures no server", []string{"load", "--server-pid", "1"}, "unknown flag --server-pid"},
		{"idle is relaybench's", []string{"idle"}, `unexpected argument idle`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parse(t, tt.args...)
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestRunLoadCommandEndToEnd(t *testing.T) {
	tests := []struct {
		name     string
		relay    fakerelay.Config
		wantCode int
	}{
		{"clean run", fakerelay.Config{}, 0},
		{"bogus answer fails the run", fakerelay.Config{BogusAfterNth: 3}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := fakerelay.New(t, tt.relay)
			_, kctx, err := parse(t, "load", "--addr", f.Addr, "--conns", "2", "--requests", "100",
				"--mix", "CORE=1,CLAIM=1", "--json", "--quiet", "--drain", "200ms")
			require.NoError(t, err)
			var out, errOut bytes.Buffer
			kctx.BindTo(t.Context(), (*context.Context)(nil))
			err = kctx.Run(&streams{Out: &out, Err: &errOut})

			assert.Equal(t, tt.wantCode, cmdline.Code(err))
			assert.Empty(t, errOut.String(), "--quiet prints no progress")
			var sum loadgen.Summary
			require.NoError(t, json.Unmarshal(out.Bytes(), &sum), out.String())
			assert.Equal(t, int64(100), sum.Sent)
			assert.Equal(t, int64(100), sum.Answered)
			assert.Equal(t, int64(100), sum.Codes["0000"])
			assert.Len(t, sum.TargetCodes, 2)
			assert.Equal(t, "relay", sum.Protocol)
			assert.Empty(t, sum.ServerCPU)
		})
	}
}

func TestRunLoadCommandCannotConnect(t *testing.T) {
	f := fakerelay.New(t, fakerelay.Config{})
	f.Close()
	_, kctx, err := parse(t, "load", "--addr", f.Addr, "--requests", "10", "--quiet")
	require.NoError(t, err)
	kctx.BindTo(t.Context(), (*context.Context)(nil))
	var out bytes.Buffer
	err = kctx.Run(&streams{Out: &out, Err: &bytes.Buffer{}})
	assert.Equal(t, 2, cmdline.Code(err))
	assert.ErrorIs(t, err, loadgen.ErrDialAll)
	assert.Empty(t, out.String())
}

func TestReadmeNamesEveryCommand(t *testing.T) {
	// The README's table of the tools names each relayctl command as it
	// is typed, so none is left out of a reader's first look.
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	var row string
	for line := range strings.SplitSeq(string(readme), "\n") {
		if strings.HasPrefix(line, "| `relayctl` |") {
			row = line
		}
	}
	require.NotEmpty(t, row, "README.md has no row for relayctl")
	var c cli
	p, err := newParser(&c)
	require.NoError(t, err)
	require.NotEmpty(t, p.Model.Children)
	for _, cmd := range p.Model.Children {
		assert.Contains(t, row, "`"+cmd.Name+"`", "README.md's relayctl row leaves out %s", cmd.Name)
	}
}
