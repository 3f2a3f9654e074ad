package settingsfile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/resolver"
)

func TestLoadResolveSettings(t *testing.T) {
	path := writeConfig(t, `[CORE]
status_url = "http://127.0.0.1:9201/tx/{txid}"
resolve_after = "2s"
resolve_max_interval = "30s"
resolve_expire = "1h"
late_answer_grace = "10s"

[CLAIM]
resolve = "reverse"
reverse_url = "http://127.0.0.1:9202/tx/{txid}/reverse"
late_answer_grace = 0
`)
	targets, err := Load(path, flagDefaults, defaultPair)
	require.NoError(t, err)

	core := byName(t, targets, "CORE")
	policy, err := core.ResolvePolicy(*core.Settings)
	require.NoError(t, err)
	assert.Equal(t, resolver.PolicyLookup, policy, "lookup by default with a status_url")
	assert.Equal(t, resolver.Target{Policy: resolver.PolicyLookup, ResolveAfter: 2 * time.Second, MaxInterval: 30 * time.Second, Expire: time.Hour},
		core.Settings.ResolveTarget(policy))
	assert.Equal(t, 10*time.Second, core.Settings.LateGrace())

	claim := byName(t, targets, "CLAIM")
	policy, err = claim.ResolvePolicy(*claim.Settings)
	require.NoError(t, err)
	assert.Equal(t, resolver.PolicyReverse, policy)
	assert.Equal(t, "http://127.0.0.1:9202/tx/{txid}/reverse", claim.ReverseURL)
	assert.Equal(t, resolver.Target{Policy: resolver.PolicyReverse, ResolveAfter: 5 * time.Second, MaxInterval: time.Minute, Expire: 24 * time.Hour},
		claim.Settings.ResolveTarget(policy), "the defaults where the file and the flags say nothing")
	assert.Zero(t, claim.Settings.LateGrace(), "0 turns late reading off")
}

func TestLoadResolveDefaults(t *testing.T) {
	defaults := flagDefaults
	defaults.ResolveAfter, defaults.ResolveMaxInterval, defaults.ResolveExpire = time.Second, 10*time.Second, time.Minute
	targets, err := Load(writeConfig(t, "[CORE]\nresolve_after = \"3s\"\n"), defaults, defaultPair)
	require.NoError(t, err)
	core, claim := byName(t, targets, "CORE"), byName(t, targets, "CLAIM")
	policy, err := claim.ResolvePolicy(*claim.Settings)
	require.NoError(t, err)
	assert.Equal(t, resolver.PolicyManual, policy, "manual by default without a status_url")
	assert.Equal(t, 3*time.Second, core.Settings.ResolveAfter)
	assert.Equal(t, 10*time.Second, core.Settings.ResolveMaxInterval, "the flag's value where the file says nothing")
	assert.Equal(t, time.Second, claim.Settings.ResolveAfter)
	assert.Equal(t, relay.DefaultLateAnswerGrace, claim.Settings.LateGrace())
}

func TestLoadResolveRejects(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"unknown policy", "[CORE]\nresolve = \"ask\"\n", `[CORE] resolve: want "lookup", "reverse" or "manual", got "ask"`},
		{"policy not a string", "[CORE]\nresolve = true\n", "[CORE] resolve: want a string, got true"},
		{"lookup without a status_url", "[CORE]\nresolve = \"lookup\"\n", `[CORE] resolve: "lookup" needs status_url`},
		{"reverse without a reverse_url", "[CORE]\nresolve = \"reverse\"\n", `[CORE] resolve: "reverse" needs reverse_url`},
		{"reverse_url without {txid}", "[CORE]\nreverse_url = \"http://127.0.0.1:9201/reverse\"\n", "[CORE] reverse_url: \"http://127.0.0.1:9201/reverse\": want {txid} once"},
		{"reverse_url with {txid} twice", "[CORE]\nreverse_url = \"http://h/{txid}/{txid}\"\n", "[CORE] reverse_url: \"http://h/{txid}/{txid}\": {txid} appears 2 times; want it once"},
		{"reverse_url not http", "[CORE]\nreverse_url = \"ftp://h/{txid}\"\n", "[CORE] reverse_url: \"ftp://h/{txid}\": want http:// or https:// with a host"},
		{"zero resolve_after", "[CORE]\nresolve_after = 0\n", "[CORE] resolve_after: must be more than zero"},
		{"bad resolve_expire", "[CORE]\nresolve_expire = \"a day\"\n", "[CORE] resolve_expire:"},
		{"negative late_answer_grace", "[CORE]\nlate_answer_grace = \"-1s\"\n", "[CORE] late_answer_grace:"},
		{"misspelt key", "[CORE]\nresolve_afer = \"1s\"\n", "[CORE] resolve_afer: unknown key (did you mean resolve_after?)"},
		{"misspelt grace", "[CORE]\nlate_answer_grac = \"1s\"\n", "[CORE] late_answer_grac: unknown key (did you mean late_answer_grace?)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(writeConfig(t, tt.body), flagDefaults, defaultPair)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
