package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/relay/resolver"
)

func TestNewRejectsBadResolveSettings(t *testing.T) {
	good := Target{Name: "CORE", URL: "http://127.0.0.1:9201"}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "negative resolve after", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{ResolveAfter: -time.Second}}, want: "ResolveAfter must not be negative"},
		{name: "negative max interval", cfg: Config{Targets: []Target{{Name: "core", URL: good.URL, Settings: &TargetSettings{ResolveMaxInterval: -1}}}}, want: "target CORE: ResolveMaxInterval must not be negative"},
		{name: "negative expire", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{ResolveExpire: -1}}, want: "ResolveExpire must not be negative"},
		{name: "negative grace", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{LateAnswerGrace: -1}}, want: "LateAnswerGrace must not be negative"},
		{name: "unknown policy", cfg: Config{Targets: []Target{good}, TargetSettings: TargetSettings{Resolve: "ask"}}, want: `resolve policy "ask": want lookup, reverse or manual`},
		{name: "reverse URL without {txid}", cfg: Config{Targets: []Target{{Name: "CORE", URL: good.URL, ReverseURL: "http://127.0.0.1:9201/reverse"}}}, want: "target CORE: reverse URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, err := New(tt.cfg)
			require.Error(t, err)
			assert.Nil(t, srv)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestTargetResolvePolicy(t *testing.T) {
	status := "http://127.0.0.1:9201/tx/{txid}"
	reverse := "http://127.0.0.1:9201/tx/{txid}/reverse"
	tests := []struct {
		name   string
		target Target
		policy resolver.Policy
		want   resolver.Policy
		err    string
	}{
		{name: "lookup by default with a status URL", target: Target{Name: "CORE", StatusURL: status}, want: resolver.PolicyLookup},
		{name: "manual by default without", target: Target{Name: "CORE"}, want: resolver.PolicyManual},
		{name: "manual chosen", target: Target{Name: "CORE", StatusURL: status}, policy: resolver.PolicyManual, want: resolver.PolicyManual},
		{name: "reverse", target: Target{Name: "CORE", ReverseURL: reverse}, policy: resolver.PolicyReverse, want: resolver.PolicyReverse},
		{name: "reverse without a reverse URL", target: Target{Name: "CORE", StatusURL: status}, policy: resolver.PolicyReverse, err: "target CORE: resolve reverse needs a reverse URL"},
		{name: "lookup without a status URL", target: Target{Name: "CORE"}, policy: resolver.PolicyLookup, err: "target CORE: resolve lookup needs a status URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.target.ResolvePolicy(TargetSettings{Resolve: tt.policy})
			if tt.err != "" {
				assert.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestResolveDefaults(t *testing.T) {
	var ts TargetSettings
	assert.Equal(t, resolver.Target{Policy: resolver.PolicyLookup, ResolveAfter: 5 * time.Second, MaxInterval: time.Minute, Expire: 24 * time.Hour},
		ts.ResolveTarget(resolver.PolicyLookup))
	assert.Equal(t, 30*time.Second, ts.LateGrace())
	ts.LateAnswerGrace = 2 * time.Second
	assert.Equal(t, 2*time.Second, ts.LateGrace())
	ts.NoLateAnswer = true
	assert.Zero(t, ts.LateGrace())
}
