package relay

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// tlsHub is a hub serving TLS with mutual TLS, with the CA of its clients
// and its own certificate swappable as a reload swaps them.
type tlsHub struct {
	ca       *certtest.CA // signs the hub's certificate and the clients'
	cert     atomic.Pointer[tls.Certificate]
	pool     atomic.Pointer[x509.CertPool]
	reg      *prometheus.Registry
	srv      *Server
	addr     string
	clientCA bool
}

// newTLSHub returns the TLS side of a hub: a CA, a server certificate for
// loopback and, with clientCA, mutual TLS against that CA.
func newTLSHub(t *testing.T, clientCA bool) *tlsHub {
	h := &tlsHub{ca: certtest.NewCA(t, "hub CA"), reg: prometheus.NewRegistry(), clientCA: clientCA}
	h.cert.Store(&h.ca.Server(t).TLS)
	h.pool.Store(h.ca.Pool())
	return h
}

// config returns the TLSConfig of h with the given handshake timeout.
func (h *tlsHub) config(timeout time.Duration) *TLSConfig {
	cfg := &TLSConfig{
		Certificate:      func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return h.cert.Load(), nil },
		HandshakeTimeout: timeout,
	}
	if h.clientCA {
		cfg.ClientCAs = h.pool.Load
	}
	return cfg
}

// start serves cfg over TLS with h's material.
func (h *tlsHub) start(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.TLS == nil {
		cfg.TLS = h.config(0)
	}
	m, err := NewMetrics(h.reg)
	require.NoError(t, err)
	cfg.Metrics = m
	h.srv, h.addr = startServer(t, cfg)
}

// dial connects a client presenting cert (none when nil) that trusts h's
// CA.
func (h *tlsHub) dial(t *testing.T, cert *certtest.Cert) *hubtest.Client {
	t.Helper()
	return hubtest.DialTLS(t, h.addr, h.ca.ClientConfig(cert))
}

// failures returns the count of handshake failures for reason.
func (h *tlsHub) failures(t *testing.T, reason string) float64 {
	return hubtest.MetricValue(t, h.reg, metricTLSHandshakeFailures, labelReason, reason)
}

func TestTLSAllowedClientsPerTarget(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	claim := hubtest.NewTarget(t, hubtest.Echo)
	open := hubtest.NewTarget(t, hubtest.Echo)
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t,
		Target{Name: "CORE", URL: core.URL, AllowedClients: []string{"branch-*"}},
		Target{Name: "CLAIM", URL: claim.URL, AllowedClients: []string{"spiffe://bank/partner-acme", "claims.partner.example"}},
		Target{Name: "OPEN", URL: open.URL},
	)
	h.start(t, cfg)

	// Given a branch known by its CN, and a partner known by its URI SAN
	// (its CN would match no pattern).
	branch := h.dial(t, h.ca.Client(t, "branch-7"))
	partner := h.dial(t, h.ca.Issue(t, certtest.Leaf{CommonName: "acme", URIs: []string{"spiffe://bank/partner-acme"}}))
	byDNS := h.dial(t, h.ca.Issue(t, certtest.Leaf{DNSNames: []string{"claims.partner.example"}}))

	// Then each reaches its own targets and every client the open one,
	assert.Equal(t, "B1|0000|got BAL 1", branch.Exchange("B1|core|BAL 1").String())
	assert.Equal(t, "B2|0000|got x", branch.Exchange("B2|OPEN|x").String())
	assert.Equal(t, "P1|0000|got SUBMIT", partner.Exchange("P1|CLAIM|SUBMIT").String())
	assert.Equal(t, "P2|0000|got y", partner.Exchange("P2|OPEN|y").String())
	assert.Equal(t, "D1|0000|got z", byDNS.Exchange("D1|CLAIM|z").String())

	// and any other target's lines get E908, without a call or a breaker
	// record.
	assert.Equal(t, "B3|E908|"+protocol.MsgNotAllowed, branch.Exchange("B3|CLAIM|SUBMIT").String())
	assert.Equal(t, "P3|E908|"+protocol.MsgNotAllowed, partner.Exchange("P3|CORE|WD 1 99").String())
	assert.Equal(t, "D2|E908|"+protocol.MsgNotAllowed, byDNS.Exchange("D2|CORE|x").String())
	assert.Equal(t, "U1|E903|"+protocol.MsgUnknownTarget, partner.Exchange("U1|NOPE|x").String(), "an unknown target is E903 for everyone")
	assert.Equal(t, 1, core.Calls())
	assert.Equal(t, 2, claim.Calls())
	assert.Equal(t, 2.0, hubtest.MetricValue(t, h.reg, metricRequests, labelTarget, "CORE", labelCode, "E908"))
	assert.Equal(t, 1.0, hubtest.MetricValue(t, h.reg, metricRequests, labelTarget, "CLAIM", labelCode, "E908"))
	assert.Equal(t, 0, status(t, h.srv, "CORE").ConsecutiveFailures)
}

