package main_test

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/internal/testutil/proctest"
)

// These tests run the real relay, fixture and relayctl binaries with TLS
// on both sides of the hub (docs/OPERATING.md, "TLS"): channel systems
// with client certificates in front, https targets behind a private CA
// that want the hub's own client certificate.

// pki is the certificates of a test, written into dir: the bank's CA,
// which signs the hub's certificate and the channel systems', and the
// back end's CA, which signs the targets' certificates and the one the hub
// presents to them.
type pki struct {
	dir      string
	bank     *certtest.CA
	backend  *certtest.CA
	bankCA   string // file of the bank's CA
	hubCert  string // the hub's certificate and key, from the bank's CA
	hubKey   string
	backCA   string // file of the back end's CA
	toTarget [2]string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir(), bank: certtest.NewCA(t, "bank CA"), backend: certtest.NewCA(t, "back-end CA")}
	p.bankCA = p.bank.WriteFile(t, p.dir, "bank-ca")
	p.hubCert, p.hubKey = p.bank.Server(t).WriteFiles(t, p.dir, "hub")
	p.backCA = p.backend.WriteFile(t, p.dir, "backend-ca")
	p.toTarget[0], p.toTarget[1] = p.backend.Client(t, "relayhub").WriteFiles(t, p.dir, "relayhub-client")
	return p
}

// hubArgs are the relay's TLS flags: the hub's certificate, and mutual
// TLS with the bank's CA.
func (p *pki) hubArgs() []string {
	return []string{"--tls-cert", p.hubCert, "--tls-key", p.hubKey, "--tls-client-ca", p.bankCA}
}

// rotate replaces the hub's certificate and the client CA files with
// those of a new CA, each written the way the relay never reads half of
// one, as a deployment does, and returns the new CA.
func (p *pki) rotate(t *testing.T) *certtest.CA {
	t.Helper()
	next := certtest.NewCA(t, "next bank CA")
	server := next.Server(t)
	certtest.WriteAtomic(t, p.hubCert, server.CertPEM)
	certtest.WriteAtomic(t, p.hubKey, server.KeyPEM)
	certtest.WriteAtomic(t, p.bankCA, next.PEM)
	return next
}

// client returns a client configuration presenting cert that trusts the
// bank's CA.
func (p *pki) client(cert *certtest.Cert) *tls.Config {
	return p.bank.ClientConfig(cert)
}

// startHTTPSFixture starts a fixture serving https with a certificate of
// the back end's CA, requiring a client certificate of it too.
func (p *pki) startHTTPSFixture(t *testing.T, name, kind string) (*proctest.Process, string) {
	t.Helper()
	cert, key := p.backend.Server(t).WriteFiles(t, p.dir, strings.ToLower(name))
	f := proctest.Start(t, proctest.FixturePkg, "--name", name, "--kind", kind, "--listen", "127.0.0.1:0",
		"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", p.backCA)
	return f, "https://" + f.Addr()
}

