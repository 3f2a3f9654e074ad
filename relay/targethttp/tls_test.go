package targethttp

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
	"github.com/relayhub/relayhub/relay/protocol"
)

// mtlsTarget starts an https target with a certificate of ca that requires
// a client certificate of ca too (at most maxVersion, 0 for any), and
// answers with the CN of the client's certificate.
func mtlsTarget(t *testing.T, ca *certtest.CA, maxVersion uint16) *httptest.Server {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		_, _ = io.WriteString(w, `{"code":"0000","message":"hello `+r.TLS.PeerCertificates[0].Subject.CommonName+`"}`)
	}))
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{ca.Server(t).TLS},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MaxVersion:   maxVersion,
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// tlsClient returns a Client posting to url's /tx with TLS configured by
// cfg.
func tlsClient(t *testing.T, url string, cfg *tls.Config) *Client {
	t.Helper()
	tg, err := New(Config{URL: strings.TrimRight(url, "/") + "/tx", Timeout: 5 * time.Second, MaxInflight: 10, Conns: NewConns(nil), TLS: cfg})
	require.NoError(t, err)
	t.Cleanup(tg.CloseIdle)
	return tg
}

func TestTargetCallWithPrivateCAAndClientCertificate(t *testing.T) {
	ca := certtest.NewCA(t, "bank back-end CA")
	srv := mtlsTarget(t, ca, 0)
	tg := tlsClient(t, srv.URL, ca.ClientConfig(ca.Client(t, "relayhub")))

	for i := range 2 {
		code, msg := codeMsg(tg.Call([]byte("TX"), []byte("BAL 1")))
		require.Equal(t, "0000", code, "call %d: %s", i, msg)
		assert.Equal(t, "hello relayhub", string(msg))
	}
}

func TestTargetTLSFailuresAreE902(t *testing.T) {
	ca := certtest.NewCA(t, "bank back-end CA")
	other := certtest.NewCA(t, "another CA")
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		srv := mtlsTarget(t, ca, version)
		// Under TLS 1.3 the target judges the hub's certificate after the
		// hub's side of the handshake is done and the request written; its
		// alert then reads as a connection closed before any answer.
		refusedCert := msgTLSFailed + suffixNotSent
		if version == tls.VersionTLS13 {
			refusedCert = msgClosedEarly + suffixInDoubt
		}
		tests := []struct {
			name string
			cfg  *tls.Config
			want string
		}{
			{"target of an unknown CA", other.ClientConfig(ca.Client(t, "relayhub")), msgTLSFailed + suffixNotSent},
			{"no client certificate", ca.ClientConfig(nil), refusedCert},
			{"client certificate the target does not trust", ca.ClientConfig(other.Client(t, "relayhub")), refusedCert},
			{"server name the certificate does not hold", func() *tls.Config {
				c := ca.ClientConfig(ca.Client(t, "relayhub"))
				c.ServerName = "core.bank.example"
				return c
			}(), msgTLSFailed + suffixNotSent},
		}
		for _, tt := range tests {
			t.Run(tls.VersionName(version)+"/"+tt.name, func(t *testing.T) {
				code, msg := codeMsg(tlsClient(t, srv.URL, tt.cfg).Call([]byte("TX"), []byte("BAL 1")))
				assert.Equal(t, protocol.CodeUnreachable, code)
				assert.Equal(t, tt.want, string(msg))
			})
		}
	}
}