func TestTLSAllowedClientsCheckOnlyTheNamedTarget(t *testing.T) {
	dr := hubtest.NewTarget(t, hubtest.Echo)
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t,
		Target{Name: "CORE", URL: "http://127.0.0.1:1", Fallback: "CORE_DR", AllowedClients: []string{"branch-*"}},
		Target{Name: "CORE_DR", URL: dr.URL, AllowedClients: []string{"ops"}},
	)
	cfg.FailThreshold = 1
	h.start(t, cfg)
	c := h.dial(t, h.ca.Client(t, "branch-1"))

	// Given CORE's breaker open after one failure,
	require.Contains(t, c.Exchange("T1|CORE|x").String(), "|E902|")
	// its fallback answers for the client of CORE, which may not name
	// CORE_DR itself.
	assert.Equal(t, "T2|0000|via CORE_DR: got x", c.Exchange("T2|CORE|x").String())
	assert.Equal(t, "T3|E908|"+protocol.MsgNotAllowed, c.Exchange("T3|CORE_DR|x").String())
}

func TestTLSHandshakeFailuresAreCountedAndHoldNothing(t *testing.T) {
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.TLS = h.config(200 * time.Millisecond)
	cfg.TLS.MinVersion = tls.VersionTLS13
	h.start(t, cfg)
	other := certtest.NewCA(t, "someone else's CA")

	tests := []struct {
		name   string
		reason string
		client func(t *testing.T) // does its part and checks it was refused
	}{
		{"plain text on the TLS port", "not_tls", func(t *testing.T) {
			c := hubtest.Dial(t, h.addr)
			c.Send("T1|CORE|BAL 1")
			c.ExpectEOF()
		}},
		{"no client certificate", "no_client_cert", func(t *testing.T) {
			h.dial(t, nil).ExpectEOF()
		}},
		{"expired client certificate", "expired", func(t *testing.T) {
			h.dial(t, h.ca.Expired(t, "branch-1")).ExpectEOF()
		}},
		{"client certificate of an unknown CA", "unknown_ca", func(t *testing.T) {
			cfg := h.ca.ClientConfig(nil)
			cfg.Certificates = []tls.Certificate{other.Client(t, "branch-1").TLS}
			hubtest.DialTLS(t, h.addr, cfg).ExpectEOF()
		}},
		{"certificate not for client authentication", "bad_cert", func(t *testing.T) {
			h.dial(t, h.ca.Issue(t, certtest.Leaf{CommonName: "branch-1", Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})).ExpectEOF()
		}},
		{"stalled handshake", "timeout", func(t *testing.T) {
			c := hubtest.Dial(t, h.addr)
			_, err := c.Conn().Write([]byte{0x16, 0x03, 0x01}) // the start of a record header, then nothing
			require.NoError(t, err)
			c.ExpectEOF()
		}},
		{"client gone mid-handshake", "closed", func(t *testing.T) {
			c := hubtest.Dial(t, h.addr)
			_, err := c.Conn().Write([]byte{0x16, 0x03, 0x01, 0x00, 0x40})
			require.NoError(t, err)
			c.Conn().Close()
		}},
		{"client that does not trust the hub", "client_refused", func(t *testing.T) {
			cfg := other.ClientConfig(h.ca.Client(t, "branch-1"))
			_, err := tls.Dial("tcp", h.addr, cfg)
			var unknown x509.UnknownAuthorityError
			require.ErrorAs(t, err, &unknown)
		}},
		{"no common version", "protocol", func(t *testing.T) {
			cfg := h.ca.ClientConfig(h.ca.Client(t, "branch-1"))
			cfg.MaxVersion = tls.VersionTLS12
			_, err := tls.Dial("tcp", h.addr, cfg)
			require.Error(t, err)
		}},
	}
	good := h.ca.Client(t, "branch-1")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.failures(t, tt.reason)
			tt.client(t)
			hubtest.Eventually(t, func() bool { return h.failures(t, tt.reason) == before+1 }, "failure not counted as "+tt.reason)
			hubtest.Eventually(t, func() bool { return h.srv.ConnectionsOpen() == 0 }, "the refused connection still holds its slot")
			// The hub goes on serving others.
			assert.Equal(t, "G|E903|"+protocol.MsgUnknownTarget, h.dial(t, good).Exchange("G|NONE|x").String())
		})
	}
	total := 0.0
	for _, name := range tlsFailureNames {
		total += h.failures(t, name)
	}
	assert.Equal(t, float64(len(tests)), total, "each refusal counted once, under one reason")
}