// fixtureCalls reads a https fixture's call count with a client
// certificate of the back end.
func (p *pki) fixtureCalls(t *testing.T, url string) int64 {
	t.Helper()
	cfg := p.backend.ClientConfig(p.backend.Client(t, "ops"))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := client.Get(url + "/_stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var st proctest.FixtureStats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	return st.Calls
}

// logged counts the relay's log lines with message msg.
func logged(p *proctest.Process, msg string) int {
	n := 0
	for _, l := range p.LogLines() {
		if l["message"] == msg {
			n++
		}
	}
	return n
}

// backendTable is the settings file table of an https target of the back
// end: its CA, the hub's client certificate for it (the files newPKI
// writes, next to the settings file), and the one client pattern allowed.
func backendTable(name, url, allowed string) string {
	return fmt.Sprintf("[%s]\nurl = %q\nca_file = %q\nclient_cert = %q\nclient_key = %q\nallowed_clients = [%q]\n",
		name, url, "backend-ca.pem", "relayhub-client.crt", "relayhub-client.key", allowed)
}

func TestTLSClientToHubToHTTPSTargetsWithIdentities(t *testing.T) {
	p := newPKI(t)
	_, coreURL := p.startHTTPSFixture(t, "CORE", "core")
	_, claimURL := p.startHTTPSFixture(t, "CLAIM", "claim")
	config := filepath.Join(p.dir, "relay.toml")
	lab := strings.Replace(closedPortURL(t), "http:", "https:", 1)
	require.NoError(t, os.WriteFile(config, []byte(
		backendTable("CORE", coreURL, "branch-*")+
			backendTable("CLAIM", claimURL, "spiffe://bank/partner/acme")+
			"[LAB]\nurl = \""+lab+"\"\ninsecure_skip_verify = true\n"), 0o600))
	relay := startAdminRelay(t, append(p.hubArgs(), "--config", config)...)

	// A branch reaches core banking through the hub, over TLS on both
	// sides, and is refused claims, without a call;
	branch := hubtest.DialTLS(t, relay.Addr(), p.client(p.bank.Client(t, "branch-7")))
	assert.Equal(t, "B1|0000|balance=100000", branch.Exchange("B1|CORE|BAL ACC1").String())
	assert.Equal(t, "B2|E908|client not allowed to use this target", branch.Exchange("B2|CLAIM|SUBMIT P-1 100").String())
	// a partner known by its URI reaches claims and is refused core
	// banking;
	partner := hubtest.DialTLS(t, relay.Addr(), p.client(p.bank.Issue(t, certtest.Leaf{CommonName: "acme", URIs: []string{"spiffe://bank/partner/acme"}})))
	assert.Equal(t, "P1|0000|claim=CLM-000001 state=SUBMITTED", partner.Exchange("P1|CLAIM|SUBMIT P-1 100").String())
	assert.Equal(t, "P2|E908|client not allowed to use this target", partner.Exchange("P2|CORE|XFER ACC1 ACC2 99999").String())
	// relayctl speaks it too.
	dir := t.TempDir()
	cert, key := p.bank.Client(t, "branch-9").WriteFiles(t, dir, "branch-9")
	res := proctest.Run(t, "./cmd/relayctl", "send", "--addr", relay.Addr(), "--ca", p.bankCA, "--cert", cert, "--key", key, "--txid", "R1", "CORE", "BAL ACC2")
	assert.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Equal(t, "R1|0000|balance=100000\n", res.Stdout)

	// E908 is counted, never a call, never a breaker failure.
	assert.Equal(t, int64(2), p.fixtureCalls(t, coreURL))
	assert.Equal(t, int64(1), p.fixtureCalls(t, claimURL))
	m, _ := relay.scrape(t)
	assert.Equal(t, 1.0, m[`relay_requests_total{code="E908",target="CORE"}`])
	assert.Equal(t, 1.0, m[`relay_requests_total{code="E908",target="CLAIM"}`])
	assert.Equal(t, 3.0, m[`relay_tls_handshakes_total{resumed="false"}`])
	st := relay.status(t)
	assert.Equal(t, "CLOSED", statusOf(t, st, "CORE").State)
	assert.Zero(t, statusOf(t, st, "CORE").ConsecutiveFailures)
	// The target whose certificate is not checked was warned about.
	assert.Contains(t, relay.Stderr(), `"target":"LAB"`)
	assert.Contains(t, relay.Stderr(), "INSECURE")
}

func TestTLSHostileClientsLeaveTheHubServing(t *testing.T) {
	p := newPKI(t)
	relay := startAdminRelay(t, append(p.hubArgs(), "--tls-handshake-timeout", "300ms", "--target", "CORE="+closedPortURL(t))...)
	good := p.bank.Client(t, "branch-1")
	kept := hubtest.DialTLS(t, relay.Addr(), p.client(good))
	require.Equal(t, "K0|E903|unknown target", kept.Exchange("K0|NONE|x").String())
	stranger := certtest.NewCA(t, "someone else's CA")

	hostile := []struct {
		reason string
		client func(t *testing.T)
	}{
		{"not_tls", func(t *testing.T) {
			c := hubtest.Dial(t, relay.Addr())
			c.Send("T1|CORE|BAL ACC1")
			c.ExpectEOF()
		}},
		{"no_client_cert", func(t *testing.T) {
			hubtest.DialTLS(t, relay.Addr(), p.client(nil)).ExpectEOF()
		}},
		{"expired", func(t *testing.T) {
			hubtest.DialTLS(t, relay.Addr(), p.client(p.bank.Expired(t, "branch-1"))).ExpectEOF()
		}},
		{"unknown_ca", func(t *testing.T) {
			cfg := p.client(nil)
			cfg.Certificates = []tls.Certificate{stranger.Client(t, "branch-1").TLS}
			hubtest.DialTLS(t, relay.Addr(), cfg).ExpectEOF()
		}},
		{"timeout", func(t *testing.T) {
			// Slowloris: connections that never finish their handshake.
			var stalls []*hubtest.Client
			for range 5 {
				c := hubtest.Dial(t, relay.Addr())
				_, err := c.Conn().Write([]byte{0x16, 0x03, 0x01})
				require.NoError(t, err)
				stalls = append(stalls, c)
			}
			assert.Equal(t, "K1|E903|unknown target", kept.Exchange("K1|NONE|x").String(), "served while the stalls last")
			for _, c := range stalls {
				c.ExpectEOF()
			}
		}},
	}
	for i, h := range hostile {
		t.Run(h.reason, func(t *testing.T) {
			h.client(t)
			// The hub goes on serving: the connection it kept, and new ones.
			txid := "G" + string(rune('0'+i))
			assert.Equal(t, txid+"|E903|unknown target", kept.Exchange(txid+"|NONE|x").String())
			assert.Equal(t, txid+"|E903|unknown target", hubtest.DialTLS(t, relay.Addr(), p.client(good)).Exchange(txid+"|NONE|x").String())
		})
	}

	want := map[string]float64{"not_tls": 1, "no_client_cert": 1, "expired": 1, "unknown_ca": 1, "timeout": 5}
	proctest.Eventually(t, 5*time.Second, "every refused handshake counted, and only the kept connection open", func() bool {
		m, _ := relay.scrape(t)
		for reason, n := range want {
			if m[`relay_tls_handshake_failures_total{reason="`+reason+`"}`] != n {
				return false
			}
		}
		return m["relay_connections_open"] == 1
	})
	assert.Contains(t, relay.Stderr(), `"reason":"expired"`)
	assert.Contains(t, relay.Stderr(), "tls handshake failed; connection closed")
	assert.Equal(t, "K2|E903|unknown target", kept.Exchange("K2|NONE|x").String())
}

func TestTLSCertificatesRotateOnSIGHUPWithoutDroppingConnections(t *testing.T) {
	p := newPKI(t)
	target := newEchoTarget(t, nil)
	relay := startAdminRelay(t, append(p.hubArgs(), "--target", "CORE="+target.URL)...)
	kept := hubtest.DialTLS(t, relay.Addr(), p.client(p.bank.Client(t, "branch-1")))
	require.Equal(t, "K0|0000|x", kept.Exchange("K0|CORE|x").String())

	// When the certificate and the client CA files are replaced by those
	// of a new CA, as a deployment does, and the relay is sent SIGHUP,
	next := p.rotate(t)
	relay.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "tls certificates reloaded", func() bool { return logged(relay.Process, "tls certificates reloaded") == 1 })

	// then the client connected before keeps getting answers,
	for _, tx := range []string{"K1", "K2", "K3"} {
		assert.Equal(t, tx+"|0000|x", kept.Exchange(tx+"|CORE|x").String())
	}
	// a client of the new CA is served with the new certificate,
	fresh := hubtest.DialTLS(t, relay.Addr(), next.ClientConfig(next.Client(t, "branch-2")))
	assert.Equal(t, "F1|0000|y", fresh.Exchange("F1|CORE|y").String())
	// and a client that knows only the old CA no longer connects.
	_, err := tls.Dial("tcp", relay.Addr(), p.client(p.bank.Client(t, "branch-3")))
	assert.Error(t, err)

	// When a broken file is deployed, the next SIGHUP keeps the
	// certificates in use and says so, once.
	require.NoError(t, os.WriteFile(p.hubCert, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), 0o600))
	relay.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "tls reload failed", func() bool {
		return logged(relay.Process, "tls reload failed; still using the old certificates") == 1
	})
	again := hubtest.DialTLS(t, relay.Addr(), next.ClientConfig(next.Client(t, "branch-4")))
	assert.Equal(t, "A1|0000|z", again.Exchange("A1|CORE|z").String())
	assert.Equal(t, "K4|0000|x", kept.Exchange("K4|CORE|x").String())
	// The same SIGHUPs reopened the breaker log.
	assert.Equal(t, 2, logged(relay.Process, "breaker log reopened"))
	assert.Equal(t, 1, logged(relay.Process, "tls certificates reloaded"))
}

