package replay

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/settingsfile"
)

// flagDefaults are settings as the hub's flags give them.
var flagDefaults = relay.TargetSettings{Policy: breaker.Policy{FailThreshold: 5, ResetTimeout: 10 * time.Second}}

func TestLoadFileReadsTheHubsOwnFile(t *testing.T) {
	// The documented example: CORE and CLAIM come from --target (no url),
	// CORE_DR is added by the file; the settings are the hub's.
	targets, err := LoadFile(filepath.Join("..", "..", "docs", "relay.example.toml"), flagDefaults)
	require.NoError(t, err)
	s := Settings{Defaults: flagDefaults, Targets: targets}
	assert.Equal(t, "fail_threshold=5 reset_timeout=30s target_timeout=3s failure_codes=E500,E901,E902 "+
		"failure_rate=0.5 window=1m0s min_samples=20 slow_call=2s max_reset_timeout=5m0s reset_jitter=0.2 fallback=CORE_DR",
		s.Describe("CORE"))
	assert.Equal(t, "fail_threshold=5 reset_timeout=5s target_timeout=3s failure_codes=E500,E901,E902", s.Describe("claim"))
	assert.Equal(t, "fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902", s.Describe("CORE_DR"))
	assert.Equal(t, s.Describe("CORE_DR"), s.Describe("PAYROLL"), "a target the file does not name has the flags' settings")
}

func TestLoadFileFindsAFallbackWithoutATable(t *testing.T) {
	// The hub ran with --target CORE=... --target CORE_DR=...; the file
	// names CORE_DR only as CORE's fallback.
	path := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(path, []byte("[CORE]\nfail_threshold = 2\nfallback = \"CORE_DR\"\n"), 0o600))
	targets, err := LoadFile(path, flagDefaults)
	require.NoError(t, err)
	s := Settings{Defaults: flagDefaults, Targets: targets}
	assert.Contains(t, s.Describe("CORE"), "fail_threshold=2 ")
	assert.Contains(t, s.Describe("CORE"), "fallback=CORE_DR")
}

func TestLoadFileRefusesWhatTheHubRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(path, []byte("[CORE]\nfail_treshold = 2\n"), 0o600))
	_, err := LoadFile(path, flagDefaults)
	require.ErrorAs(t, err, new(*settingsfile.Error))
	assert.EqualError(t, err, "config "+path+": [CORE] fail_treshold: unknown key (did you mean fail_threshold?)")

	require.NoError(t, os.WriteFile(path, []byte("[CORE\n"), 0o600))
	_, err = LoadFile(path, flagDefaults)
	assert.ErrorContains(t, err, "config "+path+": line 1: ")
}

func TestOverride(t *testing.T) {
	targets, err := LoadFile(filepath.Join("..", "..", "docs", "relay.example.toml"), flagDefaults)
	require.NoError(t, err)
	base := Settings{Name: "replay", Defaults: flagDefaults, Targets: targets, Seed: 9}

	tests := []struct {
		name      string
		overrides []string
		want      map[string]string
	}{
		{
			name:      "for every target",
			overrides: []string{"fail_threshold=3", "slow_call=250ms"},
			want: map[string]string{
				"CORE": "fail_threshold=3 reset_timeout=30s target_timeout=3s failure_codes=E500,E901,E902 " +
					"failure_rate=0.5 window=1m0s min_samples=20 slow_call=250ms max_reset_timeout=5m0s reset_jitter=0.2 fallback=CORE_DR",
				"CLAIM":   "fail_threshold=3 reset_timeout=5s target_timeout=3s failure_codes=E500,E901,E902 slow_call=250ms",
				"PAYROLL": "fail_threshold=3 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902 slow_call=250ms",
			},
		},
		{
			name:      "a target's own wins",
			overrides: []string{"CLAIM.reset_timeout=2", "reset_timeout=20s", "core.failure_codes=E500,E902", "claim.fallback=CORE_DR"},
			want: map[string]string{
				"CLAIM":   "fail_threshold=5 reset_timeout=2s target_timeout=3s failure_codes=E500,E901,E902 fallback=CORE_DR",
				"PAYROLL": "fail_threshold=5 reset_timeout=20s target_timeout=3s failure_codes=E500,E901,E902",
			},
		},
		{
			name:      "a target only an override names",
			overrides: []string{"PAYROLL.failure_rate=0.25", "PAYROLL.min_samples=4"},
			want: map[string]string{
				"PAYROLL": "fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902 failure_rate=0.25 window=1m0s min_samples=4",
				"OTHER":   "fail_threshold=5 reset_timeout=10s target_timeout=3s failure_codes=E500,E901,E902",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := base.Override("compare", "--compare", tc.overrides)
			require.NoError(t, err)
			assert.Equal(t, "compare", got.Name)
			assert.Equal(t, uint64(9), got.Seed, "the seed is kept")
			for target, want := range tc.want {
				assert.Equal(t, want, got.Describe(target), target)
			}
			assert.Equal(t, "fail_threshold=5 reset_timeout=30s target_timeout=3s failure_codes=E500,E901,E902 "+
				"failure_rate=0.5 window=1m0s min_samples=20 slow_call=2s max_reset_timeout=5m0s reset_jitter=0.2 fallback=CORE_DR",
				base.Describe("CORE"), "the base set is not changed")
		})
	}
	got, err := base.Override("compare", "--compare", []string{"CORE.failure_codes=E500,E902"})
	require.NoError(t, err)
	assert.Contains(t, got.Describe("CORE"), " failure_codes=E500,E902 ")
}

func TestOverrideRefusesWhatTheFileRefuses(t *testing.T) {
	base := Settings{Defaults: flagDefaults}
	tests := []struct {
		override string
		want     string
	}{
		{"fail_threshold", `--compare "fail_threshold": want KEY=VALUE or TARGET.KEY=VALUE`},
		{"fail_threshold=0", "config --compare: fail_threshold: must be at least 1, got 0"},
		{"CORE.fail_threshold=x", `config --compare: [CORE] fail_threshold: want a whole number, got "x"`},
		{"failure_rate=2", "config --compare: failure_rate: must be from 0 (off) to 1, got 2"},
		{"reset_timeout=soon", `config --compare: reset_timeout: duration "soon": want a number of seconds or a duration like 500ms`},
		{"failure_codes=E904", "config --compare: failure_codes: "},
		{"fail_treshold=3", "config --compare: fail_treshold: unknown key (did you mean fail_threshold?)"},
		{"max_reset_timeout=5s", "config --compare: max_reset_timeout: must be more than reset_timeout (10s) for backoff to apply, or 0 for none, got 5s"},
		{"fallback=X", `--compare "fallback=X": give a fallback per target, as TARGET.fallback=NAME`},
		{"CORE.fallback=NOWHERE", "config --compare: [CORE] fallback: no target NOWHERE"},
		{"url=http://127.0.0.1:1", `--compare "url=http://127.0.0.1:1": a replay calls no target, so a url means nothing to it`},
	}
	for _, tc := range tests {
		t.Run(tc.override, func(t *testing.T) {
			_, err := base.Override("compare", "--compare", []string{tc.override})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
