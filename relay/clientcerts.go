package relay

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

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
	key := chainKey(cs.PeerCertificates)
	if t.verified.holds(pool, key, now) {
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
	t.verified.add(pool, key, chainExpiry(chains[0]))
	return nil
}

// verifiedChains remembers the client certificate chains verified against
// one pool of client CAs, each until the first of its certificates
// expires, so that a client that connects again, or resumes its session,
// is not verified again: verifying a chain is about a third of the hub's
// part of a resumed handshake. A new pool (a reload) forgets them all. It
// is safe for concurrent use.
type verifiedChains struct {
	mu    sync.Mutex
	pool  *x509.CertPool         // guarded by mu: what the chains were verified against
	until map[[32]byte]time.Time // guarded by mu: by chainKey, when the verified chain stops being valid
}

// maxVerifiedChains bounds verifiedChains: past it, it starts over, so
// clients that present ever new certificates cannot grow it.
const maxVerifiedChains = 4096

// holds reports whether the chain of key was verified against pool and is
// still valid at now.
func (v *verifiedChains) holds(pool *x509.CertPool, key [32]byte, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.until[key]
	return ok && v.pool == pool && now.Before(until)
}

// add records that the chain of key verified against pool, valid until
// until.
func (v *verifiedChains) add(pool *x509.CertPool, key [32]byte, until time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pool != pool || len(v.until) >= maxVerifiedChains {
		v.pool, v.until = pool, make(map[[32]byte]time.Time)
	}
	v.until[key] = until
}

// chainKey identifies the certificates a client presented.
func chainKey(certs []*x509.Certificate) [32]byte {
	h := sha256.New()
	for _, c := range certs {
		h.Write(c.Raw)
	}
	var key [32]byte
	h.Sum(key[:0])
	return key
}

// chainExpiry returns when the first certificate of a verified chain
// expires.
func chainExpiry(chain []*x509.Certificate) time.Time {
	until := chain[0].NotAfter
	for _, c := range chain[1:] {
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	return until
}

// clientIdentities returns the identities of a client certificate that
// allowed_clients patterns match: its URI SANs, its DNS SANs and its
// subject CN, in that order.
func clientIdentities(leaf *x509.Certificate) []string {
	ids := make([]string, 0, len(leaf.URIs)+len(leaf.DNSNames)+1)
	for _, u := range leaf.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, leaf.DNSNames...)
	if leaf.Subject.CommonName != "" {
		ids = append(ids, leaf.Subject.CommonName)
	}
	return ids
}

// mayUse reports whether the connection's client may send requests to the
// target configured by rc: always when it does not restrict its clients,
// else when one of its patterns matches one of the identities of the
// client's certificate. It is asked at every line, against the
// configuration in force, so a reload that changes a target's allowed
// clients applies to the connections already open from their next line; a
// target's few patterns against a certificate's few names cost less than
// the breaker's admission.
func (c *conn) mayUse(rc *routeConf) bool {
	return rc.clients == nil || matchAnyPattern(rc.clients, c.certIdentities())
}

// refuseNotAllowed answers E908 to a request for rt, a target the client's
// certificate does not allow it to use. No breaker or bulkhead is asked:
// it is not a call.
func (c *conn) refuseNotAllowed(rt *route, req protocol.Request) {
	c.noteHubAnswer(rt, nil, req, protocol.CodeNotAllowed, lblNotAllowed, breakerNote{})
	c.logAddrs(c.srv.tls.failLog.Warn()).Str("target", rt.name).Strs("client", c.certIdentities()).Bytes("txid", req.TxID).
		Msg("request refused: client not allowed to use target")
	answer(c, req.TxID, protocol.CodeNotAllowed, protocol.MsgNotAllowed, false)
}

// matchAnyPattern reports whether one of patterns matches one of names.
func matchAnyPattern(patterns, names []string) bool {
	for _, p := range patterns {
		for _, n := range names {
			if MatchClientPattern(p, n) {
				return true
			}
		}
	}
	return false
}

// MatchClientPattern reports whether the client identity name matches
// pattern, an entry of a target's allowed_clients: '*' stands for any run
// of characters, none included, and every other character for itself,
// case included ("branch-*" matches "branch-7" and "branch-", not
// "Branch-7").
func MatchClientPattern(pattern, name string) bool {
	// The classic greedy match with one backtrack point: the last star and
	// the position in name it was last tried at.
	p, n := 0, 0
	star, mark := -1, 0
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, n
			p++
		case p < len(pattern) && pattern[p] == name[n]:
			p++
			n++
		case star >= 0:
			mark++
			p, n = star+1, mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
