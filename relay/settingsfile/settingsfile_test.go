package settingsfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/breaker"
	"github.com/relayhub/relayhub/relay"
)

// exampleFile is the documented example, which the tests keep valid.
const exampleFile = "../../docs/relay.example.toml"

// flagDefaults stands for what the flags give every target.
var flagDefaults = relay.TargetSettings{
	MaxInflight: 10,
	Policy: breaker.Policy{
		FailThreshold: 5,
		ResetTimeout:  10 * time.Second,
	},

	TargetTimeout: 3 * time.Second,
	FailureCodes:  []string{"E500", "E901", "E902"},
}

// defaultPair is the --target list when none is given.
var defaultPair = []relay.Target{
	{Name: "CORE", URL: "http://127.0.0.1:9201"},
	{Name: "CLAIM", URL: "http://127.0.0.1:9202"},
}

// writeConfig writes body to a file in a temporary directory and returns
// its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "relay.toml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// byName returns the loaded target of that name.
func byName(t *testing.T, targets []relay.Target, name string) relay.Target {
	t.Helper()
	for _, tg := range targets {
		if tg.Name == name {
			require.NotNil(t, tg.Settings, "%s has no settings", name)
			return tg
		}
	}
	t.Fatalf("no target %s in %+v", name, targets)
	return relay.Target{}
}