func TestTLSConnectionCountsAgainstMaxConnsFromAccept(t *testing.T) {
	h := newTLSHub(t, false)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	cfg.MaxConns = 1
	cfg.TLS = h.config(300 * time.Millisecond)
	h.start(t, cfg)

	// Given a connection that never starts its handshake,
	stall := hubtest.Dial(t, h.addr)
	hubtest.Eventually(t, func() bool { return h.srv.ConnectionsOpen() == 1 }, "a stalled handshake is not counted")
	// a TLS client is turned away with E906 in TLS, which it can read,
	turned := h.dial(t, nil)
	assert.Equal(t, "-|E906|too many connections", turned.ReadResponse().String())
	turned.ExpectEOF()
	// until the stall's handshake times out and frees the slot.
	stall.ExpectEOF()
	hubtest.Eventually(t, func() bool {
		c := h.dial(t, nil)
		c.Send("A|NONE|x")
		return c.ReadResponse().String() == "A|E903|"+protocol.MsgUnknownTarget
	}, "the slot of the stalled handshake was never freed")
	assert.Equal(t, 1.0, h.failures(t, "timeout"))
}

func TestTLSNewMaterialForNewHandshakesOnly(t *testing.T) {
	target := hubtest.NewTarget(t, hubtest.Echo)
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: target.URL})
	h.start(t, cfg)

	// Given a client connected with a certificate of the first CA,
	oldClient := h.ca.Client(t, "branch-1")
	resuming := h.ca.ClientConfig(oldClient)
	resuming.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	kept := hubtest.DialTLS(t, h.addr, resuming)
	require.Equal(t, "K1|0000|got x", kept.Exchange("K1|CORE|x").String())

	// when the hub's certificate and its client CA are replaced by those
	// of a new CA,
	next := certtest.NewCA(t, "next CA")
	h.cert.Store(&next.Server(t).TLS)
	h.pool.Store(next.Pool())

	// then the client connected before keeps being served,
	assert.Equal(t, "K2|0000|got y", kept.Exchange("K2|CORE|y").String())
	// a new client of the new CA sees the new certificate,
	fresh := hubtest.DialTLS(t, h.addr, next.ClientConfig(next.Client(t, "branch-2")))
	assert.Equal(t, "F1|0000|got z", fresh.Exchange("F1|CORE|z").String())
	// and a certificate of the CA taken out is refused, even to a client
	// that resumes the session it had.
	resuming.RootCAs = next.Pool()
	again := hubtest.DialTLS(t, h.addr, resuming)
	again.ExpectEOF()
	// The hub sends its alert before it counts the refusal.
	hubtest.Eventually(t, func() bool { return h.failures(t, "unknown_ca") == 1 }, "refusal not counted as unknown_ca")
}