func TestAdminPortOverHTTPSAndBeyondLoopback(t *testing.T) {
	p := newPKI(t)

	// Beyond loopback without a token, the relay does not start: a usage
	// error, before it listens on anything.
	res := proctest.Run(t, relayPkg, "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0", "--breaker-log", filepath.Join(t.TempDir(), "b.log"))
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Stderr, `--admin-listen "0.0.0.0:0": beyond loopback the admin port needs --admin-token`)

	// With a certificate the admin port speaks HTTPS only.
	relay := startAdminRelay(t, "--admin-tls-cert", p.hubCert, "--admin-tls-key", p.hubKey)
	adminAddr := strings.TrimPrefix(relay.admin, "http://")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: p.client(nil)}}
	resp, err := client.Get("https://" + adminAddr + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "ready\n", string(body))
	resp, err = adminClient.Get("http://" + adminAddr + "/readyz")
	if err == nil {
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP is refused")
	}
	out := proctest.Run(t, "./cmd/relayctl", "status", "--admin", adminAddr, "--ca", p.bankCA)
	assert.Equal(t, 0, out.ExitCode, out.Stderr)
	assert.Contains(t, out.Stdout, "CORE")
	// The client port stays plain TCP without its own flags.
	c, err := net.DialTimeout("tcp", relay.Addr(), time.Second)
	require.NoError(t, err)
	c.Close()
}

