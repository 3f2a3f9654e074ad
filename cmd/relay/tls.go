package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/relayhub/relayhub/relay"
	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// TLSFlags are the relay's TLS flags (docs/OPERATING.md, "TLS"), embedded
// in cli.
type TLSFlags struct {
	TLSCert             string   `name:"tls-cert" help:"PEM file of the certificate (then any intermediates) the client port serves TLS with; needs --tls-key. Re-read on SIGHUP. Empty means plain TCP." placeholder:"FILE" env:"RELAY_TLS_CERT"`
	TLSKey              string   `name:"tls-key" help:"PEM file of the private key of --tls-cert. Re-read on SIGHUP." placeholder:"FILE" env:"RELAY_TLS_KEY"`
	TLSClientCA         string   `name:"tls-client-ca" help:"PEM file of the CAs whose client certificates the client port accepts; when set every client must present one (mutual TLS), and allowed_clients can name them. Re-read on SIGHUP." placeholder:"FILE" env:"RELAY_TLS_CLIENT_CA"`
	TLSMinVersion       string   `name:"tls-min-version" help:"Oldest TLS version accepted on the client and admin ports: 1.2 or 1.3." enum:"1.2,1.3" default:"1.2" env:"RELAY_TLS_MIN_VERSION"`
	TLSHandshakeTimeout duration `name:"tls-handshake-timeout" help:"Close a client connection whose TLS handshake has not finished this long after accept." default:"5s" env:"RELAY_TLS_HANDSHAKE_TIMEOUT"`
	AdminTLSCert        string   `name:"admin-tls-cert" help:"PEM file of the certificate the admin port serves HTTPS with; needs --admin-tls-key. Re-read on SIGHUP. Empty means plain HTTP." placeholder:"FILE" env:"RELAY_ADMIN_TLS_CERT"`
	AdminTLSKey         string   `name:"admin-tls-key" help:"PEM file of the private key of --admin-tls-cert. Re-read on SIGHUP." placeholder:"FILE" env:"RELAY_ADMIN_TLS_KEY"`
}

// validateTLS checks the TLS flags and the admin port's exposure; each
// error names its flag.
func (c *cli) validateTLS() error {
	switch {
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return errors.New("--tls-cert and --tls-key: give both, or neither for plain TCP")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return errors.New("--tls-client-ca: needs --tls-cert and --tls-key: client certificates are asked for in a TLS handshake")
	case c.TLSHandshakeTimeout <= 0:
		return fmt.Errorf("--tls-handshake-timeout: must be more than zero, got %s", time.Duration(c.TLSHandshakeTimeout))
	case (c.AdminTLSCert == "") != (c.AdminTLSKey == ""):
		return errors.New("--admin-tls-cert and --admin-tls-key: give both, or neither for plain HTTP")
	case c.AdminTLSCert != "" && c.AdminListen == "":
		return errors.New("--admin-tls-cert: the admin port is off (--admin-listen is empty)")
	case c.AdminListen != "" && c.AdminToken == "" && c.AdminTokenFile == "" && beyondLoopback(c.AdminListen):
		return fmt.Errorf("--admin-listen %q: beyond loopback the admin port needs --admin-token (better RELAY_ADMIN_TOKEN) or --admin-token-file: anyone who reaches it could hold every breaker open", c.AdminListen)
	}
	return nil
}

// beyondLoopback reports whether a listen address HOST:PORT may be
// reached from other machines: an empty host (every interface), an
// address that is not loopback, or a host name other than localhost, whose
// addresses the relay does not look up.
func beyondLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return true
	}
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// minTLSVersion is --tls-min-version as crypto/tls numbers it.
func (c *cli) minTLSVersion() uint16 {
	if c.TLSMinVersion == "1.3" {
		return tls.VersionTLS13
	}
	return tls.VersionTLS12
}

// hubTLS is the TLS material the relay reads from files: nil fields are
// off. Both servers' files are reloaded on SIGHUP.
type hubTLS struct {
	client *tlsfiles.Server // the client port's
	admin  *tlsfiles.Server // the admin port's
}