func TestLoadRefusesBadFiles(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		defaults   *relay.TargetSettings // nil means flagDefaults
		table, key string                // as Error reports them
		want       string                // a substring of the message after "config FILE: "
	}{
		{name: "unknown key", body: "[CORE]\nmax_inflite = 4\n", table: "CORE", key: "max_inflite", want: "[CORE] max_inflite: unknown key (want url, "},
		{name: "misspelt key", body: "[CORE]\nmax_inflght = 4\n", table: "CORE", key: "max_inflght", want: "[CORE] max_inflght: unknown key (did you mean max_inflight?)"},
		{name: "zero max inflight", body: "[CORE]\nmax_inflight = 0\n", table: "CORE", key: "max_inflight", want: "[CORE] max_inflight: must be at least 1, got 0"},
		{name: "negative max inflight", body: "[CORE]\nmax_inflight = -3\n", table: "CORE", key: "max_inflight", want: "must be at least 1, got -3"},
		{name: "max inflight as string", body: "[CORE]\nmax_inflight = \"40\"\n", table: "CORE", key: "max_inflight", want: `want a whole number, got "40"`},
		{name: "max inflight with a fraction", body: "[CORE]\nmax_inflight = 4.5\n", table: "CORE", key: "max_inflight", want: "want a whole number, got the number 4.5"},
		{name: "huge max inflight", body: "[CORE]\nmax_inflight = 99999999999\n", table: "CORE", key: "max_inflight", want: "must be at most"},
		{name: "zero threshold", body: "[CLAIM]\nfail_threshold = 0\n", table: "CLAIM", key: "fail_threshold", want: "[CLAIM] fail_threshold: must be at least 1"},
		{name: "zero min samples", body: "[CORE]\nmin_samples = 0\n", table: "CORE", key: "min_samples", want: "must be at least 1"},
		{name: "unparsable duration", body: "[CORE]\nreset_timeout = \"soon\"\n", table: "CORE", key: "reset_timeout", want: `[CORE] reset_timeout: duration "soon"`},
		{name: "zero reset timeout", body: "[CORE]\nreset_timeout = 0\n", table: "CORE", key: "reset_timeout", want: "must be more than zero"},
		{name: "negative reset timeout", body: "[CORE]\nreset_timeout = \"-5s\"\n", table: "CORE", key: "reset_timeout", want: "must not be negative, got -5s"},
		{name: "negative seconds", body: "[CORE]\ntarget_timeout = -1.5\n", table: "CORE", key: "target_timeout", want: "must not be negative"},
		{name: "negative seconds as a string", body: "[CORE]\nwindow = \"-30\"\n", table: "CORE", key: "window", want: "must not be negative, got -30s"},
		{name: "duration of another type", body: "[CORE]\ntarget_timeout = true\n", table: "CORE", key: "target_timeout", want: "want a duration"},
		{name: "zero window", body: "[CORE]\nwindow = \"0s\"\n", table: "CORE", key: "window", want: "[CORE] window: must be more than zero"},
		{name: "negative slow call", body: "[CORE]\nslow_call = \"-1s\"\n", table: "CORE", key: "slow_call", want: "must not be negative"},
		{name: "seconds past any duration", body: "[CORE]\nslow_call = 1e300\n", table: "CORE", key: "slow_call", want: "not a usable duration"},
		{name: "backoff cap below reset", body: "[CORE]\nmax_reset_timeout = \"5s\"\n", table: "CORE", key: "max_reset_timeout", want: "must be more than reset_timeout (10s)"},
		{
			name: "reset above the flags' backoff cap", body: "[CORE]\nreset_timeout = \"30s\"\n",
			defaults: &relay.TargetSettings{Policy: breaker.Policy{MaxResetTimeout: 20 * time.Second}},
			table:    "CORE", key: "reset_timeout", want: "[CORE] reset_timeout: 30s leaves no room for backoff up to max_reset_timeout 20s",
		},
		{name: "rate above 1", body: "[CORE]\nfailure_rate = 1.5\n", table: "CORE", key: "failure_rate", want: "[CORE] failure_rate: must be from 0 (off) to 1, got 1.5"},
		{name: "negative rate", body: "[CORE]\nfailure_rate = -0.1\n", table: "CORE", key: "failure_rate", want: "got -0.1"},
		{name: "rate not a number", body: "[CORE]\nfailure_rate = nan\n", table: "CORE", key: "failure_rate", want: "got NaN"},
		{name: "rate as string", body: "[CORE]\nfailure_rate = \"half\"\n", table: "CORE", key: "failure_rate", want: "want a number from 0 to 1"},
		{name: "jitter above 1", body: "[CORE]\nreset_jitter = 2\n", table: "CORE", key: "reset_jitter", want: "[CORE] reset_jitter: must be from 0 (off) to 1, got 2"},
		{name: "failure codes not an array", body: "[CORE]\nfailure_codes = \"E500\"\n", table: "CORE", key: "failure_codes", want: "want an array of codes"},
		{name: "no failure codes", body: "[CORE]\nfailure_codes = []\n", table: "CORE", key: "failure_codes", want: "name at least one code"},
		{name: "bad failure code", body: "[CORE]\nfailure_codes = [\"E500\", \"X1\"]\n", table: "CORE", key: "failure_codes", want: `[CORE] failure_codes: failure code "X1": want E400, E500, E901, E902`},
		{name: "failure code of a refusal", body: "[CORE]\nfailure_codes = [\"E904\"]\n", table: "CORE", key: "failure_codes", want: `failure code "E904": E900 to E999 are the hub's own codes`},
		{name: "failure code reserved for the hub", body: "[CORE]\nfailure_codes = [\"E999\"]\n", table: "CORE", key: "failure_codes", want: `failure code "E999": E900 to E999 are the hub's own codes`},
		{name: "failure code as number", body: "[CORE]\nfailure_codes = [500]\n", table: "CORE", key: "failure_codes", want: "want codes as strings"},
		{name: "url scheme", body: "[CORE]\nurl = \"ftp://h\"\n", table: "CORE", key: "url", want: `[CORE] url: URL "ftp://h": want http:// or https://`},
		{name: "url unparsable", body: "[CORE]\nurl = \"http://%zz\"\n", table: "CORE", key: "url", want: "does not parse"},
		{name: "url with query", body: "[CORE]\nurl = \"http://h/?a=1\"\n", table: "CORE", key: "url", want: "want no query"},
		{name: "url as number", body: "[CORE]\nurl = 9201\n", table: "CORE", key: "url", want: "want a string"},
		{name: "added target without url", body: "[CORE_DR]\nmax_inflight = 3\n", table: "CORE_DR", key: "url", want: "[CORE_DR] url: missing"},
		{name: "unknown fallback", body: "[CORE]\nfallback = \"NOPE\"\n", table: "CORE", key: "fallback", want: "[CORE] fallback: no target NOPE (targets: CORE, CLAIM)"},
		{name: "fallback to itself", body: "[CORE]\nfallback = \"core\"\n", table: "CORE", key: "fallback", want: "CORE cannot fall back to itself"},
		{
			name:  "fallback chain",
			body:  "[CORE]\nfallback = \"CLAIM\"\n[CLAIM]\nfallback = \"DR\"\n[DR]\nurl = \"http://127.0.0.1:9203\"\n",
			table: "CORE", key: "fallback", want: "[CORE] fallback: CLAIM has a fallback of its own (DR)",
		},
		{
			name:  "fallback cycle",
			body:  "[CORE]\nfallback = \"CLAIM\"\n[CLAIM]\nfallback = \"CORE\"\n",
			table: "CORE", key: "fallback", want: "no chains or cycles",
		},
		{name: "empty fallback", body: "[CORE]\nfallback = \"\"\n", table: "CORE", key: "fallback", want: "no target name"},
		{name: "fallback as table", body: "[CORE]\nfallback = { name = \"DR\" }\n", table: "CORE", key: "fallback", want: "want a string, got a table"},
		{name: "same table in two cases", body: "[CORE]\nmax_inflight = 4\n[core]\nmax_inflight = 5\n", table: "core", want: "[core] same target as [CORE]"},
		{name: "bad target name", body: "[\"CORE DR\"]\nurl = \"http://h\"\n", table: "CORE DR", want: "target name: want 1 to 64"},
		{name: "key outside a table", body: "max_inflight = 4\n", key: "max_inflight", want: "max_inflight: want a table [NAME] of settings for target NAME, got the number 4"},
		{name: "array of tables", body: "[[CORE]]\nmax_inflight = 4\n", key: "CORE", want: "CORE: want a table [NAME] of settings for target NAME, got an array"},
		{name: "nested table", body: "[CORE.limits]\nmax_inflight = 4\n", table: "CORE", key: "limits", want: "[CORE] limits: unknown key"},
		{name: "dotted key", body: "[CORE]\nlimits.max_inflight = 4\n", table: "CORE", key: "limits.max_inflight", want: "[CORE] limits.max_inflight: unknown key"},
		{name: "syntax error", body: "[CORE]\nmax_inflight = \n", key: "CORE.max_inflight", want: "line 2 (after key CORE.max_inflight)"},
		{name: "table name not closed", body: "[CORE\nmax_inflight = 4\n", want: "line 1: expected '.' or ']' to end table name"},
		{name: "table name not closed after blank lines", body: "[CLAIM]\nmax_inflight = 4\n\n[CORE\n\n", key: "CLAIM", want: "line 4 (after key CLAIM): expected '.' or ']' to end table name"},
		{name: "string not closed", body: "[CORE]\nurl = \"http://h\nmax_inflight = 4\n", key: "CORE.url", want: "line 2 (after key CORE.url): strings cannot contain newlines"},
		{name: "table name not closed at the end", body: "[CORE", want: "line 1: expected '.' or ']' to end table name"},
		{name: "duplicate key", body: "[CORE]\nmax_inflight = 4\nmax_inflight = 5\n", key: "CORE.max_inflight", want: "line 3 (after key CORE.max_inflight)"},
		{name: "key in another case", body: "[CORE]\nMAX_INFLIGHT = 4\n", table: "CORE", key: "MAX_INFLIGHT", want: "[CORE] MAX_INFLIGHT: unknown key (did you mean max_inflight? keys are case-sensitive)"},
		{name: "key in another case beside it", body: "[CORE]\nmax_inflight = 4\nMax_Inflight = 0\n", table: "CORE", key: "Max_Inflight", want: "[CORE] Max_Inflight: unknown key (did you mean max_inflight?"},
		{name: "key that folds to a key", body: "[CORE]\n\"\u017flow_call\" = \"1s\"\n", table: "CORE", key: "\u017flow_call", want: "unknown key (did you mean slow_call?"},
		{name: "unknown key in an inline table", body: "CORE = { max_inflite = 4 }\n", table: "CORE", key: "max_inflite", want: "[CORE] max_inflite: unknown key (want url, max_inflight, fail_threshold,"},
		{name: "nested table under a key", body: "[CORE.url]\nhost = \"h\"\n", table: "CORE", key: "url", want: "[CORE] url: want a string, got a table"},
		{name: "probe payload with a line break", body: "[CORE]\nprobe_payload = \"BAL\\nHEALTH\"\n", table: "CORE", key: "probe_payload", want: `[CORE] probe_payload: must be one line`},
		{name: "probe payload as number", body: "[CORE]\nprobe_payload = 7\n", table: "CORE", key: "probe_payload", want: "want a string"},
		{name: "bad probe code", body: "[CORE]\nprobe_expect = [\"0000\", \"B40\"]\n", table: "CORE", key: "probe_expect", want: `[CORE] probe_expect: probe code "B40": want 0000, Bnnn`},
		{name: "failure as probe code", body: "[CORE]\nprobe_expect = [\"E500\"]\n", table: "CORE", key: "probe_expect", want: "a failure is never healthy"},
		{name: "hub code as probe code", body: "[CORE]\nprobe_expect = [\"E904\"]\n", table: "CORE", key: "probe_expect", want: "E900 and above are the hub's own"},
		{name: "no probe codes", body: "[CORE]\nprobe_expect = []\n", table: "CORE", key: "probe_expect", want: "name at least one code"},
		{name: "zero probe successes", body: "[CORE]\nprobe_successes = 0\n", table: "CORE", key: "probe_successes", want: "[CORE] probe_successes: must be at least 1, got 0"},
		{name: "negative probe interval", body: "[CORE]\nprobe_interval = \"-1s\"\n", table: "CORE", key: "probe_interval", want: "must not be negative"},
		{name: "misspelt probe key", body: "[CORE]\nprobe_sucesses = 3\n", table: "CORE", key: "probe_sucesses", want: "unknown key (did you mean probe_successes?)"},
		{name: "bad dedup scope", body: "[CORE]\ndedup_scope = \"client\"\n", table: "CORE", key: "dedup_scope", want: `[CORE] dedup_scope: "client": want identity or target`},
		{name: "misspelt target", body: "[COER]\nmax_inflight = 3\n", table: "COER", key: "url", want: "[COER] url: missing: COER is a target only this file names, so its table must give its url (did you mean [CORE]?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body)
			defaults := flagDefaults
			if tt.defaults != nil {
				defaults = *tt.defaults
			}
			targets, err := Load(path, defaults, defaultPair)
			require.Error(t, err)
			assert.Nil(t, targets)
			var ce *Error
			require.True(t, errors.As(err, &ce), "want a *Error, got %T: %v", err, err)
			assert.Equal(t, path, ce.File)
			assert.Equal(t, tt.table, ce.Table)
			assert.Equal(t, tt.key, ce.Key)
			msg := err.Error()
			assert.True(t, strings.HasPrefix(msg, "config "+path+": "), "the message names the file: %s", msg)
			assert.Contains(t, msg, tt.want)
			assert.NotContains(t, msg, "\n", "one line on stderr")
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.toml")
	_, err := Load(path, flagDefaults, defaultPair)
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrNotExist))
	assert.True(t, strings.HasPrefix(err.Error(), "config "+path+": "), err.Error())
}