func TestTLSBehindProxyHeaderAndOneSIGHUPForCertificatesAndAllowedClients(t *testing.T) {
	// Given a hub with mutual TLS behind a balancer on 127.0.0.1 that
	// sends PROXY headers, and CORE for the branches only,
	p := newPKI(t)
	target := newEchoTarget(t, nil)
	config := filepath.Join(p.dir, "relay.toml")
	table := func(allowed string) []byte {
		return fmt.Appendf(nil, "[CORE]\nurl = %q\nallowed_clients = [%q]\n", target.URL, allowed)
	}
	require.NoError(t, os.WriteFile(config, table("branch-*"), 0o600))
	relay := startAdminRelay(t, append(p.hubArgs(), "--config", config,
		"--proxy-protocol", "required", "--proxy-trusted", "127.0.0.1/32")...)
	header := func(client string) []byte {
		b, err := proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort(client)),
			&net.TCPAddr{IP: net.ParseIP("192.0.2.10"), Port: 9200}).Format()
		require.NoError(t, err)
		return b
	}
	dial := func(client string, cfg *tls.Config) *hubtest.Client {
		cfg.ServerName = "127.0.0.1"
		return hubtest.DialTLSAfter(t, relay.Addr(), header(client), cfg)
	}

	// when the clients' handshakes follow the balancer's headers, each is
	// served under its certificate's identity;
	branch := dial("203.0.113.7:4711", p.client(p.bank.Client(t, "branch-7")))
	partner := dial("203.0.113.8:4712", p.client(p.bank.Client(t, "partner-acme")))
	assert.Equal(t, "B1|0000|x", branch.Exchange("B1|CORE|x").String())
	assert.Equal(t, "P1|E908|client not allowed to use this target", partner.Exchange("P1|CORE|x").String())

	// When CORE is given to the partners, the certificates are rotated to
	// a new CA, and the relay is sent one SIGHUP,
	require.NoError(t, os.WriteFile(config, table("partner-*"), 0o600))
	next := p.rotate(t)
	relay.Signal(syscall.SIGHUP)
	proctest.Eventually(t, 5*time.Second, "settings reloaded", func() bool { return logged(relay.Process, "settings reloaded") == 1 })
	assert.Equal(t, 1, logged(relay.Process, "tls certificates reloaded"))

	// then the connections already open follow the new allowed clients
	// from their next line,
	assert.Equal(t, "B2|E908|client not allowed to use this target", branch.Exchange("B2|CORE|x").String())
	assert.Equal(t, "P2|0000|x", partner.Exchange("P2|CORE|x").String())
	// and a new client handshakes with the new certificates, after its
	// header.
	fresh := dial("203.0.113.9:4713", next.ClientConfig(next.Client(t, "partner-zeta")))
	assert.Equal(t, "F1|0000|x", fresh.Exchange("F1|CORE|x").String())
	assert.Equal(t, int64(3), target.calls.Load())
	for _, l := range logMessages(relay.Process, "request refused: client not allowed to use target") {
		assert.Contains(t, []any{"203.0.113.7:4711", "203.0.113.8:4712"}, l["remote"])
	}
}

