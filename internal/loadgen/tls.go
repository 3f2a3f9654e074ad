package loadgen

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/relayhub/relayhub/relay/tlsfiles"
)

// TLSFlags are the flags of a client that speaks TLS to the hub (or to a
// target), tagged for kong: a command embeds them with an envprefix, so
// every flag also has an environment variable (--ca is RELAYCTL_CA under
// the prefix RELAYCTL_). Flags embeds them. They are filled by kong and
// not for concurrent use.
type TLSFlags struct {
	TLS        bool   `name:"tls" help:"Speak TLS (the hub's --tls-cert); --ca, --cert, --key and --server-name turn it on too." env:"TLS"`
	CA         string `name:"ca" help:"PEM file of the CAs the server's certificate must chain to; empty means the system's roots." placeholder:"FILE" env:"CA"`
	Cert       string `name:"cert" help:"PEM file of the client certificate to present (mutual TLS: the hub's --tls-client-ca); needs --key." placeholder:"FILE" env:"CERT"`
	Key        string `name:"key" help:"PEM file of the private key of --cert." placeholder:"FILE" env:"KEY"`
	ServerName string `name:"server-name" help:"Name the server's certificate must hold; empty means the host of the address." env:"SERVER_NAME"`
}

// On reports whether the flags ask for TLS.
func (f *TLSFlags) On() bool {
	return f.TLS || f.CA != "" || f.Cert != "" || f.Key != "" || f.ServerName != ""
}

// ClientConfig reads the files the flags name and returns the TLS
// configuration of the connections, nil when the flags ask for no TLS.
// Its errors name the flag at fault.
func (f *TLSFlags) ClientConfig() (*tls.Config, error) {
	if !f.On() {
		return nil, nil
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("--cert and --key: give both, or neither")
	}
	cfg, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: f.CA, CertFile: f.Cert, KeyFile: f.Key, ServerName: f.ServerName})
	if err != nil {
		return nil, fmt.Errorf("--ca, --cert, --key: %w", err)
	}
	return cfg, nil
}

// dialConn connects to addr with d and, when cfg is set, completes a TLS
// handshake within the dialer's timeout.
func dialConn(ctx context.Context, d *net.Dialer, cfg *tls.Config, addr string) (net.Conn, error) {
	if cfg == nil {
		return d.DialContext(ctx, "tcp", addr)
	}
	td := tls.Dialer{NetDialer: d, Config: cfg}
	return td.DialContext(ctx, "tcp", addr)
}
