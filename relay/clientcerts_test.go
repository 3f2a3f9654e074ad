package relay

import (
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/relayhub/relayhub/relay/dedup"
)

func TestCertScopeIsTheFirstIdentitysOrTheCertificatesOwn(t *testing.T) {
	first, renewed := &x509.Certificate{Raw: []byte("first")}, &x509.Certificate{Raw: []byte("renewed")}
	ids := []string{"spiffe://bank/branch-7", "branch-7.bank.example", "branch-7"}

	// A certificate's scope is that of its first identity, whatever else
	// the certificate holds, so that a renewal keeps it;
	assert.Equal(t, dedup.ClientScope(ids[0]), certScope(first, ids))
	assert.Equal(t, certScope(first, ids), certScope(renewed, ids[:1]))
	assert.NotEqual(t, certScope(first, ids), certScope(first, ids[1:]))
	// one that names none has a scope of its own, never the target's.
	nameless := certScope(first, []string{})
	_, client := nameless.Client()
	assert.True(t, client)
	assert.NotEqual(t, nameless, certScope(renewed, nil))
}

func TestShieldScopeIsTheTargetsWithoutACertificateOrWhenSet(t *testing.T) {
	byIdentity, byTarget := &targetConf{}, &targetConf{}
	byTarget.settings.DedupScope = DedupByTarget
	scope := dedup.ClientScope("branch-7")
	withCert := &admitter{peer: &connPeer{identities: []string{"branch-7"}, scope: scope}}
	plain := &admitter{}

	assert.Equal(t, scope, withCert.shieldScope(byIdentity))
	assert.Equal(t, dedup.Scope{}, withCert.shieldScope(byTarget))
	assert.Equal(t, dedup.Scope{}, plain.shieldScope(byIdentity))
	assert.Equal(t, dedup.Scope{}, (&admitter{peer: &connPeer{}}).shieldScope(byIdentity), "a PROXY header without a certificate")
}