func TestTLSShieldKeepsEachClientIdentitysTXIDsApart(t *testing.T) {
	tests := []struct {
		name  string
		table string // CORE's settings
		// what branch b's copy of branch a's line, and branch c's W1 with
		// another payload, get
		b, c string
		// the calls CORE received, and the answers the shield replayed
		received []string
		replayed float64
	}{
		{
			name: "by identity, the default", table: "dedup = true\n",
			b: "W1|0000|balance=99500", c: "W1|0000|balance=99500",
			// b's and c's lines are calls of their own (CORE's own
			// memory of X-Tx-Id gives them its first answer); a's resend
			// is still a's.
			received: []string{"W1", "W1", "W1"}, replayed: 1,
		},
		{
			name: "by target", table: "dedup = true\ndedup_scope = \"target\"\n",
			b: "W1|0000|balance=99500", c: "W1|E909|TXID reused with a different payload",
			received: []string{"W1"}, replayed: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Given three branches with certificates of their own, and
			// CORE shielded,
			p := newPKI(t)
			core := proctest.StartFixture(t, "CORE", "core")
			config := filepath.Join(p.dir, "relay.toml")
			require.NoError(t, os.WriteFile(config, []byte("[CORE]\n"+tt.table), 0o600))
			relay := startAdminRelay(t, append(p.hubArgs(), "--target", "CORE="+core.URL, "--config", config)...)
			branch := func(cn string) *hubtest.Client {
				return hubtest.DialTLS(t, relay.Addr(), p.client(p.bank.Client(t, cn)))
			}
			a, b, c := branch("branch-a"), branch("branch-b"), branch("branch-c")

			// when a sends W1, b sends the same line, c sends W1 with
			// another payload, and a sends W1 again,
			require.Equal(t, "W1|0000|balance=99500", a.Exchange("W1|CORE|WD 1001 500").String())
			gotB := b.Exchange("W1|CORE|WD 1001 500").String()
			gotC := c.Exchange("W1|CORE|WD 1001 900").String()
			again := a.Exchange("W1|CORE|WD 1001 500").String()

			// then each gets what its scope says.
			assert.Equal(t, tt.b, gotB)
			assert.Equal(t, tt.c, gotC)
			assert.Equal(t, "W1|0000|balance=99500", again)
			assert.Equal(t, tt.received, core.Received(t))
			m, _ := relay.scrape(t)
			assert.Equal(t, tt.replayed, m[`relay_dedup_total{outcome="replayed",target="CORE"}`])
		})
	}
}
