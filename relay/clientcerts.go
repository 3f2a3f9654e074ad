package relay

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/relayhub/relayhub/relay/clientcert"
	"github.com/relayhub/relayhub/relay/dedup"
	"github.com/relayhub/relayhub/relay/protocol"
)

// Client certificates: how a verified chain is remembered, which
// identities a certificate names, and which targets they may use
// (Target.AllowedClients).

// errNoClientCert is the handshake error of a client that presented no
// certificate where mutual TLS requires one.
var errNoClientCert = errors.New("relay: client presented no certificate")

// errClientCertRefused wraps the x509 error of a client certificate that
// does not verify.
var errClientCertRefused = errors.New("relay: client certificate refused")

// verifyClient is the handshake's VerifyConnection under mutual TLS: the
// client's certificate must chain to a CA of the current pool and be valid
// now for client authentication. It also runs for resumed sessions.
func (t *tlsServer) verifyClient(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errNoClientCert
	}
	pool, now := t.clientCAs(), time.Now()
	key := clientcert.Key(cs.PeerCertificates)
	if t.verified.Holds(pool, key, now) {
		return nil
	}
	opts := x509.VerifyOptions{
		Roots:       pool,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if len(cs.PeerCertificates) > 1 {
		opts.Intermediates = x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
	}
	chains, err := cs.PeerCertificates[0].Verify(opts)
	if err != nil {
		return fmt.Errorf("%w: %w", errClientCertRefused, err)
	}
	t.verified.Add(pool, key, clientcert.Expiry(chains[0]))
	return nil
}

// certScope returns the duplicate-TXID shield's scope of a client whose
// certificate is leaf, naming ids: that of its first identity (a renewed
// certificate that keeps its name keeps its TXIDs), or, for a certificate
// that names none, that of its own SHA-256, so that clients without a name
// do not share one.
func certScope(leaf *x509.Certificate, ids []string) dedup.Scope {
	if len(ids) > 0 {
		return dedup.ClientScope(ids[0])
	}
	sum := sha256.Sum256(leaf.Raw)
	return dedup.ClientScope(string(sum[:]))
}

// mayUse reports whether the connection's client may send requests to the
// target configured by rc: always when it does not restrict its clients,
// else when one of its patterns matches one of the identities of the
// client's certificate. It is asked at every line, against the
// configuration in force, so a reload that changes a target's allowed
// clients applies to the connections already open from their next line; a
// target's few patterns against a certificate's few names cost less than
// the breaker's admission.
func (a *admitter) mayUse(rc *targetConf) bool {
	return rc.clients == nil || clientcert.MatchAny(rc.clients, a.certIdentities())
}

// refuseNotAllowed answers E908 to a request for rt, a target the client's
// certificate does not allow it to use. No breaker or bulkhead is asked:
// it is not a call.
func (a *admitter) refuseNotAllowed(rt *target, req protocol.Request) {
	a.recordHubAnswer(rt, nil, req, protocol.CodeNotAllowed, lblNotAllowed, breakerNote{})
	a.logAddrs(a.srv.tls.failLog.Warn()).Str("target", rt.name).Strs("client", a.certIdentities()).Bytes("txid", req.TxID).
		Msg("request refused: client not allowed to use target")
	a.sink.answerText(req.TxID, protocol.CodeNotAllowed, protocol.MsgNotAllowed, false)
}
