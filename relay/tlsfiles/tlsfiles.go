// Package tlsfiles reads the hub's TLS material from PEM files: the
// certificate and key a server presents and the CA its clients must chain
// to, reloadable while the hub runs, and the client side of a connection to
// a TLS server (a target, or the hub for relayctl): the CA that server is
// verified against, a client certificate, a server name.
//
// A reload reads every file again and replaces the material only when all
// of them are good, so a half-written or broken file never replaces a
// working certificate: the old one stays in use and Reload says why.
//
// Typical use:
//
//	files, err := tlsfiles.LoadServer(tlsfiles.ServerFiles{
//		CertFile: "hub.crt", KeyFile: "hub.key", ClientCAFile: "clients-ca.pem",
//	})
//	if err != nil {
//		return err // tls-cert "hub.crt": open hub.crt: no such file or directory
//	}
//	cfg := relay.TLSConfig{Certificate: files.Certificate, ClientCAs: files.ClientCAs}
//	...
//	if err := files.Reload(); err != nil { // on SIGHUP
//		logger.Error().Err(err).Msg("tls reload failed; still serving the old certificates")
//	}
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ServerFiles name the PEM files of a TLS server. It is a plain value.
type ServerFiles struct {
	// CertFile holds the server's certificate, then any intermediate CA
	// certificates, in PEM. Required.
	CertFile string
	// KeyFile holds the certificate's private key in PEM (PKCS #1, PKCS #8
	// or SEC 1). Required.
	KeyFile string
	// ClientCAFile, when set, holds the CA certificates that client
	// certificates must chain to, in PEM: one or more. Empty means the
	// server asks for no client certificate.
	ClientCAFile string
}

// Server is the material of a TLS server, read from its ServerFiles and
// reloadable. It is safe for concurrent use: handshakes read it while
// Reload replaces it.
type Server struct {
	files ServerFiles
	now   func() time.Time
	cur   atomic.Pointer[serverMaterial]
	// reload is held by Reload, so two reloads never interleave.
	reload sync.Mutex
}

// serverMaterial is one reading of a Server's files. Immutable.
type serverMaterial struct {
	cert      *tls.Certificate
	clientCAs *x509.CertPool // nil without a ClientCAFile
}

// LoadServer reads the files, refusing a certificate that does not match
// its key, has expired or is not yet valid, and a CA file without a
// certificate. Its errors name the file.
func LoadServer(files ServerFiles) (*Server, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, errors.New("tlsfiles: a server needs a certificate file and a key file")
	}
	s := &Server{files: files, now: time.Now}
	m, err := s.read()
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

// Reload reads the files again. When every one of them is good the new
// material is used for every handshake from then on; otherwise the old
// one stays and the error says which file is wrong. Connections already
// established are not touched either way.
func (s *Server) Reload() error {
	s.reload.Lock()
	defer s.reload.Unlock()
	m, err := s.read()
	if err != nil {
		return err
	}
	s.cur.Store(m)
	return nil
}

// Certificate returns the current certificate. It has the signature of
// tls.Config.GetCertificate.
func (s *Server) Certificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load().cert, nil
}

// ClientCAs returns the current pool of client CAs; nil without a
// ClientCAFile.
func (s *Server) ClientCAs() *x509.CertPool {
	return s.cur.Load().clientCAs
}

// Leaf returns the current certificate, parsed, for logs: its subject and
// when it expires.
func (s *Server) Leaf() *x509.Certificate {
	return s.cur.Load().cert.Leaf
}

// Files returns the files s reads.
func (s *Server) Files() ServerFiles { return s.files }

// read reads every file of s.
func (s *Server) read() (*serverMaterial, error) {
	cert, err := loadKeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return nil, err
	}
	now := s.now()
	switch leaf := cert.Leaf; {
	case now.After(leaf.NotAfter):
		return nil, fmt.Errorf("certificate %q expired at %s", s.files.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return nil, fmt.Errorf("certificate %q is not valid before %s", s.files.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	m := &serverMaterial{cert: cert}
	if s.files.ClientCAFile != "" {
		if m.clientCAs, err = LoadPool(s.files.ClientCAFile); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// loadKeyPair reads a certificate chain and its key, with the leaf
// parsed.
func loadKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// crypto/tls names neither file.
		return nil, fmt.Errorf("certificate %q with key %q: %w", certFile, keyFile, err)
	}
	if cert.Leaf == nil {
		// X509KeyPair fills Leaf in, unless GODEBUG turns that off.
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %q: %w", certFile, err)
		}
	}
	return &cert, nil
}

// LoadPool reads a file of one or more CA certificates in PEM. A file with
// no certificate, or with a block that is not one, is refused: a pool that
// quietly trusts nothing, or less than was meant, would only show up as
// refused handshakes.
func LoadPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("CA file %q: a %s block where certificates belong", file, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA file %q: certificate %d: %w", file, n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA file %q: no PEM certificate in it", file)
	}
	return pool, nil
}

// ClientFiles configure the client side of a TLS connection. It is a plain
// value.
type ClientFiles struct {
	// CAFile, when set, holds the CA certificates the server must chain
	// to, in PEM, in place of the system's roots.
	CAFile string
	// CertFile and KeyFile, both or neither, hold the client certificate
	// presented to a server that asks for one (mutual TLS) and its key.
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must hold, and the
	// name sent in the handshake. Empty means the host being dialled.
	ServerName string
	// InsecureSkipVerify turns off the verification of the server's
	// certificate: anyone on the path can then read and change the
	// traffic. For tests and emergencies only.
	InsecureSkipVerify bool
}

// Client returns the client configuration f describes: TLS 1.2 or later,
// with a session cache so that connections after the first resume their
// session. Its errors name the file.
func Client(f ClientFiles) (*tls.Config, error) {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, errors.New("a client certificate needs both its certificate file and its key file")
	}
	cfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         f.ServerName,
		InsecureSkipVerify: f.InsecureSkipVerify,
		ClientSessionCache: tls.NewLRUClientSessionCache(0),
	}
	if f.CAFile != "" {
		pool, err := LoadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if f.CertFile != "" {
		cert, err := loadKeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg, nil
}
