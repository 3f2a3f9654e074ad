package loadgen

import (
	"bytes"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
	"github.com/relayhub/relayhub/internal/testutil/fakerelay"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
)

// tlsHub serves a real hub over mutual TLS on loopback and returns its
// address and a client configuration it accepts.
func tlsHub(t *testing.T) (string, *tls.Config) {
	ca := certtest.NewCA(t, "hub CA")
	server := ca.Server(t)
	srv, err := relay.New(relay.Config{
		Targets: []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:1"}},
		TLS: &relay.TLSConfig{
			Certificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &server.TLS, nil },
			ClientCAs:   ca.Pool,
		},
	})
	require.NoError(t, err)
	return hubtest.Serve(t, srv, relay.ErrServerClosed), ca.ClientConfig(ca.Client(t, "bench"))
}

func TestLoadOverTLS(t *testing.T) {
	addr, client := tlsHub(t)
	mix, err := ParseMix("NONE")
	require.NoError(t, err)
	g, err := New(Config{Addr: addr, Conns: 4, Depth: 8, Requests: 400, Mix: mix, Payloads: []Template{{}}, Drain: 5 * time.Second, TLS: client})
	require.NoError(t, err)
	res, err := g.Run(t.Context())
	require.NoError(t, err)
	sum := g.Summary(res)
	assert.Empty(t, sum.Problems())
	assert.Equal(t, int64(400), sum.Answered)
	assert.Equal(t, map[string]int64{"E903": 400}, sum.Codes)
}

func TestIdleOverTLS(t *testing.T) {
	addr, client := tlsHub(t)
	sum, err := runIdle(t, IdleConfig{Addr: addr, Conns: 5, Hold: time.Millisecond, Warm: true, TLS: client})
	require.NoError(t, err)
	assert.Equal(t, 5, sum.Opened)
	assert.Equal(t, 5, sum.Answered)
}

func TestIdleOverTLSRefused(t *testing.T) {
	addr, _ := tlsHub(t)
	other := certtest.NewCA(t, "not the hub's CA")
	_, err := runIdle(t, IdleConfig{Addr: addr, Conns: 2, TLS: other.ClientConfig(nil)})
	assert.ErrorIs(t, err, ErrDialAll, "a hub the client does not trust is not connected to")
}

func TestConnectProbe(t *testing.T) {
	addr, client := tlsHub(t)
	plain := fakerelay.New(t, fakerelay.Config{}).Addr
	tests := []struct {
		name        string
		cfg         ConnectConfig
		wantResumed bool
	}{
		{"plain TCP", ConnectConfig{Addr: plain}, false},
		{"full TLS handshakes", ConnectConfig{Addr: addr, TLS: client}, false},
		{"resumed TLS sessions", ConnectConfig{Addr: addr, TLS: client, Resume: true}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Workers, tt.cfg.Duration = 2, 150*time.Millisecond
			p, err := NewConnectProbe(tt.cfg)
			require.NoError(t, err)
			sum, err := p.Run(t.Context())
			require.NoError(t, err)
			assert.Empty(t, sum.Problems(), sum.ErrorSamples)
			require.Positive(t, sum.Connections)
			assert.Positive(t, sum.PerSecond)
			assert.Positive(t, sum.LatencyUS.P50)
			if tt.wantResumed {
				// Each worker's first connection is a full handshake.
				assert.Equal(t, sum.Connections-2, sum.Resumed)
			} else {
				assert.Zero(t, sum.Resumed)
			}
			var text, js bytes.Buffer
			require.NoError(t, sum.WriteText(&text))
			require.NoError(t, sum.WriteJSON(&js))
			assert.Contains(t, text.String(), "connections")
			assert.Contains(t, js.String(), `"per_second"`)
		})
	}
}

func TestNewConnectProbe(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  ConnectConfig
		want string
	}{
		{"no duration", ConnectConfig{Addr: "x:1"}, "Duration"},
		{"too many workers", ConnectConfig{Addr: "x:1", Duration: time.Second, Workers: MaxConns + 1}, "Workers"},
		{"resume without TLS", ConnectConfig{Addr: "x:1", Duration: time.Second, Resume: true}, "Resume needs TLS"},
		{"bad pid", ConnectConfig{Addr: "x:1", Duration: time.Second, ServerPIDs: []int{0}}, "not a process id"},
	} {
		_, err := NewConnectProbe(tt.cfg)
		assert.ErrorContains(t, err, tt.want, tt.name)
	}
}

func TestTLSFlags(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "CA")
	caFile := ca.WriteFile(t, dir, "ca")
	cert, key := ca.Client(t, "ops").WriteFiles(t, dir, "ops")

	cfg, err := (&TLSFlags{}).ClientConfig()
	require.NoError(t, err)
	assert.Nil(t, cfg, "no flag, no TLS")

	cfg, err = (&TLSFlags{CA: caFile}).ClientConfig()
	require.NoError(t, err)
	require.NotNil(t, cfg, "--ca turns TLS on")
	assert.NotNil(t, cfg.RootCAs)

	cfg, err = (&TLSFlags{TLS: true, Cert: cert, Key: key, ServerName: "hub"}).ClientConfig()
	require.NoError(t, err)
	assert.Len(t, cfg.Certificates, 1)
	assert.Equal(t, "hub", cfg.ServerName)

	_, err = (&TLSFlags{Cert: cert}).ClientConfig()
	assert.ErrorContains(t, err, "--cert and --key")
	_, err = (&TLSFlags{CA: key}).ClientConfig()
	assert.ErrorContains(t, err, "--ca, --cert, --key")
}
