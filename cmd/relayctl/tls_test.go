package main

import (
	"bytes"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/fixtures"
	"github.com/relayhub/relayhub/internal/cmdline"
	"github.com/relayhub/relayhub/internal/loadgen"
	"github.com/relayhub/relayhub/internal/testutil/certtest"
	"github.com/relayhub/relayhub/internal/testutil/hubtest"
	"github.com/relayhub/relayhub/relay"
)

// tlsFiles writes a CA, and a client certificate of it for cn, into a
// temporary directory and returns the flags that use them.
func tlsFiles(t *testing.T, ca *certtest.CA, cn string) loadgen.TLSFlags {
	dir := t.TempDir()
	cert, key := ca.Client(t, cn).WriteFiles(t, dir, cn)
	return loadgen.TLSFlags{CA: ca.WriteFile(t, dir, "ca"), Cert: cert, Key: key}
}

func TestSendOverMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "hub CA")
	server := ca.Server(t)
	srv, err := relay.New(relay.Config{
		Targets: []relay.Target{{Name: "CORE", URL: "http://127.0.0.1:1", AllowedClients: []string{"branch-*"}}},
		TLS: &relay.TLSConfig{
			Certificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &server.TLS, nil },
			ClientCAs:   ca.Pool,
		},
	})
	require.NoError(t, err)
	addr := hubtest.Serve(t, srv, relay.ErrServerClosed)

	// A branch's certificate reaches CORE (unreachable here: E902 after the
	// hub tried it), another client's is refused E908 by the hub.
	out, code, err := runSend(t, sendCmd{Addr: addr, TxID: "T1", Target: "CORE", Payload: "BAL 1", TLSFlags: tlsFiles(t, ca, "branch-7")})
	assert.Equal(t, 1, code, err)
	assert.True(t, strings.HasPrefix(out, "T1|E902|"), out)
	out, code, _ = runSend(t, sendCmd{Addr: addr, TxID: "T2", Target: "CORE", TLSFlags: tlsFiles(t, ca, "partner-acme")})
	assert.Equal(t, 1, code)
	assert.Equal(t, "T2|E908|client not allowed to use this target\n", out)

	// A hub whose certificate the client cannot verify is not talked to.
	other := certtest.NewCA(t, "another CA")
	_, code, err = runSend(t, sendCmd{Addr: addr, TxID: "T3", Target: "CORE", TLSFlags: tlsFiles(t, other, "branch-7")})
	assert.Equal(t, 2, code)
	assert.ErrorContains(t, err, "certificate signed by unknown authority")
}

func TestStatusOverHTTPSWithToken(t *testing.T) {
	ca := certtest.NewCA(t, "admin CA")
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer t0ken" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"missing or wrong bearer token"}`))
			return
		}
		_, _ = w.Write([]byte(statusJSON))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server(t).TLS}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	admin := strings.TrimPrefix(srv.URL, "https://")
	flags := loadgen.TLSFlags{CA: ca.WriteFile(t, t.TempDir(), "ca")}

	out, code, err := runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: admin, Token: "t0ken", TLSFlags: flags}})
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "CORE    OPEN")

	_, code, err = runStatus(t, statusCmd{AdminFlags: AdminFlags{Admin: admin, TLSFlags: flags}})
	assert.Equal(t, 1, code)
	assert.ErrorContains(t, err, "401")
}

// TestReconcileOverMutualTLS: a target behind mutual TLS is asked with
// --ca, --cert and --key; without a client certificate it cannot be asked,
// and its transaction stays unknown.
func TestReconcileOverMutualTLS(t *testing.T) {
	ca := certtest.NewCA(t, "core CA")
	core, err := fixtures.New(fixtures.Config{Kind: fixtures.KindCore})
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(core)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server(t).TLS}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	flags := tlsFiles(t, ca, "relayhub")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig(ca.Client(t, "teller"))}}
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/tx", strings.NewReader("WD 1 10"))
	require.NoError(t, err)
	req.Header.Set("X-Tx-Id", "T1")
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	journal := writeJournal(t, journalLine("T1", "CORE", srv.URL, "E901", "request_sent"))

	var out bytes.Buffer
	c := reconcileCmd{InDoubtLog: []string{journal}, Timeout: 5 * time.Second, Concurrency: 1, TLSFlags: flags}
	require.NoError(t, c.Run(t.Context(), &streams{Out: &out}))
	assert.Contains(t, out.String(), "1 applied")

	out.Reset()
	c.Cert, c.Key = "", ""
	err = c.Run(t.Context(), &streams{Out: &out})
	assert.Equal(t, 1, cmdline.Code(err))
	assert.Contains(t, out.String(), "1 unknown")
}
