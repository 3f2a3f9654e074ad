package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
)

// serverFiles writes a server certificate of ca and ca itself as the
// client CA into dir.
func serverFiles(t *testing.T, dir string, ca *certtest.CA) ServerFiles {
	cert, key := ca.Server(t).WriteFiles(t, dir, "hub")
	return ServerFiles{CertFile: cert, KeyFile: key, ClientCAFile: ca.WriteFile(t, dir, "clients")}
}

// loadedServer loads the files serverFiles writes for a new CA.
func loadedServer(t *testing.T) (*Server, ServerFiles, *certtest.CA) {
	ca := certtest.NewCA(t, "CA one")
	files := serverFiles(t, t.TempDir(), ca)
	s, err := LoadServer(files)
	require.NoError(t, err)
	return s, files, ca
}

func TestLoadServer(t *testing.T) {
	s, files, ca := loadedServer(t)
	cert, err := s.Certificate(nil)
	require.NoError(t, err)
	assert.Equal(t, "localhost", cert.Leaf.Subject.CommonName)
	assert.Equal(t, "localhost", s.Leaf().Subject.CommonName)
	assert.Equal(t, files, s.Files())
	_, err = ca.Client(t, "branch-1").Cert.Verify(clientOpts(s))
	assert.NoError(t, err, "the client CA pool holds the CA of the file")

	files.ClientCAFile = ""
	s, err = LoadServer(files)
	require.NoError(t, err)
	assert.Nil(t, s.ClientCAs(), "no client CA file, no pool")
}

func TestReloadTakesNewFilesOrKeepsTheOld(t *testing.T) {
	s, files, one := loadedServer(t)
	two := certtest.NewCA(t, "CA two")

	// When the files are replaced by good ones, the next handshake gets
	// them.
	next := two.Server(t)
	certtest.WriteAtomic(t, files.CertFile, next.CertPEM)
	certtest.WriteAtomic(t, files.KeyFile, next.KeyPEM)
	certtest.WriteAtomic(t, files.ClientCAFile, two.PEM)
	require.NoError(t, s.Reload())
	got, _ := s.Certificate(nil)
	assert.Equal(t, next.Cert.Raw, got.Leaf.Raw)
	_, err := two.Client(t, "branch-1").Cert.Verify(clientOpts(s))
	assert.NoError(t, err)
	_, err = one.Client(t, "branch-1").Cert.Verify(clientOpts(s))
	assert.Error(t, err, "the old CA is gone from the pool")

	// When any file is wrong, nothing changes and the error names it.
	third := one.Server(t)
	expired := one.Issue(t, certtest.Leaf{CommonName: "localhost", NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	bad := []struct {
		name       string
		cert, key  []byte
		ca         []byte
		wantInErr  string
		wantInErr2 string
	}{
		{"certificate of another key", third.CertPEM, next.KeyPEM, two.PEM, files.CertFile, "private key does not match"},
		{"half-written certificate", third.CertPEM[:100], third.KeyPEM, two.PEM, files.CertFile, ""},
		{"expired certificate", expired.CertPEM, expired.KeyPEM, two.PEM, files.CertFile, "expired at"},
		{"empty CA file", third.CertPEM, third.KeyPEM, nil, files.ClientCAFile, "no PEM certificate"},
		{"key in the CA file", third.CertPEM, third.KeyPEM, third.KeyPEM, files.ClientCAFile, "PRIVATE KEY block"},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			certtest.WriteAtomic(t, files.CertFile, b.cert)
			certtest.WriteAtomic(t, files.KeyFile, b.key)
			certtest.WriteAtomic(t, files.ClientCAFile, b.ca)
			err := s.Reload()
			require.Error(t, err)
			assert.Contains(t, err.Error(), b.wantInErr)
			assert.Contains(t, err.Error(), b.wantInErr2)
			got, _ := s.Certificate(nil)
			assert.Equal(t, next.Cert.Raw, got.Leaf.Raw, "the certificate in use stays")
			_, err = two.Client(t, "branch-1").Cert.Verify(clientOpts(s))
			assert.NoError(t, err, "the client CAs in use stay")
		})
	}
	require.NoError(t, os.Remove(files.KeyFile))
	assert.ErrorContains(t, s.Reload(), files.KeyFile)
}

// clientOpts verifies a client certificate against s's client CAs.
func clientOpts(s *Server) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: s.ClientCAs(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
}

// x509VerifyOptions verifies a server certificate against cfg's roots.
func x509VerifyOptions(cfg *tls.Config) x509.VerifyOptions {
	return x509.VerifyOptions{Roots: cfg.RootCAs}
}

func TestLoadServerRefusesWhatCannotServe(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "CA")
	good := serverFiles(t, dir, ca)
	notYet := ca.Issue(t, certtest.Leaf{CommonName: "localhost", NotBefore: time.Now().Add(time.Hour), NotAfter: time.Now().Add(2 * time.Hour)})
	notYetCert, notYetKey := notYet.WriteFiles(t, dir, "later")
	tests := []struct {
		name  string
		files ServerFiles
		want  string
	}{
		{"no files", ServerFiles{}, "needs a certificate file and a key file"},
		{"missing certificate", ServerFiles{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: good.KeyFile}, "nope.crt: no such file"},
		{"certificate not yet valid", ServerFiles{CertFile: notYetCert, KeyFile: notYetKey}, "is not valid before"},
		{"missing CA file", ServerFiles{CertFile: good.CertFile, KeyFile: good.KeyFile, ClientCAFile: filepath.Join(dir, "nope.pem")}, "nope.pem: no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadServer(tt.files)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestClient(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "target CA")
	cert, key := ca.Client(t, "relayhub").WriteFiles(t, dir, "relayhub")
	caFile := ca.WriteFile(t, dir, "target-ca")

	cfg, err := Client(ClientFiles{CAFile: caFile, CertFile: cert, KeyFile: key, ServerName: "core.bank"})
	require.NoError(t, err)
	assert.Equal(t, "core.bank", cfg.ServerName)
	assert.Equal(t, uint16(tls.VersionTLS12), cfg.MinVersion)
	assert.NotNil(t, cfg.ClientSessionCache)
	require.Len(t, cfg.Certificates, 1)
	assert.Equal(t, "relayhub", cfg.Certificates[0].Leaf.Subject.CommonName)
	_, err = ca.Server(t).Cert.Verify(x509VerifyOptions(cfg))
	assert.NoError(t, err, "the target's CA is the root")

	cfg, err = Client(ClientFiles{})
	require.NoError(t, err)
	assert.Nil(t, cfg.RootCAs, "no CA file: the system's roots")
	assert.Empty(t, cfg.Certificates)

	_, err = Client(ClientFiles{CertFile: cert})
	assert.ErrorContains(t, err, "both its certificate file and its key file")
	_, err = Client(ClientFiles{CAFile: filepath.Join(dir, "missing.pem")})
	assert.ErrorContains(t, err, "missing.pem")
	_, err = Client(ClientFiles{CertFile: cert, KeyFile: caFile})
	assert.ErrorContains(t, err, cert)
}
