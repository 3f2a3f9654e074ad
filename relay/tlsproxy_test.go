package relay

import (
	"crypto/tls"
	"net"
	"net/netip"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/logtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// proxiedTLSHub serves CORE (echoing, allowed to the clients branch-*)
// over mutual TLS behind PROXY headers from 127.0.0.1 under mode, with an
// access log and a captured log; maxConns 0 is the default.
func proxiedTLSHub(t *testing.T, mode ProxyProtocol, maxConns int) (h *tlsHub, access, logs *logtest.Buffer) {
	t.Helper()
	core := hubtest.NewTarget(t, hubtest.Echo)
	h = newTLSHub(t, true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, AllowedClients: []string{"branch-*"}})
	access, logs = &logtest.Buffer{}, &logtest.Buffer{}
	cfg.AccessLog = access
	cfg.Logger = zerolog.New(logs).Level(zerolog.DebugLevel)
	cfg.ProxyProtocol, cfg.ProxyTrusted = mode, []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	cfg.MaxConns = maxConns
	h.start(t, cfg)
	return h, access, logs
}

// clientConfig returns the TLS configuration of a client presenting a
// certificate for cn, for a handshake over a connection already open.
func (h *tlsHub) clientConfig(t *testing.T, cn string) *tls.Config {
	cfg := h.ca.ClientConfig(h.ca.Client(t, cn))
	cfg.ServerName = "127.0.0.1"
	return cfg
}

func TestTLSAfterProxyHeader(t *testing.T) {
	// Given a hub with mutual TLS that requires PROXY headers from
	// 127.0.0.1,
	h, access, logs := proxiedTLSHub(t, ProxyRequired, 0)

	// when a balancer's connection opens with the header and the client's
	// handshake follows it,
	branch := hubtest.DialTLSAfter(t, h.addr, proxyHeader(t, 2, "203.0.113.7:51234", h.addr), h.clientConfig(t, "branch-7"))
	partner := hubtest.DialTLSAfter(t, h.addr, proxyHeader(t, 1, "203.0.113.8:40000", h.addr), h.clientConfig(t, "partner-acme"))

	// then each client is served under its certificate's identity,
	assert.Equal(t, "T1|0000|got a", branch.Exchange("T1|CORE|a").String())
	assert.Equal(t, "T2|E908|"+protocol.MsgNotAllowed, partner.Exchange("T2|CORE|b").String())
	branch.Conn().Close()
	partner.Conn().Close()

	// and the logs name the address its header gave.
	byTxID := map[string]any{}
	for _, l := range accessLines(t, h.srv, access) {
		byTxID[l["txid"].(string)] = l["client"]
	}
	assert.Equal(t, map[string]any{"T1": "203.0.113.7:51234", "T2": "203.0.113.8:40000"}, byTxID)
	done := logs.Messages(t, "tls handshake done")
	require.Len(t, done, 2)
	assert.ElementsMatch(t, []any{"203.0.113.7:51234", "203.0.113.8:40000"}, []any{done[0]["remote"], done[1]["remote"]})
	refused := logs.Messages(t, "request refused: client not allowed to use target")
	require.Len(t, refused, 1)
	assert.Equal(t, "203.0.113.8:40000", refused[0]["remote"])
	assert.Equal(t, []any{"partner-acme"}, refused[0]["client"])
	for _, reason := range tlsFailureNames {
		assert.Zero(t, h.failures(t, reason), reason)
	}
}

func TestTLSProxyRules(t *testing.T) {
	t.Run("optional, trusted, no header: the handshake is the first input", func(t *testing.T) {
		h, _, logs := proxiedTLSHub(t, ProxyOptional, 0)
		c := h.dial(t, h.ca.Client(t, "branch-1"))
		assert.Equal(t, "T1|0000|got a", c.Exchange("T1|CORE|a").String())
		assert.Empty(t, logs.Messages(t, "connection refused"))
	})
	t.Run("required, trusted, no header: refused before any handshake", func(t *testing.T) {
		h, _, logs := proxiedTLSHub(t, ProxyRequired, 0)
		// The hub closes the connection before it answers the client's
		// hello.
		_, err := tls.DialWithDialer(&net.Dialer{Timeout: hubtest.IOTimeout}, "tcp", h.addr, h.clientConfig(t, "branch-1"))
		require.Error(t, err)
		refused := logs.Messages(t, "connection refused")
		require.Len(t, refused, 1)
		assert.Equal(t, "no PROXY header", refused[0]["reason"])
		assert.Empty(t, logs.Messages(t, "tls handshake done"))
		assert.Zero(t, h.failures(t, "not_tls"), "a refused connection never reaches its handshake")
	})
	t.Run("over MaxConns: the header is skipped and E906 told in TLS", func(t *testing.T) {
		h, _, _ := proxiedTLSHub(t, ProxyRequired, 1)
		held := hubtest.DialTLSAfter(t, h.addr, proxyHeader(t, 2, "203.0.113.7:51234", h.addr), h.clientConfig(t, "branch-1"))
		assert.Equal(t, "T1|0000|got a", held.Exchange("T1|CORE|a").String())
		turned := hubtest.DialTLSAfter(t, h.addr, proxyHeader(t, 2, "203.0.113.9:51234", h.addr), h.clientConfig(t, "branch-2"))
		assert.Equal(t, "-|E906|too many connections", turned.ReadResponse().String())
		turned.ExpectEOF()
		assert.Zero(t, h.failures(t, "not_tls"))
	})
}