func TestTLSResumedHandshakesAreCounted(t *testing.T) {
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: "http://127.0.0.1:1"})
	h.start(t, cfg)
	client := h.ca.ClientConfig(h.ca.Client(t, "branch-1"))
	client.ClientSessionCache = tls.NewLRUClientSessionCache(4)

	for i := range 3 {
		c := hubtest.DialTLS(t, h.addr, client)
		// A round trip takes in the session ticket the hub sends after
		// the handshake.
		require.Equal(t, "A|E903|"+protocol.MsgUnknownTarget, c.Exchange("A|NONE|x").String())
		state := c.Conn().(*tls.Conn).ConnectionState()
		assert.Equal(t, i > 0, state.DidResume, "connection %d", i)
		c.Conn().Close()
	}
	assert.Equal(t, 1.0, hubtest.MetricValue(t, h.reg, metricTLSHandshakes, labelResumed, "false"))
	assert.Equal(t, 2.0, hubtest.MetricValue(t, h.reg, metricTLSHandshakes, labelResumed, "true"))
}

func TestTLSShutdownDrainsAndClosesCleanly(t *testing.T) {
	target := hubtest.NewTarget(t, nil)
	target.Set(target.BlockThen(hubtest.Echo))
	h := newTLSHub(t, false)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: target.URL})
	h.start(t, cfg)
	c := h.dial(t, nil)

	// Given a call in flight over TLS,
	c.Send("T1|CORE|x")
	target.WaitEntered(t, 1)
	// when the hub shuts down, a line read after that gets E906,
	done := hubtest.ShutdownAsync(h.srv, hubtest.IOTimeout)
	hubtest.Eventually(t, h.srv.Draining, "shutdown did not begin")
	c.Send("T2|CORE|y")
	assert.Equal(t, "T2|E906|"+protocol.MsgShuttingDown, c.ReadResponse().String())
	// the call in flight is answered, and the connection ends with a
	// TLS close, not a reset.
	target.UnblockAll()
	assert.Equal(t, "T1|0000|got x", c.ReadResponse().String())
	_, err := c.ReadLine(hubtest.ClientTimeout)
	assert.ErrorIs(t, err, io.EOF)
	require.NoError(t, <-done)
}

func TestNewRefusesTLSItCannotServe(t *testing.T) {
	plain := TLSConfig{Certificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, errors.New("none") }}
	mutual := plain
	mutual.ClientCAs = x509.NewCertPool
	tests := []struct {
		name string
		tls  *TLSConfig
		t    Target
		want string
	}{
		{"allowed clients without TLS", nil, Target{Name: "CORE", URL: "http://h", AllowedClients: []string{"a"}}, "AllowedClients need TLS with ClientCAs"},
		{"allowed clients without client CAs", &plain, Target{Name: "CORE", URL: "http://h", AllowedClients: []string{"a"}}, "AllowedClients need TLS with ClientCAs"},
		{"an empty pattern", &mutual, Target{Name: "CORE", URL: "http://h", AllowedClients: []string{"a", ""}}, "empty pattern"},
		{"TLS settings for an http target", nil, Target{Name: "CORE", URL: "http://h", TLS: &tls.Config{}}, "TLS settings need an https:// URL"},
		{"no certificate", &TLSConfig{}, Target{Name: "CORE", URL: "http://h"}, "TLS needs a Certificate"},
		{"TLS 1.1", &TLSConfig{Certificate: plain.Certificate, MinVersion: tls.VersionTLS11}, Target{Name: "CORE", URL: "http://h"}, "want TLS 1.2 or 1.3"},
		{"negative handshake timeout", &TLSConfig{Certificate: plain.Certificate, HandshakeTimeout: -1}, Target{Name: "CORE", URL: "http://h"}, "HandshakeTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Targets: []Target{tt.t}, TLS: tt.tls})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestClassifyHandshake(t *testing.T) {
	tests := []struct {
		err  error
		want tlsFailure
	}{
		{errNoClientCert, tlsNoClientCert},
		{io.EOF, tlsClosed},
		{&net.OpError{Op: "read", Err: io.ErrUnexpectedEOF}, tlsClosed},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}, tlsClientRefused},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, tlsNotTLS},
		{errors.New("tls: client offered only unsupported versions"), tlsProtocol},
	}
	for _, tt := range tests {
		assert.Equal(t, tlsFailureNames[tt.want], tlsFailureNames[classifyHandshake(tt.err)], "%v", tt.err)
	}
}

