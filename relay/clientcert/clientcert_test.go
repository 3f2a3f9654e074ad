package clientcert

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/relayhub/relayhub/internal/testutil/certtest"
)

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"partner-acme", "partner-acme", true},
		{"partner-acme", "partner-acme2", false},
		{"partner-acme", "Partner-acme", false},
		{"branch-*", "branch-7", true},
		{"branch-*", "branch-", true},
		{"branch-*", "branch", false},
		{"branch-*", "xbranch-7", false},
		{"*", "", true},
		{"*", "anything at all", true},
		{"*.branches.bank", "b7.branches.bank", true},
		{"*.branches.bank", "b7.branches.bank.evil", false},
		{"spiffe://bank/*/teller", "spiffe://bank/b7/teller", true},
		{"spiffe://bank/*/teller", "spiffe://bank/b7/x/teller", true},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "aXbYc0", false},
		{"**", "x", true},
		{"", "", true},
		{"", "x", false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, Match(tt.pattern, tt.name), "%q ~ %q", tt.pattern, tt.name)
	}
}

func TestIdentities(t *testing.T) {
	ca := certtest.NewCA(t, "CA")
	c := ca.Issue(t, certtest.Leaf{CommonName: "acme", DNSNames: []string{"acme.example"}, URIs: []string{"spiffe://bank/acme"}})
	assert.Equal(t, []string{"spiffe://bank/acme", "acme.example", "acme"}, Identities(c.Cert))
	bare := &x509.Certificate{URIs: []*url.URL{{Scheme: "urn", Opaque: "x"}}}
	assert.Equal(t, []string{"urn:x"}, Identities(bare))
}

func TestChainsRememberPerPoolUntilExpiry(t *testing.T) {
	var v Chains
	one, two := x509.NewCertPool(), x509.NewCertPool()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	key := [32]byte{1}

	assert.False(t, v.Holds(one, key, now), "nothing verified yet")
	v.Add(one, key, now.Add(time.Hour))
	assert.True(t, v.Holds(one, key, now))
	assert.True(t, v.Holds(one, key, now.Add(59*time.Minute)))
	assert.False(t, v.Holds(one, key, now.Add(time.Hour)), "not once the chain has expired")
	assert.False(t, v.Holds(two, key, now), "not against another pool: a reload verifies again")
	assert.False(t, v.Holds(one, [32]byte{2}, now), "not another chain")

	v.Add(two, [32]byte{2}, now.Add(time.Hour))
	assert.False(t, v.Holds(one, key, now), "a new pool forgets the chains of the old")
	for i := range maxChains + 1 {
		v.Add(two, [32]byte{byte(i), byte(i >> 8), 3}, now.Add(time.Hour))
	}
	assert.LessOrEqual(t, len(v.until), maxChains, "bounded")
}

func TestKeyAndExpiry(t *testing.T) {
	ca := certtest.NewCA(t, "CA")
	a, b := ca.Client(t, "a"), ca.Client(t, "b")
	assert.NotEqual(t, Key([]*x509.Certificate{a.Cert}), Key([]*x509.Certificate{b.Cert}))
	assert.NotEqual(t, Key([]*x509.Certificate{a.Cert}), Key([]*x509.Certificate{a.Cert, ca.Cert}), "the intermediates count")
	assert.Equal(t, Key([]*x509.Certificate{a.Cert}), Key([]*x509.Certificate{a.Cert}))
	short := ca.Issue(t, certtest.Leaf{CommonName: "short", NotAfter: time.Now().Add(time.Minute)})
	assert.Equal(t, short.Cert.NotAfter, Expiry([]*x509.Certificate{short.Cert, ca.Cert}))
	long := ca.Issue(t, certtest.Leaf{CommonName: "long", NotAfter: time.Now().Add(48 * time.Hour)})
	assert.Equal(t, ca.Cert.NotAfter, Expiry([]*x509.Certificate{long.Cert, ca.Cert}), "a leaf that outlives its CA ends with it")
}

func ExampleMatchAny() {
	allowed := []string{"branch-*", "spiffe://bank/atm/*"}
	fmt.Println(MatchAny(allowed, []string{"spiffe://bank/atm/17", "atm17.bank.example"}))
	fmt.Println(MatchAny(allowed, []string{"Branch-7"}))
	// Output:
	// true
	// false
}
