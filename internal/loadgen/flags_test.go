package loadgen

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// defaultFlags returns the flags as kong fills them with every default.
func defaultFlags() Flags {
	return Flags{
		Addr:           "127.0.0.1:9200",
		Conns:          16,
		Duration:       10 * time.Second,
		Mix:            "CORE=100",
		Payload:        "BAL ACC{conn}",
		Drain:          5 * time.Second,
		ConnectTimeout: 5 * time.Second,
		Seed:           1,
	}
}

func TestFlagsConfig(t *testing.T) {
	tests := []struct {
		name         string
		change       func(*Flags)
		wantDepth    int
		wantDuration time.Duration
		wantPayloads []string // request 7 on connection 2, per mix entry
	}{
		{"defaults", func(*Flags) {}, 1, 10 * time.Second, []string{"BAL ACC2"}},
		{"a rate without a depth gets the rate depth", func(f *Flags) { f.Rate = 100 }, RateDepth, 10 * time.Second, []string{"BAL ACC2"}},
		{"a depth given wins", func(f *Flags) { f.Rate, f.Depth = 100, 8 }, 8, 10 * time.Second, []string{"BAL ACC2"}},
		{"requests take precedence over the duration", func(f *Flags) { f.Requests = 5 }, 1, 0, []string{"BAL ACC2"}},
		{
			"a target's own payload, named in any case",
			func(f *Flags) {
				f.Mix, f.Payload = "CORE=70,CLAIM=30", "BAL {n}"
				f.TargetPayload = map[string]string{"claim": "SUBMIT P{conn} 100"}
			},
			1, 10 * time.Second, []string{"BAL 7", "SUBMIT P2 100"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := defaultFlags()
			tt.change(&f)

			cfg, err := f.Config()

			require.NoError(t, err)
			assert.Equal(t, tt.wantDepth, cfg.Depth)
			assert.Equal(t, tt.wantDuration, cfg.Duration)
			var payloads []string
			for _, p := range cfg.Payloads {
				payloads = append(payloads, string(p.AppendTo(nil, 7, 2)))
			}
			assert.Equal(t, tt.wantPayloads, payloads)
			assert.Equal(t, ProtocolRelay, cfg.Protocol)
			assert.Empty(t, cfg.ServerPIDs)
			_, err = New(cfg)
			assert.NoError(t, err, "New takes what Config returns")
		})
	}
}

func TestFlagsConfigRejects(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Flags)
		wantErr string
	}{
		{"no connections", func(f *Flags) { f.Conns = 0 }, "--conns 0: want 1 to 10000"},
		{"depth too deep", func(f *Flags) { f.Depth = MaxDepth + 1 }, "--depth 65537"},
		{"zero duration", func(f *Flags) { f.Duration = 0 }, "--duration 0s"},
		{"negative rate", func(f *Flags) { f.Rate = -1 }, "--rate -1"},
		{"rate not a number", func(f *Flags) { f.Rate = math.NaN() }, "--rate NaN"},
		{"negative drain", func(f *Flags) { f.Drain = -time.Second }, "--drain -1s"},
		{"zero connect timeout", func(f *Flags) { f.ConnectTimeout = 0 }, "--connect-timeout 0s"},
		{"bad mix", func(f *Flags) { f.Mix = "CORE=x" }, "--mix: "},
		{"line break in payload", func(f *Flags) { f.Payload = "BAL\n" }, "--payload: "},
		{"payload for a target not in the mix", func(f *Flags) { f.TargetPayload = map[string]string{"CLAIM": "X"} }, "--target-payload CLAIM: target not in --mix CORE=100"},
		{"bad target payload", func(f *Flags) { f.TargetPayload = map[string]string{"CORE": "X\r"} }, "--target-payload CORE: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := defaultFlags()
			tt.change(&f)

			_, err := f.Config()

			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}