// loadTLS reads the TLS files the flags name, and checks that the targets
// that restrict their clients can tell them apart. Each error names its
// flag or the settings file.
func (c *cli) loadTLS(targets []relay.Target) (hubTLS, error) {
	var (
		h   hubTLS
		err error
	)
	if err := checkAllowedClients(c.Config, c.TLSClientCA != "", targets); err != nil {
		return h, err
	}
	if c.TLSCert != "" {
		if h.client, err = tlsfiles.LoadServer(tlsfiles.ServerFiles{CertFile: c.TLSCert, KeyFile: c.TLSKey, ClientCAFile: c.TLSClientCA}); err != nil {
			return h, fmt.Errorf("--tls-cert, --tls-key, --tls-client-ca: %w", err)
		}
	}
	if c.AdminTLSCert != "" {
		if h.admin, err = tlsfiles.LoadServer(tlsfiles.ServerFiles{CertFile: c.AdminTLSCert, KeyFile: c.AdminTLSKey}); err != nil {
			return h, fmt.Errorf("--admin-tls-cert, --admin-tls-key: %w", err)
		}
	}
	return h, nil
}

// checkAllowedClients refuses targets, read from the settings file path,
// that restrict their clients when the client port has no mutual TLS.
func checkAllowedClients(path string, mutualTLS bool, targets []relay.Target) error {
	if mutualTLS {
		return nil
	}
	for _, t := range targets {
		if len(t.AllowedClients) > 0 {
			return fmt.Errorf("config %s: [%s] allowed_clients: needs --tls-client-ca (mutual TLS): without a verified client certificate there is no identity to match", path, t.Name)
		}
	}
	return nil
}

// relayConfig is the TLS of the client port as relay.Config takes it; nil
// for plain TCP.
func (h hubTLS) relayConfig(c *cli) *relay.TLSConfig {
	if h.client == nil {
		return nil
	}
	cfg := &relay.TLSConfig{
		Certificate:      h.client.Certificate,
		MinVersion:       c.minTLSVersion(),
		HandshakeTimeout: time.Duration(c.TLSHandshakeTimeout),
	}
	if c.TLSClientCA != "" {
		cfg.ClientCAs = h.client.ClientCAs
	}
	return cfg
}

// adminListener wraps the admin port's listener in TLS when it has a
// certificate.
func (h hubTLS) adminListener(ln net.Listener, c *cli) net.Listener {
	if h.admin == nil {
		return ln
	}
	return tls.NewListener(ln, &tls.Config{GetCertificate: h.admin.Certificate, MinVersion: c.minTLSVersion()})
}

// reloads returns the SIGHUP reloads of the TLS files.
func (h hubTLS) reloads(logger zerolog.Logger) []func() {
	var out []func()
	for _, s := range []struct {
		port  string
		files *tlsfiles.Server
	}{{"client", h.client}, {"admin", h.admin}} {
		if s.files != nil {
			out = append(out, reloadTLS(s.port, s.files, logger))
		}
	}
	return out
}

// reloadTLS returns the reload of one port's TLS files. A file that
// cannot be used is logged, once, and the port goes on with the
// certificates it had: no connection is dropped either way.
func reloadTLS(port string, files *tlsfiles.Server, logger zerolog.Logger) func() {
	return func() {
		if err := files.Reload(); err != nil {
			logger.Error().Err(err).Str("port", port).Msg("tls reload failed; still using the old certificates")
			return
		}
		logCertificate(logger.Info(), port, files).Msg("tls certificates reloaded")
	}
}

// log logs, at start, the TLS of each port that has it, and a loud
// warning for each target whose certificate is not verified.
func (h hubTLS) log(logger zerolog.Logger, c *cli, targets []relay.Target) {
	if h.client != nil {
		logCertificate(logger.Info(), "client", h.client).Str("client_ca", c.TLSClientCA).
			Str("min_version", c.TLSMinVersion).Stringer("handshake_timeout", c.TLSHandshakeTimeout).Msg("tls on")
	}
	if h.admin != nil {
		logCertificate(logger.Info(), "admin", h.admin).Str("min_version", c.TLSMinVersion).Msg("tls on")
	}
	warnInsecureTargets(logger, targets)
}

// warnInsecureTargets logs a loud warning for each target whose
// certificate is not verified, at start and after each reload.
func warnInsecureTargets(logger zerolog.Logger, targets []relay.Target) {
	for _, t := range targets {
		if t.TLS != nil && t.TLS.InsecureSkipVerify {
			logger.Warn().Str("target", t.Name).Str("url", t.URL).
				Msg("INSECURE: the certificate of this target is not verified (insecure_skip_verify): anyone on the path can read and change its transactions")
		}
	}
}

// logCertificate adds a port's certificate to ev: which port, its files,
// its subject and when it expires.
func logCertificate(ev *zerolog.Event, port string, files *tlsfiles.Server) *zerolog.Event {
	leaf := files.Leaf()
	return ev.Str("port", port).Str("cert", files.Files().CertFile).Str("subject", leaf.Subject.String()).
		Str("not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
}
