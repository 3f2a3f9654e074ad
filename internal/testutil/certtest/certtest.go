// Package certtest makes X.509 certificates for tests with crypto/x509: a
// certificate authority, server certificates for loopback, client
// certificates with the identities a test needs (URI and DNS SANs, a
// subject CN), expired ones, and their PEM files. Keys are ECDSA P-256, so
// making one costs well under a millisecond.
//
// Typical use:
//
//	ca := certtest.NewCA(t, "test CA")
//	srv := ca.Server(t)
//	certFile, keyFile := srv.WriteFiles(t, dir, "hub")
//	branch := ca.Issue(t, certtest.Leaf{CommonName: "branch-7"})
//	cfg := ca.ClientConfig(branch) // trusts ca, presents branch
//	nc, err := tls.Dial("tcp", addr, cfg)
package certtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serial numbers the certificates of one test process, so no two share
// one.
var serial atomic.Int64

// CA is a certificate authority of a test. It is safe for concurrent use:
// Issue only reads it.
type CA struct {
	// Cert is the CA's own certificate.
	Cert *x509.Certificate
	// Key signs the certificates it issues.
	Key crypto.Signer
	// PEM is Cert in PEM form, the content of a CA file.
	PEM []byte
}

// NewCA returns a self-signed CA valid from an hour ago for a day, failing
// the test on error.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"relayhub tests"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatalf("certtest: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("certtest: parse CA: %v", err)
	}
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der)}
}

// Leaf describes a certificate for Issue. It is a plain value.
type Leaf struct {
	// CommonName is the subject CN; may be empty.
	CommonName string
	// DNSNames and IPs are the DNS and IP address SANs.
	DNSNames []string
	IPs      []net.IP
	// URIs are URI SANs, such as "spiffe://bank/branch-7"; each must parse.
	URIs []string
	// NotBefore and NotAfter bound its validity. Zero means an hour ago
	// and a day from now.
	NotBefore, NotAfter time.Time
	// Usage is its extended key usage. Empty means both server and client
	// authentication.
	Usage []x509.ExtKeyUsage
}

// Cert is an issued certificate with its key. It is a plain value once
// Issue has returned.
type Cert struct {
	// Cert is the parsed certificate.
	Cert *x509.Certificate
	// CertPEM and KeyPEM are the certificate and its private key (PKCS #8)
	// in PEM form, the contents of a certificate and a key file.
	CertPEM, KeyPEM []byte
	// TLS is the certificate as crypto/tls takes it.
	TLS tls.Certificate
}

// Issue returns a certificate signed by ca, failing the test on error.
func (ca *CA) Issue(t testing.TB, l Leaf) *Cert {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: l.CommonName},
		DNSNames:     l.DNSNames,
		IPAddresses:  l.IPs,
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  l.Usage,
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = now.Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = now.Add(24 * time.Hour)
	}
	if len(tmpl.ExtKeyUsage) == 0 {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	for _, raw := range l.URIs {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("certtest: URI SAN %q: %v", raw, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatalf("certtest: issue %q: %v", l.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("certtest: parse %q: %v", l.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("certtest: marshal key: %v", err)
	}
	return &Cert{
		Cert:    cert,
		CertPEM: pemBlock("CERTIFICATE", der),
		KeyPEM:  pemBlock("PRIVATE KEY", keyDER),
		TLS:     tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert},
	}
}

// Server returns a server certificate for loopback: DNS name localhost,
// addresses 127.0.0.1 and ::1, CN "localhost".
func (ca *CA) Server(t testing.TB) *Cert {
	t.Helper()
	return ca.Issue(t, Leaf{
		CommonName: "localhost",
		DNSNames:   []string{"localhost"},
		IPs:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	})
}

// Client returns a client certificate whose only identity is the subject
// CN cn.
func (ca *CA) Client(t testing.TB, cn string) *Cert {
	t.Helper()
	return ca.Issue(t, Leaf{CommonName: cn, Usage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

// Expired returns a client certificate with subject CN cn that expired an
// hour ago.
func (ca *CA) Expired(t testing.TB, cn string) *Cert {
	t.Helper()
	now := time.Now()
	return ca.Issue(t, Leaf{
		CommonName: cn,
		NotBefore:  now.Add(-48 * time.Hour),
		NotAfter:   now.Add(-time.Hour),
		Usage:      []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// Pool returns a pool holding ca alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientConfig returns a client configuration that trusts ca alone and,
// when cert is not nil, presents cert. Its server name is left empty, so
// crypto/tls checks the certificate against the dialled host (127.0.0.1
// for a loopback address).
func (ca *CA) ClientConfig(cert *Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	return cfg
}

// WriteFile writes ca's PEM to dir/name.pem and returns the path.
func (ca *CA) WriteFile(t testing.TB, dir, name string) string {
	t.Helper()
	return writeFile(t, filepath.Join(dir, name+".pem"), ca.PEM)
}

// WriteFiles writes the certificate and its key to dir/name.crt and
// dir/name.key and returns their paths.
func (c *Cert) WriteFiles(t testing.TB, dir, name string) (certFile, keyFile string) {
	t.Helper()
	return writeFile(t, filepath.Join(dir, name+".crt"), c.CertPEM),
		writeFile(t, filepath.Join(dir, name+".key"), c.KeyPEM)
}

// WriteAtomic replaces the file at path with data as an operator's
// deployment does: written to a temporary file in the same directory,
// then renamed over it, so a reader never sees half a file.
func WriteAtomic(t testing.TB, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("certtest: %v", err)
	}
}

// writeFile writes data to path, readable by its owner only, as a key
// file should be, and returns path.
func writeFile(t testing.TB, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("certtest: %v", err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("certtest: generate key: %v", err)
	}
	return key
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}