func TestLoadFileWinsKeyByKey(t *testing.T) {
	// Given flags that turn the failure rate on for every target,
	defaults := flagDefaults
	defaults.FailureRate, defaults.MinSamples, defaults.SlowCall = 0.3, 15, time.Second
	// and a file that overrides some keys of CORE, turns CLAIM's rate off,
	// and adds DR,
	path := writeConfig(t, `
[core]
max_inflight = 40
reset_timeout = 30
target_timeout = "1.5s"
failure_codes = ["e500", "E901"]
window = 60
max_reset_timeout = "5m"
reset_jitter = 0.25
fallback = "dr"
url = "http://10.0.0.1:8080/core"

[CLAIM]
failure_rate = 0

[DR]
url = "https://dr.bank:8443"
fail_threshold = 2
`)
	targets, err := Load(path, defaults, defaultPair)
	require.NoError(t, err)

	// then the targets are the flags' pair, then the file's, in order,
	require.Len(t, targets, 3)
	assert.Equal(t, []string{"CORE", "CLAIM", "DR"}, []string{targets[0].Name, targets[1].Name, targets[2].Name})

	// CORE has the file's keys and the flags' for the rest,
	core := byName(t, targets, "CORE")
	assert.Equal(t, "http://10.0.0.1:8080/core", core.URL)
	assert.Equal(t, "DR", core.Fallback)
	assert.Equal(t, relay.TargetSettings{
		MaxInflight: 40, Policy: breaker.Policy{
			FailThreshold:   5,
			ResetTimeout:    30 * time.Second,
			FailureRate:     0.3,
			Window:          time.Minute,
			MinSamples:      15,
			SlowCall:        time.Second,
			MaxResetTimeout: 5 * time.Minute,
			ResetJitter:     0.25,
		}, TargetTimeout: 1500 * time.Millisecond,
		FailureCodes: []string{"E500", "E901"},
	}, *core.Settings)

	// CLAIM keeps its flag URL and turns only the rate off,
	claim := byName(t, targets, "CLAIM")
	assert.Equal(t, "http://127.0.0.1:9202", claim.URL)
	assert.Empty(t, claim.Fallback)
	want := defaults
	want.FailureRate = 0
	assert.Equal(t, want, *claim.Settings)

	// and DR, added by the file, has its url and the flags' defaults.
	dr := byName(t, targets, "DR")
	assert.Equal(t, "https://dr.bank:8443", dr.URL)
	want = defaults
	want.FailThreshold = 2
	assert.Equal(t, want, *dr.Settings)

	// Each target has settings of its own: changing one changes no other.
	core.Settings.FailureCodes[0] = "E999"
	assert.Equal(t, "E500", claim.Settings.FailureCodes[0])
}