func TestIdleTLSConnectionHoldsNoReadBuffer(t *testing.T) {
	srv := lineServer(t, DefaultMaxLineBytes)
	ca := certtest.NewCA(t, "CA")
	server := ca.Server(t)
	nc, raw := tcpPair(t)
	tc := tls.Server(nc, &tls.Config{Certificates: []tls.Certificate{server.TLS}})
	clientConfig := ca.ClientConfig(nil)
	clientConfig.ServerName = "localhost"
	client := tls.Client(raw, clientConfig)
	handshook := make(chan error, 1)
	go func() { handshook <- client.Handshake() }()
	c := newConn(srv, tc)
	srv.tls = &tlsServer{timeout: hubtest.IOTimeout}
	require.True(t, c.handshake())
	require.NoError(t, <-handshook)

	// Lines are read whole, the first byte of each burst included,
	_, err := io.WriteString(client, "A|CORE|1\nB|CORE|2\nC|CO")
	require.NoError(t, err)
	assert.Equal(t, []string{"A|CORE|1", "B|CORE|2"}, readLines(t, c, 2))
	_, err = io.WriteString(client, "RE|3\n")
	require.NoError(t, err)
	assert.Equal(t, []string{"C|CORE|3"}, readLines(t, c, 1), "a partial line waits in a buffer for its end")
	// and a connection waiting with nothing begun holds no buffer.
	waitForInput(t, c)
	assertHoldsNoInput(t, c)
	_, err = io.WriteString(client, "D|CORE|4\n")
	require.NoError(t, err)
	assert.Equal(t, []string{"D|CORE|4"}, readLines(t, c, 1))
}

func TestReloadChangesAllowedClientsOfOpenConnections(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	h := newTLSHub(t, true)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL, AllowedClients: []string{"branch-*"}})
	h.start(t, cfg)
	branch := h.dial(t, h.ca.Client(t, "branch-7"))
	partner := h.dial(t, h.ca.Client(t, "partner-acme"))
	assert.Equal(t, "B1|0000|got x", branch.Exchange("B1|CORE|x").String())
	assert.Equal(t, "P1|E908|"+protocol.MsgNotAllowed, partner.Exchange("P1|CORE|x").String())

	// When a reload gives CORE to the partners instead,
	res, err := h.srv.Reload([]Target{{Name: "CORE", URL: core.URL, AllowedClients: []string{"partner-*"}}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{Changed: []string{"CORE"}}, res)
	// then the connections already open follow it from their next line,
	assert.Equal(t, "B2|E908|"+protocol.MsgNotAllowed, branch.Exchange("B2|CORE|x").String())
	assert.Equal(t, "P2|0000|got x", partner.Exchange("P2|CORE|x").String())

	// and a reload that drops the restriction opens CORE to both.
	res, err = h.srv.Reload([]Target{{Name: "CORE", URL: core.URL}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{Changed: []string{"CORE"}}, res)
	assert.Equal(t, "B3|0000|got x", branch.Exchange("B3|CORE|x").String())
	assert.Equal(t, "P3|0000|got x", partner.Exchange("P3|CORE|x").String())
	assert.Equal(t, 4, core.Calls())
	assert.Equal(t, 2.0, hubtest.MetricValue(t, h.reg, metricRequests, labelTarget, "CORE", labelCode, "E908"))
}

func TestReloadRefusesTLSSettingsItCannotServe(t *testing.T) {
	core := hubtest.NewTarget(t, hubtest.Echo)
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: core.URL})
	srv, addr := startServer(t, cfg)

	_, err := srv.Reload([]Target{{Name: "CORE", URL: core.URL, AllowedClients: []string{"branch-*"}}})
	assert.EqualError(t, err, "relay: target CORE: AllowedClients need TLS with ClientCAs: without a verified client certificate there is no identity to match")
	_, err = srv.Reload([]Target{{Name: "CORE", URL: core.URL, TLS: &tls.Config{ServerName: "core"}}})
	assert.EqualError(t, err, fmt.Sprintf("relay: target CORE: TLS settings need an https:// URL, got %q", core.URL))
	assert.Equal(t, "T1|0000|got x", hubtest.Dial(t, addr).Exchange("T1|CORE|x").String(), "a refused reload changes nothing")
}

