package targethttp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
)

// isTLSFailure reports whether err ended a call in the TLS handshake with
// an https target: a certificate the hub does not trust (or that names
// another host), an alert from the target (which refused the hub's client
// certificate, say), or an answer that is no TLS. The request was never
// written, but like any failure to reach the target it is E902, and it
// counts for the breaker: the target cannot be used.
func isTLSFailure(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		hostname  x509.HostnameError
		unknownCA x509.UnknownAuthorityError
		invalid   x509.CertificateInvalidError
		header    tls.RecordHeaderError
		op        *net.OpError
	)
	return errors.As(err, &verify) || errors.As(err, &hostname) || errors.As(err, &unknownCA) ||
		errors.As(err, &invalid) || errors.As(err, &header) ||
		errors.As(err, &op) && op.Op == "remote error"
}