func TestLoadFillsPackageDefaults(t *testing.T) {
	// Zero defaults are the package's, as for Config.
	path := writeConfig(t, "[CORE]\nmax_inflight = 2\n")
	targets, err := Load(path, relay.TargetSettings{}, []relay.Target{{Name: "core", URL: "http://127.0.0.1:1"}})
	require.NoError(t, err)
	require.Len(t, targets, 1)
	assert.Equal(t, "CORE", targets[0].Name)
	assert.Equal(t, relay.TargetSettings{
		MaxInflight: 2, Policy: breaker.Policy{
			FailThreshold: relay.DefaultFailThreshold,
			ResetTimeout:  relay.DefaultResetTimeout,
		},
		TargetTimeout: relay.DefaultTargetTimeout, FailureCodes: []string{"E500", "E901", "E902"},
	}, *targets[0].Settings)
}

func TestExampleFileLoadsAndServes(t *testing.T) {
	// Given the documented example and the default pair,
	targets, err := Load(exampleFile, flagDefaults, defaultPair)
	require.NoError(t, err)

	// then CORE, CLAIM and CORE_DR have what the example promises,
	require.Len(t, targets, 3)
	core := byName(t, targets, "CORE")
	assert.Equal(t, "http://127.0.0.1:9201", core.URL)
	assert.Equal(t, "CORE_DR", core.Fallback)
	assert.Equal(t, relay.TargetSettings{
		MaxInflight: 40, Policy: breaker.Policy{
			FailThreshold:   5,
			ResetTimeout:    30 * time.Second,
			FailureRate:     0.5,
			Window:          time.Minute,
			MinSamples:      20,
			SlowCall:        2 * time.Second,
			MaxResetTimeout: 5 * time.Minute,
			ResetJitter:     0.2,
		}, TargetTimeout: 3 * time.Second,
		FailureCodes: []string{"E500", "E901", "E902"},
	}, *core.Settings)
	claim := byName(t, targets, "CLAIM")
	assert.Equal(t, 8, claim.Settings.MaxInflight)
	assert.Equal(t, 5*time.Second, claim.Settings.ResetTimeout)
	assert.Equal(t, "http://127.0.0.1:9203", byName(t, targets, "CORE_DR").URL)

	// and a Server built from them runs with each target's own settings.
	srv, err := relay.New(relay.Config{Targets: targets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	st := snapshot(t, srv, "CORE")
	assert.Equal(t, 40, st.MaxInFlight)
	assert.Equal(t, "CORE_DR", st.Fallback)
	assert.Equal(t, 30*time.Second, st.Settings.ResetTimeout)
	assert.Equal(t, 4*time.Second, st.ProbeTimeout)
	assert.Equal(t, 0.2, st.Settings.ResetJitter)
	assert.Equal(t, 8, snapshot(t, srv, "CLAIM").MaxInFlight)
	assert.Equal(t, 10, snapshot(t, srv, "CORE_DR").MaxInFlight)
}

// snapshot returns the named target's snapshot.
func snapshot(t *testing.T, srv *relay.Server, name string) relay.TargetSnapshot {
	t.Helper()
	st, ok := srv.Target(name)
	require.True(t, ok, "no target %s", name)
	return st
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{in: "30", want: 30 * time.Second},
		{in: " 0.25 ", want: 250 * time.Millisecond},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: "5m", want: 5 * time.Minute},
		{in: "-1", want: -time.Second},
		{in: "-0.5", want: -500 * time.Millisecond},
		{in: "-2s", want: -2 * time.Second},
		{in: "", bad: true},
		{in: "-", bad: true},
		{in: "--1", bad: true},
		{in: "-99999999999999999999", bad: true},
		{in: "soon", bad: true},
		{in: "1..2", bad: true},
		{in: "99999999999999999999", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseDuration(tt.in)
			if tt.bad {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestLoadSuggestsTheNearestTarget(t *testing.T) {
	base := []relay.Target{
		{Name: "CORE", URL: "http://127.0.0.1:9201"},
		{Name: "CLAIM", URL: "http://127.0.0.1:9202"},
		{Name: "CARD", URL: "http://127.0.0.1:9204"},
	}
	tests := []struct {
		name    string
		before  string // the file before the table
		table   string // a table for a new target, without url
		suggest string // the target the error suggests, if any
	}{
		{name: "two letters swapped", table: "COER", suggest: "CORE"},
		{name: "a letter more, in lower case", table: "claims", suggest: "CLAIM"},
		{name: "a letter less", table: "Cor", suggest: "CORE"},
		{name: "the nearer of two", table: "CARDE", suggest: "CARD"},
		{name: "of two as near the first given", table: "CARE", suggest: "CORE"},
		{name: "three edits away", table: "CORE_DR"},
		{name: "near only a target the file adds", before: "[CORE_DR]\nurl = \"http://127.0.0.1:9203\"\n", table: "CORE_RD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.before+"["+tt.table+"]\nmax_inflight = 3\n")
			_, err := Load(path, flagDefaults, base)
			var ce *Error
			require.True(t, errors.As(err, &ce), "want a *Error, got %T: %v", err, err)
			assert.Equal(t, tt.table, ce.Table)
			assert.Equal(t, "url", ce.Key)
			want := "config " + path + ": [" + tt.table + "] url: missing: " + strings.ToUpper(tt.table) +
				" is a target only this file names, so its table must give its url"
			if tt.suggest != "" {
				want += " (did you mean [" + tt.suggest + "]?)"
			}
			assert.Equal(t, want, err.Error())
		})
	}
}

func TestLoadReportsTheSameMistakeEveryTime(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{
			name: "the first bad value in file order",
			body: "[CORE]\nfail_threshold = 0\nmax_inflight = 0\nreset_timeout = 0\nwindow = 0\n[CLAIM]\nmin_samples = 0\n",
			want: "[CORE] fail_threshold: must be at least 1, got 0",
		},
		{
			name: "an unknown key before a bad value",
			body: "[CORE]\nmax_inflight = 0\nreset_timeout = 0\n[CLAIM]\nmax_inflite = 4\n",
			want: "[CLAIM] max_inflite: unknown key",
		},
		{
			name: "a bad value before a missing url",
			body: "[DR]\nmax_inflight = 4\n[CLAIM]\nreset_jitter = 2\n",
			want: "[CLAIM] reset_jitter: must be from 0 (off) to 1, got 2",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.body)
			// The decoder reads a table's keys in map order, which differs
			// from run to run: twenty runs all agree only if the order of
			// the file decides.
			for range 20 {
				_, err := Load(path, flagDefaults, defaultPair)
				require.Error(t, err)
				require.Contains(t, err.Error(), tt.want)
			}
		})
	}
}

