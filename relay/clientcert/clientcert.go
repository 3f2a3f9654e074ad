// Package clientcert is what the hub knows of client certificates beyond
// crypto/tls: the identities a certificate names, the allowed_clients
// patterns that match them, and a cache of chains already verified.
//
// Typical use:
//
//	ids := clientcert.Identities(state.PeerCertificates[0])
//	if !clientcert.MatchAny(allowed, ids) {
//		// refuse the request: E908
//	}
package clientcert

import (
	"crypto/sha256"
	"crypto/x509"
	"sync"
	"time"
)

// Chains remembers the client certificate chains verified against
// one pool of client CAs, each until the first of its certificates
// expires, so that a client that connects again, or resumes its session,
// is not verified again: verifying a chain is about a third of the hub's
// part of a resumed handshake. A new pool (a reload) forgets them all. It
// is safe for concurrent use.
type Chains struct {
	mu    sync.Mutex
	pool  *x509.CertPool         // guarded by mu: what the chains were verified against
	until map[[32]byte]time.Time // guarded by mu: by Key, when the verified chain stops being valid
}

// maxChains bounds Chains: past it, it starts over, so
// clients that present ever new certificates cannot grow it.
const maxChains = 4096

// Holds reports whether the chain of key was verified against pool and is
// still valid at now.
func (v *Chains) Holds(pool *x509.CertPool, key [32]byte, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.until[key]
	return ok && v.pool == pool && now.Before(until)
}

// Add records that the chain of key verified against pool, valid until
// until.
func (v *Chains) Add(pool *x509.CertPool, key [32]byte, until time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.pool != pool || len(v.until) >= maxChains {
		v.pool, v.until = pool, make(map[[32]byte]time.Time)
	}
	v.until[key] = until
}

// Key identifies the certificates a client presented.
func Key(certs []*x509.Certificate) [32]byte {
	h := sha256.New()
	for _, c := range certs {
		h.Write(c.Raw)
	}
	var key [32]byte
	h.Sum(key[:0])
	return key
}

// Expiry returns when the first certificate of a verified chain
// expires.
func Expiry(chain []*x509.Certificate) time.Time {
	until := chain[0].NotAfter
	for _, c := range chain[1:] {
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	return until
}

// Identities returns the identities of a client certificate that
// allowed_clients patterns match: its URI SANs, its DNS SANs and its
// subject CN, in that order.
func Identities(leaf *x509.Certificate) []string {
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

// MatchAny reports whether one of patterns matches one of names.
func MatchAny(patterns, names []string) bool {
	for _, p := range patterns {
		for _, n := range names {
			if Match(p, n) {
				return true
			}
		}
	}
	return false
}

// Match reports whether the client identity name matches
// pattern, an entry of a target's allowed_clients: '*' stands for any run
// of characters, none included, and every other character for itself,
// case included ("branch-*" matches "branch-7" and "branch-", not
// "Branch-7").
func Match(pattern, name string) bool {
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