func TestReloadReadsTargetTLSAgain(t *testing.T) {
	// Given an https target with a private CA that wants the hub's client
	// certificate and answers with its CN,
	ca := certtest.NewCA(t, "back-end CA")
	target := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{"code":"0000","message":"hello `+r.TLS.PeerCertificates[0].Subject.CommonName+`"}`)
	}))
	target.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server(t).TLS}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	target.StartTLS()
	t.Cleanup(target.Close)
	first := ca.Client(t, "relayhub-1")
	cfg, _ := testConfig(t, Target{Name: "CORE", URL: target.URL, TLS: ca.ClientConfig(first)})
	reg := withMetrics(t, &cfg)
	srv, addr := startServer(t, cfg)
	c := hubtest.Dial(t, addr)
	assert.Equal(t, "T1|0000|hello relayhub-1", c.Exchange("T1|CORE|x").String())
	opened := func() float64 { return hubtest.MetricValue(t, reg, metricConnsOpened, labelTarget, "CORE") }
	require.Equal(t, 1.0, opened())

	// When a reload reads the same files again, nothing changes and the
	// pooled connection is used on;
	res, err := srv.Reload([]Target{{Name: "CORE", URL: target.URL, TLS: ca.ClientConfig(first)}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{}, res)
	assert.Equal(t, "T2|0000|hello relayhub-1", c.Exchange("T2|CORE|x").String())
	assert.Equal(t, 1.0, opened())

	// when it reads a rotated client certificate, CORE changed and its
	// next call goes on a new connection with it.
	res, err = srv.Reload([]Target{{Name: "CORE", URL: target.URL, TLS: ca.ClientConfig(ca.Client(t, "relayhub-2"))}})
	require.NoError(t, err)
	assert.Equal(t, ReloadResult{Changed: []string{"CORE"}}, res)
	assert.Equal(t, "T3|0000|hello relayhub-2", c.Exchange("T3|CORE|x").String())
	assert.Equal(t, 2.0, opened())
}

func TestSameTargetTLS(t *testing.T) {
	ca, other := certtest.NewCA(t, "CA"), certtest.NewCA(t, "other CA")
	cert := ca.Client(t, "relayhub")
	base := func() *tls.Config { return ca.ClientConfig(cert) }
	with := func(change func(*tls.Config)) *tls.Config { c := base(); change(c); return c }
	tests := []struct {
		name string
		a, b *tls.Config
		same bool
	}{
		{"both nil", nil, nil, true},
		{"one nil", base(), nil, false},
		{"built twice alike", base(), base(), true},
		{"another server name", base(), with(func(c *tls.Config) { c.ServerName = "core" }), false},
		{"no verification", base(), with(func(c *tls.Config) { c.InsecureSkipVerify = true }), false},
		{"another CA", base(), with(func(c *tls.Config) { c.RootCAs = other.Pool() }), false},
		{"another client certificate", base(), ca.ClientConfig(ca.Client(t, "relayhub")), false},
		{"no client certificate", base(), ca.ClientConfig(nil), false},
		{"another oldest version", base(), with(func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.same, sameTargetTLS(tt.a, tt.b))
			assert.Equal(t, tt.same, sameTargetTLS(tt.b, tt.a))
		})
	}
}