func TestLoadTakesInlineTables(t *testing.T) {
	path := writeConfig(t, "CORE = { max_inflight = 4, failure_codes = [\"E500\"] }\nDR = { url = \"http://127.0.0.1:9203\" }\n")
	targets, err := Load(path, flagDefaults, defaultPair)
	require.NoError(t, err)
	require.Len(t, targets, 3)
	core := byName(t, targets, "CORE")
	assert.Equal(t, 4, core.Settings.MaxInflight)
	assert.Equal(t, []string{"E500"}, core.Settings.FailureCodes)
	assert.Equal(t, "http://127.0.0.1:9203", byName(t, targets, "DR").URL)
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "CORE", 4}, {"CORE", "CORE", 0}, {"COER", "CORE", 2},
		{"CLAIMS", "CLAIM", 1}, {"COR", "CORE", 1}, {"CARE", "CORE", 1}, {"CARDE", "CORE", 2},
		{"CORE_DR", "CORE", 3}, {"KITTEN", "SITTING", 3}, {"FLAW", "LAWN", 2},
	}
	for _, tt := range tests {
		t.Run(tt.a+"~"+tt.b, func(t *testing.T) {
			assert.Equal(t, tt.want, editDistance(tt.a, tt.b))
			assert.Equal(t, tt.want, editDistance(tt.b, tt.a), "symmetric")
		})
	}
}

func TestLoadTargetIdleTimeout(t *testing.T) {
	path := writeConfig(t, "[CORE]\ntarget_idle_timeout = \"2s\"\n[CLAIM]\ntarget_idle_timeout = 0\n")
	_, err := Load(path, flagDefaults, defaultPair)
	require.ErrorContains(t, err, "[CLAIM] target_idle_timeout: must be more than zero")

	path = writeConfig(t, "[CORE]\ntarget_idle_timeout = \"2s\"\n")
	targets, err := Load(path, flagDefaults, defaultPair)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, byName(t, targets, "CORE").Settings.TargetIdleTimeout)
	assert.Equal(t, flagDefaults.TargetIdleTimeout, byName(t, targets, "CLAIM").Settings.TargetIdleTimeout, "the flag's value where the file says nothing")
}

func TestLoadProbeKeys(t *testing.T) {
	// Given flags that set no probe and a file that sets one for CORE,
	path := writeConfig(t, `[CORE]
probe_payload = "BAL HEALTH"
probe_expect = ["0000", "b404"]
probe_successes = 3
probe_interval = "2s"

[CLAIM]
probe_expect = "0000,B212"
`)

	targets, err := Load(path, flagDefaults, defaultPair)

	require.NoError(t, err)
	core := byName(t, targets, "CORE").Settings
	assert.Equal(t, "BAL HEALTH", core.ProbePayload)
	assert.Equal(t, []string{"0000", "B404"}, core.ProbeExpect)
	assert.Equal(t, 3, core.ProbeSuccesses)
	assert.Equal(t, 2*time.Second, core.ProbeInterval)
	claim := byName(t, targets, "CLAIM").Settings
	assert.Empty(t, claim.ProbePayload, "the flags' default: off")
	assert.Equal(t, []string{"0000", "B212"}, claim.ProbeExpect, "a comma-separated string, as the flag takes it")
	assert.Zero(t, claim.ProbeSuccesses)
}

func TestLoadDedupScope(t *testing.T) {
	// Given flags that keep identities apart and a file that shares CORE's
	// TXIDs among its clients,
	path := writeConfig(t, "[CORE]\ndedup_scope = \"target\"\n[CLAIM]\ndedup = true\n")

	targets, err := Load(path, flagDefaults, defaultPair)

	// then CORE is scoped by target, and CLAIM keeps the flags' scope.
	require.NoError(t, err)
	assert.Equal(t, relay.DedupByTarget, byName(t, targets, "CORE").Settings.DedupScope)
	assert.Equal(t, relay.DedupByIdentity, byName(t, targets, "CLAIM").Settings.DedupScope)
}

func TestLoadAdaptiveLimit(t *testing.T) {
	// Given a file that turns the adaptive limit on for CORE with its own
	// floor, and observes it for CLAIM,
	path := writeConfig(t, "[CORE]\nadaptive_limit = true\nmin_inflight = 4\n[CLAIM]\nadaptive_limit = \"observe\"\n")

	targets, err := Load(path, flagDefaults, defaultPair)

	// then each target has what its section says.
	require.NoError(t, err)
	core := byName(t, targets, "CORE").Settings
	assert.Equal(t, relay.LimitAdaptive, core.AdaptiveLimit)
	assert.Equal(t, 4, core.MinInflight)
	assert.Equal(t, relay.LimitObserve, byName(t, targets, "CLAIM").Settings.AdaptiveLimit)

	// and a value that is none of true, false and "observe" is refused.
	_, err = Load(writeConfig(t, "[CORE]\nadaptive_limit = \"yes\"\n"), flagDefaults, defaultPair)
	assert.ErrorContains(t, err, `[CORE] adaptive_limit: want true, false or "observe", got`)
}
